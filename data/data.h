/*
 * data/data.h - the trainer's input side: Criteo-format TSV parsing,
 * the kiln-bin binary format (writer, converters, chunk reader), Parquet
 * (Kiln's own reader, data_parquet.c, with a column mapping), the batch
 * reader that partitions rows block-cyclically over MPI ranks and parses
 * ahead of training in its own thread, and the synthetic data generator.
 *
 * Every format yields the same batch layout (data_batch_t, CSR by slot), so
 * the trainer never knows where its rows came from. The rules (empty fields,
 * clamping, log1p, key hashing), the kiln-bin layout byte by byte and the
 * partitioning scheme are written out in docs/data-formats.md.
 *
 * kiln-train, the kiln CLI (convert, datagen) and kiln-serve (request rows)
 * include it.
 */
#ifndef KILN_DATA_DATA_H
#define KILN_DATA_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Criteo's shape: 13 integer features, 26 categorical ones. */
#define DATA_CRITEO_NDENSE 13
#define DATA_CRITEO_NSLOTS 26
/* Pass as ndense / nslots to data_reader_open to take them from a kiln-bin
 * header, or Criteo's 13 / 26 for TSV. */
#define DATA_DIMS_AUTO (-1)
/* A TSV line longer than this (bytes, without its newline) is malformed. */
#define DATA_TSV_MAX_LINE 65536
/* How many malformed-line messages are kept in full; the rest are counted. */
#define DATA_MAX_MESSAGES 5
#define DATA_MESSAGE_LEN 384
/* Rows per kiln-bin chunk unless the converter is told otherwise. */
#define DATA_BIN_CHUNK_ROWS 4096
/* Keys are masked to 63 bits so that they are non-negative int64. */
#define DATA_KEY_MASK INT64_C(0x7fffffffffffffff)

typedef enum {
    DATA_FMT_AUTO = 0, /* kiln-bin for "KILNBIN1", Parquet for "PAR1" at the start, else TSV */
    DATA_FMT_TSV = 1,
    DATA_FMT_BIN = 2,
    DATA_FMT_PARQUET = 3
} data_format_t;

/* Looks at the first 8 bytes of path: DATA_FMT_BIN for "KILNBIN1",
 * DATA_FMT_PARQUET for "PAR1", else DATA_FMT_TSV. Returns 0 or KILN_ENOENT /
 * KILN_EIO naming the file. */
int data_format_detect(const char *path, data_format_t *out /* OUT */);

/* ---- Parquet column mapping ---------------------------------------------------
 * Which Parquet columns (top-level fields, by name) are the label, the dense
 * features and the categorical slots (docs/data-formats.md, "Parquet"). */
typedef enum {
    DATA_DENSE_AUTO = 0,  /* log1p for integer columns (as TSV), none for float ones */
    DATA_DENSE_LOG1P = 1, /* log(1 + max(x, 0)) for every dense column */
    DATA_DENSE_NONE = 2   /* the values as they are (NVTabular's normalised floats) */
} data_dense_transform_t;

typedef struct data_columns {
    const char *label;              /* NULL: "label" */
    const char *const *dense;       /* [ndense]; NULL: "I1" .. "I<ndense>" */
    const char *const *categorical; /* [nslots]; NULL: "C1" .. "C<nslots>" */
    data_dense_transform_t dense_transform;
} data_columns_t;

/* Whether a Parquet file is complete: 1 when it ends with "PAR1" (a writer
 * adds it last), 0 when not (cut short or still being written). Returns
 * KILN_ENOENT / KILN_EIO naming the file when it cannot be read. */
int data_parquet_complete(const char *path);

/* ---- complete partitions (data_ready.c) -----------------------------------------
 * When a file an incremental or online job finds counts as landed whole
 * (docs/job-spec.md, data.ready). */
typedef struct data_ready {
    bool parquet;      /* complete when its footer is (data_parquet_complete) */
    bool marker;       /* complete once _SUCCESS is in its directory */
    int64_t settle_ms; /* otherwise: size and mtime unchanged for this long */
} data_ready_t;

/* Whether path is complete as how says: 1 yes, 0 not yet (look again
 * later), or KILN_ENOENT / KILN_EIO naming the file. */
int data_partition_ready(const char *path, const data_ready_t *how);

/* Whether path is a completion marker itself (_SUCCESS), never data. */
bool data_is_marker(const char *path);

/* ---- batches ---------------------------------------------------------------
 * One rank's rows of one global step, CSR by slot. Shapes:
 *   labels   float[n]                      0 or 1
 *   dense    float[n * ndense]             row-major, log(1 + max(x, 0))
 *   offsets  int64[nslots * (n + 1)]       slot s, row i has the keys
 *            keys[offsets[s*(n+1)+i] .. offsets[s*(n+1)+i+1])
 *            offsets[0] == 0, and each slot's run starts where the previous
 *            slot's ended (offsets[s*(n+1)] == offsets[(s-1)*(n+1)+n])
 *   keys     int64[nkeys]                  slot-major, all >= 0
 * An empty bag (empty TSV field) is a row with no keys in that slot; a
 * multi-hot bag (kiln-bin) has several. n may be 0: a rank whose part of a
 * step lies past the end of the data still gets a batch, so that all ranks
 * take the same number of steps (see data_reader_open). */
typedef struct data_batch {
    int n;          /* rows in this batch (good rows only) */
    int nslots;     /* categorical slots (tables) */
    int ndense;     /* dense features per row */
    float *labels;  /* [n] */
    float *dense;   /* [n * ndense] */
    int64_t *offsets; /* [nslots * (n + 1)] */
    int64_t *keys;  /* [nkeys] */
    int64_t nkeys;  /* == offsets[nslots * (n + 1) - 1] when nslots > 0 */
    int64_t step;   /* global step index, 0-based */
    int64_t first_row; /* global row index where this rank's part of the step starts */
    int nskipped;   /* malformed rows in this part (counted, not in the batch) */
    int cap_rows;   /* allocated rows (internal) */
    int64_t keys_cap; /* allocated keys (internal) */
} data_batch_t;

/* What a reader or converter met. Messages are "FILE:LINE: reason" for the
 * first DATA_MAX_MESSAGES malformed lines; later ones are only counted. The
 * library does not log them; the caller decides (kiln-train logs them). */
typedef struct data_reader_stats {
    int64_t rows;      /* good rows returned / written */
    int64_t malformed; /* lines skipped as malformed */
    int64_t bytes;     /* bytes read from the input files (both passes) */
    int nmessages;     /* <= DATA_MAX_MESSAGES */
    char messages[DATA_MAX_MESSAGES][DATA_MESSAGE_LEN];
} data_reader_stats_t;

/* The categorical key of a raw value in a slot: xxh64(value, seed = slot)
 * masked to 63 bits. Deterministic across runs, hosts and formats. */
int64_t data_key_hash(int slot, const char *value, size_t len);

/* ---- the reader -------------------------------------------------------------- */
typedef struct data_reader data_reader_t;

/* Opens paths[0..npaths) (read in that order, as one row sequence) and
 * starts the producer thread that reads and parses `prefetch` batches ahead.
 * With prefetch 0 there is no thread: data_reader_next makes each batch when
 * it is asked for, parsing a TSV batch's lines and decoding a Parquet row
 * group's columns on the caller's OpenMP threads. That is the faster choice
 * when the caller's threads already take every core: a producer thread
 * would then only take turns with them (docs/benchmarks.md). Rows are dealt block-cyclically: with N = nranks and
 * B = batch_size (rows per rank per step), global step k covers rows
 * [k*B*N, (k+1)*B*N) and rank r gets rows [k*B*N + r*B, k*B*N + (r+1)*B),
 * so 1 rank with batch 2B and 2 ranks with batch B see the same global
 * batches. Every rank returns ceil(total_rows / (B*N)) batches; at the end a
 * rank's batch may be short or empty (n == 0). A malformed TSV line keeps
 * its row position (every rank agrees on positions) but is left out of the
 * batch and counted in the stats.
 *
 * TSV needs the total row count up front: open counts newlines in all files
 * (a read of every byte with memchr, about as fast as the disk or page cache
 * gives it) before returning. kiln-bin reads it from the headers and seeks
 * straight to each rank's chunks.
 *
 * ndense / nslots may be DATA_DIMS_AUTO; for kiln-bin they must otherwise
 * match the file header. Returns 0, KILN_EINVAL (bad arguments), KILN_ENOENT
 * / KILN_EIO (a file that cannot be opened or read, named in the message),
 * KILN_ECORRUPT / KILN_ECHECKSUM / KILN_EVERSION (a bad kiln-bin header or
 * index) or KILN_ENOMEM. Close with data_reader_close. */
int data_reader_open(const char *const *paths, int npaths, data_format_t format, int rank,
                   int nranks, int batch_size, int ndense, int nslots, int prefetch,
                   data_reader_t **out /* OUT */);

/* data_reader_open with a Parquet column mapping (cols may be NULL: Criteo's
 * names; copied, so it need not outlive the call; ignored for TSV and
 * kiln-bin). Parquet, like kiln-bin, needs no pre-pass: the row counts come
 * from the footers. Rows are dealt as above; a rank decodes the row groups
 * that hold its rows, one at a time, on the producer thread. Besides
 * data_reader_open's codes: KILN_EBUSY for a Parquet file that does not end
 * with PAR1 (still being written), KILN_EINVAL for a mapped column missing
 * or of the wrong type or files whose schemas differ. */
int data_reader_open_cols(const char *const *paths, int npaths, data_format_t format,
                        const data_columns_t *cols, int rank, int nranks, int batch_size,
                        int ndense, int nslots, int prefetch, data_reader_t **out /* OUT */);

/* Hands out the next batch: returns 1 and sets *batch (borrowed: valid until
 * the next data_reader_next or data_reader_close on this reader), 0 after the
 * last batch, or a negative KILN_E* code when reading failed (the message
 * names the file, and for kiln-bin the chunk; e.g. KILN_ECHECKSUM). Batches
 * produced before a failure are all handed out first. One consumer thread. */
int data_reader_next(data_reader_t *r, data_batch_t **batch /* OUT */);

/* The total row count over all files (malformed TSV lines included) and the
 * number of batches every rank will return. */
int64_t data_reader_total_rows(const data_reader_t *r);
int64_t data_reader_nsteps(const data_reader_t *r);
/* A snapshot of the stats so far (safe while the producer runs). */
void data_reader_stats(data_reader_t *r, data_reader_stats_t *out /* OUT */);

/* Stops the producer (mid-file is fine), joins it and frees everything.
 * Accepts NULL. */
void data_reader_close(data_reader_t *r);

/* ---- kiln-bin ------------------------------------------------------------------ */
typedef struct data_bin_writer data_bin_writer_t;

/* Starts a kiln-bin file: writes go to "<path>.tmp.<pid>" and become `path`
 * only in data_bin_writer_commit. chunk_rows <= 0 means DATA_BIN_CHUNK_ROWS.
 * Returns 0, KILN_EINVAL, KILN_EIO (naming the file) or KILN_ENOMEM. */
int data_bin_writer_create(const char *path, int ndense, int nslots, int chunk_rows,
                         data_bin_writer_t **out /* OUT */);
/* Appends the rows of b (its ndense / nslots must match the writer's).
 * A bag of more than 65535 keys is KILN_ERANGE. Returns 0 or KILN_E*. */
int data_bin_writer_add(data_bin_writer_t *w, const data_batch_t *b);
/* Writes the last chunk, the chunk index and the header, fsyncs and renames
 * the temp file into place; frees w either way. Returns 0 or KILN_EIO. */
int data_bin_writer_commit(data_bin_writer_t *w);
/* Removes the temp file and frees w. Accepts NULL. */
void data_bin_writer_abort(data_bin_writer_t *w);

typedef struct data_convert_opts {
    int ndense;     /* dense fields per line; 0 means 13 */
    int nslots;     /* categorical fields per line; 0 means 26 */
    int chunk_rows; /* rows per chunk; 0 means DATA_BIN_CHUNK_ROWS */
} data_convert_opts_t;

/* Converts TSV files (in order) into one kiln-bin file at out_path, written
 * under a temp name and renamed when complete. Malformed lines are skipped
 * and reported in stats (so the kiln-bin row sequence holds the good rows
 * only). opts may be NULL (Criteo defaults); stats may be NULL. Returns 0 or
 * KILN_ENOENT / KILN_EIO naming the file, KILN_EINVAL, KILN_ENOMEM. */
int data_convert_tsv_to_bin(const char *const *inputs, int ninputs, const char *out_path,
                          const data_convert_opts_t *opts, data_reader_stats_t *stats /* OUT */);

/* Converts Parquet files (in order, one schema) into one kiln-bin file, read
 * with the column mapping cols (NULL: Criteo names) through the batch
 * reader; opts may be NULL. Rows whose label is null or not 0 / 1 are left
 * out and counted in stats as malformed. Returns 0 or data_reader_open_cols's
 * and the writer's codes. */
int data_convert_parquet_to_bin(const char *const *inputs, int ninputs, const data_columns_t *cols,
                              const char *out_path, const data_convert_opts_t *opts,
                              data_reader_stats_t *stats /* OUT */);

/* ---- synthetic data ----------------------------------------------------------- */
typedef struct data_datagen_opts {
    const char *path; /* output TSV, written under a temp name then renamed */
    int64_t rows;     /* lines to write (>= 0) */
    uint64_t seed;    /* the hidden model and the id strings */
    int day;          /* >= 0; moves popularity, adds new ids, drifts weights */
    /* Skew (`kiln datagen --zipf --vocab --empty`). Zero-initialised fields
     * keep the default mix described in docs/data-formats.md. */
    int zipf_set;     /* nonzero: every slot's ids follow a power law of exponent zipf */
    double zipf;      /* >= 0; 0 is uniform over the vocabulary */
    int64_t vocab;    /* > 0: every slot has this many stable ids (0: 10 .. 1e6 by slot) */
    int empty_set;    /* nonzero: every categorical field is empty with probability empty */
    double empty;     /* in [0, 1] */
    int part;         /* >= 0: another draw of rows from the same model and ids (0: default) */
    /* OUT, may be NULL: the Bayes-optimal logloss of the written rows, the
     * mean over rows of the binary entropy of their true click probability
     * (what a model that knows the hidden model scores, in expectation). */
    double *bayes_logloss;
    double *ctr; /* OUT, may be NULL: the share of written rows labelled 1 */
} data_datagen_opts_t;

/* Writes rows lines of Criteo-format TSV (label, 13 integers, 26 categorical
 * 8-hex-digit ids) drawn from a hidden logistic model: power-law ids per slot
 * with vocabularies from 10 to 1e6 (scaled down for small files) unless the
 * skew fields say otherwise, some empty fields, heavy-tailed integers, a base
 * CTR near 25%, and day-to-day drift. Deterministic given (seed, day, part,
 * rows and the skew fields). See docs/data-formats.md. Returns 0, KILN_EINVAL
 * (naming the bad field) or KILN_EIO naming the file. */
int data_datagen(const data_datagen_opts_t *o);

/* ---- one TSV line (also kiln-serve's predict rows) -------------------------------- */

/* Parses one TSV line [p, p+len) (no newline; a trailing '\r' is dropped)
 * into label, dense[ndense] and keys[nslots] with has_key[nslots]. Returns
 * 0, or -1 with a reason written into why. */
int data_tsv_parse_line(const char *p, size_t len, int ndense, int nslots, float *label,
                      float *dense, int64_t *keys, unsigned char *has_key, char *why,
                      size_t whysz);

#ifdef __cplusplus
}
#endif

#endif /* KILN_DATA_DATA_H */
