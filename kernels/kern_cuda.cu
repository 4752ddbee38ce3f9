/*
 * kernels/kern_cuda.cu - the CUDA backend (kern_cuda.h): the fused step ops
 * with the shapes of kern_cpu.c but device arrays (gather + combine,
 * backward reduce, sparse optimizer update), and the GPU hash table whose
 * slab those ops read. The per-element math is kern_ops.h, the code the CPU
 * backend runs: the seeded row initializer, the key hash and bucket index,
 * the eviction priority, the combine scale and the optimizer element steps.
 * Each kernel sits just above its host launcher; every launch is followed
 * by a cudaGetLastError check.
 *
 * Fusing: a launch covers up to CHUNK tables, whose descriptors travel by
 * value as the kernel parameter (no device copy of the descriptor array);
 * blockIdx.y picks the table, blockIdx.x strides over bags, rows or tiles,
 * and the threads of a block stride over the dim floats of a row, so loads
 * of a row are coalesced (the gather's float4 kernel: a group of lanes per
 * bag instead, where dims and columns allow).
 *
 * The table: buckets of 32 slots, a warp per key. A key's slot is found by
 * one coalesced read of its bucket and a ballot; a missing key claims the
 * first free slot with atomicCAS on the key word (a lost race re-reads the
 * bucket; slots only fill during this pass, so two copies of a key always
 * race for the same slot). Keys whose bucket is full go to a second pass
 * that takes a per-bucket lock and replaces the bucket's lowest-priority row
 * not used at this step. docs/gpu.md has the design and its limits.
 */
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>
#include <cublas_api.h>
#include <cuda_runtime.h>
#include <float.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_cuda.h"
#include "kern_ops.h"
#include "kiln_cuda.h"

#define CHUNK 32
#define MAX_BLOCKS_X 65536
#define WARP_ALL 0xffffffffu
#define WARPS_PER_BLOCK 4 /* keys in flight per block of the table kernels */

static unsigned threads_for(int maxdim)
{
    unsigned th = (unsigned)((maxdim + 31) / 32 * 32);
    return th > 256 ? 256 : th;
}

static unsigned blocks_for(int64_t n)
{
    return (unsigned)(n < 1 ? 1 : n > MAX_BLOCKS_X ? MAX_BLOCKS_X : n);
}

/* Checks what every fused op needs of a table's batch (host side). */
static int check_bags(const char *op, int ntables, const kern_bags_t *bags, int64_t nbags,
                      int64_t out_stride)
{
    if (ntables < 0 || nbags < 0 || (ntables > 0 && !bags))
        return kiln_errf(KILN_EINVAL, "cuda %s: bad table count %d or bag count %lld", op,
                         ntables, (long long)nbags);
    /* A table without a slab is fine when none of its bags holds a row
     * (a column empty in every row of the batch). The offsets live on the
     * device, so that cannot be checked here: the caller passes a slab
     * whenever a table has positions. */
    for (int t = 0; t < ntables; t++)
        if (!bags[t].offsets || bags[t].dim < 1 || bags[t].out_col < 0 ||
            bags[t].out_col + bags[t].dim > out_stride)
            return kiln_errf(KILN_EINVAL, "cuda %s: table %d has no offsets or its "
                             "columns fall outside the output stride %lld",
                             op, t, (long long)out_stride);
    return 0;
}

/* ==== fused step ops ============================================================= */

struct bags_chunk {
    kern_bags_t t[CHUNK];
};

/* grid (bags, tables of the chunk), block (threads over dim).
 * out is (nbags, out_stride). */
static __global__ void gather_combine_kernel(const bags_chunk c, int64_t nbags, int64_t out_stride,
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

/* The vector path: a group of L lanes (a power of two up to a warp) per
 * bag, each lane summing float4 columns. All the positions of a bag are
 * summed in order from zero, as the scalar kernel and the CPU do, so the
 * result is the same to the bit; the row ids of four positions are read
 * before their rows, so a lane has four row loads in flight instead of one.
 * For tables whose dims are multiples of 4 and whose slab and output
 * columns are 16-byte aligned (kern_cuda_gather_combine checks). */
static __device__ __forceinline__ void add4(float4 &a, const float4 v)
{
    a.x += v.x;
    a.y += v.y;
    a.z += v.z;
    a.w += v.w;
}

template <int L>
static __global__ void gather_combine_vec_kernel(const bags_chunk c, int64_t nbags,
                                                 int64_t out_stride, float *out)
{
    const kern_bags_t &g = c.t[blockIdx.y];
    const int d4 = g.dim >> 2, lane = (int)(threadIdx.x & (L - 1));
    const int64_t per_block = blockDim.x / L, step = (int64_t)gridDim.x * per_block;
    const float4 *values = (const float4 *)g.values;
    for (int64_t b = (int64_t)blockIdx.x * per_block + threadIdx.x / L; b < nbags; b += step) {
        const int64_t s = g.offsets[b], e = g.offsets[b + 1];
        float4 *o = (float4 *)(out + b * out_stride + g.out_col);
        for (int j = lane; j < d4; j += L) {
            float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            int64_t p = s;
            for (; p + 4 <= e; p += 4) {
                const size_t r0 = (size_t)g.rows[p], r1 = (size_t)g.rows[p + 1],
                             r2 = (size_t)g.rows[p + 2], r3 = (size_t)g.rows[p + 3];
                const float4 v0 = __ldg(values + r0 * d4 + j), v1 = __ldg(values + r1 * d4 + j),
                             v2 = __ldg(values + r2 * d4 + j), v3 = __ldg(values + r3 * d4 + j);
                add4(acc, v0);
                add4(acc, v1);
                add4(acc, v2);
                add4(acc, v3);
            }
            for (; p < e; p++)
                add4(acc, __ldg(values + (size_t)g.rows[p] * d4 + j));
            if (g.combine == KERN_COMBINE_MEAN && e > s) {
                const float sc = kern_combine_scale(g.combine, e - s);
                acc.x *= sc;
                acc.y *= sc;
                acc.z *= sc;
                acc.w *= sc;
            }
            o[j] = acc;
        }
    }
}

#define VEC_THREADS 256

/* Launches the vector kernel when the chunk allows it; 1 if it did. */
static int gather_vec(const bags_chunk &c, int nt, int maxdim, int64_t nbags, int64_t out_stride,
                      float *d_out, cudaStream_t stream)
{
    if (out_stride % 4 || (uintptr_t)d_out % 16)
        return 0;
    for (int k = 0; k < nt; k++)
        if (c.t[k].dim % 4 || c.t[k].out_col % 4 || (uintptr_t)c.t[k].values % 16)
            return 0;
    int lanes = 1;
    while (lanes < 32 && lanes * 4 < maxdim)
        lanes *= 2;
    dim3 grid(blocks_for((nbags + VEC_THREADS / lanes - 1) / (VEC_THREADS / lanes)), (unsigned)nt);
    switch (lanes) {
#define VEC_CASE(n)                                                                              \
    case n:                                                                                      \
        gather_combine_vec_kernel<n><<<grid, VEC_THREADS, 0, stream>>>(c, nbags, out_stride, d_out); \
        break;
        VEC_CASE(1)
        VEC_CASE(2)
        VEC_CASE(4)
        VEC_CASE(8)
        VEC_CASE(16)
        VEC_CASE(32)
#undef VEC_CASE
    }
    return 1;
}

extern "C" int kern_cuda_gather_combine(int ntables, const kern_bags_t *bags, int64_t nbags,
                                        int64_t out_stride, float *d_out, void *stream)
{
    KILN_CHECK(check_bags("gather", ntables, bags, nbags, out_stride));
    if (ntables > 0 && !d_out)
        return kiln_errf(KILN_EINVAL, "cuda gather: no output array");
    if (nbags == 0)
        return 0;
    for (int t0 = 0; t0 < ntables; t0 += CHUNK) {
        bags_chunk c;
        int nt = ntables - t0 < CHUNK ? ntables - t0 : CHUNK, maxdim = 1;
        for (int k = 0; k < nt; k++) {
            c.t[k] = bags[t0 + k];
            maxdim = c.t[k].dim > maxdim ? c.t[k].dim : maxdim;
        }
        if (!gather_vec(c, nt, maxdim, nbags, out_stride, d_out, (cudaStream_t)stream)) {
            dim3 grid(blocks_for(nbags), (unsigned)nt);
            gather_combine_kernel<<<grid, threads_for(maxdim), 0, (cudaStream_t)stream>>>(
                c, nbags, out_stride, d_out);
        }
        CUDA_CHECK(cudaGetLastError());
    }
    return 0;
}

/* ---- backward reduce --------------------------------------------------------------
 * Per table, in a fixed order, so that every run gives the same bits and
 * those of kern_cpu_backward_reduce:
 *   1. prep: every position p gets its bag (bag_of[p]) and pos[p] = p, and a
 *      row outside the slab raises the bad flag;
 *   2. a stable radix sort of the (row, position) pairs by row (cub), so
 *      each row's positions stay ascending: bag order, as on the CPU;
 *   3. run-length encoding of the sorted rows: the unique rows (ascending,
 *      straight into grads.rows), the positions per row and their number;
 *   4. an exclusive scan of those counts: where each row's segment starts;
 *   5. a segmented sum, a block per unique row and a thread per dim float,
 *      adding go * scale in position order with round-to-nearest multiply
 *      and add (no fused multiply-add, which would round differently from
 *      the CPU's `acc += go * sc`).
 * Scratch is O(positions) of the largest table (cudaMallocAsync, reused
 * table after table on the stream). Two synchronizations: one to learn the
 * tables' position counts (offsets live on the device; none where the
 * caller passes them, kern_cuda_backward_reduce_npos), one at the end for
 * the unique-row counts and the bad flag. */

/* grid (bags), block (threads over the bag's positions). */
static __global__ void reduce_prep_kernel(const kern_bags_t g, int64_t nbags, int64_t npos,
                                          int32_t *bag_of, int32_t *pos, int32_t *bad)
{
    if (blockIdx.x == 0 && threadIdx.x == 0 && g.offsets[nbags] != npos)
        *bad = 1; /* the caller's count (kern_cuda_backward_reduce_npos) is not the offsets' */
    for (int64_t b = blockIdx.x; b < nbags; b += gridDim.x) {
        const int64_t s = g.offsets[b], e = g.offsets[b + 1];
        if (e < s && threadIdx.x == 0)
            *bad = 1;
        for (int64_t p = s + threadIdx.x; p < e; p += blockDim.x) {
            bag_of[p] = (int32_t)b;
            pos[p] = (int32_t)p;
            if (g.rows[p] < 0 || g.rows[p] >= g.capacity)
                *bad = 1;
        }
    }
}

/* grid (unique rows), block (threads over dim). grad_out is (nbags,
 * out_stride); seg/count/pos describe the sorted positions of each unique
 * row; grads is (nuniq, dim). */
static __global__ void reduce_segments_kernel(const kern_bags_t g, const int32_t *nuniq,
                                              const int32_t *seg, const int32_t *count,
                                              const int32_t *pos, const int32_t *bag_of,
                                              int64_t out_stride, const float *grad_out,
                                              float *grads)
{
    const size_t dim = (size_t)g.dim;
    for (int64_t u = blockIdx.x; u < *nuniq; u += gridDim.x) {
        const int32_t i0 = seg[u], i1 = seg[u] + count[u];
        for (size_t j = threadIdx.x; j < dim; j += blockDim.x) {
            float acc = 0.0f;
            for (int32_t i = i0; i < i1; i++) {
                const int64_t b = bag_of[pos[i]];
                const float sc = kern_combine_scale(g.combine, g.offsets[b + 1] - g.offsets[b]);
                acc = __fadd_rn(acc, __fmul_rn(grad_out[b * out_stride + g.out_col + j], sc));
            }
            grads[(size_t)u * dim + j] = acc;
        }
    }
}

/* The cub temporary storage the three passes need for n positions. */
static int reduce_temp_bytes(int n, int end_bit, size_t *bytes)
{
    size_t a = 0, b = 0, c = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, a, (const int32_t *)NULL, (int32_t *)NULL,
                                               (const int32_t *)NULL, (int32_t *)NULL, n, 0,
                                               end_bit));
    CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(NULL, b, (const int32_t *)NULL, (int32_t *)NULL,
                                                  (int32_t *)NULL, (int32_t *)NULL, n));
    CUDA_CHECK(cub::DeviceScan::ExclusiveSum(NULL, c, (const int32_t *)NULL, (int32_t *)NULL, n));
    *bytes = a > b ? (a > c ? a : c) : (b > c ? b : c);
    return 0;
}

/* Bits a sort needs for row ids below capacity. */
static int row_bits(int64_t capacity)
{
    int bits = 1;
    while (bits < 31 && ((int64_t)1 << bits) < capacity)
        bits++;
    return bits;
}

/* kern_cuda_backward_reduce with npos: the position counts from the host
 * (known), or NULL to read them from the device offsets. */
static int backward_reduce(int ntables, const kern_bags_t *bags, int64_t nbags,
                           const int64_t *known, int64_t out_stride, const float *d_grad_out,
                           kern_row_grads_t *grads /* OUT (ntables) */, void *stream)
{
    KILN_CHECK(check_bags("backward", ntables, bags, nbags, out_stride));
    for (int t = 0; t < ntables; t++) {
        grads[t].n = 0;
        if (nbags > 0 && (!grads[t].rows || !grads[t].grads || !bags[t].rows || !d_grad_out))
            return kiln_errf(KILN_EINVAL, "cuda backward: table %d has no rows, gradient "
                             "input or output arrays", t);
    }
    if (nbags == 0 || ntables == 0)
        return 0;
    if (nbags > INT32_MAX)
        return kiln_errf(KILN_EINVAL, "cuda backward: %lld bags (at most %d)", (long long)nbags,
                         INT32_MAX);
    cudaStream_t st = (cudaStream_t)stream;
    int rc = 0;
    int64_t *nnz = (int64_t *)kiln_calloc((size_t)ntables, sizeof *nnz);
    int32_t *hn = (int32_t *)kiln_calloc((size_t)ntables + 1, sizeof *hn);
    char *d_scr = NULL;
    int32_t *d_n = NULL; /* (ntables + 1) unique rows per table, then the bad flag */
    if (nnz == NULL || hn == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    if (known != NULL) {
        memcpy(nnz, known, sizeof(int64_t) * (size_t)ntables);
    } else {
        for (int t = 0; t < ntables; t++)
            CUDA_CHECK_GOTO(cudaMemcpyAsync(&nnz[t], bags[t].offsets + nbags, sizeof(int64_t),
                                            cudaMemcpyDeviceToHost, st),
                            rc, out);
        CUDA_CHECK_GOTO(cudaStreamSynchronize(st), rc, out);
    }
    {
        int64_t most = 0;
        size_t temp = 0;
        for (int t = 0; t < ntables; t++) {
            if (nnz[t] > INT32_MAX) {
                rc = kiln_errf(KILN_EINVAL,
                               "cuda backward: table %d has %lld positions "
                               "(at most %d)",
                               t, (long long)nnz[t], INT32_MAX);
                goto out;
            }
            most = nnz[t] > most ? nnz[t] : most;
            size_t tb = 0;
            KILN_CHECK_GOTO(reduce_temp_bytes((int)nnz[t], row_bits(bags[t].capacity), &tb), rc,
                            out);
            temp = tb > temp ? tb : temp;
        }
        /* d_n, then bag_of, pos, pos_sorted, rows_sorted, count, seg: (m) int32
         * each, then cub's storage at a 256-byte boundary */
        const size_t m = (size_t)(most > 0 ? most : 1), head = (size_t)ntables + 1;
        const size_t temp_at = (sizeof(int32_t) * (head + 6 * m) + 255) / 256 * 256;
        CUDA_CHECK_GOTO(cudaMallocAsync((void **)&d_scr, temp_at + temp, st), rc, out);
        CUDA_CHECK_GOTO(cudaMemsetAsync(d_scr, 0, sizeof(int32_t) * head, st), rc, out);
        d_n = (int32_t *)d_scr;
        int32_t *bag_of = d_n + head, *pos = bag_of + m, *pos_sorted = pos + m,
                *rows_sorted = pos_sorted + m, *count = rows_sorted + m, *seg = count + m;
        void *d_temp = d_scr + temp_at;
        for (int t = 0; t < ntables; t++) {
            const kern_bags_t &g = bags[t];
            const int n = (int)nnz[t];
            int32_t *d_nuniq = &d_n[t];
            if (n == 0)
                continue;
            size_t tb = temp;
            reduce_prep_kernel<<<blocks_for(nbags), 128, 0, st>>>(g, nbags, nnz[t], bag_of, pos,
                                                                  &d_n[ntables]);
            CUDA_CHECK_GOTO(cudaGetLastError(), rc, out);
            CUDA_CHECK_GOTO(cub::DeviceRadixSort::SortPairs(d_temp, tb, g.rows, rows_sorted, pos,
                                                            pos_sorted, n, 0, row_bits(g.capacity),
                                                            st),
                            rc, out);
            tb = temp;
            CUDA_CHECK_GOTO(cub::DeviceRunLengthEncode::Encode(
                                d_temp, tb, rows_sorted, grads[t].rows, count, d_nuniq, n, st),
                            rc, out);
            tb = temp;
            CUDA_CHECK_GOTO(cub::DeviceScan::ExclusiveSum(d_temp, tb, count, seg, n, st), rc, out);
            reduce_segments_kernel<<<blocks_for(n), threads_for(g.dim), 0, st>>>(
                g, d_nuniq, seg, count, pos_sorted, bag_of, out_stride, d_grad_out, grads[t].grads);
            CUDA_CHECK_GOTO(cudaGetLastError(), rc, out);
        }
    }
    CUDA_CHECK_GOTO(cudaMemcpyAsync(hn, d_n, sizeof(int32_t) * (size_t)(ntables + 1),
                                    cudaMemcpyDeviceToHost, st),
                    rc, out);
    CUDA_CHECK_GOTO(cudaStreamSynchronize(st), rc, out);
    if (hn[ntables]) {
        rc = kiln_errf(KILN_EINVAL, "cuda backward: a bag has decreasing offsets, a row id "
                                    "outside its table's slab, or its offsets end elsewhere "
                                    "than the position count given");
        goto out;
    }
    for (int t = 0; t < ntables; t++)
        grads[t].n = hn[t];
out:
    if (d_scr != NULL)
        (void)cudaFreeAsync(d_scr, st);
    free(nnz);
    free(hn);
    return rc;
}

extern "C" int kern_cuda_backward_reduce(int ntables, const kern_bags_t *bags, int64_t nbags,
                                         int64_t out_stride, const float *d_grad_out,
                                         kern_row_grads_t *grads /* OUT (ntables) */, void *stream)
{
    return backward_reduce(ntables, bags, nbags, NULL, out_stride, d_grad_out, grads, stream);
}

extern "C" int kern_cuda_backward_reduce_npos(int ntables, const kern_bags_t *bags, int64_t nbags,
                                              const int64_t *npos, int64_t out_stride,
                                              const float *d_grad_out,
                                              kern_row_grads_t *grads /* OUT (ntables) */,
                                              void *stream)
{
    return backward_reduce(ntables, bags, nbags, npos, out_stride, d_grad_out, grads, stream);
}

/* ---- sparse optimizer update ------------------------------------------------------ */

struct update_chunk {
    kern_slab_t s[CHUNK];
    const int32_t *rows[CHUNK]; /* (n[t]) */
    const float *grads[CHUNK];  /* (n[t], dim) */
    int64_t n[CHUNK];
};

/* grid (unique rows, tables of the chunk), block (threads over dim). */
static __global__ void sparse_update_kernel(const update_chunk c, const kern_opt_t opt,
                                            int64_t step)
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

extern "C" int kern_cuda_sparse_update(const kern_opt_t *opt, int ntables,
                                       const kern_slab_t *slabs, const kern_row_grads_t *grads,
                                       int64_t step, void *stream)
{
    for (int t = 0; t < ntables; t++)
        KILN_CHECK(kern_slab_check_opt(&slabs[t], opt->kind, t, "cuda update"));
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

/* ==== the GPU hash table ============================================================ */

/* What the kernels need of a table, passed by value. Per slot s: keys[s],
 * values (dim), opt (nstate*dim), stamps[s] (-1 free), opt_steps (adam),
 * used[s] (step of the last use, -1 never) and freq[s] (lfu use count). */
struct table_dev {
    int64_t *keys;
    float *values;
    float *opt;
    int64_t *stamps;
    uint32_t *opt_steps;
    int64_t *used;
    uint32_t *freq;
    int *locks; /* (nbuckets) 0 free, 1 held (second pass only) */
    int64_t nbuckets;
    int dim, nstate, init, evict;
    float init_scale;
    float opt_init; /* a fresh slot's optimizer state (adagrad's accumulator; 0 otherwise) */
    uint64_t seed;
};

/* Counters of one find_or_insert / export call, in device memory. */
struct counters {
    unsigned long long nnew;   /* slots the first pass filled (ids in newslots) */
    unsigned long long npend;  /* keys the first pass found no room for */
    unsigned long long nfill;  /* free slots the second pass filled */
    unsigned long long nevict; /* rows the second pass evicted (in the log) */
    unsigned long long nfull;  /* keys whose bucket had nothing evictable */
    unsigned long long nout;   /* rows the export scan found */
    unsigned long long badkey; /* reserved keys seen */
};

struct kern_cuda_table {
    char *name;
    table_dev d;
    kern_opt_kind_t opt;
    int64_t nslots;
    counters *d_ctr;
    counters *h_ctr;       /* pinned: where the counters come back */
    int64_t *d_scratch;    /* (2 * scratch_cap): new slots, then pending key indices */
    kern_evicted_t *d_log; /* (scratch_cap) */
    int64_t scratch_cap;
    int64_t size;
    kern_evicted_t *log; /* host copy of the evictions */
    int64_t nlog, caplog;
};

__device__ static inline int64_t load_i64(const int64_t *p)
{
    return *(const volatile int64_t *)p;
}

static __device__ __host__ int64_t bucket_of(int64_t key, int64_t nbuckets)
{
    return (int64_t)kern_hash_index(kern_key_hash(key), (uint64_t)nbuckets);
}

/* The warp writes key's seeded initial row into slot s, a fresh optimizer
 * state (opt_init: adagrad's initial accumulator, else 0) and stamps it with
 * step. */
__device__ static void init_slot(const table_dev &d, int64_t s, int64_t key, int64_t step,
                                 int lane)
{
    const size_t dim = (size_t)d.dim, sdim = dim * (size_t)d.nstate;
    for (size_t j = lane; j < dim; j += 32)
        d.values[(size_t)s * dim + j] = kern_init_elem(d.init, d.init_scale, d.seed, key, (int)j);
    for (size_t j = lane; j < sdim; j += 32)
        d.opt[(size_t)s * sdim + j] = d.opt_init;
    if (lane == 0) {
        if (d.opt_steps)
            d.opt_steps[s] = 0;
        d.stamps[s] = step;
    }
}

/* Counts a use of slot s at step (one thread). */
__device__ static inline void touch_slot(const table_dev &d, int64_t s, int64_t step)
{
    d.used[s] = step;
    if (d.freq && d.freq[s] < KERN_FREQ_MAX)
        atomicAdd(&d.freq[s], 1u);
}

/* First pass, a warp per key: find the key in its bucket or claim a free
 * slot by atomicCAS. insert = 0 only looks (no use counted). Keys without
 * room get row -1 and their index in pending. */
static __global__ void table_find_insert_kernel(const table_dev d, int64_t n, const int64_t *keys,
                                                int64_t step, int insert, int32_t *rows,
                                                int64_t *newslots, int64_t *pending, counters *ctr)
{
    const int lane = threadIdx.x & 31;
    const int64_t nw = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t i = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; i < n;
         i += nw) {
        const int64_t key = keys[i];
        if (key == KERN_CUDA_EMPTY_KEY) {
            if (lane == 0) {
                rows[i] = -1;
                if (ctr)
                    atomicAdd(&ctr->badkey, 1ull);
            }
            continue;
        }
        const int64_t b = bucket_of(key, d.nbuckets);
        int64_t *bk = d.keys + b * KERN_CUDA_BUCKET; /* (32) */
        int at = -1, fresh = 0;
        for (;;) {
            const int64_t k = load_i64(&bk[lane]);
            const unsigned hit = __ballot_sync(WARP_ALL, k == key);
            if (hit) {
                at = __ffs(hit) - 1;
                break;
            }
            const unsigned empty = __ballot_sync(WARP_ALL, k == KERN_CUDA_EMPTY_KEY);
            if (!insert || !empty)
                break;
            const int e = __ffs(empty) - 1;
            unsigned long long old = 0;
            if (lane == e)
                old = atomicCAS((unsigned long long *)&bk[e],
                                (unsigned long long)KERN_CUDA_EMPTY_KEY, (unsigned long long)key);
            old = __shfl_sync(WARP_ALL, old, e);
            if ((int64_t)old == KERN_CUDA_EMPTY_KEY || (int64_t)old == key) {
                at = e;
                fresh = (int64_t)old == KERN_CUDA_EMPTY_KEY;
                break;
            }
            /* Another key took the slot: read the bucket again. */
        }
        if (at < 0) {
            if (lane == 0) {
                rows[i] = -1;
                if (insert)
                    pending[atomicAdd(&ctr->npend, 1ull)] = i;
            }
            continue;
        }
        const int64_t s = b * KERN_CUDA_BUCKET + at;
        if (fresh)
            init_slot(d, s, key, step, lane);
        if (lane == 0) {
            rows[i] = (int32_t)s;
            if (fresh)
                newslots[atomicAdd(&ctr->nnew, 1ull)] = s;
            if (insert)
                touch_slot(d, s, step);
        }
    }
}

/* Second pass, a warp per pending key, under its bucket's lock: the key
 * (inserted meanwhile by another copy), else a free slot, else the slot of
 * lowest kern_evict_priority not used at step, whose key goes to the log. */
static __global__ void table_evict_insert_kernel(const table_dev d, int64_t npend,
                                                 const int64_t *pending, const int64_t *keys,
                                                 int64_t step, int32_t *rows, kern_evicted_t *log,
                                                 counters *ctr)
{
    const int lane = threadIdx.x & 31;
    const int64_t nw = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t q = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; q < npend;
         q += nw) {
        const int64_t i = pending[q], key = keys[i];
        const int64_t b = bucket_of(key, d.nbuckets), s0 = b * KERN_CUDA_BUCKET;
        if (lane == 0)
            while (atomicCAS(&d.locks[b], 0, 1) != 0) {
            }
        __syncwarp();
        __threadfence();
        const int64_t k = load_i64(&d.keys[s0 + lane]);
        const unsigned hit = __ballot_sync(WARP_ALL, k == key);
        const unsigned empty = __ballot_sync(WARP_ALL, k == KERN_CUDA_EMPTY_KEY);
        int at;
        if (hit) {
            at = __ffs(hit) - 1;
        } else if (empty) {
            at = __ffs(empty) - 1;
        } else {
            const int64_t u = load_i64(&d.used[s0 + lane]);
            unsigned long long best = ~0ull;
            if (u != step) {
                const uint32_t age = u > step || step - u > (int64_t)KERN_AGE_MAX
                                         ? KERN_AGE_MAX
                                         : (uint32_t)(step - u);
                const uint32_t f = d.freq ? ((const volatile uint32_t *)d.freq)[s0 + lane] : 0;
                best = (unsigned long long)kern_evict_priority(d.evict, age, f) << 32 |
                       (unsigned)lane;
            }
            for (int o = 16; o > 0; o >>= 1) {
                const unsigned long long x = __shfl_xor_sync(WARP_ALL, best, o);
                best = x < best ? x : best;
            }
            at = best == ~0ull ? -1 : (int)(best & 31);
        }
        const int64_t s = s0 + at;
        if (at < 0) {
            if (lane == 0) {
                rows[i] = -1;
                atomicAdd(&ctr->nfull, 1ull);
            }
        } else if (!hit) {
            if (lane == 0) {
                const int64_t old = load_i64(&d.keys[s]);
                if (old != KERN_CUDA_EMPTY_KEY) {
                    kern_evicted_t *ev = &log[atomicAdd(&ctr->nevict, 1ull)];
                    ev->key = old;
                    ev->stamp = load_i64(&d.stamps[s]);
                    ev->step = step;
                } else {
                    atomicAdd(&ctr->nfill, 1ull);
                }
                *(volatile int64_t *)&d.keys[s] = key;
                if (d.freq)
                    d.freq[s] = 0;
            }
            __syncwarp();
            init_slot(d, s, key, step, lane);
        }
        __syncwarp();
        if (at >= 0 && lane == 0) {
            rows[i] = (int32_t)s;
            touch_slot(d, s, step);
        }
        __threadfence();
        __syncwarp();
        if (lane == 0)
            atomicExch(&d.locks[b], 0);
        __syncwarp();
    }
}

/* Frees the slots newslots (n) that the first pass of a refused call filled. */
static __global__ void table_rollback_kernel(const table_dev d, int64_t n, const int64_t *newslots)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t s = newslots[i];
        d.stamps[s] = -1;
        d.used[s] = -1;
        if (d.freq)
            d.freq[s] = 0;
        d.keys[s] = KERN_CUDA_EMPTY_KEY;
    }
}

/* Sets p[0..n) to v. */
static __global__ void fill_i64_kernel(int64_t *p, int64_t n, int64_t v)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        p[i] = v;
}

/* The device arrays of a table of this shape; the one list that create and
 * destroy walk. fill: the byte every array starts as (keys: a kernel). */
typedef struct {
    void **p;
    size_t bytes;
    int fill;
} dev_array_t;

#define MAX_DEV_ARRAYS 9

static int table_arrays(kern_cuda_table_t *t, dev_array_t a[MAX_DEV_ARRAYS] /* OUT */)
{
    const size_t ns = (size_t)t->nslots, dim = (size_t)t->d.dim;
    int n = 0;
    a[n++] = (dev_array_t){(void **)&t->d.keys, sizeof(int64_t) * ns, 0};
    a[n++] = (dev_array_t){(void **)&t->d.values, sizeof(float) * ns * dim, 0};
    a[n++] = (dev_array_t){(void **)&t->d.stamps, sizeof(int64_t) * ns, 0xff};
    a[n++] = (dev_array_t){(void **)&t->d.used, sizeof(int64_t) * ns, 0xff};
    a[n++] = (dev_array_t){(void **)&t->d.locks, sizeof(int) * (size_t)t->d.nbuckets, 0};
    a[n++] = (dev_array_t){(void **)&t->d_ctr, sizeof(counters), 0};
    if (t->d.nstate > 0)
        a[n++] = (dev_array_t){(void **)&t->d.opt, sizeof(float) * ns * dim * (size_t)t->d.nstate,
                               0};
    if (t->opt == KERN_OPT_ADAM)
        a[n++] = (dev_array_t){(void **)&t->d.opt_steps, sizeof(uint32_t) * ns, 0};
    if (t->d.evict == KERN_EVICT_LFU)
        a[n++] = (dev_array_t){(void **)&t->d.freq, sizeof(uint32_t) * ns, 0};
    return n;
}

extern "C" void kern_cuda_table_destroy(kern_cuda_table_t *t)
{
    if (!t)
        return;
    cudaDeviceSynchronize();
    dev_array_t arr[MAX_DEV_ARRAYS];
    const int narr = table_arrays(t, arr);
    for (int i = 0; i < narr; i++)
        cudaFree(*arr[i].p);
    cudaFree(t->d_scratch);
    cudaFree(t->d_log);
    cudaFreeHost(t->h_ctr);
    free(t->log);
    free(t->name);
    free(t);
}

extern "C" int kern_cuda_table_create(const kern_table_config_t *cfg,
                                      kern_cuda_table_t **out /* OUT */)
{
    int rc = 0;
    *out = NULL;
    const char *name = cfg->name ? cfg->name : "?";
    if (cfg->dim < 1 || cfg->dim > KERN_MAX_DIM || cfg->capacity < 1 ||
        cfg->capacity > KERN_MAX_CAPACITY || (unsigned)cfg->opt > KERN_OPT_ADAM ||
        (unsigned)cfg->init > KERN_INIT_NORMAL || (unsigned)cfg->evict > KERN_EVICT_LFU)
        return kiln_errf(KILN_EINVAL, "GPU table '%s': dim %d (1..%d), capacity %lld "
                         "(1..%lld) or the optimizer, init or eviction kind is out of range",
                         name, cfg->dim, KERN_MAX_DIM, (long long)cfg->capacity,
                         (long long)KERN_MAX_CAPACITY);
    if (!(cfg->opt_init >= 0.0f && cfg->opt_init <= FLT_MAX))
        return kiln_errf(KILN_EINVAL,
                         "GPU table '%s': the initial accumulator %g must be finite and >= 0", name,
                         (double)cfg->opt_init);
    kern_cuda_table_t *t = (kern_cuda_table_t *)kiln_calloc(1, sizeof *t);
    if (!t)
        return KILN_ENOMEM;
    t->opt = cfg->opt;
    t->d.nbuckets = (cfg->capacity + KERN_CUDA_BUCKET - 1) / KERN_CUDA_BUCKET;
    t->nslots = t->d.nbuckets * KERN_CUDA_BUCKET;
    t->d.dim = cfg->dim;
    t->d.nstate = kern_opt_nstate(cfg->opt);
    t->d.init = cfg->init;
    t->d.evict = cfg->evict;
    t->d.init_scale = cfg->init_scale;
    t->d.opt_init = cfg->opt == KERN_OPT_ADAGRAD ? cfg->opt_init : 0.0f;
    t->d.seed = cfg->seed;
    dev_array_t arr[MAX_DEV_ARRAYS];
    const int narr = table_arrays(t, arr);
    if (!(t->name = kiln_strdup(name))) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int i = 0; i < narr; i++) {
        cudaError_t e = cudaMalloc(arr[i].p, arr[i].bytes);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            rc = kiln_errf(KILN_ECUDA, "GPU table '%s': cannot allocate %zu bytes of device "
                           "memory (%s) for %lld slots; lower model.embedding.capacity",
                           name, arr[i].bytes, cudaGetErrorString(e), (long long)t->nslots);
            goto out;
        }
        CUDA_CHECK_GOTO(cudaMemset(*arr[i].p, arr[i].fill, arr[i].bytes), rc, out);
    }
    CUDA_CHECK_GOTO(cudaHostAlloc((void **)&t->h_ctr, sizeof(counters), cudaHostAllocDefault), rc,
                    out);
    fill_i64_kernel<<<blocks_for((t->nslots + 255) / 256), 256>>>(t->d.keys, t->nslots,
                                                                   KERN_CUDA_EMPTY_KEY);
    CUDA_CHECK_GOTO(cudaGetLastError(), rc, out);
    CUDA_CHECK_GOTO(cudaDeviceSynchronize(), rc, out);
    *out = t;
    t = NULL;
out:
    kern_cuda_table_destroy(t);
    return rc;
}

/* Copies the counters back; synchronizes st. */
static int read_counters(const kern_cuda_table_t *t, counters *h /* OUT */, cudaStream_t st)
{
    CUDA_CHECK(cudaMemcpyAsync(h, t->d_ctr, sizeof *h, cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    return 0;
}

/* Makes the per-call scratch hold n keys. */
static int reserve_scratch(kern_cuda_table_t *t, int64_t n)
{
    if (n <= t->scratch_cap)
        return 0;
    CUDA_CHECK(cudaDeviceSynchronize()); /* the old scratch may be in use */
    cudaFree(t->d_scratch);
    cudaFree(t->d_log);
    t->d_scratch = NULL;
    t->d_log = NULL;
    t->scratch_cap = 0;
    CUDA_CHECK(cudaMalloc((void **)&t->d_scratch, sizeof(int64_t) * 2 * (size_t)n));
    CUDA_CHECK(cudaMalloc((void **)&t->d_log, sizeof(kern_evicted_t) * (size_t)n));
    t->scratch_cap = n;
    return 0;
}

/* Appends the second pass's nev evictions to the host log. */
static int fetch_evictions(kern_cuda_table_t *t, int64_t nev, cudaStream_t st)
{
    if (t->nlog + nev > t->caplog) {
        int64_t ncap = t->caplog ? 2 * t->caplog : 64;
        while (ncap < t->nlog + nev)
            ncap *= 2;
        kern_evicted_t *p =
            (kern_evicted_t *)kiln_reallocarray(t->log, (size_t)ncap, sizeof *p);
        if (!p)
            return KILN_ENOMEM;
        t->log = p;
        t->caplog = ncap;
    }
    CUDA_CHECK(cudaMemcpyAsync(t->log + t->nlog, t->d_log, sizeof(kern_evicted_t) * (size_t)nev,
                               cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    t->nlog += nev;
    return 0;
}

/* The first pass of find_or_insert for n keys, and its counters on their
 * way to t->h_ctr (read them after synchronizing st). */
static int find_insert_first(kern_cuda_table_t *t, int64_t n, const int64_t *d_keys, int64_t step,
                             int32_t *d_rows, cudaStream_t st)
{
    KILN_CHECK(reserve_scratch(t, n));
    int64_t *newslots = t->d_scratch, *pending = t->d_scratch + t->scratch_cap;
    const unsigned blocks = blocks_for((n + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK);
    CUDA_CHECK(cudaMemsetAsync(t->d_ctr, 0, sizeof(counters), st));
    table_find_insert_kernel<<<blocks, 32 * WARPS_PER_BLOCK, 0, st>>>(
        t->d, n, d_keys, step, 1, d_rows, newslots, pending, t->d_ctr);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpyAsync(t->h_ctr, t->d_ctr, sizeof(counters), cudaMemcpyDeviceToHost, st));
    return 0;
}

/* The rest of find_or_insert once the first pass's counters are in
 * t->h_ctr: the new rows counted, and the keys without room evicted for
 * (which synchronizes st again) or taken back. */
static int find_insert_rest(kern_cuda_table_t *t, const int64_t *d_keys, int64_t step,
                            int32_t *d_rows, cudaStream_t st)
{
    counters h = *t->h_ctr;
    int64_t *newslots = t->d_scratch, *pending = t->d_scratch + t->scratch_cap;
    t->size += (int64_t)h.nnew;
    if (h.badkey)
        return kiln_errf(KILN_EINVAL, "GPU table '%s': %llu keys equal the reserved key "
                         "INT64_MIN, which marks a free slot; map it to another key",
                         t->name, h.badkey);
    if (h.npend == 0)
        return 0;
    if (t->d.evict == KERN_EVICT_NONE) {
        table_rollback_kernel<<<blocks_for(((int64_t)h.nnew + 255) / 256), 256, 0, st>>>(
            t->d, (int64_t)h.nnew, newslots);
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaStreamSynchronize(st));
        t->size -= (int64_t)h.nnew;
        return kiln_errf(KILN_EFULL,
                         "GPU table '%s': %llu keys found their bucket of %d slots full "
                         "(capacity %lld slots, %lld live), so nothing was inserted; raise "
                         "model.embedding.capacity (a bucketed table needs 2 to 3 times "
                         "the keys it holds) or set eviction: lru",
                         t->name, h.npend, KERN_CUDA_BUCKET, (long long)t->nslots,
                         (long long)t->size);
    }
    table_evict_insert_kernel<<<blocks_for(((int64_t)h.npend + WARPS_PER_BLOCK - 1) /
                                           WARPS_PER_BLOCK),
                                32 * WARPS_PER_BLOCK, 0, st>>>(
        t->d, (int64_t)h.npend, pending, d_keys, step, d_rows, t->d_log, t->d_ctr);
    CUDA_CHECK(cudaGetLastError());
    KILN_CHECK(read_counters(t, &h, st));
    t->size += (int64_t)h.nfill;
    if (h.nevict > 0)
        KILN_CHECK(fetch_evictions(t, (int64_t)h.nevict, st));
    if (h.nfull > 0)
        return kiln_errf(KILN_EFULL,
                         "GPU table '%s': %llu keys found every row of their bucket used in "
                         "the current step, so none could be evicted; raise "
                         "model.embedding.capacity or use smaller batches",
                         t->name, h.nfull);
    return 0;
}

extern "C" int kern_cuda_table_find_or_insert(kern_cuda_table_t *t, int64_t n,
                                              const int64_t *d_keys, int64_t step,
                                              int32_t *d_rows /* OUT (n) */, void *stream)
{
    const int64_t off[2] = {0, n};
    return kern_cuda_tables_find_or_insert(1, &t, off, d_keys, step, d_rows, stream);
}

extern "C" int kern_cuda_tables_find_or_insert(int ntables, kern_cuda_table_t *const *tables,
                                               const int64_t *off, const int64_t *d_keys,
                                               int64_t step, int32_t *d_rows, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    bool any = false;
    for (int i = 0; i < ntables; i++) {
        const int64_t n = off[i + 1] - off[i];
        if (n < 0 || (n > 0 && (!d_keys || !d_rows)))
            return kiln_errf(KILN_EINVAL, "GPU table '%s': bad key count %lld or arrays",
                             tables[i]->name, (long long)n);
        if (n > 0) {
            KILN_CHECK(find_insert_first(tables[i], n, d_keys + off[i], step, d_rows + off[i], st));
            any = true;
        }
    }
    if (!any)
        return 0;
    CUDA_CHECK(cudaStreamSynchronize(st));
    int rc = 0;
    char first[512] = ""; /* the first failure's message: later ones overwrite kiln_errmsg */
    for (int i = 0; i < ntables; i++) {
        if (off[i + 1] == off[i])
            continue;
        const int r = find_insert_rest(tables[i], d_keys + off[i], step, d_rows + off[i], st);
        if (r < 0 && rc == 0) {
            rc = r;
            snprintf(first, sizeof first, "%s", kiln_errmsg());
        }
    }
    return rc < 0 ? kiln_errf(rc, "%s", first) : 0;
}

extern "C" int kern_cuda_table_find(const kern_cuda_table_t *t, int64_t n,
                                    const int64_t *d_keys, int32_t *d_rows /* OUT (n) */,
                                    void *stream)
{
    if (n < 0 || (n > 0 && (!d_keys || !d_rows)))
        return kiln_errf(KILN_EINVAL, "GPU table '%s': bad key count %lld or arrays", t->name,
                         (long long)n);
    if (n == 0)
        return 0;
    table_find_insert_kernel<<<blocks_for((n + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK),
                               32 * WARPS_PER_BLOCK, 0, (cudaStream_t)stream>>>(
        t->d, n, d_keys, 0, 0, d_rows, NULL, NULL, NULL);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

/* ---- export scan ---------------------------------------------------------------------- */

/* A thread per slot: live rows stamped after since go to rows/keys_out at
 * the index an atomic counter hands out (the first cap of them). */
static __global__ void table_changed_kernel(const table_dev d, int64_t nslots, int64_t since,
                                            int64_t cap, int32_t *rows, int64_t *keys_out,
                                            counters *ctr)
{
    for (int64_t s = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; s < nslots;
         s += (int64_t)gridDim.x * blockDim.x) {
        const int64_t k = d.keys[s];
        if (k == KERN_CUDA_EMPTY_KEY || d.stamps[s] <= since)
            continue;
        const int64_t at = (int64_t)atomicAdd(&ctr->nout, 1ull);
        if (at < cap) {
            rows[at] = (int32_t)s;
            if (keys_out)
                keys_out[at] = k;
        }
    }
}

extern "C" int kern_cuda_table_changed_since(const kern_cuda_table_t *t, int64_t since,
                                             int32_t *d_rows /* OUT (cap) */,
                                             int64_t *d_keys /* OUT (cap) */, int64_t cap,
                                             int64_t *n /* OUT */, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    counters h;
    *n = 0;
    if (cap < 0 || (cap > 0 && !d_rows))
        return kiln_errf(KILN_EINVAL, "GPU table '%s': changed_since needs an output array",
                         t->name);
    CUDA_CHECK(cudaMemsetAsync(t->d_ctr, 0, sizeof(counters), st));
    table_changed_kernel<<<blocks_for((t->nslots + 255) / 256), 256, 0, st>>>(
        t->d, t->nslots, since, cap, d_rows, d_keys, t->d_ctr);
    CUDA_CHECK(cudaGetLastError());
    KILN_CHECK(read_counters(t, &h, st));
    *n = (int64_t)h.nout;
    if (*n > cap)
        return kiln_errf(KILN_ERANGE, "GPU table '%s': changed_since found %lld rows, more "
                         "than the %lld entries given", t->name, (long long)*n, (long long)cap);
    return 0;
}

/* ---- accessors -------------------------------------------------------------------------- */

extern "C" const kern_evicted_t *kern_cuda_table_evicted(const kern_cuda_table_t *t,
                                                         int64_t *n /* OUT */)
{
    *n = t->nlog;
    return t->log;
}

extern "C" void kern_cuda_table_evicted_clear(kern_cuda_table_t *t)
{
    free(t->log);
    t->log = NULL;
    t->nlog = t->caplog = 0;
}

extern "C" void kern_cuda_table_slab(kern_cuda_table_t *t, kern_slab_t *slab /* OUT */)
{
    slab->values = t->d.values;
    slab->opt_state = t->d.opt;
    slab->stamps = t->d.stamps;
    slab->opt_steps = t->d.opt_steps;
    slab->capacity = t->nslots;
    slab->dim = t->d.dim;
    slab->nstate = t->d.nstate;
}

extern "C" const int64_t *kern_cuda_table_keys(const kern_cuda_table_t *t) { return t->d.keys; }
extern "C" int64_t kern_cuda_table_size(const kern_cuda_table_t *t) { return t->size; }
extern "C" int64_t kern_cuda_table_capacity(const kern_cuda_table_t *t) { return t->nslots; }

/* ==== the runtime ================================================================== */

extern "C" int kern_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* forget the sticky-free error */
        return 0;
    }
    return n;
}

extern "C" int kern_cuda_announce(const char *who)
{
    int v = 0, major = 0, minor = 0, patch = 0, cublas = 0;
    const int runtime = cudaRuntimeGetVersion(&v) == cudaSuccess ? v : 0;
    if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
        cublas = major * 10000 + minor * 100 + patch;
    const int nccl = ncclGetVersion(&v) == ncclSuccess ? v : 0;
    printf("%s: CUDA runtime %d, cuBLAS %d, NCCL %d\n", who, runtime, cublas, nccl);
    const int n = kern_cuda_device_count();
    if (n < 1)
        printf("skipped: no CUDA device\n");
    return n;
}
