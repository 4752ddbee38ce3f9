/*
 * bench/gemm_bench.c - which dense kernels should dlrm's layers run? The
 * GFLOP/s of each candidate at dlrm's layer shapes, the way model/ calls
 * them: 256-row blocks spread over the OpenMP threads, one single-threaded
 * call per block (model_blas.c), for the forward (Y = A W^T), the input
 * gradient (dA = dY W) and the weight gradient (dW = dY^T A, one 256-row
 * block per call) of bottom 13-64-16 and top 367-256-128-1 at batch 4096.
 *
 * Candidates, each the median of --runs timings of a whole step's GEMMs:
 *   OpenBLAS as the library picks its kernels on this CPU (no
 *     OPENBLAS_CORETYPE), then with each core type the CPU can run forced
 *     (the bench executes itself again per core type: OpenBLAS reads the
 *     variable when it loads);
 *   oneDNN's dnnl_sgemm (libdnnl, dispatches on CPU features), when the
 *     bench was built with it;
 *   BLIS's bli_sgemm (libblis.so.4, loaded with dlopen so that its BLAS
 *     symbols cannot shadow OpenBLAS's), when installed;
 *   and Kiln's own dense layers, as a step runs them (model_dense_linear_fwd
 *     and _bwd of a dlrm model of these shapes: the conversions, the
 *     float64 weight-gradient sums and the bias columns included), once
 *     with model.dense_precision fp32 (OpenBLAS) and, on a CPU with bf16,
 *     once with bf16 (model_bf16.c: oneDNN, operands rounded once per
 *     layer, weights once per step): the figure for the precision choice.
 *
 *   gemm_bench [--threads N] [--runs R]
 *
 * Prints one JSON line per candidate, then one summary line with the ratio
 * of each to OpenBLAS as installed.
 */
#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef KILN_BENCH_DNNL
#include <dnnl.h>
#endif

#include "bench.h"
#include "kiln.h"
#define MODEL_IMPL /* the layers' own calls, model_dense_linear_* */
#include "model.h"

enum { BATCH = 4096, BLOCK = 256 };

static const int layers[][2] = {{13, 64}, {64, 16}, {367, 256}, {256, 128}, {128, 1}};
#define NLAYERS ((int)(sizeof layers / sizeof layers[0]))

/* C (m, n; ldc) = op(A) op(B), row-major, one thread. */
typedef void (*gemm_fn)(bool ta, bool tb, int m, int n, int k, const float *A, int lda,
                        const float *B, int ldb, float *C, int ldc);

static void openblas_gemm(bool ta, bool tb, int m, int n, int k, const float *A, int lda,
                          const float *B, int ldb, float *C, int ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                n, k, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}

#ifdef KILN_BENCH_DNNL
/* ---- oneDNN bf16 matmul: the candidate for model.dense_precision: bf16 ----
 * bf16 inputs (converted from float32 per call, as a bf16 layer would do
 * for its activations), float32 output; one primitive per (shape,
 * transposes), memory objects per thread. */
enum { MM_MAX = 64, MM_THREADS = 64 };
typedef struct {
    int m, n, k;
    bool ta, tb;
    dnnl_primitive_t p;
    dnnl_memory_t a[MM_THREADS], b[MM_THREADS], c[MM_THREADS];
} mm_t;
static mm_t mms[MM_MAX];
static int nmm;
static dnnl_engine_t eng;
static dnnl_stream_t strm[MM_THREADS];
static uint16_t *bfA[MM_THREADS], *bfB[MM_THREADS];

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16); /* round to nearest even */
}

static mm_t *mm_get(bool ta, bool tb, int m, int n, int k)
{
    for (int i = 0; i < nmm; i++)
        if (mms[i].m == m && mms[i].n == n && mms[i].k == k && mms[i].ta == ta && mms[i].tb == tb)
            return &mms[i];
    mm_t *x = &mms[nmm++];
    *x = (mm_t){.m = m, .n = n, .k = k, .ta = ta, .tb = tb};
    dnnl_dims_t ad = {m, k}, bd = {k, n}, cd = {m, n};
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_memory_desc_init_by_tag(&amd, 2, ad, dnnl_bf16, ta ? dnnl_ba : dnnl_ab);
    dnnl_memory_desc_init_by_tag(&bmd, 2, bd, dnnl_bf16, tb ? dnnl_ba : dnnl_ab);
    dnnl_memory_desc_init_by_tag(&cmd, 2, cd, dnnl_f32, dnnl_ab);
    dnnl_matmul_desc_t d;
    dnnl_primitive_desc_t pd;
    if (dnnl_matmul_desc_init(&d, &amd, &bmd, NULL, &cmd) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &d, NULL, eng, NULL) != dnnl_success ||
        dnnl_primitive_create(&x->p, pd) != dnnl_success) {
        fprintf(stderr, "gemm_bench: oneDNN bf16 matmul %dx%dx%d unavailable\n", m, n, k);
        exit(1);
    }
    dnnl_primitive_desc_destroy(pd);
    for (int t = 0; t < MM_THREADS; t++) {
        dnnl_memory_create(&x->a[t], &amd, eng, DNNL_MEMORY_NONE);
        dnnl_memory_create(&x->b[t], &bmd, eng, DNNL_MEMORY_NONE);
        dnnl_memory_create(&x->c[t], &cmd, eng, DNNL_MEMORY_NONE);
    }
    return x;
}

/* Converts op(A) and op(B) (dense: lda == k or m, ldb == n or k, as the
 * bench passes them) to bf16 and runs the matmul on this thread. */
static void onednn_bf16_gemm(bool ta, bool tb, int m, int n, int k, const float *A, int lda,
                             const float *B, int ldb, float *C, int ldc)
{
    (void)lda;
    (void)ldb;
    (void)ldc;
    mm_t *x;
#pragma omp critical(gemm_bench_mm)
    x = mm_get(ta, tb, m, n, k);
    const int t = omp_get_thread_num();
    uint16_t *a = bfA[t], *b = bfB[t];
    for (size_t i = 0; i < (size_t)m * k; i++)
        a[i] = to_bf16(A[i]);
    for (size_t i = 0; i < (size_t)k * n; i++)
        b[i] = to_bf16(B[i]);
    dnnl_memory_set_data_handle(x->a[t], a);
    dnnl_memory_set_data_handle(x->b[t], b);
    dnnl_memory_set_data_handle(x->c[t], C);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, x->a[t]}, {DNNL_ARG_WEIGHTS, x->b[t]},
                               {DNNL_ARG_DST, x->c[t]}};
    dnnl_primitive_execute(x->p, strm[t], 3, args);
    dnnl_stream_wait(strm[t]);
}

static void onednn_bf16_init(int threads)
{
    dnnl_engine_create(&eng, dnnl_cpu, 0);
    for (int t = 0; t < threads && t < MM_THREADS; t++) {
        dnnl_stream_create(&strm[t], eng, dnnl_stream_default_flags);
        bfA[t] = malloc((size_t)400 * 400 * 2 + (size_t)BLOCK * 400 * 2);
        bfB[t] = malloc((size_t)400 * 400 * 2 + (size_t)BLOCK * 400 * 2);
    }
}

static void onednn_gemm(bool ta, bool tb, int m, int n, int k, const float *A, int lda,
                      const float *B, int ldb, float *C, int ldc)
{
    dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}
#endif

/* BLIS's typed API with general strides: row-major and transposes are
 * strides, so every call is BLIS_NO_TRANSPOSE. */
typedef void (*bli_sgemm_fn)(int, int, int64_t, int64_t, int64_t, const float *, const float *,
                             int64_t, int64_t, const float *, int64_t, int64_t, const float *,
                             float *, int64_t, int64_t);
static bli_sgemm_fn bli_sgemm_p;

static void blis_gemm(bool ta, bool tb, int m, int n, int k, const float *A, int lda,
                      const float *B, int ldb, float *C, int ldc)
{
    const float one = 1.0f, zero = 0.0f;
    bli_sgemm_p(0, 0, m, n, k, &one, A, ta ? 1 : lda, ta ? lda : 1, B, tb ? 1 : ldb, tb ? ldb : 1,
                &zero, C, ldc, 1);
}

typedef struct {
    float *A, *W, *Y, *dY, *dA, *dW[64];
} bufs_t;

/* One step's GEMMs over the layers; returns their flops. */
static double step(gemm_fn g, bufs_t *b)
{
    double flops = 0;
    for (int l = 0; l < NLAYERS; l++) {
        const int in = layers[l][0], out = layers[l][1];
#pragma omp parallel for schedule(static)
        for (int blk = 0; blk < BATCH / BLOCK; blk++) {
            const size_t r0 = (size_t)blk * BLOCK;
            g(false, true, BLOCK, out, in, b->A + r0 * in, in, b->W, in, b->Y + r0 * out, out);
            g(false, false, BLOCK, in, out, b->dY + r0 * out, out, b->W, in, b->dA + r0 * in, in);
            g(true, false, out, in, BLOCK, b->dY + r0 * out, out, b->A + r0 * in, in,
              b->dW[omp_get_thread_num()], in);
        }
        flops += 3.0 * 2.0 * BATCH * in * out;
    }
    return flops;
}

static double measure(gemm_fn g, int runs)
{
    bufs_t b;
    const size_t big = (size_t)BATCH * 400;
    b.A = calloc(big, sizeof(float));
    b.Y = calloc(big, sizeof(float));
    b.dY = calloc(big, sizeof(float));
    b.dA = calloc(big, sizeof(float));
    b.W = calloc(400 * 400, sizeof(float));
    for (int t = 0; t < 64; t++)
        b.dW[t] = calloc(400 * 400, sizeof(float));
    for (size_t i = 0; i < big; i++)
        b.A[i] = b.dY[i] = (float)(i % 97) * 0.01f;
    for (size_t i = 0; i < 400 * 400; i++)
        b.W[i] = (float)(i % 89) * 0.01f;
    double *rate = calloc((size_t)runs, sizeof(double));
    step(g, &b); /* warm-up: packing buffers, page faults */
    for (int r = 0; r < runs; r++) {
        double t0 = (double)kiln_mono_ns();
        double flops = 0;
        for (int it = 0; it < 10; it++)
            flops += step(g, &b);
        rate[r] = flops / ((double)kiln_mono_ns() - t0); /* flops per ns = GFLOP/s */
    }
    double med = bench_median(rate, runs);
    free(rate);
    KILN_FREE_ALL(b.A, b.Y, b.dY, b.dA, b.W);
    for (int t = 0; t < 64; t++)
        free(b.dW[t]);
    return med;
}

/* A dlrm model of the bench's shapes (dlrm's default), lr 0, in precision p. */
static model_t *layers_model(model_dense_precision_t p)
{
    static const int bottom[] = {64, 16}, top[] = {256, 128, 1};
    const model_config_t cfg = {.type = MODEL_DLRM, .nslots = 26, .ndense = 13, .dim = 16,
                                   .bottom = bottom, .nbottom = 2, .top = top, .ntop = 3,
                                   .max_batch = BATCH, .seed = 1,
                                   .opt = {.type = KERN_OPT_SGD, .lr = 0.0f},
                                   .precision = p};
    model_t *m = NULL;
    if (model_create(&cfg, &m) < 0) {
        fprintf(stderr, "gemm_bench: %s\n", kiln_errmsg());
        exit(1);
    }
    return m;
}

/* 10 steps of m's dense layers as a step runs them; returns GFLOP/s (the
 * flops of the three products of every layer; the first has no input
 * gradient). A (BATCH, 400) inputs, dY output gradients, Y and dA outputs. */
static double layers_once(model_t *m, const float *A, const float *dY, float *Y, float *dA)
{
    const double t0 = (double)kiln_mono_ns();
    double flops = 0;
    for (int it = 0; it < 10; it++) {
        model_step(m); /* lr 0: remakes bf16's weight copy, as a step does */
        for (int l = 0; l < m->nbottom + m->ntop; l++) {
            const model_layer_t *L = &m->layers[l];
            const int ldy = l == m->nbottom - 1 ? m->ldr : L->out;
            model_dense_linear_fwd(m, BATCH, L, A, L->in, Y, ldy);
            model_dense_linear_bwd(m, BATCH, L, A, L->in, dY, L->out, l > 0 ? dA : NULL, L->in);
            flops += (l > 0 ? 3.0 : 2.0) * 2.0 * BATCH * L->in * L->out;
        }
    }
    return flops / ((double)kiln_mono_ns() - t0);
}

/* --layers: Kiln's own dense layers, fp32 and (where the CPU has it) bf16,
 * their runs interleaved so that both see the same load; one line each,
 * the median of runs. */
static void layers_lines(int runs, int threads)
{
    const int bf = model_bf16_check_here() == 0;
    model_t *m[2] = {layers_model(MODEL_DENSE_FP32), bf ? layers_model(MODEL_DENSE_BF16) : NULL};
    const size_t big = (size_t)BATCH * 400;
    float *A = malloc(big * sizeof(float)), *dY = malloc(big * sizeof(float));
    float *Y = malloc(big * sizeof(float)), *dA = malloc(big * sizeof(float));
    for (size_t i = 0; i < big; i++) {
        A[i] = (float)(i % 97) * 0.01f;
        dY[i] = (float)(i % 89) * 0.001f - 0.04f;
    }
    double *rate[2] = {calloc((size_t)runs, sizeof(double)), calloc((size_t)runs, sizeof(double))};
    for (int r = -1; r < runs; r++) /* run -1: warm-up */
        for (int p = 0; p < 1 + bf; p++) {
            const double g = layers_once(m[p], A, dY, Y, dA);
            if (r >= 0)
                rate[p][r] = g;
        }
    const double lay32 = bench_median(rate[0], runs);
    printf("{\"candidate\": \"Kiln's dense layers, fp32 (OpenBLAS %s)\", \"threads\": %d, "
           "\"gflops\": %.1f}\n",
           openblas_get_corename(), threads, lay32);
    if (bf) {
        const double lay16 = bench_median(rate[1], runs);
        printf("{\"candidate\": \"Kiln's dense layers, bf16 (oneDNN %d.%d)\", \"threads\": "
               "%d, \"gflops\": %.1f, \"bf16_over_fp32\": %.2f}\n",
               dnnl_version()->major, dnnl_version()->minor, threads, lay16, lay16 / lay32);
    }
    fflush(stdout);
    KILN_FREE_ALL(rate[0], rate[1], A, dY, Y, dA);
    model_destroy(m[0]);
    model_destroy(m[1]);
}

/* The OpenBLAS line of this process: its core type and rate. */
static double openblas_line(int runs, int threads)
{
    double g = measure(openblas_gemm, runs);
    char *core = openblas_get_corename();
    const char *env = getenv("OPENBLAS_CORETYPE");
    printf("{\"candidate\": \"OpenBLAS %s\", \"forced\": %s, \"threads\": %d, \"gflops\": %.1f}\n",
           core, env ? "true" : "false", threads, g);
    fflush(stdout);
    return g;
}

/* Runs this bench again with OPENBLAS_CORETYPE=core and mode (--child or
 * --layers), passing its lines through; returns the GFLOP/s of its first
 * line, 0 when it failed. */
static double child(const char *self, const char *core, int runs, int threads, const char *mode)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "OPENBLAS_CORETYPE=%s '%s' %s --runs %d --threads %d", core, self,
             mode, runs, threads);
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return 0;
    char line[512];
    double g = 0;
    while (fgets(line, sizeof line, p)) {
        fputs(line, stdout);
        const char *s = strstr(line, "\"gflops\": ");
        if (s && g == 0)
            g = atof(s + 10);
    }
    pclose(p);
    return g;
}

int main(int argc, char **argv)
{
    int threads = 2, runs = 5, is_child = 0, is_layers = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--child") == 0)
            is_child = 1;
        else if (strcmp(argv[i], "--layers") == 0)
            is_layers = 1;
        else {
            fprintf(stderr, "usage: gemm_bench [--threads N] [--runs R]\n");
            return 2;
        }
    }
    omp_set_num_threads(threads);
    openblas_set_num_threads(1);
    if (is_child) {
        openblas_line(runs, threads);
        return 0;
    }
    if (is_layers) {
        layers_lines(runs, threads);
        return 0;
    }
    if (getenv("OPENBLAS_CORETYPE") != NULL) {
        fprintf(stderr, "gemm_bench: unset OPENBLAS_CORETYPE: the first line is OpenBLAS as "
                        "installed\n");
        return 2;
    }
    model_cpu_t cpu;
    model_cpu_detect(&cpu);
    char feats[128], self[4096];
    model_cpu_describe(&cpu, feats, sizeof feats);
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = '\0';
    printf("{\"cpu_family\": %d, \"cpu_model\": %d, \"cpu\": \"%s\", \"batch\": %d, "
           "\"layers\": \"bottom 13-64-16, top 367-256-128-1\"}\n",
           cpu.family, cpu.model, feats, BATCH);
    const double base = openblas_line(runs, threads);
    double best_ob = base;
    const char *best_core = openblas_get_corename();
    static const char *const cores[] = {"Sandybridge", "Haswell", "SkylakeX", "Cooperlake"};
    for (size_t i = 0; i < sizeof cores / sizeof cores[0]; i++) {
        if (model_blas_core_isa(cores[i]) > (int)model_cpu_isa(&cpu) ||
            (strcmp(cores[i], "Cooperlake") == 0 && !cpu.avx512_bf16))
            continue;
        double g = child(self, cores[i], runs, threads, "--child");
        if (g > best_ob) {
            best_ob = g;
            best_core = cores[i];
        }
    }
    double dnnl = 0, blis = 0, bf16 = 0;
#ifdef KILN_BENCH_DNNL
    dnnl = measure(onednn_gemm, runs);
    printf("{\"candidate\": \"oneDNN %d.%d\", \"threads\": %d, \"gflops\": %.1f}\n",
           dnnl_version()->major, dnnl_version()->minor, threads, dnnl);
    if (cpu.avx512_bf16 || cpu.amx_bf16) {
        onednn_bf16_init(threads);
        bf16 = measure(onednn_bf16_gemm, runs);
        printf("{\"candidate\": \"oneDNN %d.%d bf16 matmul (inputs converted per call)\", "
               "\"threads\": %d, \"gflops\": %.1f}\n",
               dnnl_version()->major, dnnl_version()->minor, threads, bf16);
    }
#endif
    void *h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        h = dlopen("/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    if (h != NULL && (bli_sgemm_p = (bli_sgemm_fn)dlsym(h, "bli_sgemm")) != NULL) {
        blis = measure(blis_gemm, runs);
        printf("{\"candidate\": \"BLIS\", \"threads\": %d, \"gflops\": %.1f}\n", threads, blis);
    }
    /* Kiln's layers, with the kernels kiln-train runs (it sets the core
     * type the same way: model_kernels.c). */
    const char *own = model_blas_core_for(&cpu);
    child(self, own ? own : openblas_get_corename(), runs, threads, "--layers");
    printf("{\"summary\": true, \"openblas_installed_gflops\": %.1f, \"openblas_best_core\": "
           "\"%s\", \"openblas_best_gflops\": %.1f, \"onednn_gflops\": %.1f, \"blis_gflops\": "
           "%.1f, \"onednn_bf16_gflops\": %.1f, \"best_over_installed\": %.2f, "
           "\"onednn_over_openblas_best\": %.2f, \"blis_over_openblas_best\": %.2f, "
           "\"bf16_over_openblas_best\": %.2f}\n",
           base, best_core, best_ob, dnnl, blis, bf16, best_ob / base, dnnl / best_ob,
           blis / best_ob, bf16 / best_ob);
    return 0;
}
