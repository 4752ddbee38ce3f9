/*
 * tests/test_runtime_gpu.c - the CUDA runtime pieces against their CPU
 * references, on a real GPU (label gpu; exits 77, "skipped: no CUDA
 * device", where none is visible):
 *
 *   - the cuBLAS dense layer (rt_dense_cuda_*) against model_dlrm.c's
 *     rt_dense_linear_fwd / _bwd on the same inputs, every layer of a small
 *     DLRM, tolerance atol + rtol * |ref|;
 *   - rt_comm's NCCL backend against its MPI backend: the same all-to-all-v
 *     (uneven counts, zeros, gaps), float64 allreduce and broadcast;
 *   - the pinned double buffers: batches staged ahead of their use come
 *     back unchanged, and misuse is refused.
 *
 * With two or more GPUs the test re-runs itself as `mpirun -np 2` so NCCL
 * moves data between two GPUs; with one it is a single rank.
 *
 * The dense reference needs the model's internals (its layers and flat
 * parameter vector), hence RT_MODEL_IMPL here.
 */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln.h"
#include "rt_comm.h"
#include "rt_dense_cuda.h"
#include "rt_device.h"
#define RT_MODEL_IMPL
#include "rt_model.h"
#include "rt_staging.h"

static int g_rank, g_size;

#define CU(call) assert_int_equal((int)(call), (int)cudaSuccess)

/* Every rank's mismatch count summed, so all ranks pass or fail together. */
static int total_bad(int bad)
{
    int all = 0;
    assert_int_equal(MPI_Allreduce(&bad, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD), MPI_SUCCESS);
    return all;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;

static float urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int close_enough(double got, double ref, double atol, double rtol)
{
    return fabs(got - ref) <= atol + rtol * fabs(ref);
}

static void *dmalloc(size_t bytes)
{
    void *p = NULL;
    CU(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

/* ---- dense layer: cuBLAS vs the CPU ------------------------------------------- */

/* One layer L of model m on n rows: forward, ReLU mask and backward on both
 * backends; returns the number of mismatches. */
static int dense_layer_case(rt_model_t *m, rt_dense_cuda_t *h, const rt_model_layer_t *L, int n)
{
    const int in = L->in, out = L->out;
    const int lda = in + 3, ldy = out + 1, ldda = in + 2; /* leading dims > widths */
    float *A = calloc((size_t)n * lda, sizeof(float));
    float *Y = calloc((size_t)n * ldy, sizeof(float)), *Yg = calloc((size_t)n * ldy, sizeof(float));
    float *dY = calloc((size_t)n * ldy, sizeof(float));
    float *dA = calloc((size_t)n * ldda, sizeof(float));
    float *dAg = calloc((size_t)n * ldda, sizeof(float));
    double *dWg = calloc((size_t)out * in, sizeof(double)),
           *dbg = calloc((size_t)out, sizeof(double));
    assert_true(A && Y && Yg && dY && dA && dAg && dWg && dbg);
    for (size_t i = 0; i < (size_t)n * lda; i++)
        A[i] = urand();
    for (size_t i = 0; i < (size_t)n * ldy; i++)
        dY[i] = urand();

    /* The gradients start nonzero: backward must ADD to them. */
    rt_model_zero_grad(m);
    double *gW = m->grads + L->w_off, *gb = m->grads + L->b_off;
    for (int i = 0; i < out * in; i++)
        gW[i] = 0.125 * (double)(i % 7);
    for (int i = 0; i < out; i++)
        gb[i] = -0.5 * (double)(i % 3);

    float *d_W = dmalloc(sizeof(float) * (size_t)out * in), *d_b = dmalloc(sizeof(float) * out);
    double *d_dW = dmalloc(sizeof(double) * (size_t)out * in),
           *d_db = dmalloc(sizeof(double) * out);
    float *d_A = dmalloc(sizeof(float) * (size_t)n * lda),
          *d_Y = dmalloc(sizeof(float) * (size_t)n * ldy);
    float *d_dY = dmalloc(sizeof(float) * (size_t)n * ldy);
    float *d_dA = dmalloc(sizeof(float) * (size_t)n * ldda);
    CU(cudaMemcpy(d_W, m->params + L->w_off, sizeof(float) * (size_t)out * in,
                  cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_b, m->params + L->b_off, sizeof(float) * out, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_dW, gW, sizeof(double) * (size_t)out * in, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_db, gb, sizeof(double) * out, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_A, A, sizeof(float) * (size_t)n * lda, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_dY, dY, sizeof(float) * (size_t)n * ldy, cudaMemcpyHostToDevice));
    CU(cudaMemset(d_Y, 0, sizeof(float) * (size_t)n * ldy));
    CU(cudaMemset(d_dA, 0, sizeof(float) * (size_t)n * ldda));
    const rt_dense_cuda_layer_t G = {in, out, L->relu, d_W, d_b, d_dW, d_db};

    /* forward */
    rt_dense_linear_fwd(m, n, L, A, lda, Y, ldy);
    assert_int_equal(rt_dense_cuda_fwd(h, n, &G, d_A, lda, d_Y, ldy), 0);
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(Yg, d_Y, sizeof(float) * (size_t)n * ldy, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < out; j++) {
            const float r = Y[(size_t)i * ldy + j], g = Yg[(size_t)i * ldy + j];
            if (!close_enough(g, r, 5e-5, 1e-4) && bad++ < 5)
                fprintf(stderr, "fwd %d->%d n=%d: Y[%d,%d] gpu %.9g cpu %.9g\n", in, out, n, i, j,
                        g, r);
        }

    /* ReLU mask of dY by Y (as model_dlrm.c does between layers), then
     * backward from the masked gradient. */
    if (L->relu) {
        for (int i = 0; i < n; i++)
            for (int j = 0; j < out; j++)
                if (!(Y[(size_t)i * ldy + j] > 0.0f))
                    dY[(size_t)i * ldy + j] = 0.0f;
        /* The GPU masks by its own Y; rows whose Y is near 0 could differ,
         * so mask by the CPU's Y on both sides. */
        CU(cudaMemcpy(d_Y, Y, sizeof(float) * (size_t)n * ldy, cudaMemcpyHostToDevice));
        assert_int_equal(rt_dense_cuda_relu_mask(h, n, out, d_Y, ldy, d_dY, ldy), 0);
    }
    rt_dense_linear_bwd(m, n, L, A, lda, dY, ldy, dA, ldda);
    assert_int_equal(rt_dense_cuda_bwd(h, n, &G, d_A, lda, d_dY, ldy, d_dA, ldda), 0);
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(dAg, d_dA, sizeof(float) * (size_t)n * ldda, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(dWg, d_dW, sizeof(double) * (size_t)out * in, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(dbg, d_db, sizeof(double) * out, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        for (int j = 0; j < in; j++) {
            const float r = dA[(size_t)i * ldda + j], g = dAg[(size_t)i * ldda + j];
            if (!close_enough(g, r, 5e-5, 1e-4) && bad++ < 5)
                fprintf(stderr, "bwd %d->%d n=%d: dA[%d,%d] gpu %.9g cpu %.9g\n", in, out, n, i, j,
                        g, r);
        }
    /* float64 sums of exact float32 products: equal far below float32. */
    for (int i = 0; i < out * in; i++)
        if (!close_enough(dWg[i], gW[i], 1e-10, 1e-10) && bad++ < 5)
            fprintf(stderr, "bwd %d->%d n=%d: dW[%d] gpu %.17g cpu %.17g\n", in, out, n, i, dWg[i],
                    gW[i]);
    for (int i = 0; i < out; i++)
        if (!close_enough(dbg[i], gb[i], 1e-10, 1e-10) && bad++ < 5)
            fprintf(stderr, "bwd %d->%d n=%d: db[%d] gpu %.17g cpu %.17g\n", in, out, n, i, dbg[i],
                    gb[i]);

    cudaFree(d_W);
    cudaFree(d_b);
    cudaFree(d_dW);
    cudaFree(d_db);
    cudaFree(d_A);
    cudaFree(d_Y);
    cudaFree(d_dY);
    cudaFree(d_dA);
    free(A);
    free(Y);
    free(Yg);
    free(dY);
    free(dA);
    free(dAg);
    free(dWg);
    free(dbg);
    return bad;
}

static void test_dense_vs_cpu(void **state)
{
    (void)state;
    static const int bottom[] = {64, 16}, top[] = {48, 32, 1};
    rt_model_config_t cfg = {0};
    cfg.type = RT_MODEL_DLRM;
    cfg.nslots = 4;
    cfg.ndense = 13;
    cfg.dim = 16;
    cfg.bottom = bottom;
    cfg.nbottom = 2;
    cfg.top = top;
    cfg.ntop = 3;
    cfg.max_batch = 100;
    cfg.seed = 7;
    cfg.opt.type = RT_DENSE_SGD;
    cfg.opt.lr = 0.1f;
    rt_model_t *m = NULL;
    assert_int_equal(rt_model_create(&cfg, &m), 0);
    const int nl = m->nbottom + m->ntop;
    int maxw = 1;
    for (int l = 0; l < nl; l++) {
        maxw = m->layers[l].in > maxw ? m->layers[l].in : maxw;
        maxw = m->layers[l].out > maxw ? m->layers[l].out : maxw;
    }
    rt_dense_cuda_t *h = NULL;
    assert_int_equal(rt_dense_cuda_create(cfg.max_batch, maxw, NULL, &h), 0);
    int bad = 0;
    static const int ns[] = {1, 37, 100}; /* a lone row, a ragged 16-row block, max_batch */
    for (int l = 0; l < nl; l++)
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
            bad += dense_layer_case(m, h, &m->layers[l], ns[k]);

    /* Refusals: too many rows, a layer wider than the workspace. */
    const rt_model_layer_t *L = &m->layers[0];
    rt_dense_cuda_layer_t G = {L->in, L->out, 1, (const float *)h, (const float *)h, NULL, NULL};
    bad += rt_dense_cuda_fwd(h, cfg.max_batch + 1, &G, NULL, L->in, NULL, L->out) != KILN_EINVAL;
    G.in = maxw + 1;
    G.d_dW = (double *)h;
    G.d_db = (double *)h;
    bad += rt_dense_cuda_bwd(h, 1, &G, NULL, G.in, NULL, G.out, NULL, 0) != KILN_EINVAL;
    rt_dense_cuda_t *none = (rt_dense_cuda_t *)m;
    bad += rt_dense_cuda_create(0, 4, NULL, &none) != KILN_EINVAL || none != NULL;
    rt_dense_cuda_destroy(h);
    rt_dense_cuda_destroy(NULL);
    rt_model_destroy(m);
    assert_int_equal(total_bad(bad), 0);
}

/* ---- rt_comm: NCCL vs MPI ----------------------------------------------------- */

static size_t pair_bytes(int s, int d)
{
    return (size_t)((s + 2 * d + 1) % 4) * 4099; /* uneven, some 0, not a multiple of 8 */
}

static void test_nccl_vs_mpi(void **state)
{
    (void)state;
    const int n = g_size, me = g_rank;
    rt_comm_t *cm = NULL, *cn = NULL;
    assert_int_equal(rt_comm_create(RT_COMM_MPI, MPI_COMM_WORLD, &cm), 0);
    int rc = rt_comm_create(RT_COMM_NCCL, MPI_COMM_WORLD, &cn);
    if (rc != 0)
        fprintf(stderr, "rank %d: %s\n", me, kiln_errmsg());
    assert_int_equal(rc, 0);
    assert_int_equal(rt_comm_kind(cn), RT_COMM_NCCL);
    assert_true(rt_comm_device(cn) >= 0);
    assert_non_null(rt_comm_stream(cn));
    int bad = 0;

    /* all-to-all-v with gaps between blocks; gaps must stay as they were */
    size_t *sc = calloc((size_t)n, sizeof *sc), *sd = calloc((size_t)n, sizeof *sd);
    size_t *rcn = calloc((size_t)n, sizeof *rcn), *rd = calloc((size_t)n, sizeof *rd);
    assert_true(sc && sd && rcn && rd);
    size_t so = 0, ro = 0;
    for (int d = n - 1; d >= 0; d--) {
        sc[d] = pair_bytes(me, d);
        sd[d] = so;
        so += sc[d] + 5;
    }
    for (int s = 0; s < n; s++) {
        rcn[s] = pair_bytes(s, me);
        rd[s] = ro;
        ro += rcn[s] + 3;
    }
    unsigned char *sb = malloc(so), *rm = malloc(ro), *rn = malloc(ro);
    assert_true(sb && rm && rn);
    for (size_t i = 0; i < so; i++)
        sb[i] = (unsigned char)(me * 17 + i * 29 + 5);
    memset(rm, 0xEE, ro);
    unsigned char *d_sb = dmalloc(so), *d_rb = dmalloc(ro);
    CU(cudaMemcpy(d_sb, sb, so, cudaMemcpyHostToDevice));
    CU(cudaMemset(d_rb, 0xEE, ro));
    bad += rt_comm_alltoallv(cm, sb, sc, sd, rm, rcn, rd) != 0;
    bad += rt_comm_alltoallv(cn, d_sb, sc, sd, d_rb, rcn, rd) != 0;
    bad += rt_comm_sync(cn) != 0;
    CU(cudaMemcpy(rn, d_rb, ro, cudaMemcpyDeviceToHost));
    if (memcmp(rm, rn, ro) != 0) {
        fprintf(stderr, "rank %d: NCCL all-to-all-v differs from MPI's\n", me);
        bad++;
    }

    /* allreduce of float64 */
    const size_t cnt = 12345;
    double *vm = malloc(cnt * sizeof *vm), *vn = malloc(cnt * sizeof *vn);
    assert_true(vm && vn);
    for (size_t i = 0; i < cnt; i++)
        vm[i] = (double)urand() * (1.0 + (double)me) + 1e-9 * (double)i;
    double *d_v = dmalloc(cnt * sizeof *d_v);
    CU(cudaMemcpy(d_v, vm, cnt * sizeof *vm, cudaMemcpyHostToDevice));
    bad += rt_comm_allreduce_sum_f64(cm, vm, cnt) != 0;
    bad += rt_comm_allreduce_sum_f64(cn, d_v, cnt) != 0;
    bad += rt_comm_sync(cn) != 0;
    CU(cudaMemcpy(vn, d_v, cnt * sizeof *vn, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < cnt; i++)
        if (!close_enough(vn[i], vm[i], 1e-15, 1e-13) && bad++ < 5)
            fprintf(stderr, "rank %d: allreduce[%zu] nccl %.17g mpi %.17g\n", me, i, vn[i], vm[i]);

    /* broadcast from the last rank */
    const int root = n - 1;
    const size_t bb = 100003;
    unsigned char *bm = malloc(bb), *bn = malloc(bb);
    assert_true(bm && bn);
    for (size_t i = 0; i < bb; i++)
        bm[i] = me == root ? (unsigned char)(i * 11 + 1) : 0;
    unsigned char *d_bb = dmalloc(bb);
    CU(cudaMemcpy(d_bb, bm, bb, cudaMemcpyHostToDevice));
    bad += rt_comm_bcast(cm, bm, bb, root) != 0;
    bad += rt_comm_bcast(cn, d_bb, bb, root) != 0;
    bad += rt_comm_sync(cn) != 0;
    CU(cudaMemcpy(bn, d_bb, bb, cudaMemcpyDeviceToHost));
    bad += memcmp(bm, bn, bb) != 0;
    for (size_t i = 0; i < bb; i++)
        bad += bm[i] != (unsigned char)(i * 11 + 1);

    rt_comm_destroy(cn);
    rt_comm_destroy(cm);
    cudaFree(d_sb);
    cudaFree(d_rb);
    cudaFree(d_v);
    cudaFree(d_bb);
    free(sb);
    free(rm);
    free(rn);
    free(vm);
    free(vn);
    free(bm);
    free(bn);
    free(sc);
    free(sd);
    free(rcn);
    free(rd);
    assert_int_equal(total_bad(bad), 0);
}

/* ---- pinned double buffers ----------------------------------------------------- */

static void test_staging_round_trip(void **state)
{
    (void)state;
    enum { NB = 7 };
    const size_t slot = (size_t)3 << 20, sizes[NB] = {slot, 1, 4096, slot - 7, 0, 999999, slot};
    cudaStream_t compute;
    CU(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    rt_staging_t *s = NULL;
    assert_int_equal(rt_staging_create(slot, compute, &s), 0);
    assert_int_equal(rt_staging_slot_bytes(s), slot);
    unsigned char *src = malloc(slot), *back[NB];
    assert_non_null(src);
    int bad = 0;

    /* Stage batch b+1 before reading batch b, as the trainer will; the
     * source buffer is scribbled over right after each stage. */
    int cur = -1, nxt = -1;
    memset(src, 1, slot);
    assert_int_equal(rt_staging_stage(s, src, sizes[0], &cur), 0);
    memset(src, 0xFF, slot);
    for (int b = 0; b < NB; b++) {
        back[b] = malloc(slot);
        assert_non_null(back[b]);
        memset(back[b], 0x5A, slot);
        if (b + 1 < NB) {
            for (size_t i = 0; i < sizes[b + 1]; i++)
                src[i] = (unsigned char)(b + 2 + i * 3);
            assert_int_equal(rt_staging_stage(s, src, sizes[b + 1], &nxt), 0);
            bad += nxt == cur; /* slots alternate */
            memset(src, 0xFF, slot);
        }
        void *d = NULL;
        assert_int_equal(rt_staging_wait(s, cur, &d), 0);
        assert_non_null(d);
        if (sizes[b] > 0)
            CU(cudaMemcpyAsync(back[b], d, sizes[b], cudaMemcpyDeviceToHost, compute));
        cur = nxt;
    }
    CU(cudaStreamSynchronize(compute));
    for (int b = 0; b < NB; b++) {
        for (size_t i = 0; i < sizes[b]; i++) {
            const unsigned char want = b == 0 ? 1 : (unsigned char)(b + 1 + i * 3);
            if (back[b][i] != want) {
                if (bad++ < 5)
                    fprintf(stderr, "batch %d byte %zu: %u, want %u\n", b, i, back[b][i], want);
                break;
            }
        }
        free(back[b]);
    }

    /* Refusals: too big, a bad slot, a slot never staged. */
    int sl = 0;
    void *d = NULL;
    bad += rt_staging_stage(s, src, slot + 1, &sl) != KILN_EINVAL;
    bad += rt_staging_wait(s, 2, &d) != KILN_EINVAL;
    rt_staging_t *fresh = NULL;
    assert_int_equal(rt_staging_create(64, compute, &fresh), 0);
    bad += rt_staging_wait(fresh, 1, &d) != KILN_EINVAL;
    rt_staging_destroy(fresh);
    rt_staging_t *none = s;
    bad += rt_staging_create(0, compute, &none) != KILN_EINVAL || none != NULL;
    rt_staging_destroy(s);
    rt_staging_destroy(NULL);
    CU(cudaStreamDestroy(compute));
    free(src);
    assert_int_equal(total_bad(bad), 0);
}

/* With >= 2 GPUs and not yet under mpirun: run again as 2 ranks. */
static void maybe_reexec(char **argv, int gpus)
{
    if (gpus < 2 || getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMI_SIZE") != NULL ||
        getenv("KILN_GPU_TEST_ONE_RANK") != NULL)
        return;
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    char *args[] = {"mpirun", "-np", "2", "--oversubscribe", argv[0], NULL};
    fflush(stdout);
    execvp("mpirun", args);
    fprintf(stderr, "could not start mpirun (%s); running as one rank\n", strerror(errno));
}

int main(int argc, char **argv)
{
    const int gpus = rt_device_visible_gpus();
    if (gpus == 0) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    maybe_reexec(argv, gpus);
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    /* One GPU per rank of this host (the NCCL comm binds the same way). */
    MPI_Comm local;
    int lrank = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &lrank);
    MPI_Comm_free(&local);
    if (cudaSetDevice(lrank % gpus) != cudaSuccess) {
        fprintf(stderr, "rank %d: cudaSetDevice(%d) failed\n", g_rank, lrank % gpus);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    rng_state += (uint64_t)g_rank * 0x1234567ULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_vs_cpu),
        cmocka_unit_test(test_nccl_vs_mpi),
        cmocka_unit_test(test_staging_round_trip),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    MPI_Finalize();
    return failed ? 1 : 0;
}
