/*
 * kernels/kern_cuda.h - the CUDA backend of kernels/ (library
 * kiln_kernels_cuda, built when the top level found nvcc and NCCL; its users
 * get KILN_HAVE_CUDA=1 and include this header where they call kern_cuda_*;
 * it includes kern.h, never the reverse).
 *
 * Two parts. The fused step ops have the shapes of kern_cpu_*: the arrays
 * inside bags, slabs and grads and every d_ argument are device memory, the
 * descriptor arrays themselves are host memory. And a GPU hash table
 * (kern_cuda_table_t) that keeps keys, rows, optimizer state and stamps in
 * device memory, laid out as a kern_slab_t the fused ops read directly; a
 * key gets the same initial row as on the CPU table (kern_ops.h).
 *
 * stream is a cudaStream_t passed as void * (NULL: the default stream).
 * Calls are asynchronous unless their comment says they synchronize (those
 * that must return a count to the host). Functions return 0, KILN_EINVAL,
 * KILN_EFULL, KILN_ERANGE or KILN_ECUDA (the message names the CUDA error);
 * docs/gpu.md has the design. C11, safe to include from a .cu file.
 */
#ifndef KILN_KERNELS_KERN_CUDA_H
#define KILN_KERNELS_KERN_CUDA_H

#include "kern.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- fused step ops ------------------------------------------------------------ */

/* kern_cpu_gather_combine on the device. Row ids are not range-checked. */
int kern_cuda_gather_combine(int ntables, const kern_bags_t *bags, int64_t nbags,
                             int64_t out_stride, float *d_out, void *stream);

/* kern_cpu_backward_reduce on the device: grad_out (nbags, out_stride) ->
 * per table the unique rows (ascending) and their summed gradients in
 * grads[t].rows / grads[t].grads (device arrays with room for the table's
 * offsets[nbags] rows). A stable sort of (row, position) and a segmented
 * sum in position order, without fused multiply-adds: the CPU's bits, on
 * every run. Needs O(positions) scratch (cudaMallocAsync on stream) and at
 * most 2^31 - 1 positions per table. Synchronizes the stream twice (the
 * position counts, then the unique-row counts into grads[t].n). Returns 0,
 * KILN_EINVAL (bad shapes, or a row id outside its slab) or KILN_ECUDA. */
int kern_cuda_backward_reduce(int ntables, const kern_bags_t *bags, int64_t nbags,
                              int64_t out_stride, const float *d_grad_out,
                              kern_row_grads_t *grads /* OUT (ntables) */, void *stream);
/* The same where the caller knows each table's position count
 * (offsets[nbags], a host array npos): one synchronization, not two, and
 * no copies of single counts. npos must match the device offsets. */
int kern_cuda_backward_reduce_npos(int ntables, const kern_bags_t *bags, int64_t nbags,
                                   const int64_t *npos, int64_t out_stride, const float *d_grad_out,
                                   kern_row_grads_t *grads /* OUT (ntables) */, void *stream);

/* kern_cpu_sparse_update on the device (grads[t].n is read on the host). */
int kern_cuda_sparse_update(const kern_opt_t *opt, int ntables, const kern_slab_t *slabs,
                            const kern_row_grads_t *grads, int64_t step, void *stream);

/* ---- the GPU hash table ------------------------------------------------------------
 * Buckets of KERN_CUDA_BUCKET slots; a key lives in bucket
 * kern_hash_index(kern_key_hash(key), nbuckets) and its row id is its slot
 * (bucket * KERN_CUDA_BUCKET + lane), so rows never move while the key
 * stays. Key KERN_CUDA_EMPTY_KEY (INT64_MIN) marks a free slot and cannot be
 * stored. A full bucket evicts its lowest kern_evict_priority row not used
 * at the current step (lru, lfu), or refuses (none). Buckets fill unevenly:
 * give a `none` table 2 to 3 x the keys it must hold (docs/gpu.md). */
#define KERN_CUDA_BUCKET 32
#define KERN_CUDA_EMPTY_KEY ((int64_t)(-0x7fffffffffffffffLL - 1))

typedef struct kern_cuda_table kern_cuda_table_t;

/* Creates an empty table of cfg->capacity slots rounded up to a whole
 * bucket, all in device memory (current device). Returns 0, KILN_EINVAL
 * (bad config), KILN_ENOMEM or KILN_ECUDA. Free with kern_cuda_table_destroy. */
int kern_cuda_table_create(const kern_table_config_t *cfg, kern_cuda_table_t **out /* OUT */);
/* Frees the table (NULL is fine); synchronizes the device first. */
void kern_cuda_table_destroy(kern_cuda_table_t *t);

/* kern_table_find_or_insert on the device: d_keys (n) -> d_rows (n).
 * Missing keys are inserted with their seeded initial row, zero optimizer
 * state and stamp = step; every key counts a use at step. When a bucket is
 * full: lru/lfu evict (logged, see kern_cuda_table_evicted); `none` takes
 * back the keys this call inserted and returns KILN_EFULL. Also KILN_EFULL
 * when every row of a bucket was used at step (the keys inserted before
 * stay), and KILN_EINVAL for the reserved key. Synchronizes the stream. */
int kern_cuda_table_find_or_insert(kern_cuda_table_t *t, int64_t n, const int64_t *d_keys,
                                   int64_t step, int32_t *d_rows /* OUT (n) */, void *stream);
/* The same for several tables in one call: table i's keys are
 * d_keys[off[i] .. off[i + 1]) (off: a host array), their rows go to the
 * same places of d_rows. The first pass runs for every table before one
 * synchronization reads all their counters; only tables with keys left
 * over (a full bucket) synchronize again. The tables are independent, so
 * each ends as the single call leaves it; an error is the first table's,
 * after every table has had its call. */
int kern_cuda_tables_find_or_insert(int ntables, kern_cuda_table_t *const *tables,
                                    const int64_t *off, const int64_t *d_keys, int64_t step,
                                    int32_t *d_rows /* OUT (off[ntables]) */, void *stream);
/* Looks d_keys (n) up without inserting or counting a use; a missing key
 * gets -1. Asynchronous. */
int kern_cuda_table_find(const kern_cuda_table_t *t, int64_t n, const int64_t *d_keys,
                         int32_t *d_rows /* OUT (n) */, void *stream);
/* The export scan: writes the live rows whose stamp is > since (stamps come
 * from insertion and from kern_cuda_sparse_update) to d_rows and their keys
 * to d_keys (cap entries each; d_keys may be NULL), in no particular order,
 * and their number to *n. One pass over all slots. Synchronizes the stream.
 * Returns 0, KILN_ERANGE (more than cap rows; *n says how many) or
 * KILN_ECUDA. */
int kern_cuda_table_changed_since(const kern_cuda_table_t *t, int64_t since,
                                  int32_t *d_rows /* OUT (cap) */, int64_t *d_keys /* OUT (cap) */,
                                  int64_t cap, int64_t *n /* OUT */, void *stream);

/* The keys evicted since the last kern_cuda_table_evicted_clear, in host
 * memory, owned by the table, valid until its next change. */
const kern_evicted_t *kern_cuda_table_evicted(const kern_cuda_table_t *t, int64_t *n /* OUT */);
void kern_cuda_table_evicted_clear(kern_cuda_table_t *t);

/* Describes the table's device arrays for the fused ops (borrowed). */
void kern_cuda_table_slab(kern_cuda_table_t *t, kern_slab_t *slab /* OUT */);
/* Device array (capacity) of each slot's key, KERN_CUDA_EMPTY_KEY when free. */
const int64_t *kern_cuda_table_keys(const kern_cuda_table_t *t);
/* Live keys, as of the last synchronizing call. */
int64_t kern_cuda_table_size(const kern_cuda_table_t *t);
/* Slots (cfg->capacity rounded up to a multiple of KERN_CUDA_BUCKET). */
int64_t kern_cuda_table_capacity(const kern_cuda_table_t *t);

/* ---- the runtime ------------------------------------------------------------------- */

/* Number of CUDA devices visible (0 when none or the driver is missing). */
int kern_cuda_device_count(void);
/* For a GPU test or bench starting up: prints "WHO: CUDA runtime R, cuBLAS
 * C, NCCL N", the versions the backend is linked against (cuBLAS as
 * major*10000 + minor*100 + patch; 0 for one that cannot say), then
 * "skipped: no CUDA device" when none is visible, to stdout. Returns
 * kern_cuda_device_count(). */
int kern_cuda_announce(const char *who);

#ifdef __cplusplus
}
#endif

#endif /* KILN_KERNELS_KERN_CUDA_H */
