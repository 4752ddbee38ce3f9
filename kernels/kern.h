/*
 * kernels/kern.h - the compute kernels of Kiln's sharded-embedding trainer:
 * the dynamic embedding table one rank holds for one table (int64 keys ->
 * rows of a dense slab, seeded initializer, eviction, change tracking) and
 * the fused ops of a training step over all tables at once (gather+combine
 * per bag, backward reduce to unique rows, sparse optimizer update).
 *
 * Every op has one C signature per backend: kern_cpu_* (C11 + OpenMP, the
 * readable reference) and, when built with CUDA (KILN_HAVE_CUDA=1, library
 * kiln_kernels_cuda), kern_cuda_* with the same argument shapes whose array
 * pointers are device pointers. The ops do not know the table type: they
 * read and write slabs (kern_slab_t), which kern_table_slab() describes for
 * a host table and which a device mirror describes for the GPU.
 *
 * Row ids are int32 (a table holds at most KERN_MAX_CAPACITY rows per rank);
 * bag offsets and counts are int64. See docs/kernels.md for the layout.
 * This header is C11 and safe to include from a .cu file.
 */
#ifndef KILN_KERNELS_KERN_H
#define KILN_KERNELS_KERN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The optimizer, initializer, eviction and combiner kinds have this one home:
 * the job spec's fields hold them (jobs.h) and the dense optimizer's type is a
 * kern_opt_kind_t too (model.h). Their values are never written to a file or
 * the wire (checkpoints and result.json spell them, e.g. "adagrad"). */
typedef enum { KERN_INIT_ZEROS = 0, KERN_INIT_UNIFORM = 1, KERN_INIT_NORMAL = 2 } kern_init_t;
typedef enum { KERN_EVICT_NONE = 0, KERN_EVICT_LRU = 1, KERN_EVICT_LFU = 2 } kern_evict_t;
/* How a disk tier reads pages (writes are pwrite whatever it reads with):
 * AUTO reads with io_uring when Kiln is built with liburing and the kernel
 * gives the process a ring, else with pread. MMAP reads through a
 * read-only mapping of the file: the fastest while the page cache holds the
 * file, but the mapped pages count in the process's RSS (docs/models.md).
 * PREAD, URING and MMAP ask for one. */
typedef enum {
    KERN_TIER_IO_AUTO = 0,
    KERN_TIER_IO_PREAD = 1,
    KERN_TIER_IO_URING = 2,
    KERN_TIER_IO_MMAP = 3
} kern_tier_io_t;
typedef enum { KERN_OPT_SGD = 0, KERN_OPT_ADAGRAD = 1, KERN_OPT_ADAM = 2 } kern_opt_kind_t;
typedef enum { KERN_COMBINE_SUM = 0, KERN_COMBINE_MEAN = 1 } kern_combine_t;

#define KERN_MAX_CAPACITY ((int64_t)0x7ffffff0)
#define KERN_MAX_DIM 65536

/* ---- the dynamic embedding table -------------------------------------------- */

typedef struct {
    const char *name;       /* for messages, e.g. "slot3" (copied) */
    int dim;                /* floats per row, 1..KERN_MAX_DIM */
    int64_t capacity;       /* rows this rank can hold, 1..KERN_MAX_CAPACITY */
    kern_opt_kind_t opt;    /* decides the optimizer state kept per row */
    float opt_init;         /* adagrad: the accumulator a new row starts with
                               (train.sparse.initial_accumulator), finite, >= 0; sgd keeps
                               no state and adam's starts at 0 whatever this says */
    kern_init_t init;       /* initializer of a new key's row */
    float init_scale;       /* s of U(-s, s) or N(0, s) */
    uint64_t seed;          /* the table's seed: init depends on (seed, key) only */
    kern_evict_t evict;     /* what to do when full */
    float evict_fraction;   /* share of a segment's rows evicted per batch; 0 -> 0.01 */
    int64_t segment_rows;   /* most rows per index segment; 0 -> 2^24 - 1, the most a
                               3-byte slot addresses (tests set it low to get segments) */
    int64_t limit;          /* rows find_or_insert keeps, 1..capacity; 0 -> capacity. The
                               rows above it are room for kern_table_insert_rows only (a
                               checkpoint whose keys hash unevenly over a new rank count);
                               find_or_insert evicts (or refuses) down to the limit. */
    const char *capacity_note; /* for the "is full" message: what the limit is (copied),
                                  e.g. "50 rows on this rank, its share of capacity 100
                                  over 2 ranks"; NULL -> "capacity <limit> rows" */
    /* The disk tier (docs/models.md, "Tables larger than memory"): when
     * 0 < ram_rows < limit, at most ram_rows rows live in RAM and the rest
     * in a file at spill_path (created now, removed by destroy). capacity,
     * limit and evict keep meaning the whole table; which rows stay in RAM
     * is lru among them, and a row moves between the tiers whole. */
    int64_t ram_rows;
    const char *spill_path;
    kern_tier_io_t spill_io; /* model.embedding.spill_io; the bench compares them */
    /* kern_table_prefetch: false (the trainer) only while the tier's reads
     * are slow, true always (tests and the bench). */
    bool spill_prefetch_always;
    /* Admission: with admit_min > 1 a key not in the table gets a row only
     * once a count-min sketch (4 x admit_width 16-bit counters; 0 -> 65536)
     * has seen it admit_min times; until then find_or_insert gives it row
     * -1 (reads as zeros, takes no update). Every admit_decay steps (0:
     * never) every counter halves. */
    int64_t admit_min;
    int64_t admit_width;
    int64_t admit_decay;
} kern_table_config_t;

typedef struct kern_table kern_table_t;

/* What a fused op needs of one table: its dense arrays, row r at r*dim.
 * Pointers are host memory for kern_cpu_* and device memory for kern_cuda_*.
 * Fields the op does not use may be NULL (gather needs only values). */
typedef struct {
    float *values;        /* (capacity, dim) */
    float *opt_state;     /* (capacity, nstate*dim): adagrad acc | adam m then v; NULL for sgd */
    int64_t *stamps;      /* (capacity) step of the row's last change, -1 for a free row */
    uint32_t *opt_steps;  /* (capacity) updates this row has had; adam only, else NULL */
    int64_t capacity;
    int dim;
    int nstate;           /* 0 sgd, 1 adagrad, 2 adam */
} kern_slab_t;

/* A removed key: evicted or deleted at `step`, last changed at `stamp`. */
typedef struct {
    int64_t key;
    int64_t stamp;
    int64_t step;
} kern_evicted_t;

typedef struct {
    int64_t size;             /* live rows */
    int64_t capacity;
    int64_t limit;            /* rows find_or_insert keeps (kern_table_config_t.limit) */
    int64_t nslots;           /* hash index slots, all segments */
    int nsegments;            /* index segments (1 below 2^24 rows) */
    int64_t evictions;        /* rows evicted since creation */
    int64_t eviction_batches; /* eviction rounds run since creation */
    int64_t changed_pending;  /* rows on the change list */
    int64_t last_visited;     /* rows the last changed_since looked at */
    /* The disk tier (zeros without one) and admission. */
    int64_t ram_size;         /* live rows in RAM (size counts both tiers) */
    int64_t disk_size;        /* live rows on disk */
    int64_t ram_hits;         /* keys found in RAM by find_or_insert and fetch */
    int64_t disk_hits;        /* keys brought in from disk */
    int64_t demoted;          /* rows moved from RAM to disk */
    int64_t disk_reads, disk_writes;           /* transfers */
    int64_t disk_read_bytes, disk_written_bytes;
    int64_t disk_submits;     /* io_uring_enter, pread/pwrite or fadvise calls */
    int64_t prefetched;       /* pages kern_table_prefetch asked the kernel for */
    int64_t page_bytes;
    kern_tier_io_t disk_io;   /* what the tier reads with: MMAP, URING or PREAD */
    int64_t admit_rejected;   /* lookups of keys not admitted yet */
    int64_t expired;          /* rows removed by kern_table_expire */
} kern_table_stats_t;

/* Creates an empty table; the slab for `capacity` rows is allocated now.
 * Returns 0, KILN_EINVAL (bad config, message names the field) or
 * KILN_ENOMEM. Free with kern_table_destroy. */
int kern_table_create(const kern_table_config_t *cfg, kern_table_t **out /* OUT */);
/* Frees the table (NULL is fine). */
void kern_table_destroy(kern_table_t *t);

/* Maps each of keys[n] to its row, inserting missing keys with their seeded
 * initial row (zero optimizer state, stamp = step, put on the change list)
 * and counting a use of every key at `step` (for lru/lfu). Duplicates in
 * keys get the same row. When the new keys do not fit under the limit (in
 * the index segment they hash to, for tables of 2^24 rows or more), lru/lfu
 * evict a batch there first (see docs/kernels.md; rows used at `step` are
 * never evicted) and `none` refuses: nothing is inserted and KILN_EFULL says
 * which table. A table that holds more than its limit (after a load) evicts
 * down to it on its next insert.
 * Returns 0, KILN_EFULL or KILN_ENOMEM. rows is (n). */
int kern_table_find_or_insert(kern_table_t *t, int64_t n, const int64_t *keys, int64_t step,
                              int32_t *rows /* OUT (n) */);
/* Looks keys up without inserting or counting a use; a missing key gets -1.
 * Returns the number of keys found. With a disk tier, rows[] names RAM rows
 * only (a key on disk gets -1) while the count covers both tiers; use
 * kern_table_fetch to read rows. */
int64_t kern_table_find(const kern_table_t *t, int64_t n, const int64_t *keys,
                        int32_t *rows /* OUT (n) */);
/* kern_table_find for reading: keys on disk are brought into RAM first (as
 * find_or_insert would, counting no use), so every key the table holds gets
 * a row; missing keys get -1. Without a disk tier it is kern_table_find.
 * Returns 0, KILN_EFULL (RAM too small for the keys), KILN_EIO or
 * KILN_ENOSPC. */
int kern_table_fetch(kern_table_t *t, int64_t n, const int64_t *keys, int64_t step,
                     int32_t *rows /* OUT (n) */);
/* The rows fetches at step found or brought in stop counting as used at
 * step (call once their values are read), so that the next fetch at the
 * same step (the next eval batch) may move them out again. */
void kern_table_unpin(kern_table_t *t, int64_t step);
/* Warms the rows of keys[n] that a coming find_or_insert or fetch will
 * bring in from disk: asks the kernel to read their pages into its cache
 * and returns without waiting (call it with the next batch's keys while
 * this one trains). Changes nothing in the table; keys in RAM or in no
 * tier cost a probe. It does nothing without a disk tier, and while the
 * tier's reads come from the page cache (they average under 20 us: the
 * fadvise would find every page there and only cost CPU). Returns 0 or
 * KILN_ENOMEM. */
int kern_table_prefetch(kern_table_t *t, int64_t n, const int64_t *keys);
/* Whether kern_table_prefetch would act now (a disk tier whose reads are
 * slow): a caller may skip gathering the keys otherwise. */
bool kern_table_prefetching(const kern_table_t *t);
/* Removes every row whose stamp (step of its last change) is below before,
 * from both tiers, logging each as removed at step. */
int kern_table_expire(kern_table_t *t, int64_t before, int64_t step, int64_t *nexpired /* OUT */);
/* True when the table keeps rows on disk. */
bool kern_table_tiered(const kern_table_t *t);
/* The rows on disk with stamp > since (since < 0: all), handed to fn in
 * chunks of n rows as parallel arrays (opt NULL for sgd, opt_steps NULL
 * unless adam). kern_table_changed_since and kern_table_scan cover the RAM
 * rows; this covers the rest. disk_count counts them first. */
typedef int (*kern_rows_fn)(void *ctx, int64_t n, const int64_t *keys, const float *values,
                            const float *opt, const uint32_t *opt_steps);
int kern_table_disk_count(kern_table_t *t, int64_t since, int64_t *n /* OUT */);
int kern_table_disk_each(kern_table_t *t, int64_t since, kern_rows_fn fn, void *ctx);
/* The admission sketch: 4 x width counters and the decay epoch they are at
 * (n = 0 without admission). load replaces them (add: adds, saturating: the
 * sum of several ranks' sketches after a resume on another rank count), as
 * they stood at step. Returns 0 or KILN_EINVAL (another shape). */
const uint16_t *kern_table_admit_sketch(const kern_table_t *t, int64_t *n /* OUT */,
                                        int64_t *epoch /* OUT */);
int kern_table_admit_load(kern_table_t *t, const uint16_t *counters, int64_t n, int64_t step,
                          bool add);
/* Removes keys (missing ones are ignored), logging each as removed at step.
 * Returns 0 or KILN_ENOMEM (the log could not grow). */
int kern_table_delete(kern_table_t *t, int64_t n, const int64_t *keys, int64_t step,
                      int64_t *ndeleted /* OUT, may be NULL */);
/* Bulk load: sets each key's row to values (n, dim) and optimizer state
 * opt_state (n, nstate*dim; NULL -> zeros) and opt_steps (n; NULL -> 0),
 * inserting keys as needed (never evicts; up to the capacity, past the
 * limit), stamping rows with step. Returns 0 or KILN_EFULL (nothing
 * changed). */
int kern_table_insert_rows(kern_table_t *t, int64_t n, const int64_t *keys,
                           const float *values, const float *opt_state,
                           const uint32_t *opt_steps, int64_t step);

/* Puts rows (n) on the change list; call it with the unique rows of an
 * optimizer update (kern_*_sparse_update stamps them, this remembers them).
 * O(n). Rows out of range are ignored. */
void kern_table_mark_changed(kern_table_t *t, int64_t n, const int32_t *rows);
/* Writes the live rows whose stamp is > since into rows (cap entries;
 * cap >= kern_table_size() always suffices), in no particular order. When
 * since >= the stamp of the last kern_table_set_base, the cost is
 * proportional to the change list, not the table; an older `since` falls
 * back to a scan of the whole slab. Returns 0 or KILN_ERANGE (cap too small). */
int kern_table_changed_since(kern_table_t *t, int64_t since, int32_t *rows /* OUT (cap) */,
                             int64_t cap, int64_t *n /* OUT */);
/* Records that a dump holds every row with stamp <= base: drops those rows
 * from the change list (O(change list)). */
void kern_table_set_base(kern_table_t *t, int64_t base);
/* Writes every live row id into rows (cap entries), ascending. Returns 0 or
 * KILN_ERANGE (cap too small). */
int kern_table_scan(const kern_table_t *t, int32_t *rows /* OUT (cap) */, int64_t cap,
                    int64_t *n /* OUT */);

/* The keys removed since the last kern_table_evicted_clear, oldest first;
 * the array belongs to the table and is valid until the next change. */
const kern_evicted_t *kern_table_evicted(const kern_table_t *t, int64_t *n /* OUT */);
void kern_table_evicted_clear(kern_table_t *t);

/* Describes the table's arrays for the fused ops (borrowed, host memory). */
void kern_table_slab(kern_table_t *t, kern_slab_t *slab /* OUT */);
/* keys[r] is the key of live row r (capacity entries; free rows hold junk). */
const int64_t *kern_table_keys(const kern_table_t *t);
int64_t kern_table_size(const kern_table_t *t);
int64_t kern_table_capacity(const kern_table_t *t);
int kern_table_dim(const kern_table_t *t);
const char *kern_table_name(const kern_table_t *t);
void kern_table_stats(const kern_table_t *t, kern_table_stats_t *st /* OUT */);
/* Bytes the table holds now (slab, index, bookkeeping, eviction log). */
size_t kern_table_bytes(const kern_table_t *t);
/* Bytes of one raw row: key 8 + dim*4 values + optimizer state + stamp 8.
 * kern_table_bytes() stays under 1.3 x capacity x this for dim >= 4 with
 * any optimizer and policy, and for dim 1 with adagrad or adam under lru or
 * none (docs/kernels.md has the table). */
size_t kern_table_row_bytes(const kern_table_t *t);
/* Bytes one RAM row of a table with a disk tier costs: values and optimizer
 * state (and adam's step count), key, stamp, lru word and its share of the
 * RAM index (a 3-byte slot at load 0.5: 6). model.embedding.memory in bytes
 * is divided by this. */
int64_t kern_table_tier_ram_row_bytes(int dim, kern_opt_kind_t opt);

/* ---- fused ops over all tables of a step ---------------------------------------- */

/* One table's part of a batch: nbags bags (the same nbags for all tables) in
 * CSR form. Bag b of this table holds rows[offsets[b] .. offsets[b+1]).
 * Its combined vector lands at out[b*out_stride + out_col .. + dim). */
typedef struct {
    const float *values;    /* (capacity, dim): the table's slab */
    int64_t capacity;       /* rows in the slab; row ids are checked against it */
    int dim;
    kern_combine_t combine; /* sum, or mean over the bag's rows */
    const int64_t *offsets; /* (nbags+1), offsets[0] = 0, non-decreasing */
    const int32_t *rows;    /* (offsets[nbags]) row ids, repeats allowed */
    int64_t out_col;        /* first column of this table in out */
} kern_bags_t;

/* Per-table gradients of unique rows: the output of the backward reduce and
 * the input of the sparse update. Caller allocates rows and grads with room
 * for the table's offsets[nbags] entries (an upper bound on unique rows). */
typedef struct {
    int32_t *rows;  /* (n) unique row ids, ascending */
    float *grads;   /* (n, dim) */
    int64_t n;
} kern_row_grads_t;

typedef struct {
    kern_opt_kind_t kind;
    float lr;
    float eps;    /* adagrad, adam */
    float beta1;  /* adam */
    float beta2;  /* adam */
} kern_opt_t;

/* Forward: for each bag b and table t, out[b, col_t .. col_t+dim_t) =
 * combine over the bag's rows of values[row] (empty bag -> zeros).
 * out is (nbags, out_stride); columns no table writes are left alone.
 * Returns 0 or KILN_EINVAL (bad shapes or a row id out of range). */
int kern_cpu_gather_combine(int ntables, const kern_bags_t *bags, int64_t nbags,
                            int64_t out_stride, float *out /* OUT (nbags, out_stride) */);

/* Backward: grad_out is (nbags, out_stride), laid out like the forward out.
 * For each table, every row that occurs in its bags gets the sum over its
 * occurrences of grad_out[bag, col..col+dim) * scale(bag) (1 for sum,
 * 1/len for mean); rows come out unique and ascending. The sum runs in bag
 * order, so the result does not depend on the thread count. grads[t] must
 * have room for offsets[nbags] rows. Returns 0, KILN_EINVAL or KILN_ENOMEM. */
int kern_cpu_backward_reduce(int ntables, const kern_bags_t *bags, int64_t nbags,
                             int64_t out_stride, const float *grad_out,
                             kern_row_grads_t *grads /* OUT (ntables) */);

/* Applies one optimizer step to each table's unique rows: slabs[t] rows
 * grads[t].rows get grads[t].grads, and their stamps become step. Adam
 * corrects the bias with the row's own update count (opt_steps, incremented
 * here), so a row first seen late starts with a full-size step. Rows must be
 * unique within a table. Returns 0 or KILN_EINVAL. */
int kern_cpu_sparse_update(const kern_opt_t *opt, int ntables, const kern_slab_t *slabs,
                           const kern_row_grads_t *grads, int64_t step);

/* kern_cpu_sparse_update of one table (t names it in errors) on the calling
 * thread alone, for callers that run tables side by side. */
int kern_cpu_sparse_update_table(const kern_opt_t *opt, int t, const kern_slab_t *slab,
                                 const kern_row_grads_t *grads, int64_t step);

#ifdef __cplusplus
}
#endif

#endif /* KILN_KERNELS_KERN_H */
