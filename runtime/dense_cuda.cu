/*
 * runtime/dense_cuda.cu - the dense layer on cuBLAS (rt_dense_cuda.h), the
 * device twin of model_dlrm.c's rt_dense_linear_fwd / _bwd. Row-major
 * arrays are handed to column-major cuBLAS as their transposes:
 *
 *   Y  = A W^T   is  Y^T (out, n)  = W^T_cm^T A^T_cm      Sgemm(T, N)
 *   dW += dY^T A is  dW^T (in, out) += A^T_cm dY^T_cm^T   Dgemm(N, T), float64
 *   dA = dY W    is  dA^T (in, n)  = W^T_cm dY^T_cm       Sgemm(N, N)
 *
 * where X^T_cm is a row-major X read column-major (no copy). The kernels
 * (bias + ReLU, float32 -> float64 widening, the in-order bias column sum,
 * the ReLU mask) come first, the launchers after; every launch is followed
 * by a cudaGetLastError check.
 */
#include "rt_dense_cuda.h"
#include "kiln_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdlib.h>

#define THREADS 256
#define MAX_BLOCKS 4096

struct rt_dense_cuda {
    cublasHandle_t blas;
    cudaStream_t stream;
    int max_batch, max_width;
    double *d_a64, *d_b64; /* (max_batch, max_width) each: widened A and dY */
};

/* ---- kernels -------------------------------------------------------------------- */

/* Y (n, out; ldy) += b, then ReLU if relu. */
__global__ void bias_act_kernel(int n, int out, const float *b, float *Y, int ldy, int relu)
{
    const size_t total = (size_t)n * (size_t)out;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t i = e / (size_t)out, j = e % (size_t)out;
        float v = Y[i * (size_t)ldy + j] + b[j];
        Y[i * (size_t)ldy + j] = relu ? (v > 0.0f ? v : 0.0f) : v; /* as model_dlrm.c */
    }
}

/* dst (n, cols) dense float64 = src (n, cols; ld) float32. */
__global__ void widen_kernel(int n, int cols, const float *src, int ld, double *dst)
{
    const size_t total = (size_t)n * (size_t)cols;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t i = e / (size_t)cols, j = e % (size_t)cols;
        dst[e] = (double)src[i * (size_t)ld + j];
    }
}

/* g (cols) += the float64 sum of each column of A (n, cols; lda), rows in
 * order: one thread per column, so the result does not depend on the grid. */
__global__ void colsum_kernel(int n, int cols, const float *A, int lda, double *g)
{
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < cols; j += gridDim.x * blockDim.x) {
        double acc = 0.0;
        for (int i = 0; i < n; i++)
            acc += (double)A[(size_t)i * (size_t)lda + (size_t)j];
        g[j] += acc;
    }
}

/* dA (n, w; ldd) = act > 0 ? dA : 0, act (n, w; lda). */
__global__ void relu_mask_kernel(int n, int w, const float *act, int lda, float *dA, int ldd)
{
    const size_t total = (size_t)n * (size_t)w;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t i = e / (size_t)w, j = e % (size_t)w;
        if (!(act[i * (size_t)lda + j] > 0.0f))
            dA[i * (size_t)ldd + j] = 0.0f;
    }
}

/* ---- launchers ------------------------------------------------------------------ */

#define CUBLAS_CHECK(call)                                                                         \
    do {                                                                                           \
        cublasStatus_t blas_st_ = (call);                                                          \
        if (blas_st_ != CUBLAS_STATUS_SUCCESS)                                                     \
            return kiln_errf(KILN_ECUDA, "%s: %s (%s)", #call, cublasGetStatusString(blas_st_),    \
                             KILN_WHERE);                                                          \
    } while (0)

/* Blocks for a grid-stride loop over total elements. */
static unsigned blocks_for(size_t total)
{
    size_t b = (total + THREADS - 1) / THREADS;
    if (b < 1)
        b = 1;
    return (unsigned)(b < MAX_BLOCKS ? b : MAX_BLOCKS);
}

static int setup(rt_dense_cuda_t *h, int max_batch, int max_width, void *stream)
{
    h->stream = (cudaStream_t)stream;
    h->max_batch = max_batch;
    h->max_width = max_width;
    cublasStatus_t st = cublasCreate(&h->blas);
    if (st != CUBLAS_STATUS_SUCCESS) {
        h->blas = NULL;
        return kiln_errf(KILN_ECUDA,
                         "cublasCreate: %s; is a GPU visible (nvidia-smi, CUDA_VISIBLE_DEVICES)? "
                         "Set device: cpu to train without one",
                         cublasGetStatusString(st));
    }
    CUBLAS_CHECK(cublasSetStream(h->blas, h->stream));
    CUBLAS_CHECK(cublasSetPointerMode(h->blas, CUBLAS_POINTER_MODE_HOST));
    CUBLAS_CHECK(cublasSetMathMode(h->blas, CUBLAS_DEFAULT_MATH));
    const size_t bytes = sizeof(double) * (size_t)max_batch * (size_t)max_width;
    CUDA_CHECK(cudaMalloc((void **)&h->d_a64, bytes));
    CUDA_CHECK(cudaMalloc((void **)&h->d_b64, bytes));
    return 0;
}

extern "C" int rt_dense_cuda_create(int max_batch, int max_width, void *stream,
                                    rt_dense_cuda_t **out)
{
    if (out == NULL)
        return kiln_errf(KILN_EINVAL, "rt_dense_cuda_create: out is NULL");
    *out = NULL;
    if (max_batch < 1 || max_width < 1)
        return kiln_errf(KILN_EINVAL,
                         "rt_dense_cuda_create: max_batch %d and max_width %d must be >= 1",
                         max_batch, max_width);
    rt_dense_cuda_t *h = (rt_dense_cuda_t *)kiln_calloc(1, sizeof *h);
    if (h == NULL)
        return KILN_ENOMEM;
    int rc = setup(h, max_batch, max_width, stream);
    if (rc < 0) {
        rt_dense_cuda_destroy(h);
        return rc;
    }
    *out = h;
    return 0;
}

extern "C" void rt_dense_cuda_destroy(rt_dense_cuda_t *h)
{
    if (h == NULL)
        return;
    if (h->blas != NULL)
        (void)cudaStreamSynchronize(h->stream);
    (void)cudaFree(h->d_a64);
    (void)cudaFree(h->d_b64);
    if (h->blas != NULL)
        (void)cublasDestroy(h->blas);
    free(h);
}

extern "C" void *rt_dense_cuda_stream(const rt_dense_cuda_t *h)
{
    return (void *)h->stream;
}

static int check_layer(const rt_dense_cuda_t *h, int n, const rt_dense_cuda_layer_t *L,
                       const char *what)
{
    if (h == NULL || L == NULL || L->d_W == NULL || L->d_b == NULL)
        return kiln_errf(KILN_EINVAL, "%s: NULL handle, layer or weights", what);
    if (L->in < 1 || L->out < 1 || n < 0 || n > h->max_batch)
        return kiln_errf(KILN_EINVAL, "%s: layer %d -> %d with n = %d rows (max_batch %d)", what,
                         L->in, L->out, n, h->max_batch);
    return 0;
}

extern "C" int rt_dense_cuda_fwd(rt_dense_cuda_t *h, int n, const rt_dense_cuda_layer_t *L,
                                 const float *d_A, int lda, float *d_Y, int ldy)
{
    KILN_CHECK(check_layer(h, n, L, "rt_dense_cuda_fwd"));
    const int in = L->in, out = L->out;
    if (lda < in || ldy < out)
        return kiln_errf(KILN_EINVAL, "rt_dense_cuda_fwd: lda %d < in %d or ldy %d < out %d", lda,
                         in, ldy, out);
    if (n == 0)
        return 0;
    if (d_A == NULL || d_Y == NULL)
        return kiln_errf(KILN_EINVAL, "rt_dense_cuda_fwd: NULL input or output");
    const float one = 1.0f, zero = 0.0f;
    /* Y^T (out, n; ldy) = (W^T_cm (in, out; in))^T A^T_cm (in, n; lda) */
    CUBLAS_CHECK(cublasSgemm(h->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, L->d_W, in, d_A,
                             lda, &zero, d_Y, ldy));
    bias_act_kernel<<<blocks_for((size_t)n * out), THREADS, 0, h->stream>>>(n, out, L->d_b, d_Y,
                                                                            ldy, L->relu);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int rt_dense_cuda_bwd(rt_dense_cuda_t *h, int n, const rt_dense_cuda_layer_t *L,
                                 const float *d_A, int lda, const float *d_dY, int ldy, float *d_dA,
                                 int ldda)
{
    KILN_CHECK(check_layer(h, n, L, "rt_dense_cuda_bwd"));
    const int in = L->in, out = L->out;
    if (L->d_dW == NULL || L->d_db == NULL)
        return kiln_errf(KILN_EINVAL, "rt_dense_cuda_bwd: the layer has no gradient arrays");
    if (in > h->max_width || out > h->max_width)
        return kiln_errf(KILN_EINVAL,
                         "rt_dense_cuda_bwd: layer %d -> %d is wider than the workspace (%d); "
                         "create the handle with max_width >= the widest layer",
                         in, out, h->max_width);
    if (lda < in || ldy < out || (d_dA != NULL && ldda < in))
        return kiln_errf(KILN_EINVAL, "rt_dense_cuda_bwd: a leading dimension is too small");
    if (n == 0)
        return 0;
    if (d_A == NULL || d_dY == NULL)
        return kiln_errf(KILN_EINVAL, "rt_dense_cuda_bwd: NULL input or output gradient");

    /* a64 (n, in), b64 (n, out): float64 copies for the weight gradient. */
    widen_kernel<<<blocks_for((size_t)n * in), THREADS, 0, h->stream>>>(n, in, d_A, lda, h->d_a64);
    CUDA_CHECK(cudaGetLastError());
    widen_kernel<<<blocks_for((size_t)n * out), THREADS, 0, h->stream>>>(n, out, d_dY, ldy,
                                                                         h->d_b64);
    CUDA_CHECK(cudaGetLastError());
    const double done = 1.0;
    /* dW^T (in, out; in) += a64^T_cm (in, n; in) (b64^T_cm (out, n; out))^T */
    CUBLAS_CHECK(cublasDgemm(h->blas, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, &done, h->d_a64, in,
                             h->d_b64, out, &done, L->d_dW, in));
    /* db (out) += column sums of dY (n, out; ldy), rows in order */
    colsum_kernel<<<blocks_for((size_t)out), THREADS, 0, h->stream>>>(n, out, d_dY, ldy, L->d_db);
    CUDA_CHECK(cudaGetLastError());
    if (d_dA != NULL) {
        const float one = 1.0f, zero = 0.0f;
        /* dA^T (in, n; ldda) = W^T_cm (in, out; in) dY^T_cm (out, n; ldy) */
        CUBLAS_CHECK(cublasSgemm(h->blas, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, &one, L->d_W, in,
                                 d_dY, ldy, &zero, d_dA, ldda));
    }
    return 0;
}

extern "C" int rt_dense_cuda_relu_mask(rt_dense_cuda_t *h, int n, int w, const float *d_act,
                                       int lda, float *d_dA, int ldd)
{
    if (h == NULL || n < 0 || w < 0 || lda < w || ldd < w)
        return kiln_errf(KILN_EINVAL, "rt_dense_cuda_relu_mask: bad handle or sizes");
    if (n == 0 || w == 0)
        return 0;
    if (d_act == NULL || d_dA == NULL)
        return kiln_errf(KILN_EINVAL, "rt_dense_cuda_relu_mask: NULL array");
    relu_mask_kernel<<<blocks_for((size_t)n * w), THREADS, 0, h->stream>>>(n, w, d_act, lda, d_dA,
                                                                           ldd);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}
