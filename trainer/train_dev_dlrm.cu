/*
 * trainer/train_dev_dlrm.cu - dlrm's dense model on the GPU for the device
 * step (train_dev.h): the twin of model/model_dlrm.c, its layers on cuBLAS
 * and the pairwise dot products (and their backward) one block a row.
 * Row-major arrays go to column-major cuBLAS as their transposes, X^T_cm
 * being a row-major X read column-major (no copy):
 *
 *   Y  = A W^T     Y^T (out, n)    = W^T_cm^T A^T_cm          Sgemm(T, N)
 *   dW += dY^T A   dW^T (in, out) += A64^T_cm (dY64^T_cm)^T   Dgemm(N, T)
 *   dA = dY W      dA^T (in, n)    = W^T_cm dY^T_cm           Sgemm(N, N)
 *
 * Weight gradients are float64 products of widened operands and bias
 * gradients float64 column sums with the rows in order, as the CPU's sums
 * over rows are float64 (model_blas.c); the loss is a fixed-order tree. So
 * one GPU type gives the same bits on every run (cuBLAS is deterministic
 * for one handle on one stream), and they agree with the CPU's to float32
 * rounding of the per-row products. The host params stay the master copy,
 * uploaded when the step's params_version moves; the gradient sums come
 * back and are added to the model's host grads, as for lr and fm.
 */
#include <cuda_runtime.h>
#include <new>
#include <stdio.h>
#include <string.h>

#include "train_dev.h"
#include "train_dev_cuda.cuh"

#define THREADS 256
#define MAX_BLOCKS 4096
#define MAX_LAYERS (2 * MODEL_MAX_LAYERS)

struct layer_t {
    int in, out;
    size_t w_off, b_off; /* W (out, in), b (out) in params and grads */
    bool relu;
};

namespace
{

/* Blocks for a grid-stride loop over total elements. */
unsigned blocks_for(size_t total)
{
    const size_t b = (total + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b < MAX_BLOCKS ? b : MAX_BLOCKS);
}

/* ---- kernels -------------------------------------------------------------------- */

/* Y (n, out; ldy) += b, then ReLU if relu (model_dlrm.c's v > 0 ? v : 0). */
__global__ void bias_act_kernel(int n, int out, const float *b, float *Y, int ldy, bool relu)
{
    const size_t total = (size_t)n * (size_t)out;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t i = e / (size_t)out, j = e % (size_t)out;
        const float v = Y[i * (size_t)ldy + j] + b[j];
        Y[i * (size_t)ldy + j] = relu ? (v > 0.0f ? v : 0.0f) : v;
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
 * order: one thread a column, so the result does not depend on the grid. */
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

/* The interaction over a row's N = S + 1 vectors v_0 = bot (R's first d
 * columns), v_s+1 = E[i, s]: R[i, d + p] = <v_x, v_y> for the p-th pair
 * x < y in the order (0,1) .. (0,S), (1,2) .. (S-1,S), model_dlrm.c's
 * order. pair_index and pair_of go between p and (x, y). */
__device__ int pair_index(int N, int x, int y)
{
    return x * (2 * N - x - 1) / 2 + (y - x - 1);
}

__device__ void pair_of(int N, int p, int *x, int *y)
{
    int a = 0;
    while (p >= N - 1 - a) {
        p -= N - 1 - a;
        a++;
    }
    *x = a;
    *y = a + 1 + p;
}

__device__ const float *vec(const float *bot, const float *e, int d, int v)
{
    return v == 0 ? bot : e + (size_t)(v - 1) * (size_t)d;
}

/* A block a row, a thread a pair (strided): each dot sums its d products in
 * order, as the CPU does, so the bits do not depend on the launch shape. The
 * row's vectors are small (N * d floats) and stay in L1 across the pairs. */
__global__ void interact_fwd_kernel(int n, int S, int d, int ldr, const float *E, float *R)
{
    const int i = blockIdx.x, N = S + 1, np = N * (N - 1) / 2;
    if (i >= n)
        return;
    const float *bot = R + (size_t)i * (size_t)ldr;
    const float *e = E + (size_t)i * (size_t)S * (size_t)d;
    float *dots = R + (size_t)i * (size_t)ldr + d;
    for (int p = (int)threadIdx.x; p < np; p += (int)blockDim.x) {
        int x, y;
        pair_of(N, p, &x, &y);
        const float *a = vec(bot, e, d, x), *b = vec(bot, e, d, y);
        float s = 0.0f;
        for (int j = 0; j < d; j++)
            s += a[j] * b[j];
        dots[p] = s;
    }
}

/* A block a row, a thread an output element (vector t, column j): the
 * interaction's backward (model_dlrm.c). d v_t = sum over u != t of
 * g(pair t,u) v_u, the u in ascending order, bot's term first: the order in
 * which the CPU's pair loop adds them, so the same bits. dR's first d
 * columns become d bot (ReLU'd), dE gets the slots' gradients; dT holds the
 * row's (S + 1, d) gradients until every thread has read E, so dE may
 * alias E. */
__global__ void interact_bwd_kernel(int n, int S, int d, int ldr, const float *R, const float *E,
                                    float *dR, float *dT, float *dE)
{
    const int i = blockIdx.x, N = S + 1, out = N * d;
    if (i >= n)
        return;
    const size_t rowE = (size_t)S * (size_t)d;
    const float *bot = R + (size_t)i * (size_t)ldr, *e = E + (size_t)i * rowE;
    float *dr = dR + (size_t)i * (size_t)ldr, *dt = dT + (size_t)i * (size_t)out;
    const float *gd = dr + d;
    for (int k = (int)threadIdx.x; k < out; k += (int)blockDim.x) {
        const int t = k / d, j = k % d;
        float acc = 0.0f;
        for (int u = 0; u < N; u++) {
            if (u == t)
                continue;
            const float c = gd[u < t ? pair_index(N, u, t) : pair_index(N, t, u)];
            acc += c * vec(bot, e, d, u)[j];
        }
        dt[k] = acc;
    }
    __syncthreads();
    float *de = dE + (size_t)i * rowE;
    for (int k = (int)threadIdx.x; k < out; k += (int)blockDim.x) {
        if (k < d)
            dr[k] = bot[k] > 0.0f ? dr[k] + dt[k] : 0.0f;
        else
            de[k - d] = dt[k];
    }
}

/* One thread a row: the row's loss and gz = (sigmoid(z) - y) * scale. */
__global__ void loss_kernel(int n, const float *z, const float *y, float scale, float *gz,
                            double *rowloss)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    rowloss[i] = dev_logloss((double)z[i], (double)y[i]);
    gz[i] = (dev_sigmoid(z[i]) - y[i]) * scale;
}

/* One block: *out = the sum of v (n), a strided sum per thread, then a tree. */
__global__ void sum_kernel(int n, const double *v, double *out)
{
    double acc = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        acc += v[i];
    acc = dev_block_sum(acc);
    if (threadIdx.x == 0)
        *out = acc;
}

} // namespace

/* ---- the model on the device ---------------------------------------------------- */

struct dev_dlrm {
    cublasHandle_t blas = nullptr;
    cudaStream_t st = nullptr;
    int S = 0, F = 0, d = 0, ldr = 0, nb = 0, nl = 0, maxw = 0, cap = 0;
    layer_t L[MAX_LAYERS] = {};
    size_t np = 0;
    uint64_t version = 0; /* of d_params; 0: never uploaded */
    float *d_params = nullptr, *h_params = nullptr;
    double *d_grads = nullptr, *h_grads = nullptr; /* (np) the step's sums */
    float *act[MAX_LAYERS] = {};                   /* outputs; the last bottom one is R */
    float *R = nullptr, *gbuf[2] = {}, *dT = nullptr, *gz = nullptr;
    double *rowloss = nullptr, *a64 = nullptr, *b64 = nullptr; /* (cap), (cap, maxw) x 2 */
    double *d_loss = nullptr, *h_loss = nullptr;
};

/* The layers from the model's parameter groups ("bottom.0.weight",
 * "bottom.0.bias", ..., "top.K.bias", in that order). */
static int read_layers(dev_dlrm_t *h, const model_t *m)
{
    int nl = 0, nb = 0;
    for (int i = 0; i + 1 < model_ngroups(m); i += 2) {
        const model_group_t *w = model_group(m, i), *b = model_group(m, i + 1);
        if (nl == MAX_LAYERS || strstr(w->name, ".weight") == NULL ||
            strstr(b->name, ".bias") == NULL)
            return kiln_errf(KILN_EINTERNAL, "dlrm on the GPU: parameter group %s is not a layer",
                             w->name);
        nb += strncmp(w->name, "bottom.", 7) == 0;
        h->L[nl++] = layer_t{w->cols, w->rows, w->offset, b->offset, true};
    }
    if (nb < 1 || nl - nb < 1)
        return kiln_errf(KILN_EINTERNAL, "dlrm on the GPU: %d bottom and %d top layers", nb,
                         nl - nb);
    h->L[nl - 1].relu = false; /* the logit */
    h->nb = nb;
    h->nl = nl;
    return 0;
}

template <typename T> static int dalloc(T **p, size_t n)
{
    CUDA_CHECK(cudaMalloc((void **)p, sizeof(T) * (n ? n : 1)));
    return 0;
}

template <typename T> static int halloc(T **p, size_t n)
{
    CUDA_CHECK(cudaHostAlloc((void **)p, sizeof(T) * (n ? n : 1), cudaHostAllocDefault));
    return 0;
}

static int setup(dev_dlrm_t *h, const model_t *m, void *stream)
{
    h->st = (cudaStream_t)stream;
    const model_info_t mi = model_info(m);
    h->S = mi.nslots;
    h->F = mi.ndense;
    h->d = mi.dim;
    h->ldr = h->d + h->S * (h->S + 1) / 2;
    h->np = model_nparams(m);
    h->cap = mi.max_batch;
    KILN_CHECK(read_layers(h, m));
    h->maxw = h->ldr > h->F ? h->ldr : h->F;
    for (int l = 0; l < h->nl; l++)
        h->maxw = h->L[l].out > h->maxw ? h->L[l].out : h->maxw;
    CUBLAS_CHECK(cublasCreate(&h->blas));
    CUBLAS_CHECK(cublasSetStream(h->blas, h->st));
    CUBLAS_CHECK(cublasSetPointerMode(h->blas, CUBLAS_POINTER_MODE_HOST));
    const size_t B = (size_t)h->cap, W = (size_t)h->maxw;
    KILN_CHECK(dalloc(&h->d_params, h->np));
    KILN_CHECK(halloc(&h->h_params, h->np));
    KILN_CHECK(dalloc(&h->d_grads, h->np));
    KILN_CHECK(halloc(&h->h_grads, h->np));
    KILN_CHECK(dalloc(&h->R, B * (size_t)h->ldr));
    for (int l = 0; l < h->nl; l++)
        if (l == h->nb - 1)
            h->act[l] = h->R; /* the bottom's output is R's first d columns */
        else
            KILN_CHECK(dalloc(&h->act[l], B * (size_t)h->L[l].out));
    KILN_CHECK(dalloc(&h->gbuf[0], B * W));
    KILN_CHECK(dalloc(&h->gbuf[1], B * W));
    KILN_CHECK(dalloc(&h->dT, B * (size_t)(h->S + 1) * (size_t)h->d));
    KILN_CHECK(dalloc(&h->gz, B));
    KILN_CHECK(dalloc(&h->rowloss, B));
    KILN_CHECK(dalloc(&h->a64, B * W));
    KILN_CHECK(dalloc(&h->b64, B * W));
    KILN_CHECK(dalloc(&h->d_loss, 1));
    return halloc(&h->h_loss, 1);
}

void dev_dlrm_destroy(dev_dlrm_t *h)
{
    if (h == nullptr)
        return;
    if (h->st != nullptr)
        (void)cudaStreamSynchronize(h->st);
    for (int l = 0; l < h->nl; l++)
        if (h->act[l] != h->R)
            (void)cudaFree(h->act[l]);
    void *dev[] = {h->d_params, h->d_grads, h->R,   h->gbuf[0], h->gbuf[1], h->dT,
                   h->gz,       h->rowloss, h->a64, h->b64,     h->d_loss};
    for (void *p : dev)
        (void)cudaFree(p); /* cudaFree(NULL) does nothing */
    void *pinned[] = {h->h_params, h->h_grads, h->h_loss};
    for (void *p : pinned)
        (void)cudaFreeHost(p);
    if (h->blas != nullptr)
        (void)cublasDestroy(h->blas);
    delete h;
}

/* Y (n, out; ldy) = A (n, in; lda) W^T + b, ReLU if the layer has one. */
static int layer_fwd(dev_dlrm_t *h, int n, const layer_t &L, const float *A, int lda, float *Y,
                     int ldy)
{
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasSgemm(h->blas, CUBLAS_OP_T, CUBLAS_OP_N, L.out, n, L.in, &one,
                             h->d_params + L.w_off, L.in, A, lda, &zero, Y, ldy));
    bias_act_kernel<<<blocks_for((size_t)n * L.out), THREADS, 0, h->st>>>(
        n, L.out, h->d_params + L.b_off, Y, ldy, L.relu);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

/* dW += dY^T A and db += the column sums of dY in float64, and dA = dY W
 * when dA is not NULL. */
static int layer_bwd(dev_dlrm_t *h, int n, const layer_t &L, const float *A, int lda,
                     const float *dY, int ldy, float *dA, int ldda)
{
    widen_kernel<<<blocks_for((size_t)n * L.in), THREADS, 0, h->st>>>(n, L.in, A, lda, h->a64);
    CUDA_CHECK(cudaGetLastError());
    widen_kernel<<<blocks_for((size_t)n * L.out), THREADS, 0, h->st>>>(n, L.out, dY, ldy, h->b64);
    CUDA_CHECK(cudaGetLastError());
    const double done = 1.0;
    CUBLAS_CHECK(cublasDgemm(h->blas, CUBLAS_OP_N, CUBLAS_OP_T, L.in, L.out, n, &done, h->a64, L.in,
                             h->b64, L.out, &done, h->d_grads + L.w_off, L.in));
    colsum_kernel<<<blocks_for((size_t)L.out), THREADS, 0, h->st>>>(n, L.out, dY, ldy,
                                                                    h->d_grads + L.b_off);
    CUDA_CHECK(cudaGetLastError());
    if (dA != nullptr) {
        const float one = 1.0f, zero = 0.0f;
        CUBLAS_CHECK(cublasSgemm(h->blas, CUBLAS_OP_N, CUBLAS_OP_N, L.in, n, L.out, &one,
                                 h->d_params + L.w_off, L.in, dY, ldy, &zero, dA, ldda));
    }
    return 0;
}

static int relu_mask(dev_dlrm_t *h, int n, int w, const float *act, int lda, float *dA, int ldd)
{
    relu_mask_kernel<<<blocks_for((size_t)n * w), THREADS, 0, h->st>>>(n, w, act, lda, dA, ldd);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

static int forward(dev_dlrm_t *h, const dev_dense_t *a)
{
    const int n = a->n, nb = h->nb, nl = h->nl;
    const float *A = a->X;
    int lda = h->F;
    for (int l = 0; l < nb; l++) {
        const int ldy = l == nb - 1 ? h->ldr : h->L[l].out;
        KILN_CHECK(layer_fwd(h, n, h->L[l], A, lda, h->act[l], ldy));
        A = h->act[l];
        lda = ldy;
    }
    const unsigned rb = (unsigned)((n + 127) / 128);
    interact_fwd_kernel<<<(unsigned)n, 128, 0, h->st>>>(n, h->S, h->d, h->ldr, a->E, h->R);
    CUDA_CHECK(cudaGetLastError());
    A = h->R;
    lda = h->ldr;
    for (int l = nb; l < nl; l++) {
        KILN_CHECK(layer_fwd(h, n, h->L[l], A, lda, h->act[l], h->L[l].out));
        A = h->act[l];
        lda = h->L[l].out;
    }
    loss_kernel<<<rb, 128, 0, h->st>>>(n, h->act[nl - 1], a->y, a->scale, h->gz, h->rowloss);
    CUDA_CHECK(cudaGetLastError());
    sum_kernel<<<1, DEV_SUM_THREADS, 0, h->st>>>(n, h->rowloss, h->d_loss);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

/* model_dlrm.c's model_dlrm_backward, buffer for buffer. */
static int backward(dev_dlrm_t *h, const dev_dense_t *a)
{
    const int n = a->n, nb = h->nb, nl = h->nl;
    const float *cur = h->gz;
    int ldc = 1, cb = 0;
    for (int l = nl - 1; l >= nb; l--) {
        const layer_t &L = h->L[l];
        const float *Ap = l == nb ? h->R : h->act[l - 1];
        const int lda = l == nb ? h->ldr : h->L[l - 1].out;
        float *dA = h->gbuf[cb];
        KILN_CHECK(layer_bwd(h, n, L, Ap, lda, cur, ldc, dA, L.in));
        if (l > nb)
            KILN_CHECK(relu_mask(h, n, L.in, Ap, lda, dA, L.in));
        cur = dA;
        ldc = L.in;
        cb ^= 1;
    }
    float *dR = h->gbuf[cb ^ 1]; /* the top's input gradient, (n, ldr) */
    interact_bwd_kernel<<<(unsigned)n, 128, 0, h->st>>>(n, h->S, h->d, h->ldr, h->R, a->E, dR,
                                                        h->dT, a->dE);
    CUDA_CHECK(cudaGetLastError());
    cur = dR;
    ldc = h->ldr;
    for (int l = nb - 1; l >= 0; l--) {
        const layer_t &L = h->L[l];
        const float *Ap = l == 0 ? a->X : h->act[l - 1];
        const int lda = l == 0 ? h->F : h->L[l - 1].out;
        float *dA = l == 0 ? nullptr : h->gbuf[cb];
        KILN_CHECK(layer_bwd(h, n, L, Ap, lda, cur, ldc, dA, L.in));
        if (l > 0)
            KILN_CHECK(relu_mask(h, n, L.in, Ap, lda, dA, L.in));
        cur = dA;
        ldc = L.in;
        cb ^= 1;
    }
    return 0;
}

int dev_dlrm_dense(dev_dlrm_t **hp, void *stream, const dev_dense_t *a, double *loss)
{
    model_t *m = a->model;
    *loss = 0.0;
    if (*hp == nullptr) {
        dev_dlrm_t *h = new (std::nothrow) dev_dlrm_t();
        if (h == nullptr)
            return KILN_ENOMEM;
        *hp = h; /* destroy takes a half-made one */
        KILN_CHECK(setup(h, m, stream));
    }
    dev_dlrm_t *h = *hp;
    if (a->n == 0)
        return 0;
    if (a->n > h->cap)
        return kiln_errf(KILN_EINTERNAL, "dlrm on the GPU: %d rows, room for %d", a->n, h->cap);
    if (h->version != a->params_version) {
        /* The last upload out of h_params is done: the last call synchronized. */
        memcpy(h->h_params, model_params(m), sizeof(float) * h->np);
        CUDA_CHECK(cudaMemcpyAsync(h->d_params, h->h_params, sizeof(float) * h->np,
                                   cudaMemcpyHostToDevice, h->st));
        h->version = a->params_version;
    }
    CUDA_CHECK(cudaMemsetAsync(h->d_grads, 0, sizeof(double) * h->np, h->st));
    KILN_CHECK(forward(h, a));
    KILN_CHECK(backward(h, a));
    CUDA_CHECK(cudaMemcpyAsync(h->h_grads, h->d_grads, sizeof(double) * h->np,
                               cudaMemcpyDeviceToHost, h->st));
    CUDA_CHECK(
        cudaMemcpyAsync(h->h_loss, h->d_loss, sizeof(double), cudaMemcpyDeviceToHost, h->st));
    CUDA_CHECK(cudaStreamSynchronize(h->st));
    double *g = model_grads(m);
    for (size_t i = 0; i < h->np; i++)
        g[i] += h->h_grads[i];
    *loss = *h->h_loss;
    return 0;
}
