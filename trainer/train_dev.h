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

#ifdef __cplusplus
extern "C" {
#endif

enum { DEV_COPY = 0, DEV_COMPUTE = 1, DEV_NSTREAMS = 2 };
#define DEV_NEVENTS 8

/* The dense model's forward, loss and backward for n rows. */
typedef struct dev_dense {
    rt_model_t *model;       /* shapes; its params are the host master copy */
    uint64_t params_version; /* changes whenever the host params changed */
    int n;
    const float *E; /* (n, S, d) device */
    const float *X; /* (n, F) device */
    const float *y; /* (n) device */
    float scale;    /* the loss scale: 1 / rows of all ranks in the step */
    float *dE;      /* (n, S, d) device, OUT; may be E */
} dev_dense_t;

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
    /* On DEV_COMPUTE: kern_cpu_backward_reduce's contract on device arrays;
     * g[i].n is set on the host (so it synchronizes). */
    int (*reduce)(void *ctx, int nbags, const kern_bags_t *bags, int64_t n, int64_t ld,
                  const float *dE, kern_row_grads_t *g /* OUT (nbags) */);
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
