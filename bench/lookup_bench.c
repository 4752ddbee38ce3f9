/*
 * bench/lookup_bench.c - two measurements of the lookup side of a step
 * against this machine's own bounds, each the median of several runs:
 *
 *   lookup: kern_cpu_gather_combine over 26 tables of dim 16 (batch 4096,
 *     one key per bag, power-law keys over tables of 1 M rows each) in rows
 *     gathered per second, against a plain random-row gather: the same
 *     number of 64-byte rows copied from one array of the same total size
 *     at uniformly random rows (no bags, no tables, no combine), with the
 *     same OpenMP threads. The ratio is fused / plain.
 *
 *   roofline: the dlrm step's bound from the GEMM rate and the gather rate
 *     measured here. OpenBLAS sgemm GFLOP/s at each dlrm layer shape (the
 *     forward, weight-gradient and input-gradient GEMMs of bottom 13-64-16
 *     and top 367-256-128-1, batch 4096), split over the OpenMP threads the
 *     way model/model_dlrm.c does, gives the GEMM time of a step; the
 *     fused gather rate gives the time to move its embedding rows (forward
 *     gather + backward scatter, 2 x 26 x 4096 rows). Bound per step =
 *     gemm_flops / gemm_rate + gathered_bytes / gather_rate; with
 *     --dlrm-sps S (kiln-train's measured samples/s) it prints achieved /
 *     bound.
 *
 *   bounds: this machine's memory bandwidth (a STREAM triad over three
 *     256 MB arrays, 2 reads + 1 write per element) and, for lr (dim 1)
 *     and fm (dim 17), the gather-and-update bound of a step: the batch's
 *     DISTINCT rows (the power-law draw above, deduplicated per table, as
 *     kiln-train does) each read once at random (a plain row copy) and
 *     updated once at random with adagrad (row and accumulator read and
 *     written), each rate measured here over 26 tables' worth of rows of
 *     the model's width; pooling the 26 x 4096 lookups from those rows is
 *     cache-resident and not counted. Bound samples/s = 4096 / (distinct
 *     x (1 / gather rate + 1 / update rate)). With --lr-sps / --fm-sps
 *     (kiln-train's measured samples/s) it prints achieved / bound.
 *
 * The GEMMs run the kernels kiln-train runs: the bench chooses OpenBLAS's
 * core type as kiln-train does (model_kernels_ensure) and names it.
 *
 *   lookup_bench [--threads N] [--runs R] [--rows-per-table N] [--dlrm-sps S]
 *                [--lr-sps S] [--fm-sps S]
 *
 * Prints one JSON line.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kern.h"
#include "kiln.h"
#include "model.h"

enum { NT = 26, DIM = 16, BATCH = 4096 };

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rng(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double u01(void)
{
    return (double)(rng() >> 11) * (1.0 / 9007199254740992.0);
}

static double now_s(void)
{
    return (double)kiln_mono_ns() / 1e9;
}

/* A power-law rank in [0, n): a continuous Pareto-like draw, exponent 1.1,
 * as kiln datagen does for its ids. */
static int32_t power_law(int64_t n)
{
    double a = 1.1, u = u01();
    double x = pow(1.0 - u * (1.0 - pow((double)n, 1.0 - a)), 1.0 / (1.0 - a)) - 1.0;
    int64_t r = (int64_t)x;
    return (int32_t)(r < 0 ? 0 : r >= n ? n - 1 : r);
}

/* ---- GEMM rate at the dlrm shapes ------------------------------------------------ */

/* C (m, nn) = op(A) op(B), rows of C split over the OpenMP threads. */
static void gemm_rows(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int nn, int k,
                      const float *A, int lda, const float *B, int ldb, float *C, int ldc)
{
#pragma omp parallel
    {
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
        const int panels = (m + 15) / 16;
        const int p0 = (int)((int64_t)panels * id / nt), p1 = (int)((int64_t)panels * (id + 1) / nt);
        const int m0 = p0 * 16, m1 = p1 * 16 < m ? p1 * 16 : m;
        if (m1 > m0) {
            const float *a = ta == CblasNoTrans ? A + (size_t)m0 * (size_t)lda : A + m0;
            cblas_sgemm(CblasRowMajor, ta, tb, m1 - m0, nn, k, 1.0f, a, lda, B, ldb, 0.0f,
                        C + (size_t)m0 * (size_t)ldc, ldc);
        }
    }
}

typedef struct {
    int in, out;
} layer_t;

/* Seconds for one step's GEMMs (forward, dW, dA of every layer; no dA for
 * the first), and their flops. */
static double dlrm_gemms(const layer_t *L, int nl, float *A, float *W, float *C, double *flops)
{
    double t0 = now_s(), f = 0.0;
    for (int l = 0; l < nl; l++) {
        int in = L[l].in, out = L[l].out;
        gemm_rows(CblasNoTrans, CblasTrans, BATCH, out, in, A, in, W, in, C, out);
        gemm_rows(CblasTrans, CblasNoTrans, out, in, BATCH, C, out, A, in, W, in);
        f += 4.0 * BATCH * in * out;
        if (l > 0) {
            gemm_rows(CblasNoTrans, CblasNoTrans, BATCH, in, out, C, out, W, in, A, in);
            f += 2.0 * BATCH * in * out;
        }
    }
    *flops = f;
    return now_s() - t0;
}

/* ---- memory bandwidth, and the gather-and-update bound of lr and fm ----------- */

/* STREAM triad a = b + s c over n floats each; bytes moved per second. */
static double triad_bytes_per_s(size_t n, int runs)
{
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
    if (!a || !b || !c)
        return 0;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        a[i] = 0.0f;
        b[i] = 1.0f;
        c[i] = 2.0f;
    }
    double best = 0;
    for (int r = 0; r < runs; r++) {
        double t0 = now_s();
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            a[i] = b[i] + 0.5f * c[i];
        double bps = 3.0 * (double)n * sizeof(float) / (now_s() - t0);
        best = bps > best ? bps : best;
    }
    KILN_FREE_ALL(a, b, c);
    return best; /* STREAM reports the best run */
}

/* Rows per second of (a) plain random-row gathers of `dim` floats and (b)
 * adagrad updates of random rows (row and accumulator read and written),
 * over a table of nrows rows; medians of runs. */
static void row_rates(int64_t nrows, int dim, int runs, double *gather, double *update)
{
    const size_t cnt = (size_t)nrows * (size_t)dim;
    float *v = malloc(cnt * sizeof *v), *acc = malloc(cnt * sizeof *acc);
    float *out = malloc((size_t)NT * BATCH * (size_t)dim * sizeof *out);
    int64_t *idx = malloc((size_t)NT * BATCH * sizeof *idx);
    double g[101], u[101];
    *gather = *update = 0;
    if (!v || !acc || !out || !idx)
        goto out;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < cnt; i++) {
        v[i] = (float)(i % 89) * 0.01f;
        acc[i] = 1.0f;
    }
    const int64_t n = (int64_t)NT * BATCH;
    for (int r = 0; r < runs; r++) {
        for (int64_t i = 0; i < n; i++)
            idx[i] = (int64_t)(rng() % (uint64_t)nrows);
        double t0 = now_s();
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++)
            memcpy(out + i * dim, v + idx[i] * dim, sizeof(float) * (size_t)dim);
        g[r] = (double)n / (now_s() - t0);
        t0 = now_s();
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float *w = v + idx[i] * dim, *a = acc + idx[i] * dim;
            const float *gr = out + i * dim;
            for (int j = 0; j < dim; j++) {
                a[j] += gr[j] * gr[j];
                w[j] -= 0.05f * gr[j] / (sqrtf(a[j]) + 1e-8f);
            }
        }
        u[r] = (double)n / (now_s() - t0);
    }
    *gather = bench_median(g, runs);
    *update = bench_median(u, runs);
out:
    KILN_FREE_ALL(v, acc, out, idx);
}

static int cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Distinct rows per batch over the 26 tables of the power-law draw. */
static int64_t distinct_rows(const int32_t *rows)
{
    int64_t total = 0;
    int32_t *tmp = malloc(sizeof(int32_t) * BATCH);
    for (int t = 0; tmp && t < NT; t++) {
        memcpy(tmp, rows + (size_t)t * BATCH, sizeof(int32_t) * BATCH);
        qsort(tmp, BATCH, sizeof *tmp, cmp_i32);
        for (int i = 0; i < BATCH; i++)
            total += i == 0 || tmp[i] != tmp[i - 1];
    }
    free(tmp);
    return total;
}

int main(int argc, char **argv)
{
    int threads = 2, runs = 7;
    int64_t rows_per_table = 1000000;
    double dlrm_sps = 0.0, lr_sps = 0.0, fm_sps = 0.0;
    /* The GEMM bound is of the kernels kiln-train runs (may execute the
     * bench again with OpenBLAS's core type set, as kiln-train does). */
    if (model_kernels_ensure(argv) < 0)
        fprintf(stderr, "lookup_bench: %s\n", kiln_errmsg());
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rows-per-table") && i + 1 < argc)
            rows_per_table = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--dlrm-sps") && i + 1 < argc)
            dlrm_sps = atof(argv[++i]);
        else if (!strcmp(argv[i], "--lr-sps") && i + 1 < argc)
            lr_sps = atof(argv[++i]);
        else if (!strcmp(argv[i], "--fm-sps") && i + 1 < argc)
            fm_sps = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: lookup_bench [--threads N] [--runs R] "
                            "[--rows-per-table N] [--dlrm-sps S] [--lr-sps S] [--fm-sps S]\n");
            return 2;
        }
    }
    if (threads < 1 || runs < 1 || runs > 101 || rows_per_table < 1000) {
        fprintf(stderr, "lookup_bench: bad --threads, --runs or --rows-per-table\n");
        return 2;
    }
    omp_set_num_threads(threads);
    openblas_set_num_threads(1);

    /* Tables: 26 slabs of rows_per_table x 16 floats, written once. */
    const size_t tab_floats = (size_t)rows_per_table * DIM;
    float **vals = calloc(NT, sizeof *vals);
    int64_t *offsets = malloc(sizeof(int64_t) * (BATCH + 1));
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)NT * BATCH);
    float *out = malloc(sizeof(float) * (size_t)BATCH * NT * DIM);
    /* The plain gather: one array of the same total size. */
    const size_t all_rows = (size_t)NT * (size_t)rows_per_table;
    float *flat = malloc(sizeof(float) * all_rows * DIM);
    int64_t *prow = malloc(sizeof(int64_t) * (size_t)NT * BATCH);
    if (!vals || !offsets || !rows || !out || !flat || !prow) {
        fprintf(stderr, "lookup_bench: out of memory\n");
        return 1;
    }
    for (int t = 0; t < NT; t++) {
        vals[t] = malloc(sizeof(float) * tab_floats);
        if (!vals[t]) {
            fprintf(stderr, "lookup_bench: out of memory\n");
            return 1;
        }
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < tab_floats; i++)
            vals[t][i] = (float)(i % 97) * 0.01f;
    }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < all_rows * DIM; i++)
        flat[i] = (float)(i % 89) * 0.01f;
    for (int64_t b = 0; b <= BATCH; b++)
        offsets[b] = b;
    kern_bags_t bags[NT];
    for (int t = 0; t < NT; t++)
        bags[t] = (kern_bags_t){.values = vals[t], .capacity = rows_per_table, .dim = DIM,
                                .combine = KERN_COMBINE_SUM, .offsets = offsets,
                                .rows = rows + (size_t)t * BATCH, .out_col = (int64_t)t * DIM};

    /* Each run draws fresh keys: power-law ranks scattered over the table
     * (a hash of the rank), as a trained table's rows are. */
    double fused[101], plain[101], ratio[101], gemm_s[101], flops = 0.0;
    const double nrows = (double)NT * BATCH;
    const layer_t L[] = {{13, 64}, {64, 16}, {367, 256}, {256, 128}, {128, 1}};
    float *gA = calloc((size_t)BATCH * 367, sizeof(float));
    float *gW = calloc(367 * 256, sizeof(float));
    float *gC = calloc((size_t)BATCH * 256, sizeof(float));
    if (!gA || !gW || !gC) {
        fprintf(stderr, "lookup_bench: out of memory\n");
        return 1;
    }
    for (int r = 0; r < runs; r++) {
        for (int64_t i = 0; i < NT * BATCH; i++) {
            uint64_t h = (uint64_t)power_law(rows_per_table) * 0x9e3779b97f4a7c15ULL;
            rows[i] = (int32_t)((h >> 20) % (uint64_t)rows_per_table);
            prow[i] = (int64_t)(rng() % all_rows);
        }
        /* 20 batches per timing so one run lasts a few ms. */
        double t0 = now_s();
        for (int k = 0; k < 20; k++)
            if (kern_cpu_gather_combine(NT, bags, BATCH, NT * DIM, out) < 0) {
                fprintf(stderr, "lookup_bench: %s\n", kiln_errmsg());
                return 1;
            }
        fused[r] = 20 * nrows / (now_s() - t0);

        t0 = now_s();
        for (int k = 0; k < 20; k++) {
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < NT * BATCH; i++)
                memcpy(out + i * DIM, flat + prow[i] * DIM, sizeof(float) * DIM);
        }
        plain[r] = 20 * nrows / (now_s() - t0);
        ratio[r] = fused[r] / plain[r];

        gemm_s[r] = dlrm_gemms(L, 5, gA, gW, gC, &flops);
    }
    /* The ratio is the median of the runs' ratios: fused and plain run back
     * to back, so noise from other work on the machine mostly cancels. */
    double q = bench_median(ratio, runs);
    double f = bench_median(fused, runs), p = bench_median(plain, runs), g = bench_median(gemm_s, runs);
    double gemm_gflops = flops / g / 1e9;
    /* Bound per step: GEMMs at the measured rate plus moving 2 x 26 x 4096
     * rows (gather forward, scatter backward) at the fused gather rate. */
    double step_bound_s = flops / (gemm_gflops * 1e9) + 2.0 * nrows / f;
    double bound_sps = BATCH / step_bound_s;
    printf("{\"threads\": %d, \"runs\": %d, \"tables\": %d, \"dim\": %d, \"batch\": %d, "
           "\"rows_per_table\": %lld, \"fused_rows_per_s\": %.0f, \"plain_rows_per_s\": %.0f, "
           "\"fused_over_plain\": %.3f, \"dlrm_gemm_gflops\": %.1f, "
           "\"dlrm_gemm_flops_per_step\": %.0f, \"dlrm_bound_samples_per_s\": %.0f",
           threads, runs, NT, DIM, BATCH, (long long)rows_per_table, f, p, q, gemm_gflops,
           flops, bound_sps);
    if (dlrm_sps > 0)
        printf(", \"dlrm_samples_per_s\": %.0f, \"dlrm_over_bound\": %.3f", dlrm_sps,
               dlrm_sps / bound_sps);
    model_kernels_t kk;
    model_kernels_describe(&kk);
    printf(", \"dense_kernels\": \"%s\"", kk.name);
    /* Memory bandwidth, and lr's and fm's gather-and-update bounds. */
    printf(", \"triad_gb_per_s\": %.1f", triad_bytes_per_s((size_t)64 << 20, runs) / 1e9);
    const int64_t uniq = distinct_rows(rows);
    static const struct {
        const char *name;
        int dim;
    } lin[] = {{"lr", 1}, {"fm", 17}};
    for (int i = 0; i < 2; i++) {
        double gr, up;
        row_rates((int64_t)all_rows, lin[i].dim, runs, &gr, &up);
        /* The least a step must do: read each distinct row once at random
         * and update it once (pooling from those rows is cache-resident). */
        const double step = (double)uniq / gr + (double)uniq / up, sps = BATCH / step;
        const double have = i == 0 ? lr_sps : fm_sps;
        printf(", \"%s_gather_rows_per_s\": %.0f, \"%s_update_rows_per_s\": %.0f, "
               "\"%s_bound_samples_per_s\": %.0f",
               lin[i].name, gr, lin[i].name, up, lin[i].name, sps);
        if (have > 0)
            printf(", \"%s_samples_per_s\": %.0f, \"%s_over_bound\": %.3f", lin[i].name, have,
                   lin[i].name, have / sps);
    }
    printf(", \"distinct_rows_per_batch\": %lld}\n", (long long)uniq);
    for (int t = 0; t < NT; t++)
        free(vals[t]);
    KILN_FREE_ALL(vals, offsets, rows, out, flat, prow, gA, gW, gC);
    return 0;
}
