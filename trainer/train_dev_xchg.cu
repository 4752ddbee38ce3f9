/*
 * trainer/train_dev_xchg.cu - the kernels of the device step's exchange
 * (train_dev.h's permute, dedupe, accum and combine; train_dev_cuda.cu
 * wraps them as dev_ops). Each is a few cub passes and small kernels on the
 * compute stream; none uses floating-point atomics, so a call gives the same
 * bits on every run:
 *
 *   permute  one launch per 64 pieces, passed by value; a block row per
 *            piece copies its 32-bit words.
 *   dedupe   per table: a radix sort of (key, position), run heads and an
 *            inclusive scan (each key's run), the distinct keys' owners
 *            (shard_owner, the host's function), a stable radix sort of
 *            the distinct keys by owner, then the outputs by scatter; the
 *            counts per owner are integer atomics (exact in any order). One
 *            synchronization for all tables (the counts to the host).
 *   accum    tg[rows[u]] += sums[u], a thread an element (rows distinct).
 *   combine  per table: a stable radix sort of (row, position), run heads
 *            and a scan, then a block a distinct row summing its positions
 *            in order in float64 and rounding once. One synchronization for
 *            all tables (the counts).
 *
 * Scratch lives in a dev_xchg_t that grows to the largest call.
 */
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>
#include <new>
#include <stdlib.h>
#include <string.h>

#include "train_dev.h"
#include "train_dev_cuda.cuh"

struct dev_xchg {
    void *temp = nullptr; /* cub */
    size_t temp_cap = 0;
    void *buf = nullptr; /* the arrays below, carved per call */
    size_t buf_cap = 0;
    unsigned long long *d_cnt = nullptr; /* (cnt_cap) dedupe's counts */
    int cnt_cap = 0;
    int *d_nu = nullptr, *h_nu = nullptr; /* (nu_cap) distinct counts: device, pinned */
    int nu_cap = 0;
};

namespace
{

/* Blocks of `threads` for a thread per element (the x dimension takes up
 * to 2^31 - 1 blocks, more than the 2^31 - 1 elements a call allows). */
unsigned blocks_for(int64_t n, unsigned threads)
{
    const int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 0 ? b : 1);
}

/* ---- permute ---- */

constexpr int PIECES = 64;

struct pieces_t {
    int n;
    size_t src[PIECES], dst[PIECES], words[PIECES];
};

__global__ void permute_kernel(uint32_t *dst, const uint32_t *src, pieces_t p)
{
    const int k = blockIdx.y;
    if (k >= p.n)
        return;
    const uint32_t *s = src + p.src[k];
    uint32_t *d = dst + p.dst[k];
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.words[k];
         i += (size_t)gridDim.x * blockDim.x)
        d[i] = s[i];
}

/* ---- dedupe ---- */

__global__ void iota_kernel(int32_t *p, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = (int32_t)i;
}

/* heads[i] = 1 where sorted[i] starts a run. */
template <typename K> __global__ void heads_kernel(const K *sorted, int64_t n, int32_t *heads)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        heads[i] = i == 0 || sorted[i] != sorted[i - 1];
}

/* The distinct keys (run r's key at r), their owners (R past the end, so
 * they sort last) and the distinct count. */
__global__ void distinct_kernel(const int64_t *skeys, const int32_t *heads, const int32_t *run,
                                int64_t n, int nranks, int64_t *ukeys, int32_t *owner,
                                int32_t *uidx, int *nu)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    if (heads[i]) {
        const int32_t r = run[i] - 1;
        ukeys[r] = skeys[i];
        owner[r] = shard_owner(skeys[i], nranks);
    }
    if (i == n - 1)
        *nu = run[i];
    if (i >= run[n - 1])
        owner[i] = nranks;
    uidx[i] = (int32_t)i;
}

/* Distinct key su[j] goes to j: the output keys, where each run lands
 * (rankof) and the counts per owner. */
__global__ void place_kernel(const int32_t *sowner, const int32_t *su, const int64_t *ukeys,
                             const int *nu, int ntables, int t, int64_t *uniq, int32_t *rankof,
                             unsigned long long *cnt)
{
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= *nu)
        return;
    uniq[j] = ukeys[su[j]];
    rankof[su[j]] = (int32_t)j;
    atomicAdd(&cnt[(int64_t)sowner[j] * ntables + t], 1ull);
}

__global__ void inverse_kernel(const int32_t *spos, const int32_t *run, const int32_t *rankof,
                               int64_t n, int32_t *inv)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        inv[spos[i]] = rankof[run[i] - 1];
}

/* ---- accum, combine ---- */

__global__ void accum_kernel(int64_t n, const int32_t *rows, const float *sums, int dim, double *tg)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * dim)
        return;
    const int64_t u = i / dim, j = i % dim;
    tg[(int64_t)rows[u] * dim + j] += (double)sums[i];
}

/* Run heads to run starts and the distinct rows; the distinct count. */
__global__ void starts_kernel(const int32_t *srows, const int32_t *heads, const int32_t *run,
                              int64_t n, int32_t *starts, int32_t *urows, int *nu)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    if (heads[i]) {
        starts[run[i] - 1] = (int32_t)i;
        urows[run[i] - 1] = srows[i];
    }
    if (i == n - 1)
        *nu = run[i];
}

/* A block a distinct row u, a thread an element: the row's positions in
 * order (stable sort: source-rank order), in float64, rounded once. */
__global__ void segsum_kernel(const int32_t *starts, const int32_t *sidx, const double *grads,
                              int64_t n, int dim, const int *nu, float *out)
{
    const int u = blockIdx.x;
    if (u >= *nu)
        return;
    const int64_t p0 = starts[u], p1 = u + 1 < *nu ? starts[u + 1] : n;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        double acc = 0.0;
        for (int64_t p = p0; p < p1; p++)
            acc = __dadd_rn(acc, grads[(int64_t)sidx[p] * dim + j]);
        out[(int64_t)u * dim + j] = (float)acc;
    }
}

/* Makes x's scratch hold `bytes` of arrays and `temp` of cub temp. */
int room(dev_xchg *x, size_t bytes, size_t temp)
{
    if (bytes > x->buf_cap) {
        if (x->buf)
            CUDA_CHECK(cudaFree(x->buf)); /* waits for the device */
        x->buf = nullptr;
        x->buf_cap = 0;
        CUDA_CHECK(cudaMalloc(&x->buf, bytes));
        x->buf_cap = bytes;
    }
    if (temp > x->temp_cap) {
        if (x->temp)
            CUDA_CHECK(cudaFree(x->temp));
        x->temp = nullptr;
        x->temp_cap = 0;
        CUDA_CHECK(cudaMalloc(&x->temp, temp));
        x->temp_cap = temp;
    }
    return 0;
}

/* Makes x's distinct counts hold n ints; st is done with the old ones. */
int room_nu(dev_xchg *x, int n, cudaStream_t st)
{
    if (n <= x->nu_cap)
        return 0;
    CUDA_CHECK(cudaStreamSynchronize(st)); /* a copy into h_nu may be in flight */
    if (x->d_nu)
        CUDA_CHECK(cudaFree(x->d_nu));
    if (x->h_nu)
        CUDA_CHECK(cudaFreeHost(x->h_nu));
    x->d_nu = x->h_nu = nullptr;
    x->nu_cap = 0;
    CUDA_CHECK(cudaMalloc(&x->d_nu, sizeof(int) * (size_t)n));
    CUDA_CHECK(cudaHostAlloc(&x->h_nu, sizeof(int) * (size_t)n, cudaHostAllocDefault));
    x->nu_cap = n;
    return 0;
}

/* Carves n elements of T off *at (16-byte aligned). */
template <typename T> T *carve(char **at, int64_t n)
{
    T *p = (T *)*at;
    *at += ((size_t)n * sizeof(T) + 15) / 16 * 16;
    return p;
}

int make(dev_xchg **x)
{
    if (*x == nullptr && (*x = new (std::nothrow) dev_xchg()) == nullptr)
        return KILN_ENOMEM;
    return 0;
}

/* The runs of equal keys among n keys (their low `bits` bits sorted), for
 * dedupe and combine alike: sorted (n) the keys in order, from (n) the
 * position each came from, heads (n) 1 where a run starts, run (n) the
 * run's number (the inclusive sum of heads, from 1). pos (n) is scratch.
 * Enqueued on st with x's temp storage. */
template <typename K>
int sort_runs(dev_xchg *x, cudaStream_t st, const K *keys, int64_t n, int bits, int32_t *pos,
              K *sorted, int32_t *from, int32_t *heads, int32_t *run)
{
    const unsigned nb = blocks_for(n, 256);
    size_t tb = x->temp_cap;
    iota_kernel<<<nb, 256, 0, st>>>(pos, n);
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(x->temp, tb, keys, sorted, pos, from, (int)n, 0,
                                               bits, st));
    heads_kernel<K><<<nb, 256, 0, st>>>(sorted, n, heads);
    tb = x->temp_cap;
    CUDA_CHECK(cub::DeviceScan::InclusiveSum(x->temp, tb, heads, run, (int)n, st));
    return 0;
}

} // namespace

int dev_xchg_permute(cudaStream_t st, void *dst, const void *src, int nseg, const dev_seg_t *segs)
{
    for (int k0 = 0; k0 < nseg; k0 += PIECES) {
        pieces_t p;
        p.n = nseg - k0 < PIECES ? nseg - k0 : PIECES;
        size_t most = 0;
        for (int k = 0; k < p.n; k++) {
            const dev_seg_t *g = &segs[k0 + k];
            if (g->src % 4 || g->dst % 4 || g->bytes % 4)
                return kiln_errf(KILN_EINTERNAL, "permute: a piece not in whole 32-bit words");
            p.src[k] = g->src / 4;
            p.dst[k] = g->dst / 4;
            p.words[k] = g->bytes / 4;
            most = p.words[k] > most ? p.words[k] : most;
        }
        if (most == 0)
            continue;
        const unsigned nb = blocks_for((int64_t)most, 256); /* grid-stride past 1024 */
        dim3 grid(nb < 1024 ? nb : 1024, (unsigned)p.n);
        permute_kernel<<<grid, 256, 0, st>>>((uint32_t *)dst, (const uint32_t *)src, p);
        CUDA_CHECK(cudaGetLastError());
    }
    return 0;
}

int dev_xchg_dedupe(dev_xchg **xp, cudaStream_t st, int ntables, const int64_t *koff,
                    const int64_t *keys, int nranks, int64_t *uniq, int32_t *inv, int64_t *cnt)
{
    KILN_CHECK(make(xp));
    dev_xchg *x = *xp;
    int64_t most = 1;
    for (int t = 0; t < ntables; t++)
        most = koff[t + 1] - koff[t] > most ? koff[t + 1] - koff[t] : most;
    if (most > INT32_MAX)
        return kiln_errf(KILN_ERANGE, "the device dedupe takes at most 2^31 - 1 keys a table");
    const int n_most = (int)most;
    int obits = 1;
    while ((1 << obits) <= nranks)
        obits++;
    size_t t1 = 0, t2 = 0, t3 = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, t1, (const int64_t *)NULL, (int64_t *)NULL,
                                               (const int32_t *)NULL, (int32_t *)NULL, n_most));
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, t2, (const int32_t *)NULL, (int32_t *)NULL,
                                               (const int32_t *)NULL, (int32_t *)NULL, n_most, 0,
                                               obits));
    CUDA_CHECK(
        cub::DeviceScan::InclusiveSum(NULL, t3, (const int32_t *)NULL, (int32_t *)NULL, n_most));
    const size_t temp = t1 > t2 ? (t1 > t3 ? t1 : t3) : (t2 > t3 ? t2 : t3);
    const size_t a = ((size_t)most * 8 + 15) / 16 * 16, b = ((size_t)most * 4 + 15) / 16 * 16;
    KILN_CHECK(room(x, 2 * a + 9 * b, temp));
    KILN_CHECK(room_nu(x, 1, st));
    const int ncnt = nranks * ntables;
    if (ncnt > x->cnt_cap) {
        if (x->d_cnt)
            CUDA_CHECK(cudaFree(x->d_cnt));
        x->d_cnt = nullptr;
        x->cnt_cap = 0;
        CUDA_CHECK(cudaMalloc(&x->d_cnt, sizeof(unsigned long long) * (size_t)ncnt));
        x->cnt_cap = ncnt;
    }
    CUDA_CHECK(cudaMemsetAsync(x->d_cnt, 0, sizeof(unsigned long long) * (size_t)ncnt, st));
    char *at = (char *)x->buf;
    int64_t *skeys = carve<int64_t>(&at, most), *ukeys = carve<int64_t>(&at, most);
    int32_t *pos = carve<int32_t>(&at, most), *spos = carve<int32_t>(&at, most),
            *heads = carve<int32_t>(&at, most), *run = carve<int32_t>(&at, most),
            *owner = carve<int32_t>(&at, most), *uidx = carve<int32_t>(&at, most),
            *sowner = carve<int32_t>(&at, most), *su = carve<int32_t>(&at, most),
            *rankof = carve<int32_t>(&at, most);
    for (int t = 0; t < ntables; t++) {
        const int64_t k0 = koff[t], n = koff[t + 1] - k0;
        if (n == 0)
            continue;
        KILN_CHECK(sort_runs(x, st, keys + k0, n, 64, pos, skeys, spos, heads, run));
        const unsigned nb = blocks_for(n, 256);
        distinct_kernel<<<nb, 256, 0, st>>>(skeys, heads, run, n, nranks, ukeys, owner, uidx,
                                            x->d_nu);
        size_t tb = x->temp_cap;
        CUDA_CHECK(cub::DeviceRadixSort::SortPairs(x->temp, tb, owner, sowner, uidx, su, (int)n, 0,
                                                   obits, st));
        place_kernel<<<nb, 256, 0, st>>>(sowner, su, ukeys, x->d_nu, ntables, t, uniq + k0, rankof,
                                         x->d_cnt);
        inverse_kernel<<<nb, 256, 0, st>>>(spos, run, rankof, n, inv + k0);
        CUDA_CHECK(cudaGetLastError());
    }
    static_assert(sizeof(unsigned long long) == sizeof(int64_t), "counts are 64-bit");
    CUDA_CHECK(
        cudaMemcpyAsync(cnt, x->d_cnt, sizeof(int64_t) * (size_t)ncnt, cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    return 0;
}

int dev_xchg_accum(cudaStream_t st, int64_t n, const int32_t *rows, const float *sums, int dim,
                   double *tg)
{
    if (n == 0)
        return 0;
    accum_kernel<<<blocks_for(n * dim, 256), 256, 0, st>>>(n, rows, sums, dim, tg);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

int dev_xchg_combine(dev_xchg **xp, cudaStream_t st, int ntables, const int64_t *off,
                     const int32_t *rows, const double *grads, int dim, kern_row_grads_t *out)
{
    int64_t most = 0;
    for (int t = 0; t < ntables; t++) {
        out[t].n = 0;
        most = off[t + 1] - off[t] > most ? off[t + 1] - off[t] : most;
    }
    if (most == 0)
        return 0;
    if (most > INT32_MAX)
        return kiln_errf(KILN_ERANGE, "the owners' sum takes at most 2^31 - 1 rows a table");
    KILN_CHECK(make(xp));
    dev_xchg *x = *xp;
    size_t temp = 0;
    for (int t = 0; t < ntables; t++) {
        const int n = (int)(off[t + 1] - off[t]);
        size_t t1 = 0, t2 = 0;
        CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, t1, (const int32_t *)NULL, (int32_t *)NULL,
                                                   (const int32_t *)NULL, (int32_t *)NULL, n));
        CUDA_CHECK(
            cub::DeviceScan::InclusiveSum(NULL, t2, (const int32_t *)NULL, (int32_t *)NULL, n));
        temp = t1 > temp ? t1 : temp;
        temp = t2 > temp ? t2 : temp;
    }
    const size_t b = ((size_t)most * 4 + 15) / 16 * 16;
    KILN_CHECK(room(x, 6 * b, temp));
    KILN_CHECK(room_nu(x, ntables, st));
    /* Every table carves the same scratch: the stream runs them in turn. */
    char *at = (char *)x->buf;
    int32_t *idx = carve<int32_t>(&at, most), *srows = carve<int32_t>(&at, most),
            *sidx = carve<int32_t>(&at, most), *heads = carve<int32_t>(&at, most),
            *run = carve<int32_t>(&at, most), *starts = carve<int32_t>(&at, most);
    const int threads = dim < 32 ? 32 : dim < 256 ? (dim + 31) / 32 * 32 : 256;
    for (int t = 0; t < ntables; t++) {
        const int64_t o0 = off[t], n = off[t + 1] - o0;
        if (n == 0)
            continue;
        KILN_CHECK(sort_runs(x, st, rows + o0, n, 32, idx, srows, sidx, heads, run));
        starts_kernel<<<blocks_for(n, 256), 256, 0, st>>>(srows, heads, run, n, starts,
                                                          out[t].rows, x->d_nu + t);
        segsum_kernel<<<(unsigned)n, threads, 0, st>>>(starts, sidx, grads + o0 * dim, n, dim,
                                                       x->d_nu + t, out[t].grads);
        CUDA_CHECK(cudaGetLastError());
    }
    CUDA_CHECK(cudaMemcpyAsync(x->h_nu, x->d_nu, sizeof(int) * (size_t)ntables,
                               cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    for (int t = 0; t < ntables; t++)
        out[t].n = off[t + 1] > off[t] ? x->h_nu[t] : 0;
    return 0;
}

void dev_xchg_destroy(dev_xchg *x)
{
    if (x == nullptr)
        return;
    void *dev[] = {x->temp, x->buf, x->d_cnt, x->d_nu};
    for (void *p : dev)
        if (p)
            (void)cudaFree(p);
    if (x->h_nu)
        (void)cudaFreeHost(x->h_nu);
    delete x;
}
