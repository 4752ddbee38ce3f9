/*
 * tests/test_kernels_gpu.c - parity of the CUDA backend with the CPU one:
 * the same seeded tables and batches go through kern_cpu_* and kern_cuda_*
 * and must agree within atol + rtol*|cpu| (nvcc fuses multiply-adds and its
 * powf/sqrtf may differ in the last bit). Labelled gpu; exits 77, which
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

static void *to_dev(const void *h, size_t bytes)
{
    void *d = NULL;
    assert_int_equal(cudaMalloc(&d, bytes ? bytes : 4), cudaSuccess);
    if (bytes)
        assert_int_equal(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

static void assert_close(const float *a, const float *ref, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float tol = 1e-5f + 1e-4f * fabsf(ref[i]);
        if (!(fabsf(a[i] - ref[i]) <= tol))
            fail_msg("element %zu: cuda %.9g vs cpu %.9g", i, (double)a[i], (double)ref[i]);
    }
}

/* Builds NT tables of 500 rows and random bags (lengths 0..5). */
static void make_batch(kern_table_t **tabs, kern_bags_t *bags, int64_t **offs, int32_t **rows,
                       int64_t *stride, kern_opt_kind_t opt)
{
    int64_t col = 0;
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
        for (int b = 0; b < NBAGS; b++) {
            int len = (int)(rnd() % 6);
            for (int k = 0; k < len; k++)
                rows[t][offs[t][b] + k] = (int32_t)(rnd() % (uint64_t)kern_table_size(tabs[t]));
            offs[t][b + 1] = offs[t][b] + len;
        }
        kern_slab_t s;
        kern_table_slab(tabs[t], &s);
        bags[t] = (kern_bags_t){.values = s.values, .capacity = s.capacity, .dim = dims[t],
                                .combine = t == 1 ? KERN_COMBINE_MEAN : KERN_COMBINE_SUM,
                                .offsets = offs[t], .rows = rows[t], .out_col = col};
        col += dims[t];
    }
    *stride = col;
}

static void test_gather_parity(void **state)
{
    (void)state;
    kern_table_t *tabs[NT];
    kern_bags_t bags[NT], dbags[NT];
    int64_t *offs[NT], stride;
    int32_t *rows[NT];
    make_batch(tabs, bags, offs, rows, &stride, KERN_OPT_SGD);
    float *cpu = calloc(NBAGS * (size_t)stride, sizeof(float));
    float *gpu = calloc(NBAGS * (size_t)stride, sizeof(float));
    assert_int_equal(kern_cpu_gather_combine(NT, bags, NBAGS, stride, cpu), 0);
    for (int t = 0; t < NT; t++) {
        dbags[t] = bags[t];
        dbags[t].values = to_dev(bags[t].values, sizeof(float) * 500 * (size_t)dims[t]);
        dbags[t].offsets = to_dev(offs[t], sizeof(int64_t) * (NBAGS + 1));
        dbags[t].rows = to_dev(rows[t], sizeof(int32_t) * (size_t)offs[t][NBAGS]);
    }
    float *d_out = NULL;
    assert_int_equal(cudaMalloc((void **)&d_out, sizeof(float) * NBAGS * (size_t)stride),
                     cudaSuccess);
    assert_int_equal(kern_cuda_gather_combine(NT, dbags, NBAGS, stride, d_out, NULL), 0);
    assert_int_equal(cudaMemcpy(gpu, d_out, sizeof(float) * NBAGS * (size_t)stride,
                                cudaMemcpyDeviceToHost), cudaSuccess);
    assert_close(gpu, cpu, NBAGS * (size_t)stride);
    for (int t = 0; t < NT; t++) {
        cudaFree((void *)dbags[t].values);
        cudaFree((void *)dbags[t].offsets);
        cudaFree((void *)dbags[t].rows);
        kern_table_destroy(tabs[t]);
        free(offs[t]);
        free(rows[t]);
    }
    cudaFree(d_out);
    free(cpu);
    free(gpu);
}

static void update_parity(kern_opt_kind_t kind)
{
    kern_table_t *tabs[NT];
    kern_bags_t bags[NT];
    int64_t *offs[NT], stride;
    int32_t *rows[NT];
    make_batch(tabs, bags, offs, rows, &stride, kind);
    kern_opt_t opt = {.kind = kind, .lr = 0.05f, .eps = 1e-6f, .beta1 = 0.9f, .beta2 = 0.999f};
    kern_slab_t cs[NT], ds[NT];
    kern_row_grads_t cg[NT], dg[NT];
    float *gout = malloc(sizeof(float) * NBAGS * (size_t)stride);
    for (int64_t i = 0; i < NBAGS * stride; i++)
        gout[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
    for (int t = 0; t < NT; t++) {
        kern_table_slab(tabs[t], &cs[t]);
        size_t d = (size_t)dims[t], cap = 500;
        ds[t] = cs[t];
        ds[t].values = to_dev(cs[t].values, sizeof(float) * cap * d);
        ds[t].stamps = to_dev(cs[t].stamps, sizeof(int64_t) * cap);
        ds[t].opt_state = cs[t].nstate ? to_dev(cs[t].opt_state, sizeof(float) * cap * d *
                                                                     (size_t)cs[t].nstate)
                                       : NULL;
        ds[t].opt_steps = cs[t].opt_steps ? to_dev(cs[t].opt_steps, sizeof(uint32_t) * cap)
                                          : NULL;
        size_t nnz = (size_t)offs[t][NBAGS] + 1;
        cg[t] = (kern_row_grads_t){.rows = malloc(sizeof(int32_t) * nnz),
                                   .grads = malloc(sizeof(float) * nnz * d)};
    }
    assert_int_equal(kern_cpu_backward_reduce(NT, bags, NBAGS, stride, gout, cg), 0);
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
        free(h);
        cudaFree(ds[t].values);
        cudaFree(ds[t].stamps);
        cudaFree(ds[t].opt_state);
        cudaFree(ds[t].opt_steps);
        cudaFree(dg[t].rows);
        cudaFree(dg[t].grads);
        free(cg[t].rows);
        free(cg[t].grads);
        kern_table_destroy(tabs[t]);
        free(offs[t]);
        free(rows[t]);
    }
    free(gout);
}

static void test_update_parity_sgd(void **state) { (void)state; update_parity(KERN_OPT_SGD); }
static void test_update_parity_adagrad(void **state)
{
    (void)state;
    update_parity(KERN_OPT_ADAGRAD);
}
static void test_update_parity_adam(void **state) { (void)state; update_parity(KERN_OPT_ADAM); }

int main(void)
{
    int rt = 0, cublas = 0, nccl = 0;
    kern_cuda_versions(&rt, &cublas, &nccl);
    printf("linked: CUDA runtime %d, cuBLAS %d, NCCL %d\n", rt, cublas, nccl);
    if (kern_cuda_device_count() < 1) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gather_parity),
        cmocka_unit_test(test_update_parity_sgd),
        cmocka_unit_test(test_update_parity_adagrad),
        cmocka_unit_test(test_update_parity_adam),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
