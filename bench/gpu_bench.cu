/*
 * bench/gpu_bench.cu - the CUDA backend's throughput on one GPU: table
 * inserts/s and lookups/s of the GPU hash table (kern_cuda_table_*),
 * lookups/s of the fused gather + combine, and rows/s of the backward
 * reduce + sparse adagrad update, each with its bytes moved per second as
 * a fraction of two bounds: the peak HBM bandwidth from the device's
 * memory clock and bus width, and a device-to-device cudaMemcpy measured in
 * this run. Prints "skipped: no CUDA device" and exits 0 without a GPU.
 *
 * usage: gpu_bench [--tables T] [--rows R] [--dim D] [--bags B] [--hot H] [--iters N]
 * Defaults: 8 tables of 2M rows x 64 floats, batches of 65536 bags of 4.
 * Results go to docs/gpu.md.
 */
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kern_cuda.h"

#define CHECK(x)                                                                          \
    do {                                                                                  \
        if ((x) != 0) {                                                                   \
            fprintf(stderr, "gpu_bench: %s failed: %s\n", #x, kiln_errmsg());             \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

#define CUDA(x)                                                                           \
    do {                                                                                  \
        cudaError_t e_ = (x);                                                             \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "gpu_bench: %s: %s\n", #x, cudaGetErrorString(e_));           \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

struct opts {
    int tables, dim, hot, iters;
    int64_t rows, bags;
};

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    CUDA(cudaMalloc(&p, bytes ? bytes : 4));
    return p;
}

/* Times fn(arg) iters times on the default stream; returns seconds per call. */
template <typename F> static double time_it(int iters, F fn)
{
    cudaEvent_t a, b;
    float ms = 0.0f;
    CUDA(cudaEventCreate(&a));
    CUDA(cudaEventCreate(&b));
    fn(); /* warm-up */
    CUDA(cudaDeviceSynchronize());
    CUDA(cudaEventRecord(a));
    for (int i = 0; i < iters; i++)
        fn();
    CUDA(cudaEventRecord(b));
    CUDA(cudaEventSynchronize(b));
    CUDA(cudaEventElapsedTime(&ms, a, b));
    CUDA(cudaEventDestroy(a));
    CUDA(cudaEventDestroy(b));
    return (double)ms / 1000.0 / iters;
}

static void report(const char *what, double items, double sec, double bytes, double peak,
                   double copy)
{
    const double bw = bytes / sec;
    printf("%-22s %12.3e /s  %8.1f GB/s  %5.1f%% of peak  %5.1f%% of memcpy\n", what,
           items / sec, bw / 1e9, 100.0 * bw / peak, 100.0 * bw / copy);
}

int main(int argc, char **argv)
{
    struct opts o = {8, 64, 4, 20, 2000000, 65536};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tables"))
            o.tables = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rows"))
            o.rows = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--dim"))
            o.dim = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--bags"))
            o.bags = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--hot"))
            o.hot = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters"))
            o.iters = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: gpu_bench [--tables T] [--rows R] [--dim D] [--bags B] "
                            "[--hot H] [--iters N]\n");
            return 2;
        }
    }
    if (o.tables < 1 || o.tables > 64 || o.dim < 1 || o.hot < 1 || o.iters < 1 ||
        o.rows < 1024 || o.bags < 1) {
        fprintf(stderr, "gpu_bench: bad sizes\n");
        return 2;
    }
    if (kern_cuda_announce("gpu_bench") < 1)
        return 0;

    /* The two bandwidth bounds. */
    int dev = 0, clock_khz = 0, bus_bits = 0;
    cudaDeviceProp prop;
    CUDA(cudaGetDevice(&dev));
    CUDA(cudaGetDeviceProperties(&prop, dev));
    CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev));
    CUDA(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev));
    const double peak = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0); /* double data rate */
    const size_t cbytes = (size_t)1 << 30;
    void *c0 = dev_alloc(cbytes), *c1 = dev_alloc(cbytes);
    const double csec = time_it(10, [&] { CUDA(cudaMemcpyAsync(c1, c0, cbytes,
                                                               cudaMemcpyDeviceToDevice)); });
    const double copy = 2.0 * (double)cbytes / csec; /* read + write */
    CUDA(cudaFree(c0));
    CUDA(cudaFree(c1));
    printf("device: %s, %d SMs; peak HBM %.0f GB/s (clock x bus), D2D memcpy %.0f GB/s\n",
           prop.name, prop.multiProcessorCount, peak / 1e9, copy / 1e9);
    printf("tables %d x %lld rows x %d floats, %lld bags x %d rows per table, %d iters\n",
           o.tables, (long long)o.rows, o.dim, (long long)o.bags, o.hot, o.iters);

    const int T = o.tables;
    const int64_t nnz = o.bags * o.hot, nkeys = o.rows / 2; /* half full */
    kern_cuda_table_t **tabs = (kern_cuda_table_t **)calloc((size_t)T, sizeof *tabs);
    kern_bags_t *bags = (kern_bags_t *)calloc((size_t)T, sizeof *bags);
    kern_slab_t *slabs = (kern_slab_t *)calloc((size_t)T, sizeof *slabs);
    kern_row_grads_t *grads = (kern_row_grads_t *)calloc((size_t)T, sizeof *grads);
    int64_t *hkeys = (int64_t *)malloc(sizeof(int64_t) * (size_t)nkeys);
    int64_t *hoff = (int64_t *)malloc(sizeof(int64_t) * (size_t)(o.bags + 1));
    int64_t *d_keys = (int64_t *)dev_alloc(sizeof(int64_t) * (size_t)nkeys);
    int32_t *d_rows = (int32_t *)dev_alloc(sizeof(int32_t) * (size_t)nkeys);
    int64_t *d_off = (int64_t *)dev_alloc(sizeof(int64_t) * (size_t)(o.bags + 1));
    float *d_out = (float *)dev_alloc(sizeof(float) * (size_t)o.bags * (size_t)o.dim * T);
    if (!tabs || !bags || !slabs || !grads || !hkeys || !hoff) {
        fprintf(stderr, "gpu_bench: out of host memory\n");
        return 1;
    }
    for (int64_t b = 0; b <= o.bags; b++)
        hoff[b] = b * o.hot;
    CUDA(cudaMemcpy(d_off, hoff, sizeof(int64_t) * (size_t)(o.bags + 1),
                    cudaMemcpyHostToDevice));

    for (int64_t i = 0; i < nkeys; i++)
        hkeys[i] = (int64_t)(bench_rnd() >> 1);
    CUDA(cudaMemcpy(d_keys, hkeys, sizeof(int64_t) * (size_t)nkeys, cudaMemcpyHostToDevice));

    /* Inserts: the nkeys keys into each table in 8 calls at steps 1..8, so
     * a bucket that overflows evicts a row of an earlier step instead of
     * refusing (keys 8 B read; slot key 8 B, row dim*4, adagrad state dim*4,
     * stamp 8 written). */
    double ins_sec = 0.0;
    for (int t = 0; t < T; t++) {
        kern_table_config_t cfg = {};
        cfg.name = "bench";
        cfg.dim = o.dim;
        cfg.capacity = o.rows;
        cfg.opt = KERN_OPT_ADAGRAD;
        cfg.init = KERN_INIT_UNIFORM;
        cfg.init_scale = 0.05f;
        cfg.seed = (uint64_t)t;
        cfg.evict = KERN_EVICT_LRU;
        CHECK(kern_cuda_table_create(&cfg, &tabs[t]));
        const int64_t t0 = kiln_mono_ns(), part = (nkeys + 7) / 8;
        for (int64_t k0 = 0, step = 1; k0 < nkeys; k0 += part, step++)
            CHECK(kern_cuda_table_find_or_insert(tabs[t], nkeys - k0 < part ? nkeys - k0 : part,
                                                 d_keys + k0, step, d_rows + k0, NULL));
        ins_sec += (double)(kiln_mono_ns() - t0) / 1e9;
        int64_t nev = 0;
        (void)kern_cuda_table_evicted(tabs[t], &nev);
        if (t == 0)
            printf("table 0: %lld keys live, %lld evicted by bucket overflow\n",
                   (long long)kern_cuda_table_size(tabs[t]), (long long)nev);
        kern_cuda_table_slab(tabs[t], &slabs[t]);
    }
    const double row_b = 4.0 * o.dim;
    report("table inserts", (double)nkeys * T, ins_sec,
           (double)nkeys * T * (8 + 8 + 2 * row_b + 8), peak, copy);

    /* Lookups (kern_cuda_table_find: no insert, no sync; a bucket read is 256 B). */
    const double find_sec = time_it(o.iters, [&] {
        CHECK(kern_cuda_table_find(tabs[T - 1], nkeys, d_keys, d_rows, NULL));
    });
    report("table lookups", (double)nkeys, find_sec, (double)nkeys * (8 + 256 + 4), peak,
           copy);

    /* A batch: nnz rows per table drawn uniformly from all its live rows
     * (about a million at the defaults, 256 MB of rows at dim 64, far past
     * the L2), so that few positions repeat a row and the bytes counted are
     * bytes that come from HBM, as in FBGEMM's TBE benchmark. */
    int32_t *hrows = (int32_t *)malloc(sizeof(int32_t) * (size_t)nkeys);
    int32_t *pick = (int32_t *)malloc(sizeof(int32_t) * (size_t)nnz);
    if (!hrows || !pick) {
        fprintf(stderr, "gpu_bench: out of host memory\n");
        return 1;
    }
    int64_t col = 0;
    for (int t = 0; t < T; t++) {
        int32_t *all = (int32_t *)dev_alloc(sizeof(int32_t) * (size_t)nnz);
        CHECK(kern_cuda_table_find(tabs[t], nkeys, d_keys, d_rows, NULL));
        CUDA(cudaMemcpy(hrows, d_rows, sizeof(int32_t) * (size_t)nkeys, cudaMemcpyDeviceToHost));
        int64_t live = 0; /* the rows of keys still in the table, first */
        for (int64_t i = 0; i < nkeys; i++)
            if (hrows[i] >= 0)
                hrows[live++] = hrows[i];
        if (live == 0) {
            fprintf(stderr, "gpu_bench: table %d holds none of its keys\n", t);
            return 1;
        }
        for (int64_t i = 0; i < nnz; i++) /* not in place: a drawn row must not be drawn from */
            pick[i] = hrows[bench_rnd() % (uint64_t)live];
        CUDA(cudaMemcpy(all, pick, sizeof(int32_t) * (size_t)nnz, cudaMemcpyHostToDevice));
        bags[t].values = slabs[t].values;
        bags[t].capacity = slabs[t].capacity;
        bags[t].dim = o.dim;
        bags[t].combine = KERN_COMBINE_SUM;
        bags[t].offsets = d_off;
        bags[t].rows = all;
        bags[t].out_col = col;
        col += o.dim;
        grads[t].rows = (int32_t *)dev_alloc(sizeof(int32_t) * (size_t)nnz);
        grads[t].grads = (float *)dev_alloc(sizeof(float) * (size_t)nnz * (size_t)o.dim);
    }

    /* Gather: each position reads a row id and a row, each bag writes dim floats. */
    const double g_sec = time_it(o.iters, [&] {
        CHECK(kern_cuda_gather_combine(T, bags, o.bags, col, d_out, NULL));
    });
    report("fused gather lookups", (double)nnz * T, g_sec,
           (double)T * ((double)nnz * (4 + row_b) + (double)o.bags * row_b), peak, copy);

    /* Backward reduce + adagrad update: rows are read back from positions,
     * each unique row reads and writes its value and state, reads its grad. */
    kern_opt_t opt = {KERN_OPT_ADAGRAD, 0.01f, 1e-8f, 0.9f, 0.999f};
    int64_t step = 3;
    const double r_sec = time_it(o.iters, [&] {
        CHECK(kern_cuda_backward_reduce(T, bags, o.bags, col, d_out, grads, NULL));
    });
    double uniq = 0.0;
    for (int t = 0; t < T; t++)
        uniq += (double)grads[t].n;
    report("backward reduce rows", (double)nnz * T, r_sec,
           (double)T * ((double)nnz * (4 + 2 * row_b) + (double)o.rows * 12) + uniq * row_b,
           peak, copy);
    const double u_sec = time_it(o.iters, [&] {
        CHECK(kern_cuda_sparse_update(&opt, T, slabs, grads, step++, NULL));
    });
    report("adagrad row updates", uniq, u_sec, uniq * (5 * row_b + 4 + 8), peak, copy);
    CUDA(cudaDeviceSynchronize());

    for (int t = 0; t < T; t++) {
        cudaFree((void *)bags[t].rows);
        cudaFree(grads[t].rows);
        cudaFree(grads[t].grads);
        kern_cuda_table_destroy(tabs[t]);
    }
    cudaFree(d_keys);
    cudaFree(d_rows);
    cudaFree(d_off);
    cudaFree(d_out);
    free(hrows);
    free(pick);
    free(hkeys);
    free(hoff);
    free(tabs);
    free(bags);
    free(slabs);
    free(grads);
    return 0;
}
