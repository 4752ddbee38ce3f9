/*
 * trainer/train_dev.h - the device a training step runs on, for the device
 * step (train_dev.c). Internal to trainer/. Two implementations, one per
 * file: the CUDA runtime (train_dev_cuda.cu) and the host stand-in
 * (train_dev_host.c) that runs the same calls on host memory with the CPU
 * kernels and checks their order, so CI runs the device step's orchestration
 * without a GPU (docs/gpu.md).
 *
 * A device has two streams, DEV_COPY and DEV_COMPUTE; the host is a third
 * party. Work on one stream runs in order; between streams, and between a
 * stream and the host, only events order it: record(s, e) marks what s has
 * queued so far, wait(s, e) makes s wait for that, sync(e) makes the host
 * wait for it. Memory is device memory or pinned host memory (alloc's host
 * flag); copy() moves bytes between any two on a stream, asynchronously. The
 * host reads or writes pinned memory only after host_touch() says so, which
 * is how the stand-in sees the host's side. Every call returns 0 or a
 * negative KILN_E* code with a message.
 */
#ifndef KILN_TRAINER_TRAIN_DEV_H
#define KILN_TRAINER_TRAIN_DEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kern.h"
#include "model.h"
#include "shard.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { DEV_COPY = 0, DEV_COMPUTE = 1, DEV_NSTREAMS = 2 };
#define DEV_NEVENTS 8

/* The dense model's forward, loss and backward for n rows. */
typedef struct dev_dense {
    model_t *model;          /* shapes; its params are the host master copy */
    uint64_t params_version; /* changes whenever the host params changed */
    int n;
    const float *E; /* (n, S, d) device */
    const float *X; /* (n, F) device */
    const float *y; /* (n) device */
    float scale;    /* the loss scale: 1 / rows of all ranks in the step */
    float *dE;      /* (n, S, d) device, OUT; may be E */
} dev_dense_t;

/* A piece of a permute: bytes from src + src to dst + dst (byte offsets,
 * all multiples of 4). */
typedef struct dev_seg {
    size_t src, dst, bytes;
} dev_seg_t;

typedef struct dev_ops {
    const char *name;
    /* device: the GPU to use (ignored by the stand-in) */
    int (*create)(int device, void **ctx /* OUT */);
    void (*destroy)(void *ctx);
    /* host: pinned host memory, else device memory */
    int (*alloc)(void *ctx, size_t bytes, bool host, void **p /* OUT */);
    void (*release)(void *ctx, void *p, bool host);
    int (*copy)(void *ctx, int stream, void *dst, const void *src, size_t bytes);
    int (*record)(void *ctx, int stream, int event);
    int (*wait)(void *ctx, int stream, int event);
    int (*sync)(void *ctx, int event);
    /* The host is about to read (write false) or write pinned [p, p + bytes). */
    int (*host_touch)(void *ctx, const void *p, size_t bytes, bool write);
    /* On DEV_COMPUTE: kern_cpu_gather_combine's contract on device arrays. */
    int (*gather)(void *ctx, int nbags, const kern_bags_t *bags, int64_t n, int64_t ld,
                  float *E /* OUT (n, ld) */);
    /* On DEV_COMPUTE: forward, loss and backward; ADDS the dense gradient
     * sums to the model's host grads and sets *loss to the unscaled loss sum
     * (so it synchronizes). */
    int (*dense)(void *ctx, const dev_dense_t *a, double *loss /* OUT */);
    /* On DEV_COMPUTE: kern_cpu_backward_reduce's contract on device arrays,
     * with npos[i] (host) the positions of bags[i] (its offsets[n], the
     * offsets starting at 0); g[i].n is set on the host (so it synchronizes,
     * once). */
    int (*reduce)(void *ctx, int nbags, const kern_bags_t *bags, int64_t n, const int64_t *npos,
                  int64_t ld, const float *dE, kern_row_grads_t *g /* OUT (nbags) */);

    /* ---- the exchange on the device (train_dev.c); all on DEV_COMPUTE ---- */
    /* Copies nseg pieces (a host array) from src to dst. */
    int (*permute)(void *ctx, void *dst, const void *src, int nseg, const dev_seg_t *segs);
    /* Zeroes [p, p + bytes). */
    int (*zero)(void *ctx, void *p, size_t bytes);
    /* Per table t, whose keys are keys[koff[t] .. koff[t + 1]) (koff: a
     * host array): its distinct keys ordered by owner (shard_owner over
     * nranks), then ascending, to uniq + koff[t]; inv[i] the index of keys[i]
     * among its table's distinct keys; cnt[r * ntables + t] (host) how many
     * of table t's keys rank r owns. Synchronizes. */
    int (*dedupe)(void *ctx, int ntables, const int64_t *koff, const int64_t *keys, int nranks,
                  int64_t *uniq /* OUT */, int32_t *inv /* OUT */,
                  int64_t *cnt /* OUT (nranks, ntables) */);
    /* shard_comm_alltoallv / shard_comm_allreduce_sum_dd over comm on device
     * buffers, after the compute stream's work so far and before its later
     * work. (The stand-in's comm is MPI over its host memory.) */
    int (*alltoallv)(void *ctx, shard_comm_t *comm, const void *send, const size_t *sc,
                     const size_t *sd, void *recv, const size_t *rc, const size_t *rd);
    int (*allreduce_dd)(void *ctx, shard_comm_t *comm, double *pairs, size_t npairs);
    /* The owner's table calls on device arrays (shard_store_find_dev, _read_dev,
     * _update_dev); every table's rows are dim floats. find takes all
     * ntables tables of s, table t's keys at keys[off[t] .. off[t + 1])
     * (off: a host array), and synchronizes once. */
    int (*find)(void *ctx, shard_store_t *s, int ntables, const int64_t *off, const int64_t *keys,
                int64_t step, bool insert, int32_t *rows /* OUT (off[ntables]) */);
    int (*read)(void *ctx, shard_store_t *s, int t, int64_t n, const int32_t *rows, int dim,
                float *out /* OUT (n, dim) */);
    int (*update)(void *ctx, shard_store_t *s, int ntables, const kern_opt_t *opt,
                  const kern_row_grads_t *ug, int dim, int64_t step);
    /* tg (ntg, dim) float64: tg[rows[u]] += sums[u] for u < n (distinct rows). */
    int (*accum)(void *ctx, int64_t n, const int32_t *rows, const float *sums, int dim, int64_t ntg,
                 double *tg);
    /* The owner's sum, per table t, whose rows and float64 gradients are
     * rows[off[t] .. off[t + 1]) and grads (same rows, dim) (off: a host
     * array): the distinct rows, ascending, each with its gradients summed
     * in input order and rounded once to float32, in out[t].rows and
     * out[t].grads (room for its rows); out[t].n is set on the host
     * (synchronizes, once for all tables). */
    int (*combine)(void *ctx, int ntables, const int64_t *off, const int32_t *rows,
                   const double *grads, int dim, kern_row_grads_t *out /* (ntables) */);
} dev_ops_t;

/* The host stand-in: host memory, the CPU kernels and model, and a vector
 * clock per stream that fails a call touching memory another stream (or
 * the host) wrote or still reads with no event between (KILN_EINTERNAL,
 * naming the call, the buffer and both sides). */
extern const dev_ops_t train_dev_host_ops;
#ifdef KILN_HAVE_CUDA
extern const dev_ops_t train_dev_cuda_ops;

/* dlrm's dense model on cuBLAS (train_dev_dlrm.cu) for the CUDA dense op:
 * made on the first call into *h, on stream (a cudaStream_t). */
typedef struct dev_dlrm dev_dlrm_t;
int dev_dlrm_dense(dev_dlrm_t **h, void *stream, const dev_dense_t *a, double *loss /* OUT */);
void dev_dlrm_destroy(dev_dlrm_t *h);
#endif

#ifdef __cplusplus
}
#endif

#endif /* KILN_TRAINER_TRAIN_DEV_H */
