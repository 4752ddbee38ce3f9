/*
 * kernels/kern_cuda.cu - the CUDA backend of the fused step ops: gather +
 * combine per bag over all tables and the sparse optimizer update, with the
 * same argument shapes as kern_cpu.c but device arrays. The per-element math
 * is kern_ops.h, the same code the CPU runs. Kernels come first, their host
 * launchers after. The hash table stays on the host for now (the runtime
 * maps keys to rows there and ships row ids), and the backward reduce still
 * runs on the CPU (kern_cpu_backward_reduce).
 *
 * Fusing: a launch covers up to CHUNK tables, whose descriptors travel by
 * value as the kernel parameter (no device copy of the descriptor array);
 * blockIdx.y picks the table, blockIdx.x strides over bags or rows, and the
 * threads of a block stride over the dim floats of a row, so loads of a row
 * are coalesced.
 */
#include <cuda_runtime.h>
#include <cublas_api.h>
#include <nccl.h>

#include "kern.h"
#include "kern_ops.h"

#define CHUNK 32
#define MAX_BLOCKS_X 65536

#define CUDA_CHECK(call)                                                                  \
    do {                                                                                  \
        cudaError_t cuda_err_ = (call);                                                   \
        if (cuda_err_ != cudaSuccess)                                                     \
            return kiln_errf(KILN_ECUDA, "%s: %s (%s)", #call, cudaGetErrorString(cuda_err_), \
                             KILN_WHERE);                                                 \
    } while (0)

struct bags_chunk {
    kern_bags_t t[CHUNK];
};

struct update_chunk {
    kern_slab_t s[CHUNK];
    const int32_t *rows[CHUNK]; /* (n[t]) */
    const float *grads[CHUNK];  /* (n[t], dim) */
    int64_t n[CHUNK];
};

/* ---- kernels ------------------------------------------------------------------ */

/* grid (bags, tables of the chunk), block (threads over dim).
 * out is (nbags, out_stride). */
__global__ void gather_combine_kernel(const bags_chunk c, int64_t nbags, int64_t out_stride,
                                      float *out)
{
    const kern_bags_t &g = c.t[blockIdx.y];
    const int dim = g.dim;
    for (int64_t b = blockIdx.x; b < nbags; b += gridDim.x) {
        const int64_t s = g.offsets[b], e = g.offsets[b + 1];
        float *o = out + b * out_stride + g.out_col;
        for (int j = threadIdx.x; j < dim; j += blockDim.x) {
            float acc = 0.0f;
            for (int64_t p = s; p < e; p++)
                acc += g.values[(size_t)g.rows[p] * (size_t)dim + j];
            if (g.combine == KERN_COMBINE_MEAN && e > s)
                acc *= kern_combine_scale(g.combine, e - s);
            o[j] = acc;
        }
    }
}

/* grid (unique rows, tables of the chunk), block (threads over dim). */
__global__ void sparse_update_kernel(const update_chunk c, const kern_opt_t opt, int64_t step)
{
    const int t = blockIdx.y;
    const kern_slab_t &s = c.s[t];
    const size_t dim = (size_t)s.dim;
    for (int64_t i = blockIdx.x; i < c.n[t]; i += gridDim.x) {
        const size_t r = (size_t)c.rows[t][i];
        float *w = s.values + r * dim;
        const float *gi = c.grads[t] + (size_t)i * dim;
        uint32_t tt = 0;
        float bc1 = 1.0f, bc2 = 1.0f;
        if (opt.kind == KERN_OPT_ADAM) {
            tt = s.opt_steps[r] + 1;
            bc1 = kern_adam_bias(opt.beta1, tt);
            bc2 = kern_adam_bias(opt.beta2, tt);
        }
        for (size_t j = threadIdx.x; j < dim; j += blockDim.x) {
            if (opt.kind == KERN_OPT_SGD) {
                kern_sgd_elem(&w[j], gi[j], opt.lr);
            } else if (opt.kind == KERN_OPT_ADAGRAD) {
                kern_adagrad_elem(&w[j], &s.opt_state[r * dim + j], gi[j], opt.lr, opt.eps);
            } else {
                float *m = s.opt_state + r * 2 * dim;
                kern_adam_elem(&w[j], &m[j], &m[dim + j], gi[j], opt.lr, opt.beta1, opt.beta2,
                               opt.eps, bc1, bc2);
            }
        }
        __syncthreads(); /* every thread has read opt_steps[r] */
        if (threadIdx.x == 0) {
            if (opt.kind == KERN_OPT_ADAM)
                s.opt_steps[r] = tt;
            s.stamps[r] = step;
        }
    }
}

/* ---- launchers ------------------------------------------------------------------- */

static unsigned threads_for(int maxdim)
{
    unsigned th = (unsigned)((maxdim + 31) / 32 * 32);
    return th > 256 ? 256 : th;
}

static unsigned blocks_for(int64_t n)
{
    return (unsigned)(n < 1 ? 1 : n > MAX_BLOCKS_X ? MAX_BLOCKS_X : n);
}

extern "C" int kern_cuda_gather_combine(int ntables, const kern_bags_t *bags, int64_t nbags,
                                        int64_t out_stride, float *d_out, void *stream)
{
    if (ntables < 0 || nbags < 0 || (ntables > 0 && (!bags || !d_out)))
        return kiln_errf(KILN_EINVAL, "cuda gather: bad arguments");
    for (int t = 0; t < ntables; t++)
        if (!bags[t].values || !bags[t].offsets || bags[t].dim < 1 || bags[t].out_col < 0 ||
            bags[t].out_col + bags[t].dim > out_stride)
            return kiln_errf(KILN_EINVAL, "cuda gather: table %d has no slab/offsets or its "
                             "columns fall outside the output stride %lld",
                             t, (long long)out_stride);
    if (nbags == 0)
        return 0;
    for (int t0 = 0; t0 < ntables; t0 += CHUNK) {
        bags_chunk c;
        int nt = ntables - t0 < CHUNK ? ntables - t0 : CHUNK, maxdim = 1;
        for (int k = 0; k < nt; k++) {
            c.t[k] = bags[t0 + k];
            maxdim = c.t[k].dim > maxdim ? c.t[k].dim : maxdim;
        }
        dim3 grid(blocks_for(nbags), (unsigned)nt);
        gather_combine_kernel<<<grid, threads_for(maxdim), 0, (cudaStream_t)stream>>>(
            c, nbags, out_stride, d_out);
        CUDA_CHECK(cudaGetLastError());
    }
    return 0;
}

extern "C" int kern_cuda_sparse_update(const kern_opt_t *opt, int ntables,
                                       const kern_slab_t *slabs, const kern_row_grads_t *grads,
                                       int64_t step, void *stream)
{
    const int nstate = kern_opt_nstate(opt->kind);
    for (int t = 0; t < ntables; t++) {
        const kern_slab_t *s = &slabs[t];
        if (!s->values || !s->stamps || s->nstate != nstate || (nstate > 0 && !s->opt_state) ||
            (opt->kind == KERN_OPT_ADAM && !s->opt_steps))
            return kiln_errf(KILN_EINVAL,
                             "cuda update: table %d does not carry the state of this "
                             "optimizer (it has %d state floats per element, the optimizer "
                             "needs %d)",
                             t, s->nstate, nstate);
    }
    for (int t0 = 0; t0 < ntables; t0 += CHUNK) {
        update_chunk c;
        int nt = ntables - t0 < CHUNK ? ntables - t0 : CHUNK, maxdim = 1;
        int64_t maxn = 0;
        for (int k = 0; k < nt; k++) {
            c.s[k] = slabs[t0 + k];
            c.rows[k] = grads[t0 + k].rows;
            c.grads[k] = grads[t0 + k].grads;
            c.n[k] = grads[t0 + k].n;
            maxdim = c.s[k].dim > maxdim ? c.s[k].dim : maxdim;
            maxn = c.n[k] > maxn ? c.n[k] : maxn;
        }
        if (maxn == 0)
            continue;
        dim3 grid(blocks_for(maxn), (unsigned)nt);
        sparse_update_kernel<<<grid, threads_for(maxdim), 0, (cudaStream_t)stream>>>(c, *opt,
                                                                                     step);
        CUDA_CHECK(cudaGetLastError());
    }
    return 0;
}

extern "C" void kern_cuda_versions(int *runtime, int *cublas, int *nccl)
{
    int v = 0, major = 0, minor = 0, patch = 0;
    *runtime = cudaRuntimeGetVersion(&v) == cudaSuccess ? v : 0;
    if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
        *cublas = major * 10000 + minor * 100 + patch;
    else
        *cublas = 0;
    *nccl = ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

extern "C" int kern_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* forget the sticky-free error */
        return 0;
    }
    return n;
}
