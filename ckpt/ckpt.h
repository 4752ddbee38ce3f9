/*
 * ckpt/ckpt.h - checkpoints: full and incremental dumps of the sharded
 * embedding tables plus the dense model state, their manifest, integrity
 * checks, chain resolution, loading on any rank count, retention, and the
 * HugeCTR / npy exports. The on-disk layout is docs/checkpoint-format.md.
 *
 * A checkpoint is a directory <root>/<uid>. It is written as
 * <root>/.tmp-<uid> (every rank writes its shard files, rank 0 the dense
 * arrays), every file fsynced, and rank 0 writes manifest.json LAST, fsyncs
 * it and the directory, renames the directory into place and fsyncs root.
 * Nothing without a manifest is loaded, and a loader checks the size and
 * xxh64 of every file the manifest lists before it uses any of them.
 *
 * The per-rank functions (ckpt_write_*, ckpt_commit, the readers) need
 * no MPI; ckpt_dump (ckpt_mpi.c, library kiln_ckpt_mpi) runs the whole
 * collective dump over a communicator.
 */
#ifndef KILN_CKPT_CKPT_H
#define KILN_CKPT_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kern.h"
#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CKPT_FORMAT_VERSION 1
#define CKPT_MANIFEST "manifest.json"
#define CKPT_UID_MAX 64
#define CKPT_NAME_MAX 64
#define CKPT_MAX_TABLES 256

typedef enum { CKPT_FULL = 0, CKPT_INCREMENTAL = 1 } ckpt_kind_t;

/* "full" | "incremental". */
const char *ckpt_kind_name(ckpt_kind_t k);

/* A named float array of the dense state (a view; see model_state). */
typedef struct ckpt_array {
    const char *name; /* "dense.params", ... (a file name stem: [A-Za-z0-9_.-]) */
    float *data;
    size_t count;
} ckpt_array_t;

/* One table as a checkpoint sees it (summed over the ranks' shards). */
typedef struct ckpt_table_info {
    char name[CKPT_NAME_MAX];
    int dim;
    int nstate;      /* optimizer state arrays saved per row: 0 (none), 1, 2 */
    bool opt_steps;  /* adam's per-row update counts saved */
    int64_t rows;    /* rows in this checkpoint's files */
    int64_t evicted; /* incremental: keys removed since the parent */
} ckpt_table_info_t;

/* What a manifest says besides its file list. The caller of ckpt_commit /
 * ckpt_dump fills the "in" fields; the rest is computed. */
typedef struct ckpt_info {
    char uid[CKPT_UID_MAX];    /* computed by ckpt_dump, or set by the caller */
    char parent[CKPT_UID_MAX]; /* in: the previous checkpoint of the lineage, "" none */
    char base[CKPT_UID_MAX];   /* in (incremental): the full dump the chain starts at */
    ckpt_kind_t kind;          /* in */
    int chain;                    /* in: incrementals since base (0 for a full dump) */
    int world_size;               /* in: ranks that wrote it */
    int64_t step;                 /* in: the global step the state is at */
    int64_t since;                /* in (incremental): rows changed after this step */
    int64_t epoch, epoch_step;    /* in: data position: next batch is epoch_step of epoch */
    int64_t samples;              /* in: training rows seen so far */
    int64_t dense_step;           /* in: the dense optimizer's update count */
    char job[80];                 /* in */
    char model[16];               /* in: lr | fm | dlrm */
    char optimizer[16];           /* in: the sparse optimizer: sgd | adagrad | adam */
    char spec_hash[17];           /* in: xxh64 hex of the spec text */
    char inputs_hash[17];         /* in: xxh64 hex of the training file list */
    const char *inputs;           /* in: JSON array of the input files the state has learnt
                                     from whole, [{path, size, mtime}], borrowed; NULL: none
                                     (written as "inputs"; read it with ckpt_inputs) */
    bool include_optimizer;       /* in */
    int ntables;                  /* computed from the shards */
    ckpt_table_info_t tables[CKPT_MAX_TABLES];
    int64_t keys;       /* rows of all tables in this checkpoint's files */
    int64_t evicted;    /* evicted keys of all tables (incremental) */
    int64_t bytes;      /* every file, manifest included */
    char checksum[17];  /* xxh64 hex of manifest.json */
    int64_t created_at; /* Unix seconds */
} ckpt_info_t;

/* ---- writing (per rank, no MPI) -------------------------------------------------- */

/* The files one rank (or, after ckpt_part_merge, all ranks) wrote. */
typedef struct ckpt_part ckpt_part_t;

int ckpt_part_create(ckpt_part_t **out /* OUT */);
void ckpt_part_destroy(ckpt_part_t *p); /* accepts NULL */
/* Serialises p (malloc'd text, NULL on ENOMEM) and adds a serialised part to
 * p. Returns 0, KILN_ENOMEM or KILN_ECORRUPT (text not from _encode). */
char *ckpt_part_encode(const ckpt_part_t *p);
int ckpt_part_merge(ckpt_part_t *p, const char *text);

/* Writes this rank's shard of each table into dir as .npy files: keys int64
 * (n), values float32 (n, dim), and with include_opt the optimizer state
 * float32 (n, nstate*dim) and (adam) opt_steps uint32 (n). since < 0: a full
 * dump of every live row; since >= 0: an incremental dump of the rows whose
 * stamp is > since (kern_table_changed_since: cost proportional to those
 * rows) plus the keys removed since the last ckpt_mark_dumped (evicted
 * int64 (m)). Every file is fsynced. Returns 0, KILN_ENOSPC (the message
 * names the file and asks for free space), KILN_EIO or KILN_ENOMEM. */
int ckpt_write_tables(const char *dir, int rank, int ntables, kern_table_t *const *tables,
                         int64_t since, bool include_opt, ckpt_part_t *part);

/* Writes dense arrays (rank 0) as float32 .npy files named <name>.npy. */
int ckpt_write_dense(const char *dir, const ckpt_array_t *arrays, int narrays,
                        ckpt_part_t *part);

/* Rank 0, after every rank's files are on disk: writes tmp_dir/manifest.json
 * from info and all (the merged parts of every rank), fsyncs it and tmp_dir,
 * renames tmp_dir to <root>/<info->uid> and fsyncs root. Fills the computed
 * fields of info. Returns 0, KILN_ENOSPC, KILN_EIO or KILN_EEXIST. */
int ckpt_commit(const char *root, const char *tmp_dir, ckpt_info_t *info /* IN/OUT */,
                   const ckpt_part_t *all);

/* Removes a directory and everything in it (a failed dump's temp dir, a
 * retired checkpoint: manifest first, so a half-removed one is never
 * loadable). Returns 0 or KILN_EIO. */
int ckpt_remove(const char *dir);

/* After a successful dump at `step`: kern_table_set_base(step) and
 * kern_table_evicted_clear on every table, so the next incremental dump holds
 * only what changes after it. */
void ckpt_mark_dumped(int ntables, kern_table_t *const *tables, int64_t step);

/* A new uid "<13-digit unix ms>-<12-digit step>", sortable by time, never the
 * same twice in one process. buf holds CKPT_UID_MAX bytes. */
void ckpt_new_uid(int64_t step, char *buf /* OUT */);

/* ---- reading ----------------------------------------------------------------------- */

typedef struct ckpt ckpt_t;

/* Opens the checkpoint in dir: reads and checks manifest.json (format,
 * version, fields). Does not read the data files. Returns 0, KILN_ENOENT (no
 * such directory), KILN_ECORRUPT (no manifest, or a bad one; the message
 * names the file), KILN_EVERSION or KILN_ENOMEM. Close with ckpt_close. */
int ckpt_open(const char *dir, ckpt_t **out /* OUT */);
void ckpt_close(ckpt_t *c); /* accepts NULL */
const ckpt_info_t *ckpt_info(const ckpt_t *c);
const char *ckpt_path(const ckpt_t *c);
/* The "inputs" array of c's manifest as JSON text (malloc'd; "[]" when it
 * has none), or NULL when out of memory or the manifest cannot be read. */
char *ckpt_inputs(const ckpt_t *c);
/* Checks that every file the manifest lists exists with its size and xxh64.
 * Returns 0, KILN_ECORRUPT (missing or wrong size) or KILN_ECHECKSUM, with a
 * message naming the file. */
int ckpt_verify(const ckpt_t *c);

/* A checkpoint and the checkpoints it needs: items[0] is a full dump,
 * items[n-1] the one asked for, each incremental's parent before it. */
typedef struct ckpt_chain {
    ckpt_t **items;
    int n;
} ckpt_chain_t;

/* Opens dir and follows parent links (siblings in dir's parent directory)
 * back to a full dump; with verify, checks every file of every link.
 * Returns 0 or the codes of ckpt_open / ckpt_verify (a missing parent
 * is KILN_ECORRUPT naming it). Free with ckpt_chain_fini. */
int ckpt_chain_open(const char *dir, bool verify, ckpt_chain_t *out /* OUT */);
void ckpt_chain_fini(ckpt_chain_t *ch);

/* Loads a chain into this rank's tables: reads every shard file of every
 * link (any world size) and keeps the keys with shard_owner(key, nranks)
 * == rank: removals of an incremental first, then its rows
 * (kern_table_insert_rows, stamped with the last link's step). tables are
 * matched by name; a table the checkpoint lacks stays empty. Afterwards every
 * table's base is that step and its removal log is empty. Returns 0,
 * KILN_ECONFLICT (a dim differs), KILN_EFULL, KILN_ECORRUPT, KILN_EIO or
 * KILN_ENOMEM. */
int ckpt_load_tables(const ckpt_chain_t *ch, int rank, int nranks, int ntables,
                        kern_table_t *const *tables);

/* Reads the dense arrays of c (every checkpoint holds them in full) into
 * malloc'd arrays; free with ckpt_arrays_free. */
int ckpt_read_dense(const ckpt_t *c, ckpt_array_t **arrays /* OUT */,
                       int *narrays /* OUT */);
void ckpt_arrays_free(ckpt_array_t *arrays, int narrays);

/* One table of a resolved chain, sorted by key. values (n, dim), opt
 * (n, nstate*dim) or NULL, opt_steps (n) or NULL. */
typedef struct ckpt_rows {
    int64_t n;
    int dim, nstate;
    int64_t *keys;
    float *values;
    float *opt;
    uint32_t *opt_steps;
} ckpt_rows_t;

/* Resolves table `name` of the chain (all ranks' shards) into sorted rows.
 * Returns 0, KILN_ENOENT (no such table) or the load codes. */
int ckpt_read_table(const ckpt_chain_t *ch, const char *name, ckpt_rows_t *out /* OUT */);
void ckpt_rows_fini(ckpt_rows_t *r);

/* ---- scanning: a chain's shard files a slice at a time -------------------------------- */

typedef enum { CKPT_SLICE_DELETE = 0, CKPT_SLICE_ROWS = 1 } ckpt_slice_kind_t;

/* Up to max_rows rows of one shard file of table `table` (an index into the
 * names given to ckpt_scan_open): keys (n) to remove (DELETE), or keys (n)
 * with their values (n, dim) (ROWS). Owned by the scan, valid until the next
 * ckpt_scan_next. */
typedef struct ckpt_slice {
    ckpt_slice_kind_t kind;
    int table;
    int64_t n;
    const int64_t *keys;
    const float *values; /* NULL for DELETE */
} ckpt_slice_t;

typedef struct ckpt_scan ckpt_scan_t;

/* A scan of links [from, ch->n) of ch, tables names (ntables) of dims[t]
 * floats a row: for each link, each table in the order given, every rank's
 * evicted keys then every rank's rows. Applying the slices in order gives the
 * tables of the chain's last link (on top of link from - 1's, when from > 0).
 * The scan keeps what it needs: ch may be closed afterwards. Returns 0,
 * KILN_EINVAL, KILN_ECORRUPT (a manifest lists keys without values) or
 * KILN_ENOMEM. Close with ckpt_scan_close. */
int ckpt_scan_open(const ckpt_chain_t *ch, int from, int ntables, const char *const *names,
                      const int *dims, int64_t max_rows, ckpt_scan_t **out /* OUT */);
/* Returns 1 and the next slice, 0 at the end, or KILN_ECORRUPT / KILN_EIO
 * naming the file that does not read as its manifest says. */
int ckpt_scan_next(ckpt_scan_t *s, ckpt_slice_t *out /* OUT */);
void ckpt_scan_close(ckpt_scan_t *s); /* accepts NULL */

/* ---- a directory of checkpoints ------------------------------------------------------ */

/* The newest checkpoint (by uid) in root that has a readable manifest.
 * Returns 0, or KILN_ENOENT when there is none. uid holds CKPT_UID_MAX. */
int ckpt_latest(const char *root, char *uid /* OUT */);

/* Told of each checkpoint ckpt_latest_chain passes over: its directory
 * and why it cannot be used (the open or verify error). */
typedef void (*ckpt_skip_fn)(const char *dir, const char *why, void *ctx);

/* Opens the chain of the newest checkpoint in root that can be used:
 * candidates are the entries with a uid-shaped name or a manifest, newest
 * first; one whose manifest, chain or (verify) files are damaged (KILN_ECORRUPT,
 * KILN_ECHECKSUM, KILN_EVERSION) is passed to skip (may be NULL) and the next
 * older one tried. Returns 0 with the chain in *out (free with
 * ckpt_chain_fini), KILN_ENOENT when root holds no checkpoint at all,
 * KILN_ECORRUPT when it holds some and none can be used (the message names
 * the newest and why), or another code (KILN_EIO, ...) that is no reason to
 * fall back. */
int ckpt_latest_chain(const char *root, bool verify, ckpt_skip_fn skip, void *ctx,
                         ckpt_chain_t *out /* OUT */);

/* Pins dir for a running job: creates dir/.lock-<host>-<pid>; the malloc'd
 * path goes to *lock for ckpt_unlock. Returns 0 or KILN_EIO. */
int ckpt_lock(const char *dir, char **lock /* OUT */);
/* Removes the pin and frees lock (NULL is fine). */
void ckpt_unlock(char *lock);

/* Asks whether a checkpoint must stay (e.g. an endpoint holds it): returns
 * true to keep it. */
typedef bool (*ckpt_pin_fn)(const char *uid, void *ctx);

/* Keeps the newest `keep` checkpoints of root and deletes the others,
 * except any that is pinned (a live .lock-* file: a running job; or pin()
 * says so) and any that a kept one needs (every link of its chain). A
 * directory whose manifest cannot be read is never deleted (a warning names
 * it). A checkpoint is renamed to .rm-<uid> before its files go, so a
 * removal cut short is finished by the next pass. Also removes .tmp-*
 * directories older than a day (left by a killed dump).
 * *removed (may be NULL) gets the number deleted. Returns 0 or KILN_EIO. */
int ckpt_retain(const char *root, int keep, ckpt_pin_fn pin, void *ctx,
                   int *removed /* OUT, may be NULL */);

/* ---- exports --------------------------------------------------------------------------- */

typedef enum { CKPT_EXPORT_HUGECTR = 0, CKPT_EXPORT_NPY = 1 } ckpt_export_format_t;

/* Parses "hugectr" | "npy". Returns 0 or KILN_EINVAL. */
int ckpt_export_format_parse(const char *s, ckpt_export_format_t *out /* OUT */);

/* The dense parameter vector (dense.params) as the matrices it is made of,
 * in order: each (rows, cols) row-major as Kiln keeps it, a layer's weight
 * (out, in) then its bias (out, 1) (docs/models.md, "The flat parameter
 * layout"). The checkpoint does not record the layers; the job's spec does. */
typedef struct ckpt_export_matrix {
    int rows, cols;
} ckpt_export_matrix_t;
typedef struct ckpt_export_dense {
    const ckpt_export_matrix_t *m; /* (n) */
    int n;
    const char *file; /* the dense model file's name in out_dir */
} ckpt_export_dense_t;

/* Writes the resolved chain into out_dir (created). hugectr: one folder per
 * table holding raw little-endian int64 `key` and float32 `emb_vector`
 * (row n of each matching, sorted by key); for fm, whose rows are the
 * slot's linear weight then its k factors, the folder holds the factors
 * (k wide) and a folder <table>_linear the linear weights (1 wide); with
 * dense, the dense model file: every matrix of dense transposed to (cols,
 * rows) (HugeCTR's (in, out) weights), one after another, raw float32.
 * npy: <table>.keys.npy, <table>.values.npy (rows as Kiln keeps them) and
 * the dense arrays. *bytes gets the bytes written. Returns 0, KILN_EINVAL
 * (dense does not add up to the checkpoint's dense.params), KILN_ENOSPC,
 * KILN_EIO or the load codes. */
int ckpt_export(const ckpt_chain_t *ch, ckpt_export_format_t fmt, const char *out_dir,
                   const ckpt_export_dense_t *dense /* NULL: no dense model file */,
                   int64_t *bytes /* OUT, may be NULL */);

/* ---- the collective dump (ckpt_mpi.c, library kiln_ckpt_mpi) -------------------------- */
#ifdef MPI_VERSION
/* Every rank of comm calls it at the same step. Rank 0 picks the uid (into
 * info->uid on every rank) and creates <root>/.tmp-<uid>; every rank writes
 * its tables (ckpt_write_tables with since = info->kind == CKPT_FULL ?
 * -1 : info->since), rank 0 the dense arrays; after a barrier rank 0 gathers
 * the file lists and commits. On success every rank marks its tables dumped
 * at info->step; on failure the temp dir is removed and the tables are left
 * as they were. The environment variable KILN_TEST_DUMP_DELAY_MS makes every
 * rank sleep that long after writing its files (for kill -9 tests). Returns
 * the same code on every rank: 0, KILN_ENOSPC, KILN_EIO, KILN_EMPI, ... (the
 * failing rank's message; other ranks say which rank failed). */
int ckpt_dump(MPI_Comm comm, const char *root, int ntables, kern_table_t *const *tables,
                 const ckpt_array_t *dense, int ndense, ckpt_info_t *info /* IN/OUT */);
#endif

#ifdef __cplusplus
}
#endif

#endif /* KILN_CKPT_CKPT_H */
