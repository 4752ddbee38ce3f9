/*
 * runtime/rt_store.h - where this rank's shard of every embedding table
 * lives, as the owner side of the exchange (rt_shard.h) sees it.
 *
 * Three kinds:
 *   RT_STORE_HOST  the rows live in the host tables given to create
 *                  (kern_table_t, the CPU backend). Sync and upload do
 *                  nothing.
 *   RT_STORE_CUDA  the rows live in GPU hash tables (kern_cuda_table_t) on
 *                  the current device; lookups, inserts, evictions and the
 *                  fused sparse update run as CUDA kernels. The host tables
 *                  are a mirror for checkpoints: rt_store_sync copies what
 *                  changed on the GPU since the last sync into them (evicted
 *                  keys deleted, changed rows written with values, optimizer
 *                  state and adam counts), in O(changed rows) transfers, and
 *                  rt_store_upload copies them to the GPU after a load.
 *   RT_STORE_TWIN  RT_STORE_CUDA's protocol with the working copy in a
 *                  second set of host tables: the CPU stand-in for the GPU
 *                  that lets the CPU tests run the mirror logic (sync,
 *                  upload, the ordering of deletions and rows) that the CUDA
 *                  store shares. Training results equal RT_STORE_HOST's.
 *
 * Calls are collective over nothing: each rank's store is its own. Errors
 * are KILN_E* codes with a message (KILN_EFULL names the table and rank
 * state, KILN_ECUDA the CUDA call and what to check).
 */
#ifndef KILN_RUNTIME_RT_STORE_H
#define KILN_RUNTIME_RT_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "kern.h"

typedef enum { RT_STORE_HOST = 0, RT_STORE_TWIN = 1, RT_STORE_CUDA = 2 } rt_store_kind_t;

typedef struct rt_store rt_store_t;

/* mirror: the host tables (borrowed, they outlive the store). TWIN and
 * CUDA make their working tables from cfgs (CUDA on GPU `device`, which it
 * makes current); the mirror needs room for every row they can hold (a GPU
 * table's capacity is rounded up to whole buckets; docs/gpu.md). Returns 0,
 * KILN_EINVAL (RT_STORE_CUDA in a build without CUDA), KILN_ENOMEM or
 * KILN_ECUDA. */
int rt_store_create(rt_store_kind_t kind, int ntables, kern_table_t *const *mirror,
                    const kern_table_config_t *cfgs, int device, rt_store_t **out /* OUT */);
void rt_store_destroy(rt_store_t *s);
const char *rt_store_kind_name(rt_store_kind_t kind);

/* Whether different tables may be used from several threads at once. */
bool rt_store_parallel(const rt_store_t *s);
/* Row ids of table t are below this. */
int64_t rt_store_rows_bound(const rt_store_t *s, int t);
/* Live keys of table t. */
int64_t rt_store_size(const rt_store_t *s, int t);

/* kern_table_find_or_insert (insert) or kern_table_find (!insert) on table
 * t's working copy: keys (n) -> rows (n), host arrays. */
int rt_store_find(rt_store_t *s, int t, int64_t n, const int64_t *keys, int64_t step, bool insert,
                  int32_t *rows /* OUT (n) */);
/* out (n, dim) = the values of rows (n); row -1 reads as zeros. */
int rt_store_read(rt_store_t *s, int t, int64_t n, const int32_t *rows, float *out /* OUT */);
/* The fused sparse update of every table: ug[t] holds unique rows and their
 * float32 gradients (host arrays); the rows are stamped with step and put
 * on the change list. */
int rt_store_update(rt_store_t *s, const kern_opt_t *opt, const kern_row_grads_t *ug,
                    int64_t step);

/* Brings the mirror up to date with the working copy at step: first the
 * keys evicted since the last sync are deleted from it (and so land in its
 * removal log), then the rows changed since then are written. Call before
 * reading the mirror (a checkpoint). */
int rt_store_sync(rt_store_t *s, int64_t step);
/* Copies every row of the mirror into the working copy (after a load into
 * the mirror, into an empty working copy). */
int rt_store_upload(rt_store_t *s, int64_t step);

#endif /* KILN_RUNTIME_RT_STORE_H */
