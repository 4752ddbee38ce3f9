/*
 * tests/test_kernels_gpu.c - parity of the CUDA backend with the CPU one:
 * the same seeded tables and batches go through kern_cpu_* / kern_table_*
 * and kern_cuda_* and must agree within atol + rtol*|cpu| (nvcc fuses
 * multiply-adds and its logf/powf/sqrtf may differ in the last bit). The
 * backward reduce must equal the CPU's to the bit, on every run (it sums in
 * bag order without fused multiply-adds). Covered: gather
 * + combine (sum, mean, empty and multi-hot bags), backward reduce, the
 * sgd/adagrad/adam update, the GPU table (same keys -> same initial rows as
 * the CPU table, duplicates, find, lru/lfu eviction under pressure keeping
 * the table consistent, `none` refusing and taking its inserts back) and
 * 20 steps of lookup -> loss gradient -> reduce -> update on both backends,
 * compared at every forward and at the end, with the export scan returning
 * the key set of kern_table_changed_since. Labelled gpu; exits 77, which
 * CTest reports as skipped, when no CUDA device is visible.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kern.h"
#ifdef KILN_HAVE_CUDA
#include "kern_cuda.h"
#endif
#include "kiln.h"

#define NT 3
#define NBAGS 257

static const int dims[NT] = {16, 7, 64};

static uint64_t rng_state = 12345;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* A device copy of h (bytes); h NULL: uninitialised device memory. */
static void *to_dev(const void *h, size_t bytes)
{
    void *d = NULL;
    assert_int_equal(cudaMalloc(&d, bytes ? bytes : 4), cudaSuccess);
    if (h && bytes)
        assert_int_equal(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

/* cudaFree of each of n device pointers (any may be NULL); DEV_FREE_ALL is
 * KILN_FREE_ALL's twin for device memory. */
static void dev_free_all(void *const *d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cudaFree(d[i]);
}
#define DEV_FREE_ALL(...)                                                                          \
    dev_free_all((void *[]){__VA_ARGS__}, sizeof((void *[]){__VA_ARGS__}) / sizeof(void *))

static void *from_dev(const void *d, size_t bytes)
{
    void *h = malloc(bytes ? bytes : 4);
    assert_non_null(h);
    if (bytes)
        assert_int_equal(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

static void assert_close_tol(const float *a, const float *ref, size_t n, float atol, float rtol)
{
    for (size_t i = 0; i < n; i++) {
        float tol = atol + rtol * fabsf(ref[i]);
        if (!(fabsf(a[i] - ref[i]) <= tol))
            fail_msg("element %zu: cuda %.9g vs cpu %.9g", i, (double)a[i], (double)ref[i]);
    }
}

static void assert_close(const float *a, const float *ref, size_t n)
{
    assert_close_tol(a, ref, n, 1e-5f, 1e-4f);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* NT seeded tables of 500 rows and a batch of NBAGS random bags over them,
 * with, once batch_to_dev ran, the bags' device copies. */
typedef struct {
    kern_table_t *tabs[NT];
    kern_bags_t bags[NT];
    kern_bags_t dbags[NT]; /* values, offsets and rows on the device */
    int64_t *offs[NT];     /* [NBAGS + 1] */
    int32_t *rows[NT];     /* [offs[t][NBAGS]] */
    int64_t stride;        /* the width of a bag's output row: the sum of dims */
} batch_t;

/* Builds the tables (optimizer opt) and random bags (lengths 0..5) of b. */
static void make_batch(batch_t *b, kern_opt_kind_t opt)
{
    kern_table_t **tabs = b->tabs;
    kern_bags_t *bags = b->bags;
    int64_t **offs = b->offs;
    int32_t **rows = b->rows;
    int64_t col = 0;
    memset(b, 0, sizeof *b);
    for (int t = 0; t < NT; t++) {
        kern_table_config_t cfg = {.name = "gpu", .dim = dims[t], .capacity = 500, .opt = opt,
                                   .init = KERN_INIT_NORMAL, .init_scale = 0.1f,
                                   .seed = 7 + (uint64_t)t};
        assert_int_equal(kern_table_create(&cfg, &tabs[t]), 0);
        int64_t keys[500];
        int32_t r[500];
        for (int i = 0; i < 500; i++)
            keys[i] = (int64_t)(rnd() % 1000000);
        assert_int_equal(kern_table_find_or_insert(tabs[t], 500, keys, 1, r), 0);
        offs[t] = malloc(sizeof(int64_t) * (NBAGS + 1));
        rows[t] = malloc(sizeof(int32_t) * NBAGS * 5);
        offs[t][0] = 0;
        for (int g = 0; g < NBAGS; g++) {
            int len = (int)(rnd() % 6);
            for (int k = 0; k < len; k++)
                rows[t][offs[t][g] + k] = (int32_t)(rnd() % (uint64_t)kern_table_size(tabs[t]));
            offs[t][g + 1] = offs[t][g] + len;
        }
        kern_slab_t s;
        kern_table_slab(tabs[t], &s);
        bags[t] = (kern_bags_t){.values = s.values, .capacity = s.capacity, .dim = dims[t],
                                .combine = t == 1 ? KERN_COMBINE_MEAN : KERN_COMBINE_SUM,
                                .offsets = offs[t], .rows = rows[t], .out_col = col};
        col += dims[t];
    }
    b->stride = col;
}

/* Copies the bags of b to the device: b->dbags. */
static void batch_to_dev(batch_t *b)
{
    for (int t = 0; t < NT; t++) {
        b->dbags[t] = b->bags[t];
        b->dbags[t].values = to_dev(b->bags[t].values, sizeof(float) * 500 * (size_t)dims[t]);
        b->dbags[t].offsets = to_dev(b->offs[t], sizeof(int64_t) * (NBAGS + 1));
        b->dbags[t].rows = to_dev(b->rows[t], sizeof(int32_t) * (size_t)b->offs[t][NBAGS]);
    }
}

/* Frees b, its device copies too. */
static void batch_free(batch_t *b)
{
    for (int t = 0; t < NT; t++) {
        DEV_FREE_ALL((void *)b->dbags[t].values, (void *)b->dbags[t].offsets,
                     (void *)b->dbags[t].rows);
        kern_table_destroy(b->tabs[t]);
        KILN_FREE_ALL(b->offs[t], b->rows[t]);
    }
}

static void test_gather_parity(void **state)
{
    (void)state;
    batch_t b;
    make_batch(&b, KERN_OPT_SGD);
    const int64_t stride = b.stride;
    float *cpu = calloc(NBAGS * (size_t)stride, sizeof(float));
    float *gpu = calloc(NBAGS * (size_t)stride, sizeof(float));
    assert_int_equal(kern_cpu_gather_combine(NT, b.bags, NBAGS, stride, cpu), 0);
    batch_to_dev(&b);
    float *d_out = NULL;
    assert_int_equal(cudaMalloc((void **)&d_out, sizeof(float) * NBAGS * (size_t)stride),
                     cudaSuccess);
    assert_int_equal(kern_cuda_gather_combine(NT, b.dbags, NBAGS, stride, d_out, NULL), 0);
    assert_int_equal(cudaMemcpy(gpu, d_out, sizeof(float) * NBAGS * (size_t)stride,
                                cudaMemcpyDeviceToHost), cudaSuccess);
    assert_close(gpu, cpu, NBAGS * (size_t)stride);
    /* Tables 0 and 2 alone (dims 16 and 64) at aligned columns take the
     * float4 path; table 2 as a mean. */
    kern_bags_t h2[2] = {b.bags[0], b.bags[2]}, d2[2] = {b.dbags[0], b.dbags[2]};
    h2[1].out_col = d2[1].out_col = dims[0];
    h2[1].combine = d2[1].combine = KERN_COMBINE_MEAN;
    const int64_t s2 = dims[0] + dims[2];
    assert_int_equal(kern_cpu_gather_combine(2, h2, NBAGS, s2, cpu), 0);
    assert_int_equal(kern_cuda_gather_combine(2, d2, NBAGS, s2, d_out, NULL), 0);
    assert_int_equal(cudaMemcpy(gpu, d_out, sizeof(float) * NBAGS * (size_t)s2,
                                cudaMemcpyDeviceToHost), cudaSuccess);
    assert_close(gpu, cpu, NBAGS * (size_t)s2);
    batch_free(&b);
    cudaFree(d_out);
    free(cpu);
    free(gpu);
}

static void update_parity(kern_opt_kind_t kind)
{
    batch_t b;
    make_batch(&b, kind);
    const int64_t stride = b.stride;
    kern_opt_t opt = {.kind = kind, .lr = 0.05f, .eps = 1e-6f, .beta1 = 0.9f, .beta2 = 0.999f};
    kern_slab_t cs[NT], ds[NT];
    kern_row_grads_t cg[NT], dg[NT];
    float *gout = malloc(sizeof(float) * NBAGS * (size_t)stride);
    for (int64_t i = 0; i < NBAGS * stride; i++)
        gout[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
    for (int t = 0; t < NT; t++) {
        kern_table_slab(b.tabs[t], &cs[t]);
        size_t d = (size_t)dims[t], cap = 500;
        ds[t] = cs[t];
        ds[t].values = to_dev(cs[t].values, sizeof(float) * cap * d);
        ds[t].stamps = to_dev(cs[t].stamps, sizeof(int64_t) * cap);
        ds[t].opt_state = cs[t].nstate ? to_dev(cs[t].opt_state, sizeof(float) * cap * d *
                                                                     (size_t)cs[t].nstate)
                                       : NULL;
        ds[t].opt_steps = cs[t].opt_steps ? to_dev(cs[t].opt_steps, sizeof(uint32_t) * cap)
                                          : NULL;
        size_t nnz = (size_t)b.offs[t][NBAGS] + 1;
        cg[t] = (kern_row_grads_t){.rows = malloc(sizeof(int32_t) * nnz),
                                   .grads = malloc(sizeof(float) * nnz * d)};
    }
    assert_int_equal(kern_cpu_backward_reduce(NT, b.bags, NBAGS, stride, gout, cg), 0);
    for (int t = 0; t < NT; t++) {
        dg[t] = (kern_row_grads_t){
            .rows = to_dev(cg[t].rows, sizeof(int32_t) * (size_t)cg[t].n),
            .grads = to_dev(cg[t].grads, sizeof(float) * (size_t)cg[t].n * (size_t)dims[t]),
            .n = cg[t].n};
    }
    for (int64_t step = 2; step < 5; step++) {
        assert_int_equal(kern_cpu_sparse_update(&opt, NT, cs, cg, step), 0);
        assert_int_equal(kern_cuda_sparse_update(&opt, NT, ds, dg, step, NULL), 0);
    }
    for (int t = 0; t < NT; t++) {
        size_t n = 500 * (size_t)dims[t];
        float *h = malloc(sizeof(float) * n * 2);
        int64_t st[500];
        assert_int_equal(cudaMemcpy(h, ds[t].values, sizeof(float) * n, cudaMemcpyDeviceToHost),
                         cudaSuccess);
        assert_close(h, cs[t].values, n);
        if (cs[t].nstate) {
            size_t ns = n * (size_t)cs[t].nstate;
            assert_int_equal(cudaMemcpy(h, ds[t].opt_state, sizeof(float) * ns,
                                        cudaMemcpyDeviceToHost), cudaSuccess);
            assert_close(h, cs[t].opt_state, ns);
        }
        assert_int_equal(cudaMemcpy(st, ds[t].stamps, sizeof st, cudaMemcpyDeviceToHost),
                         cudaSuccess);
        assert_memory_equal(st, cs[t].stamps, sizeof st);
        DEV_FREE_ALL(ds[t].values, ds[t].stamps, ds[t].opt_state, ds[t].opt_steps, dg[t].rows,
                     dg[t].grads);
        KILN_FREE_ALL(h, cg[t].rows, cg[t].grads);
    }
    batch_free(&b);
    free(gout);
}

static void test_update_parity_sgd(void **state) { (void)state; update_parity(KERN_OPT_SGD); }
static void test_update_parity_adagrad(void **state)
{
    (void)state;
    update_parity(KERN_OPT_ADAGRAD);
}
static void test_update_parity_adam(void **state) { (void)state; update_parity(KERN_OPT_ADAM); }

/* GPU backward reduce vs the CPU one on the same bags and gradient:
 * the same unique rows, ascending, and the same sums within tolerance. */
static void test_backward_parity(void **state)
{
    (void)state;
    batch_t b;
    make_batch(&b, KERN_OPT_SGD);
    const int64_t stride = b.stride;
    batch_to_dev(&b);
    size_t nout = NBAGS * (size_t)stride;
    float *gout = malloc(sizeof(float) * nout);
    for (size_t i = 0; i < nout; i++)
        gout[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
    float *d_gout = to_dev(gout, sizeof(float) * nout);
    kern_row_grads_t cg[NT], dg[NT];
    for (int t = 0; t < NT; t++) {
        size_t nnz = (size_t)b.offs[t][NBAGS] + 1, d = (size_t)dims[t];
        cg[t] = (kern_row_grads_t){.rows = malloc(sizeof(int32_t) * nnz),
                                   .grads = malloc(sizeof(float) * nnz * d)};
        dg[t] = (kern_row_grads_t){.rows = to_dev(NULL, sizeof(int32_t) * nnz),
                                   .grads = to_dev(NULL, sizeof(float) * nnz * d)};
    }
    assert_int_equal(kern_cpu_backward_reduce(NT, b.bags, NBAGS, stride, gout, cg), 0);
    /* The device sums each row's positions in bag order with separate
     * multiply and add, as the CPU does: the same bits, on every run. */
    for (int run = 0; run < 2; run++) {
        assert_int_equal(kern_cuda_backward_reduce(NT, b.dbags, NBAGS, stride, d_gout, dg, NULL),
                         0);
        for (int t = 0; t < NT; t++) {
            assert_true(cg[t].n > 0);
            assert_int_equal(dg[t].n, cg[t].n);
            int32_t *hr = from_dev(dg[t].rows, sizeof(int32_t) * (size_t)cg[t].n);
            float *hg = from_dev(dg[t].grads, sizeof(float) * (size_t)cg[t].n * (size_t)dims[t]);
            assert_memory_equal(hr, cg[t].rows, sizeof(int32_t) * (size_t)cg[t].n);
            assert_memory_equal(hg, cg[t].grads, sizeof(float) * (size_t)cg[t].n * (size_t)dims[t]);
            free(hr);
            free(hg);
        }
    }
    for (int t = 0; t < NT; t++) {
        DEV_FREE_ALL(dg[t].rows, dg[t].grads);
        KILN_FREE_ALL(cg[t].rows, cg[t].grads);
    }
    batch_free(&b);
    cudaFree(d_gout);
    free(gout);
}

/* ---- the GPU table ------------------------------------------------------------------ */

static kern_table_config_t table_cfg(int dim, int64_t capacity, kern_evict_t evict)
{
    return (kern_table_config_t){.name = "gpu", .dim = dim, .capacity = capacity,
                                 .opt = KERN_OPT_ADAM, .init = KERN_INIT_NORMAL,
                                 .init_scale = 0.5f, .seed = 99, .evict = evict};
}

/* Checks that the GPU table maps keys (n, host) to d_rows consistently:
 * keys[rows[i]] == key, and its row values equal the CPU table's row of
 * the same key in cpu (the seeded init; nothing was trained). */
static void check_rows(kern_cuda_table_t *g, kern_table_t *cpu, int64_t n, const int64_t *keys,
                       const int32_t *d_rows)
{
    kern_slab_t gs, cs;
    kern_cuda_table_slab(g, &gs);
    kern_table_slab(cpu, &cs);
    const size_t dim = (size_t)gs.dim, cap = (size_t)gs.capacity;
    int32_t *gr = from_dev(d_rows, sizeof(int32_t) * (size_t)n);
    int64_t *gk = from_dev(kern_cuda_table_keys(g), sizeof(int64_t) * cap);
    float *gv = from_dev(gs.values, sizeof(float) * cap * dim);
    int32_t *cr = malloc(sizeof(int32_t) * (size_t)n);
    assert_int_equal(kern_table_find_or_insert(cpu, n, keys, 1, cr), 0);
    for (int64_t i = 0; i < n; i++) {
        assert_true(gr[i] >= 0 && (size_t)gr[i] < cap);
        assert_true(gk[gr[i]] == keys[i]);
        assert_close(gv + (size_t)gr[i] * dim, cs.values + (size_t)cr[i] * dim, dim);
    }
    KILN_FREE_ALL(gr, gk, gv, cr);
}

/* Counts the live keys of the GPU table and checks that they are unique. */
static int64_t count_live(kern_cuda_table_t *g)
{
    size_t cap = (size_t)kern_cuda_table_capacity(g);
    int64_t *gk = from_dev(kern_cuda_table_keys(g), sizeof(int64_t) * cap), n = 0;
    for (size_t s = 0; s < cap; s++)
        if (gk[s] != KERN_CUDA_EMPTY_KEY)
            gk[n++] = gk[s];
    qsort(gk, (size_t)n, sizeof *gk, cmp_i64);
    for (int64_t i = 1; i < n; i++)
        assert_true(gk[i] != gk[i - 1]);
    free(gk);
    return n;
}

/* Same keys (with duplicates) -> the CPU table's initial rows; a second
 * call and a find return the same rows; size counts distinct keys. */
static void test_table_insert_parity(void **state)
{
    (void)state;
    kern_table_config_t cfg = table_cfg(24, 4096, KERN_EVICT_NONE);
    kern_cuda_table_t *g = NULL;
    kern_table_t *cpu = NULL;
    assert_int_equal(kern_cuda_table_create(&cfg, &g), 0);
    assert_int_equal(kern_table_create(&cfg, &cpu), 0);
    assert_int_equal(kern_cuda_table_capacity(g), 4096);
    enum { N = 2000 };
    int64_t keys[N];
    for (int i = 0; i < N; i++)
        keys[i] = (int64_t)(rnd() % 1500) - 700; /* duplicates and negative keys */
    int64_t *d_keys = to_dev(keys, sizeof keys);
    int32_t *d_rows = to_dev(NULL, sizeof(int32_t) * N);
    int32_t *d_rows2 = to_dev(NULL, sizeof(int32_t) * N);
    assert_int_equal(kern_cuda_table_find_or_insert(g, N, d_keys, 1, d_rows, NULL), 0);
    check_rows(g, cpu, N, keys, d_rows);
    assert_int_equal(kern_cuda_table_size(g), kern_table_size(cpu));
    assert_int_equal(count_live(g), kern_table_size(cpu));

    int32_t *r1 = from_dev(d_rows, sizeof(int32_t) * N);
    assert_int_equal(kern_cuda_table_find_or_insert(g, N, d_keys, 2, d_rows2, NULL), 0);
    int32_t *r2 = from_dev(d_rows2, sizeof(int32_t) * N);
    assert_memory_equal(r1, r2, sizeof(int32_t) * N);
    assert_int_equal(kern_cuda_table_find(g, N, d_keys, d_rows2, NULL), 0);
    free(r2);
    r2 = from_dev(d_rows2, sizeof(int32_t) * N);
    assert_memory_equal(r1, r2, sizeof(int32_t) * N);
    assert_int_equal(kern_cuda_table_size(g), kern_table_size(cpu));

    /* A key never inserted is not found. */
    int64_t other = 1000000;
    int64_t *d_other = to_dev(&other, sizeof other);
    int32_t miss = 0;
    assert_int_equal(kern_cuda_table_find(g, 1, d_other, d_rows2, NULL), 0);
    assert_int_equal(cudaMemcpy(&miss, d_rows2, sizeof miss, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    assert_int_equal(miss, -1);
    free(r1);
    free(r2);
    cudaFree(d_keys);
    cudaFree(d_other);
    cudaFree(d_rows);
    cudaFree(d_rows2);
    kern_cuda_table_destroy(g);
    kern_table_destroy(cpu);
}

/* lru/lfu under pressure: 40 steps of 64 new keys into 256 slots. Every
 * call succeeds, the batch's keys sit in their rows with their seeded
 * initial values, live keys stay unique, and live + evicted = inserted. */
static void eviction_pressure(kern_evict_t evict)
{
    kern_table_config_t cfg = table_cfg(8, 256, evict);
    kern_table_config_t ref_cfg = table_cfg(8, 4096, KERN_EVICT_NONE);
    kern_cuda_table_t *g = NULL;
    kern_table_t *cpu = NULL;
    assert_int_equal(kern_cuda_table_create(&cfg, &g), 0);
    assert_int_equal(kern_table_create(&ref_cfg, &cpu), 0);
    enum { B = 64, STEPS = 40 };
    int64_t keys[B];
    int32_t *d_rows = to_dev(NULL, sizeof(int32_t) * B);
    for (int step = 1; step <= STEPS; step++) {
        for (int i = 0; i < B; i++)
            keys[i] = (int64_t)step * 1000 + i;
        int64_t *d_keys = to_dev(keys, sizeof keys);
        assert_int_equal(kern_cuda_table_find_or_insert(g, B, d_keys, step, d_rows, NULL), 0);
        check_rows(g, cpu, B, keys, d_rows);
        cudaFree(d_keys);
        int64_t nev = 0;
        const kern_evicted_t *ev = kern_cuda_table_evicted(g, &nev);
        assert_true(kern_cuda_table_size(g) <= 256);
        assert_int_equal(kern_cuda_table_size(g) + nev, (int64_t)step * B);
        assert_int_equal(count_live(g), kern_cuda_table_size(g));
        for (int64_t e = 0; e < nev; e++)
            assert_true(ev[e].key / 1000 < ev[e].step && ev[e].step <= step);
    }
    int64_t nev = 0;
    (void)kern_cuda_table_evicted(g, &nev);
    assert_true(nev >= STEPS * B - 256);
    kern_cuda_table_evicted_clear(g);
    (void)kern_cuda_table_evicted(g, &nev);
    assert_int_equal(nev, 0);
    cudaFree(d_rows);
    kern_cuda_table_destroy(g);
    kern_table_destroy(cpu);
}

static void test_table_evict_lru(void **state) { (void)state; eviction_pressure(KERN_EVICT_LRU); }
static void test_table_evict_lfu(void **state) { (void)state; eviction_pressure(KERN_EVICT_LFU); }

/* `none`: a batch that overflows a bucket is refused as a whole. */
static void test_table_full_none(void **state)
{
    (void)state;
    kern_table_config_t cfg = table_cfg(4, 64, KERN_EVICT_NONE);
    kern_cuda_table_t *g = NULL;
    assert_int_equal(kern_cuda_table_create(&cfg, &g), 0);
    enum { N = 100 };
    int64_t keys[N];
    for (int i = 0; i < N; i++)
        keys[i] = 5000 + i;
    int64_t *d_keys = to_dev(keys, sizeof keys);
    int32_t *d_rows = to_dev(NULL, sizeof(int32_t) * N);
    assert_int_equal(kern_cuda_table_find_or_insert(g, N, d_keys, 1, d_rows, NULL), KILN_EFULL);
    assert_int_equal(kern_cuda_table_size(g), 0);
    assert_int_equal(count_live(g), 0);
    assert_int_equal(kern_cuda_table_find(g, N, d_keys, d_rows, NULL), 0);
    int32_t *r = from_dev(d_rows, sizeof(int32_t) * N);
    for (int i = 0; i < N; i++)
        assert_int_equal(r[i], -1);
    /* The reserved key is refused. */
    int64_t bad = KERN_CUDA_EMPTY_KEY;
    int64_t *d_bad = to_dev(&bad, sizeof bad);
    assert_int_equal(kern_cuda_table_find_or_insert(g, 1, d_bad, 2, d_rows, NULL), KILN_EINVAL);
    free(r);
    cudaFree(d_bad);
    cudaFree(d_keys);
    cudaFree(d_rows);
    kern_cuda_table_destroy(g);
}

/* ---- N training steps on both backends ------------------------------------------------- */

#define TR_T 2
#define TR_BAGS 64
#define TR_STEPS 20
#define TR_UNIVERSE 300

static const int tr_dims[TR_T] = {16, 5};

/* Each step: keys -> rows (each backend its own table) -> gather -> loss
 * 0.5*|out|^2, whose gradient is out -> reduce -> update. The forward
 * outputs are compared at every step, the rows of every key at the end,
 * and the export scan against kern_table_changed_since. */
static void train_parity(kern_opt_kind_t kind)
{
    kern_opt_t opt = {.kind = kind, .lr = 0.05f, .eps = 1e-6f, .beta1 = 0.9f, .beta2 = 0.999f};
    kern_table_t *ct[TR_T];
    kern_cuda_table_t *gt[TR_T];
    int64_t stride = 0, col[TR_T];
    for (int t = 0; t < TR_T; t++) {
        kern_table_config_t cfg = {.name = "train", .dim = tr_dims[t], .capacity = 1024,
                                   .opt = kind, .init = KERN_INIT_UNIFORM, .init_scale = 0.3f,
                                   .seed = 5 + (uint64_t)t, .evict = KERN_EVICT_NONE};
        assert_int_equal(kern_table_create(&cfg, &ct[t]), 0);
        assert_int_equal(kern_cuda_table_create(&cfg, &gt[t]), 0);
        col[t] = stride;
        stride += tr_dims[t];
    }
    const size_t nout = TR_BAGS * (size_t)stride, maxnnz = TR_BAGS * 4;
    float *cout = malloc(sizeof(float) * nout), *d_out = to_dev(NULL, sizeof(float) * nout);
    for (int64_t step = 1; step <= TR_STEPS; step++) {
        kern_bags_t cb[TR_T], gb[TR_T];
        kern_slab_t cs[TR_T], gs[TR_T];
        kern_row_grads_t cg[TR_T], gg[TR_T];
        int64_t offs[TR_T][TR_BAGS + 1], keys[TR_T][TR_BAGS * 4];
        int32_t crows[TR_T][TR_BAGS * 4];
        void *dev[TR_T][5];
        for (int t = 0; t < TR_T; t++) {
            offs[t][0] = 0;
            for (int b = 0; b < TR_BAGS; b++) {
                int len = (int)(rnd() % 5); /* 0..4: empty and multi-hot bags */
                for (int k = 0; k < len; k++)
                    keys[t][offs[t][b] + k] = (int64_t)(rnd() % TR_UNIVERSE);
                offs[t][b + 1] = offs[t][b] + len;
            }
            int64_t nnz = offs[t][TR_BAGS];
            size_t d = (size_t)tr_dims[t];
            assert_int_equal(kern_table_find_or_insert(ct[t], nnz, keys[t], step, crows[t]), 0);
            dev[t][0] = to_dev(keys[t], sizeof(int64_t) * (size_t)nnz);
            dev[t][1] = to_dev(NULL, sizeof(int32_t) * maxnnz);
            dev[t][2] = to_dev(offs[t], sizeof offs[t]);
            dev[t][3] = to_dev(NULL, sizeof(int32_t) * maxnnz);
            dev[t][4] = to_dev(NULL, sizeof(float) * maxnnz * d);
            assert_int_equal(kern_cuda_table_find_or_insert(gt[t], nnz, dev[t][0], step,
                                                            dev[t][1], NULL), 0);
            kern_table_slab(ct[t], &cs[t]);
            kern_cuda_table_slab(gt[t], &gs[t]);
            kern_combine_t comb = t == 0 ? KERN_COMBINE_MEAN : KERN_COMBINE_SUM;
            cb[t] = (kern_bags_t){.values = cs[t].values, .capacity = cs[t].capacity,
                                  .dim = tr_dims[t], .combine = comb, .offsets = offs[t],
                                  .rows = crows[t], .out_col = col[t]};
            gb[t] = (kern_bags_t){.values = gs[t].values, .capacity = gs[t].capacity,
                                  .dim = tr_dims[t], .combine = comb, .offsets = dev[t][2],
                                  .rows = dev[t][1], .out_col = col[t]};
            cg[t] = (kern_row_grads_t){.rows = malloc(sizeof(int32_t) * maxnnz),
                                       .grads = malloc(sizeof(float) * maxnnz * d)};
            gg[t] = (kern_row_grads_t){.rows = dev[t][3], .grads = dev[t][4]};
        }
        assert_int_equal(kern_cpu_gather_combine(TR_T, cb, TR_BAGS, stride, cout), 0);
        assert_int_equal(kern_cuda_gather_combine(TR_T, gb, TR_BAGS, stride, d_out, NULL), 0);
        float *gout = from_dev(d_out, sizeof(float) * nout);
        assert_close_tol(gout, cout, nout, 1e-4f, 1e-3f);
        free(gout);
        /* d_out now serves as the gradient of 0.5*|out|^2, which is out. */
        assert_int_equal(kern_cpu_backward_reduce(TR_T, cb, TR_BAGS, stride, cout, cg), 0);
        assert_int_equal(kern_cuda_backward_reduce(TR_T, gb, TR_BAGS, stride, d_out, gg, NULL),
                         0);
        for (int t = 0; t < TR_T; t++) {
            assert_int_equal(gg[t].n, cg[t].n);
            kern_table_mark_changed(ct[t], cg[t].n, cg[t].rows);
        }
        assert_int_equal(kern_cpu_sparse_update(&opt, TR_T, cs, cg, step), 0);
        assert_int_equal(kern_cuda_sparse_update(&opt, TR_T, gs, gg, step, NULL), 0);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        for (int t = 0; t < TR_T; t++) {
            dev_free_all(dev[t], 5);
            KILN_FREE_ALL(cg[t].rows, cg[t].grads);
        }
    }

    /* Every key's row, optimizer state and stamp, looked up on each side. */
    for (int t = 0; t < TR_T; t++) {
        int64_t keys[TR_UNIVERSE];
        int32_t crow[TR_UNIVERSE];
        for (int i = 0; i < TR_UNIVERSE; i++)
            keys[i] = i;
        int64_t nfound = kern_table_find(ct[t], TR_UNIVERSE, keys, crow);
        assert_true(nfound > TR_UNIVERSE / 2);
        assert_int_equal(kern_cuda_table_size(gt[t]), nfound);
        int64_t *d_keys = to_dev(keys, sizeof keys);
        int32_t *d_rows = to_dev(NULL, sizeof(int32_t) * TR_UNIVERSE);
        assert_int_equal(kern_cuda_table_find(gt[t], TR_UNIVERSE, d_keys, d_rows, NULL), 0);
        int32_t *grow = from_dev(d_rows, sizeof(int32_t) * TR_UNIVERSE);
        kern_slab_t cs, gs;
        kern_table_slab(ct[t], &cs);
        kern_cuda_table_slab(gt[t], &gs);
        const size_t d = (size_t)tr_dims[t], sd = d * (size_t)cs.nstate, cap = (size_t)gs.capacity;
        float *gv = from_dev(gs.values, sizeof(float) * cap * d);
        float *go = sd ? from_dev(gs.opt_state, sizeof(float) * cap * sd) : NULL;
        int64_t *gst = from_dev(gs.stamps, sizeof(int64_t) * cap);
        for (int i = 0; i < TR_UNIVERSE; i++) {
            assert_int_equal(grow[i] < 0, crow[i] < 0);
            if (crow[i] < 0)
                continue;
            assert_close_tol(gv + (size_t)grow[i] * d, cs.values + (size_t)crow[i] * d, d, 1e-4f,
                             1e-3f);
            if (sd)
                assert_close_tol(go + (size_t)grow[i] * sd, cs.opt_state + (size_t)crow[i] * sd,
                                 sd, 1e-4f, 1e-3f);
            assert_int_equal(gst[grow[i]], cs.stamps[crow[i]]);
        }

        /* The export scan finds the key set of the CPU change tracking. */
        for (int64_t since = 0; since <= TR_STEPS; since += 10) {
            int32_t crows[TR_UNIVERSE];
            int64_t cn = 0, gn = 0, ckeys[TR_UNIVERSE];
            assert_int_equal(kern_table_changed_since(ct[t], since, crows, TR_UNIVERSE, &cn), 0);
            for (int64_t i = 0; i < cn; i++)
                ckeys[i] = kern_table_keys(ct[t])[crows[i]];
            int64_t *d_ek = to_dev(NULL, sizeof(int64_t) * TR_UNIVERSE);
            assert_int_equal(kern_cuda_table_changed_since(gt[t], since, d_rows, d_ek,
                                                           TR_UNIVERSE, &gn, NULL), 0);
            assert_int_equal(gn, cn);
            int64_t *gk = from_dev(d_ek, sizeof(int64_t) * (size_t)gn);
            qsort(ckeys, (size_t)cn, sizeof *ckeys, cmp_i64);
            qsort(gk, (size_t)gn, sizeof *gk, cmp_i64);
            assert_memory_equal(gk, ckeys, sizeof(int64_t) * (size_t)cn);
            if (since == TR_STEPS)
                assert_int_equal(gn, 0);
            else
                assert_true(gn > 0);
            /* A cap too small is ERANGE with the true count. */
            if (gn > 1) {
                int64_t n2 = 0;
                assert_int_equal(kern_cuda_table_changed_since(gt[t], since, d_rows, d_ek, 1,
                                                               &n2, NULL), KILN_ERANGE);
                assert_int_equal(n2, gn);
            }
            free(gk);
            cudaFree(d_ek);
        }
        KILN_FREE_ALL(gv, go, gst, grow);
        DEV_FREE_ALL(d_keys, d_rows);
        kern_table_destroy(ct[t]);
        kern_cuda_table_destroy(gt[t]);
    }
    free(cout);
    cudaFree(d_out);
}

static void test_train_parity_adagrad(void **state)
{
    (void)state;
    train_parity(KERN_OPT_ADAGRAD);
}
static void test_train_parity_adam(void **state) { (void)state; train_parity(KERN_OPT_ADAM); }


int main(void)
{
    if (kern_cuda_announce("linked") < 1)
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gather_parity),
        cmocka_unit_test(test_update_parity_sgd),
        cmocka_unit_test(test_update_parity_adagrad),
        cmocka_unit_test(test_update_parity_adam),
        cmocka_unit_test(test_backward_parity),
        cmocka_unit_test(test_table_insert_parity),
        cmocka_unit_test(test_table_evict_lru),
        cmocka_unit_test(test_table_evict_lfu),
        cmocka_unit_test(test_table_full_none),
        cmocka_unit_test(test_train_parity_adagrad),
        cmocka_unit_test(test_train_parity_adam),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
