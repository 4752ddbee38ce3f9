/*
 * trainer/train_dev_cuda.cu - the device step's CUDA runtime (train_dev.h):
 * two non-blocking streams, events, cudaMalloc and cudaHostAlloc memory,
 * cudaMemcpyAsync with the direction read from the pointers (unified
 * addressing), the fused gather and backward reduce of kernels/kern_cuda.h,
 * and the dense lr and fm models as two kernels (dlrm: train_dev_dlrm.cu):
 *
 *   rows   one thread a row: the logit (model/model_lr.c, model_fm.c), the
 *          sigmoid, the logistic loss, dlogit = (p - y) * scale, and the
 *          row's backward: dE (which may overwrite E) and, for fm with dense
 *          factors, du (n, k).
 *   sums   one block per dense gradient and one for the loss: the rows in a
 *          fixed order in float64 (a strided sum per thread, then a tree),
 *          so a step gives the same sums on every run.
 *
 * The host params stay the master copy (the dense optimizer, checkpoints
 * and eval run on the host); the device copy is refreshed when the step's
 * params_version moves. The gradient sums come back to the host and are
 * added to the model's grads, where the allreduce and the step take them.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <new>
#include <stdlib.h>
#include <string.h>

#include "kern_cuda.h"
#include "train_dev.h"
#include "train_dev_cuda.cuh"

namespace
{

struct cuda_dev {
    int device = 0;
    cudaStream_t s[DEV_NSTREAMS] = {};
    cudaEvent_t ev[DEV_NEVENTS] = {};
    /* the dense model */
    uint64_t version = 0; /* of d_params; 0: never uploaded */
    size_t np = 0;
    float *d_params = nullptr, *h_params = nullptr;           /* (np) device, pinned */
    int cap = 0;                                              /* rows of the scratch below */
    float *d_gz = nullptr, *d_sum = nullptr, *d_du = nullptr; /* (cap), (cap, k), (cap, k) */
    double *d_rowloss = nullptr;                              /* (cap) */
    int outcap = 0;
    double *d_out = nullptr, *h_out = nullptr; /* (outcap) gradient sums, then the loss */
    dev_dlrm_t *dlrm = nullptr;                /* dlrm's model, made on its first step */
    dev_xchg_t *xchg = nullptr;                /* the exchange kernels' scratch */
    cudaEvent_t to_comm = nullptr, from_comm = nullptr; /* compute <-> the NCCL stream */
};

cuda_dev *C(void *ctx)
{
    return (cuda_dev *)ctx;
}

struct rows_args {
    int n, S, F, d, k;
    bool fm, dense;
    const float *E, *X, *y, *w, *vx, *b;
    float scale;
    float *dE, *gz, *sum, *du;
    double *rowloss;
};

/* grid (rows / 128), block 128: one thread a row. E, dE (n, S, d); X (n, F);
 * sum, du (n, k). */
__global__ void dense_rows_kernel(const rows_args a)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.n)
        return;
    const size_t sd = (size_t)a.S * (size_t)a.d;
    const float *e = a.E + (size_t)i * sd, *x = a.X + (size_t)i * (size_t)a.F;
    float dot = 0.0f;
    for (int f = 0; f < a.F; f++)
        dot += x[f] * a.w[f];
    float lin = a.b[0] + dot, z;
    float *acc = a.fm ? a.sum + (size_t)i * (size_t)a.k : nullptr;
    if (!a.fm) {
        for (int s = 0; s < a.S; s++)
            lin += e[s];
        z = lin;
    } else {
        float sq = 0.0f, inter = 0.0f;
        for (int f = 0; f < a.k; f++) {
            float u = 0.0f;
            for (int j = 0; a.dense && j < a.F; j++)
                u += a.vx[(size_t)f * (size_t)a.F + j] * x[j];
            acc[f] = u;
            if (a.dense)
                a.du[(size_t)i * (size_t)a.k + f] = u;
            sq += u * u;
        }
        for (int s = 0; s < a.S; s++) {
            const float *es = e + (size_t)s * (size_t)a.d;
            lin += es[0];
            for (int f = 0; f < a.k; f++) {
                acc[f] += es[1 + f];
                sq += es[1 + f] * es[1 + f];
            }
        }
        for (int f = 0; f < a.k; f++)
            inter += acc[f] * acc[f];
        z = lin + 0.5f * (inter - sq);
    }
    a.rowloss[i] = dev_logloss((double)z, (double)a.y[i]);
    const float g = (dev_sigmoid(z) - a.y[i]) * a.scale;
    a.gz[i] = g;
    float *de = a.dE + (size_t)i * sd; /* may be e: each element is read before it is written */
    for (int s = 0; s < a.S; s++) {
        const float *es = e + (size_t)s * (size_t)a.d;
        float *ds = de + (size_t)s * (size_t)a.d;
        for (int f = 0; f < a.k; f++)
            ds[1 + f] = g * (acc[f] - es[1 + f]);
        ds[0] = g;
    }
    for (int f = 0; a.dense && f < a.k; f++) {
        float *u = &a.du[(size_t)i * (size_t)a.k + f];
        *u = g * (acc[f] - *u);
    }
}

struct sums_args {
    int n, F, k, nout;
    const float *X, *gz, *du;
    const double *rowloss;
};

/* grid (nout), block DEV_SUM_THREADS. out[o]: o < F: dw = X^T gz; o == F: db =
 * sum gz; then dVx (k, F) = du^T X row-major; the last: the loss sum. */
__global__ void dense_sums_kernel(const sums_args a, double *out)
{
    const int o = blockIdx.x;
    double acc = 0.0;
    for (int i = threadIdx.x; i < a.n; i += blockDim.x) {
        const float *x = a.X + (size_t)i * (size_t)a.F;
        if (o < a.F) {
            acc += (double)x[o] * (double)a.gz[i];
        } else if (o == a.F) {
            acc += a.gz[i];
        } else if (o < a.nout - 1) {
            const int q = o - a.F - 1, f = q / a.F, j = q % a.F;
            acc += (double)a.du[(size_t)i * (size_t)a.k + f] * (double)x[j];
        } else {
            acc += a.rowloss[i];
        }
    }
    acc = dev_block_sum(acc);
    if (threadIdx.x == 0)
        out[o] = acc;
}

/* The offset of parameter group name in m's params; -1 when m has none. */
long group_offset(const model_t *m, const char *name)
{
    for (int i = 0; i < model_ngroups(m); i++) {
        const model_group_t *g = model_group(m, i);
        if (strcmp(g->name, name) == 0)
            return (long)g->offset;
    }
    return -1;
}

template <typename T> int dev_grow(T **p, size_t n)
{
    if (*p != nullptr)
        CUDA_CHECK(cudaFree(*p));
    *p = nullptr;
    CUDA_CHECK(cudaMalloc((void **)p, sizeof(T) * (n ? n : 1)));
    return 0;
}

/* Room for n rows of scratch, k factors, nout sums and np params. */
int dense_room(cuda_dev *c, int n, int k, int nout, size_t np)
{
    if (n > c->cap) {
        const size_t rows = (size_t)n, kk = (size_t)(k ? k : 1);
        KILN_CHECK(dev_grow(&c->d_gz, rows));
        KILN_CHECK(dev_grow(&c->d_sum, rows * kk));
        KILN_CHECK(dev_grow(&c->d_du, rows * kk));
        KILN_CHECK(dev_grow(&c->d_rowloss, rows));
        c->cap = n;
    }
    if (nout > c->outcap) {
        KILN_CHECK(dev_grow(&c->d_out, (size_t)nout));
        if (c->h_out != nullptr)
            CUDA_CHECK(cudaFreeHost(c->h_out));
        c->h_out = nullptr;
        CUDA_CHECK(
            cudaHostAlloc((void **)&c->h_out, sizeof(double) * (size_t)nout, cudaHostAllocDefault));
        c->outcap = nout;
    }
    if (np > c->np) {
        KILN_CHECK(dev_grow(&c->d_params, np));
        if (c->h_params != nullptr)
            CUDA_CHECK(cudaFreeHost(c->h_params));
        c->h_params = nullptr;
        CUDA_CHECK(cudaHostAlloc((void **)&c->h_params, sizeof(float) * np, cudaHostAllocDefault));
        c->np = np;
        c->version = 0;
    }
    return 0;
}

int c_dense(void *ctx, const dev_dense_t *a, double *loss)
{
    cuda_dev *c = C(ctx);
    model_t *m = a->model;
    *loss = 0.0;
    const model_info_t mi = model_info(m);
    if (mi.type == MODEL_DLRM)
        return dev_dlrm_dense(&c->dlrm, c->s[DEV_COMPUTE], a, loss);
    if (a->n == 0)
        return 0;
    const bool fm = mi.type == MODEL_FM;
    const int S = mi.nslots, F = mi.ndense, d = mi.dim;
    const int k = fm ? d - 1 : 0;
    const long w_off = group_offset(m, "w"), b_off = group_offset(m, "b"),
               vx_off = group_offset(m, "vx");
    const bool dense = fm && vx_off >= 0 && F > 0;
    const int nout = F + 1 + (dense ? k * F : 0) + 1;
    const size_t np = model_nparams(m);
    cudaStream_t st = c->s[DEV_COMPUTE];
    KILN_CHECK(dense_room(c, a->n, k, nout, np));
    if (c->version != a->params_version) {
        /* The last upload out of h_params is done: the last call synchronized. */
        memcpy(c->h_params, model_params(m), sizeof(float) * np);
        CUDA_CHECK(cudaMemcpyAsync(c->d_params, c->h_params, sizeof(float) * np,
                                   cudaMemcpyHostToDevice, st));
        c->version = a->params_version;
    }
    const rows_args ra = {a->n,
                          S,
                          F,
                          d,
                          k,
                          fm,
                          dense,
                          a->E,
                          a->X,
                          a->y,
                          c->d_params + (w_off >= 0 ? w_off : 0),
                          c->d_params + (vx_off >= 0 ? vx_off : 0),
                          c->d_params + (b_off >= 0 ? b_off : 0),
                          a->scale,
                          a->dE,
                          c->d_gz,
                          c->d_sum,
                          c->d_du,
                          c->d_rowloss};
    dense_rows_kernel<<<(unsigned)((a->n + 127) / 128), 128, 0, st>>>(ra);
    CUDA_CHECK(cudaGetLastError());
    const sums_args sa = {a->n, F, k, nout, a->X, c->d_gz, c->d_du, c->d_rowloss};
    dense_sums_kernel<<<(unsigned)nout, DEV_SUM_THREADS, 0, st>>>(sa, c->d_out);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpyAsync(c->h_out, c->d_out, sizeof(double) * (size_t)nout,
                               cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    double *g = model_grads(m);
    for (int f = 0; f < F; f++)
        g[w_off + f] += c->h_out[f];
    g[b_off] += c->h_out[F];
    for (int q = 0; dense && q < k * F; q++)
        g[vx_off + q] += c->h_out[F + 1 + q];
    *loss = c->h_out[nout - 1];
    return 0;
}

int c_create(int device, void **ctx)
{
    *ctx = nullptr;
    CUDA_CHECK(cudaSetDevice(device));
    cuda_dev *c = new (std::nothrow) cuda_dev();
    if (c == nullptr)
        return KILN_ENOMEM;
    *ctx = c; /* destroy takes a half-made one */
    c->device = device;
    for (int i = 0; i < DEV_NSTREAMS; i++)
        CUDA_CHECK(cudaStreamCreateWithFlags(&c->s[i], cudaStreamNonBlocking));
    for (int i = 0; i < DEV_NEVENTS; i++)
        CUDA_CHECK(cudaEventCreateWithFlags(&c->ev[i], cudaEventDisableTiming));
    /* The backward reduce takes its scratch with cudaMallocAsync every step;
     * the default pool's release threshold (0) hands that memory back to
     * the driver at each synchronization, so every step would map it
     * again. Keep it in the pool. */
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    return 0;
}

void c_destroy(void *ctx)
{
    cuda_dev *c = C(ctx);
    if (c == nullptr)
        return;
    for (int i = 0; i < DEV_NSTREAMS; i++)
        if (c->s[i])
            (void)cudaStreamSynchronize(c->s[i]);
    dev_dlrm_destroy(c->dlrm);
    dev_xchg_destroy(c->xchg);
    if (c->to_comm)
        (void)cudaEventDestroy(c->to_comm);
    if (c->from_comm)
        (void)cudaEventDestroy(c->from_comm);
    void *dev[] = {c->d_params, c->d_gz, c->d_sum, c->d_du, c->d_rowloss, c->d_out};
    for (void *p : dev)
        if (p)
            (void)cudaFree(p);
    if (c->h_params)
        (void)cudaFreeHost(c->h_params);
    if (c->h_out)
        (void)cudaFreeHost(c->h_out);
    for (int i = 0; i < DEV_NEVENTS; i++)
        if (c->ev[i])
            (void)cudaEventDestroy(c->ev[i]);
    for (int i = 0; i < DEV_NSTREAMS; i++)
        if (c->s[i])
            (void)cudaStreamDestroy(c->s[i]);
    delete c;
}

int c_alloc(void *ctx, size_t bytes, bool host, void **p)
{
    (void)ctx;
    *p = nullptr;
    if (host)
        CUDA_CHECK(cudaHostAlloc(p, bytes ? bytes : 1, cudaHostAllocDefault));
    else
        CUDA_CHECK(cudaMalloc(p, bytes ? bytes : 1));
    return 0;
}

void c_release(void *ctx, void *p, bool host)
{
    (void)ctx;
    if (p != nullptr)
        (void)(host ? cudaFreeHost(p) : cudaFree(p));
}

int c_copy(void *ctx, int stream, void *dst, const void *src, size_t bytes)
{
    if (bytes > 0)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, C(ctx)->s[stream]));
    return 0;
}

int c_record(void *ctx, int stream, int event)
{
    CUDA_CHECK(cudaEventRecord(C(ctx)->ev[event], C(ctx)->s[stream]));
    return 0;
}

int c_wait(void *ctx, int stream, int event)
{
    CUDA_CHECK(cudaStreamWaitEvent(C(ctx)->s[stream], C(ctx)->ev[event], 0));
    return 0;
}

int c_sync(void *ctx, int event)
{
    CUDA_CHECK(cudaEventSynchronize(C(ctx)->ev[event]));
    return 0;
}

int c_host_touch(void *ctx, const void *p, size_t bytes, bool write)
{
    (void)ctx, (void)p, (void)bytes, (void)write; /* the stand-in's check; nothing to do here */
    return 0;
}

int c_gather(void *ctx, int nbags, const kern_bags_t *bags, int64_t n, int64_t ld, float *E)
{
    return kern_cuda_gather_combine(nbags, bags, n, ld, E, C(ctx)->s[DEV_COMPUTE]);
}

int c_reduce(void *ctx, int nbags, const kern_bags_t *bags, int64_t n, const int64_t *npos,
             int64_t ld, const float *dE, kern_row_grads_t *g)
{
    return kern_cuda_backward_reduce_npos(nbags, bags, n, npos, ld, dE, g, C(ctx)->s[DEV_COMPUTE]);
}

/* ---- the exchange ---- */

cudaStream_t compute(void *ctx)
{
    return C(ctx)->s[DEV_COMPUTE];
}

int c_permute(void *ctx, void *dst, const void *src, int nseg, const dev_seg_t *segs)
{
    return dev_xchg_permute(compute(ctx), dst, src, nseg, segs);
}

int c_zero(void *ctx, void *p, size_t bytes)
{
    if (bytes > 0)
        CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, compute(ctx)));
    return 0;
}

int c_dedupe(void *ctx, int ntables, const int64_t *koff, const int64_t *keys, int nranks,
             int64_t *uniq, int32_t *inv, int64_t *cnt)
{
    return dev_xchg_dedupe(&C(ctx)->xchg, compute(ctx), ntables, koff, keys, nranks, uniq, inv,
                           cnt);
}

/* The NCCL stream waits for the compute stream's work so far. */
int comm_after_compute(cuda_dev *c, shard_comm_t *comm)
{
    if (shard_comm_info(comm).kind != SHARD_COMM_NCCL)
        return kiln_errf(KILN_EINTERNAL, "the device exchange needs an NCCL communicator");
    if (c->to_comm == nullptr) {
        CUDA_CHECK(cudaEventCreateWithFlags(&c->to_comm, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&c->from_comm, cudaEventDisableTiming));
    }
    CUDA_CHECK(cudaEventRecord(c->to_comm, c->s[DEV_COMPUTE]));
    CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)shard_comm_stream(comm), c->to_comm, 0));
    return 0;
}

/* The compute stream's later work waits for the NCCL stream's. */
int compute_after_comm(cuda_dev *c, shard_comm_t *comm)
{
    CUDA_CHECK(cudaEventRecord(c->from_comm, (cudaStream_t)shard_comm_stream(comm)));
    CUDA_CHECK(cudaStreamWaitEvent(c->s[DEV_COMPUTE], c->from_comm, 0));
    return 0;
}

int c_alltoallv(void *ctx, shard_comm_t *comm, const void *send, const size_t *sc, const size_t *sd,
                void *recv, const size_t *rc, const size_t *rd)
{
    KILN_CHECK(comm_after_compute(C(ctx), comm));
    KILN_CHECK(shard_comm_alltoallv(comm, send, sc, sd, recv, rc, rd));
    return compute_after_comm(C(ctx), comm);
}

int c_allreduce_dd(void *ctx, shard_comm_t *comm, double *pairs, size_t npairs)
{
    KILN_CHECK(comm_after_compute(C(ctx), comm));
    KILN_CHECK(shard_comm_allreduce_sum_dd(comm, pairs, npairs));
    return compute_after_comm(C(ctx), comm);
}

int c_find(void *ctx, shard_store_t *s, int ntables, const int64_t *off, const int64_t *keys,
           int64_t step, bool insert, int32_t *rows)
{
    (void)ntables; /* the store's own */
    return shard_store_find_dev(s, off, keys, step, insert, rows, compute(ctx));
}

int c_read(void *ctx, shard_store_t *s, int t, int64_t n, const int32_t *rows, int dim, float *out)
{
    (void)dim;
    return shard_store_read_dev(s, t, n, rows, out, compute(ctx));
}

int c_update(void *ctx, shard_store_t *s, int ntables, const kern_opt_t *opt,
             const kern_row_grads_t *ug, int dim, int64_t step)
{
    (void)ntables, (void)dim;
    return shard_store_update_dev(s, opt, ug, step, compute(ctx));
}

int c_accum(void *ctx, int64_t n, const int32_t *rows, const float *sums, int dim, int64_t ntg,
            double *tg)
{
    (void)ntg;
    return dev_xchg_accum(compute(ctx), n, rows, sums, dim, tg);
}

int c_combine(void *ctx, int ntables, const int64_t *off, const int32_t *rows, const double *grads,
              int dim, kern_row_grads_t *out)
{
    return dev_xchg_combine(&C(ctx)->xchg, compute(ctx), ntables, off, rows, grads, dim, out);
}

} // namespace

extern "C" const dev_ops_t train_dev_cuda_ops = {
    "cuda",      c_create,       c_destroy, c_alloc, c_release, c_copy,    c_record,  c_wait,
    c_sync,      c_host_touch,   c_gather,  c_dense, c_reduce,  c_permute, c_zero,    c_dedupe,
    c_alltoallv, c_allreduce_dd, c_find,    c_read,  c_update,  c_accum,   c_combine,
};
