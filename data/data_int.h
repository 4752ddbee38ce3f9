/*
 * data/data_int.h - what the data_*.c files share and no other module uses:
 * opening a data file, the decompressing source, the batch builder, the TSV
 * cursor and row count, the kiln-bin chunk reader. Other modules use data.h;
 * the module's tests may include this one.
 */
#ifndef KILN_DATA_DATA_INT_H
#define KILN_DATA_DATA_INT_H

#include "data.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Opens a data file for reading: *fd, or KILN_ENOENT / KILN_EIO naming the
 * file, or KILN_EINVAL when it is not a regular file (/dev/zero, a FIFO, a
 * directory: training would read it forever, or block, or fail later). */
int data_open(const char *path, int *fd /* OUT */);

/* How a data file's bytes are stored, told by its first bytes. */
typedef enum { DATA_COMP_NONE = 0, DATA_COMP_GZIP = 1, DATA_COMP_ZSTD = 2 } data_comp_t;
/* gzip for 1f 8b, zstd for 28 b5 2f fd, else none; head holds n bytes. */
data_comp_t data_comp_detect(const unsigned char *head, size_t n);
/* "plain", "gzip" or "zstd". */
const char *data_comp_name(data_comp_t c);

/* The decompressed bytes of one file (data_src.c): plain, gzip or zstd by
 * the magic bytes, concatenated members or frames as one stream. */
typedef struct data_src data_src_t;
/* Opens path (data_open's checks) and reads its first bytes to pick the
 * decoder. Returns 0 or KILN_E* naming the file. */
int data_src_open(const char *path, data_src_t **out /* OUT */);
/* Reads up to cap decompressed bytes into buf: returns how many (> 0), 0 at
 * the end of the file, KILN_EIO (reading), or KILN_ECORRUPT (corrupt or
 * truncated compressed data, naming the file and the byte). */
int64_t data_src_read(data_src_t *s, char *buf, size_t cap);
/* Bytes read from the file itself so far (compressed bytes for gzip/zstd). */
int64_t data_src_file_bytes(const data_src_t *s);
data_comp_t data_src_comp(const data_src_t *s);
void data_src_close(data_src_t *s); /* accepts NULL */

/* The growing parts of a batch while rows are appended (producer-owned). */
typedef struct data_batch_builder {
    int cap_rows, ndense, nslots;
    int n;
    int64_t *slot_len;  /* [nslots] keys so far per slot */
    int64_t *slot_cap;  /* [nslots] */
    int64_t **slot_keys; /* [nslots][slot_cap[s]] */
    uint32_t *counts;   /* [nslots * cap_rows] keys of (slot, row) */
    bool team;          /* add_rows and finish spread over the caller's OpenMP threads */
} data_batch_builder_t;

/* Rows parsed one key per slot (TSV's layout): what data_builder_add_rows
 * takes. Slot s of row i is at s * stride + i in keys and has (stride >=
 * n): a slot's keys are one run. skip[i] != 0 leaves row i out. */
typedef struct data_rows {
    int n;
    size_t stride;
    const float *labels;        /* [n] */
    const float *dense;         /* [n * ndense] */
    const int64_t *keys;        /* [nslots * stride] */
    const unsigned char *has;   /* [nslots * stride] 0: the slot is empty */
    const unsigned char *skip;  /* [n] */
} data_rows_t;

int data_builder_init(data_batch_builder_t *bb, int cap_rows, int ndense, int nslots);
void data_builder_fini(data_batch_builder_t *bb);
/* Forgets the rows (keeps the memory). */
void data_builder_reset(data_batch_builder_t *bb);
/* Room for more keys in slot s; returns 0 or KILN_ENOMEM. */
int data_builder_reserve(data_batch_builder_t *bb, int s, int64_t more);
/* Moves the builder's rows into b's CSR arrays (growing b as needed); b's
 * labels/dense rows [0, bb->n) must already be written by the caller. */
int data_builder_finish(data_batch_builder_t *bb, data_batch_t *b);

/* Appends one parsed row (label, dense[ndense], keys[nslots] where
 * has_key[s]) at row bb->n of the builder and of b. Returns 0 or KILN_ENOMEM. */
int data_builder_add_row(data_batch_builder_t *bb, data_batch_t *b, float label, const float *dense,
                       const int64_t *keys, const unsigned char *has_key);
/* Appends the rows of `rows` not skipped, as data_builder_add_row would one
 * by one, a slot at a time (on the team when bb->team). Returns 0 or
 * KILN_ENOMEM. */
int data_builder_add_rows(data_batch_builder_t *bb, data_batch_t *b, const data_rows_t *rows);

/* Allocates b's arrays for up to cap_rows rows; data_batch_fini frees them. */
int data_batch_init(data_batch_t *b, int cap_rows, int ndense, int nslots);
void data_batch_fini(data_batch_t *b);

/* A cursor over TSV files as one sequence of lines. */
typedef struct data_tsv_cursor data_tsv_cursor_t;
int data_tsv_cursor_create(const char *const *paths, int npaths, data_tsv_cursor_t **out /* OUT */);
/* Next line: returns 1 and sets *line and *len (valid until the next call; NULL
 * with *too_long = 1 for a line over DATA_TSV_MAX_LINE), 0 at the end of the
 * last file, or KILN_EIO / KILN_ENOENT. *file and *lineno (1-based) say where. */
int data_tsv_cursor_next(data_tsv_cursor_t *c, const char **line /* OUT */, size_t *len /* OUT */,
                       int *too_long /* OUT */, int *file /* OUT */, int64_t *lineno /* OUT */);
/* The unread bytes of the open file, for a reader that splits whole lines
 * itself (data_reader.c's batches, on several threads): opens the next file
 * or reads more when none are left. Returns 1 with *p / *avail (valid until
 * the next call on the cursor; *avail is 0 while the cursor is inside a
 * line it drops for length: take that one with data_tsv_cursor_next) and
 * *file / *lineno (the 1-based line number of the line at *p), or 0 when
 * the last file is done, or an error. */
int data_tsv_cursor_peek(data_tsv_cursor_t *c, const char **p /* OUT */, size_t *avail /* OUT */,
                         int *file /* OUT */, int64_t *lineno /* OUT */);
/* Consumes the first `bytes` of what peek showed: `lines` whole lines,
 * each ended by its '\n'. */
void data_tsv_cursor_consume(data_tsv_cursor_t *c, size_t bytes, int64_t lines);
/* Skips n lines quickly. Returns 0, or KILN_EIO / KILN_ECORRUPT when the
 * files end early. */
int data_tsv_cursor_skip(data_tsv_cursor_t *c, int64_t n);
int64_t data_tsv_cursor_bytes(const data_tsv_cursor_t *c);
void data_tsv_cursor_destroy(data_tsv_cursor_t *c);
/* Counts the rows (lines; a last line without newline counts) of one file;
 * *bytes = the bytes read from it. A regular file counted before in this
 * process and unchanged since (device, inode, size, modification and
 * change times) is not read again: *bytes = 0. */
int data_tsv_count_rows(const char *path, int64_t *rows /* OUT */, int64_t *bytes /* OUT */);

/* A dense integer as TSV makes it a feature: log(1 + max(x, 0)). */
float data_dense_int(int64_t x);

/* Records a malformed line in stats (message kept for the first few). */
void data_stats_malformed(data_reader_stats_t *st, const char *path, int64_t lineno,
                        const char *why);

/* An opened kiln-bin file: header and chunk index, read and checked. */
typedef struct data_bin_file data_bin_file_t;
int data_bin_open(const char *path, data_bin_file_t **out /* OUT */);
void data_bin_close(data_bin_file_t *f);
/* What its header says: rows, dense features and slots of each row. */
typedef struct {
    int64_t rows;
    int ndense, nslots;
} data_bin_info_t;
data_bin_info_t data_bin_info(const data_bin_file_t *f);
/* Appends rows [lo, hi) of the file to the builder and to labels/dense at
 * builder row bb->n onwards (b's arrays sized for the batch). Loads and
 * checksums each chunk touched (the last chunk stays cached). Returns 0,
 * KILN_EIO, KILN_ECHECKSUM or KILN_ECORRUPT naming file and chunk. */
int data_bin_read_rows(data_bin_file_t *f, int64_t lo, int64_t hi, data_batch_builder_t *bb,
                     data_batch_t *b, int64_t *bytes /* OUT: added to */);

/* data_tsv_parse_line with slot s's key and flag at keys[s * ks] and
 * has_key[s * ks]: the reader parses a batch's rows into slot-major arrays. */
int data_tsv_parse_row(const char *p, size_t len, int ndense, int nslots, float *label,
                       float *dense, int64_t *keys, unsigned char *has_key, size_t ks, char *why,
                       size_t whysz);

/* Newlines in p[0..n) (data_tsv.c). */
int64_t data_tsv_count_nl(const char *p, size_t n);
/* The offsets base + i of the first newlines p[i] of p[0..n), at most max,
 * into out[]; returns how many. */
int data_tsv_find_nl(const char *p, size_t n, size_t base, size_t *out /* OUT */, int max);
/* Passes over up to k newlines of p[0..n): returns how many (k when p holds
 * k), *after = the offset just past the last one passed (0 for none). */
int64_t data_tsv_skip_nl(const char *p, size_t n, int64_t k, size_t *after /* OUT */);

/* Which of data_tsv_parse_line's paths may run (data_tsv.c): 0 its byte
 * loop alone (which otherwise takes only the lines the others leave), 1
 * also the portable vector path, 2 (the default) also AVX-512 where the
 * CPU has it. For tests and the fuzzer, which compare them; set it while
 * no file is being read. */
void data_tsv_paths(int level);

/* With off set, the Parquet decoder (data_parquet.c) takes its scalar
 * loops where it would use the CPU's vector instructions (AVX-512's
 * expand): for tests, so that a host with them checks the loops a host
 * without them runs. Set it while no file is being read. */
void data_pq_no_simd(bool off);

#ifdef __cplusplus
}
#endif

#endif /* KILN_DATA_DATA_INT_H */
