/*
 * runtime/rt_dense_cuda.h - the models' dense layer on cuBLAS: the device
 * twin of rt_dense_linear_fwd / rt_dense_linear_bwd (rt_model.h,
 * model_dlrm.c), with the same shapes and the same meaning:
 *
 *   forward   Y (n, out) = A (n, in) W^T + b, then ReLU when relu
 *   backward  dW (out, in) += dY^T A        float64 sums over the rows
 *             db (out)     += sum_i dY[i]   float64
 *             dA (n, in)   = dY W           (skipped when d_dA is NULL)
 *
 * All arrays are DEVICE memory, float32 row-major with the given leading
 * dimensions, except dW and db which are float64 (the model's gradient
 * buffer is float64 so that a gradient does not depend on how the batch is
 * split over ranks; rt_model.h). The float64 sums are made the plain way:
 * dY and A are widened to float64 copies in the handle's workspace and
 * multiplied with cublasDgemm (beta = 1, accumulating), the bias sum is one
 * thread per column adding the rows in order. The float32 products run as
 * cublasSgemm in the default math mode (no TF32), so they agree with the
 * CPU's OpenBLAS within float32 rounding but not bit for bit: the CPU runs
 * them in fixed 16-row blocks (model_blas.c) and cuBLAS orders its sums its
 * own way. The float64 gradient sums agree far below float32 resolution.
 *
 * Everything runs on the handle's stream and is asynchronous to the host.
 * A handle is not thread-safe; use one per rank (per stream).
 */
#ifndef KILN_RUNTIME_RT_DENSE_CUDA_H
#define KILN_RUNTIME_RT_DENSE_CUDA_H

#include <stddef.h>

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rt_dense_cuda rt_dense_cuda_t;

/* One layer's device arrays: W (out, in) and b (out) float32 from the
 * model's parameters, d_dW (out, in) and d_db (out) float64 from its
 * gradients (backward accumulates into them; may be NULL for forward-only
 * use). */
typedef struct {
    int in, out; /* >= 1 */
    int relu;    /* ReLU after the layer (forward only; see rt_dense_cuda_relu_mask) */
    const float *d_W;
    const float *d_b;
    double *d_dW;
    double *d_db;
} rt_dense_cuda_layer_t;

/* Creates a cuBLAS handle bound to stream (a cudaStream_t; NULL: the legacy
 * default stream) and a float64 workspace for up to max_batch rows of
 * layers up to max_width wide (in and out). Uses the current CUDA device.
 * Returns 0, KILN_EINVAL (max_batch or max_width < 1) or KILN_ECUDA (no
 * device, cuBLAS init or allocation failed; the message says which). Free
 * with rt_dense_cuda_destroy. */
int rt_dense_cuda_create(int max_batch, int max_width, void *stream,
                         rt_dense_cuda_t **out /* OUT */);
/* Waits for the handle's stream, frees the workspace and the cuBLAS handle.
 * Accepts NULL. */
void rt_dense_cuda_destroy(rt_dense_cuda_t *h);

/* The stream the handle runs on (a cudaStream_t). */
void *rt_dense_cuda_stream(const rt_dense_cuda_t *h);

/* Forward: d_Y (n, out; ldy) = d_A (n, in; lda) W^T + b, ReLU if L->relu.
 * 0 <= n <= max_batch, lda >= in, ldy >= out. Returns 0, KILN_EINVAL (bad
 * sizes, NULL arrays) or KILN_ECUDA (a cuBLAS call or a kernel launch
 * failed; the message names it). */
int rt_dense_cuda_fwd(rt_dense_cuda_t *h, int n, const rt_dense_cuda_layer_t *L, const float *d_A,
                      int lda, float *d_Y /* OUT (n, out; ldy) */, int ldy);

/* Backward for the rows of d_A (n, in; lda) and their output gradient
 * d_dY (n, out; ldy): ADDS dY^T A to L->d_dW and the column sums of dY to
 * L->d_db (float64), and writes d_dA (n, in; ldda) = dY W unless d_dA is
 * NULL. d_dY is the gradient after the ReLU's mask (as on the CPU: the
 * caller masks with rt_dense_cuda_relu_mask). Returns 0, KILN_EINVAL or
 * KILN_ECUDA. */
int rt_dense_cuda_bwd(rt_dense_cuda_t *h, int n, const rt_dense_cuda_layer_t *L, const float *d_A,
                      int lda, const float *d_dY, int ldy, float *d_dA /* OUT, may be NULL */,
                      int ldda);

/* d_dA (n, w; ldd) *= (d_act > 0): the ReLU's gradient given the layer's
 * output d_act (n, w; lda). Returns 0, KILN_EINVAL or KILN_ECUDA. */
int rt_dense_cuda_relu_mask(rt_dense_cuda_t *h, int n, int w, const float *d_act, int lda,
                            float *d_dA /* IN/OUT (n, w; ldd) */, int ldd);

#ifdef __cplusplus
}
#endif

#endif /* KILN_RUNTIME_RT_DENSE_CUDA_H */
