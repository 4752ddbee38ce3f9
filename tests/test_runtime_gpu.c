/*
 * tests/test_runtime_gpu.c - shard_comm's NCCL backend (shard/comm_nccl.cu)
 * against its MPI backend on a real GPU (label gpu; exits 77, "skipped: no
 * CUDA device", where none is visible): the same all-to-all-v (uneven
 * counts, zeros, gaps), float64 and double-double allreduce, broadcast.
 *
 * With two or more GPUs the test re-runs itself as `mpirun -np 2` so NCCL
 * moves data between two GPUs; with one it is a single rank.
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
#include "shard.h"

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

/* ---- shard_comm: NCCL vs MPI ----------------------------------------------------- */

static size_t pair_bytes(int s, int d)
{
    return (size_t)((s + 2 * d + 1) % 4) * 4099; /* uneven, some 0, not a multiple of 8 */
}

static void test_nccl_vs_mpi(void **state)
{
    (void)state;
    const int n = g_size, me = g_rank;
    shard_comm_t *cm = NULL, *cn = NULL;
    assert_int_equal(shard_comm_create(SHARD_COMM_MPI, MPI_COMM_WORLD, &cm), 0);
    int rc = shard_comm_create(SHARD_COMM_NCCL, MPI_COMM_WORLD, &cn);
    if (rc != 0)
        fprintf(stderr, "rank %d: %s\n", me, kiln_errmsg());
    assert_int_equal(rc, 0);
    assert_int_equal(shard_comm_info(cn).kind, SHARD_COMM_NCCL);
    assert_true(shard_comm_info(cn).device >= 0);
    assert_non_null(shard_comm_stream(cn));
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
    bad += shard_comm_alltoallv(cm, sb, sc, sd, rm, rcn, rd) != 0;
    bad += shard_comm_alltoallv(cn, d_sb, sc, sd, d_rb, rcn, rd) != 0;
    bad += shard_comm_sync(cn) != 0;
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
    bad += shard_comm_allreduce_sum_f64(cm, vm, cnt) != 0;
    bad += shard_comm_allreduce_sum_f64(cn, d_v, cnt) != 0;
    bad += shard_comm_sync(cn) != 0;
    CU(cudaMemcpy(vn, d_v, cnt * sizeof *vn, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < cnt; i++)
        if (!close_enough(vn[i], vm[i], 1e-15, 1e-13) && bad++ < 5)
            fprintf(stderr, "rank %d: allreduce[%zu] nccl %.17g mpi %.17g\n", me, i, vn[i], vm[i]);

    /* allreduce of double-double pairs: NCCL adds them in rank order, MPI
     * in its own; the pairs carry about 106 bits, so the rounded sums agree
     * to a few ulps of float64 and every rank gets NCCL's same bits. */
    const size_t np = 4321;
    double *pm = malloc(2 * np * sizeof *pm), *pn = malloc(2 * np * sizeof *pn);
    assert_true(pm && pn);
    for (size_t i = 0; i < np; i++) {
        pm[2 * i] = (double)urand() * 1e8 * (1.0 + (double)me);
        pm[2 * i + 1] = (double)urand() * 1e-9;
    }
    double *d_p = dmalloc(2 * np * sizeof *d_p);
    CU(cudaMemcpy(d_p, pm, 2 * np * sizeof *pm, cudaMemcpyHostToDevice));
    bad += shard_comm_allreduce_sum_dd(cm, pm, np) != 0;
    bad += shard_comm_allreduce_sum_dd(cn, d_p, np) != 0;
    bad += shard_comm_sync(cn) != 0;
    CU(cudaMemcpy(pn, d_p, 2 * np * sizeof *pn, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < np; i++)
        if (!close_enough(pn[2 * i] + pn[2 * i + 1], pm[2 * i] + pm[2 * i + 1], 0.0, 1e-15) &&
            bad++ < 5)
            fprintf(stderr, "rank %d: dd allreduce[%zu] nccl %.17g mpi %.17g\n", me, i, pn[2 * i],
                    pm[2 * i]);
    double first = pn[0], firstlo = pn[1];
    bad += shard_comm_bcast(cm, &first, sizeof first, 0) != 0;
    bad += shard_comm_bcast(cm, &firstlo, sizeof firstlo, 0) != 0;
    bad += first != pn[0] || firstlo != pn[1];

    /* broadcast from the last rank */
    const int root = n - 1;
    const size_t bb = 100003;
    unsigned char *bm = malloc(bb), *bn = malloc(bb);
    assert_true(bm && bn);
    for (size_t i = 0; i < bb; i++)
        bm[i] = me == root ? (unsigned char)(i * 11 + 1) : 0;
    unsigned char *d_bb = dmalloc(bb);
    CU(cudaMemcpy(d_bb, bm, bb, cudaMemcpyHostToDevice));
    bad += shard_comm_bcast(cm, bm, bb, root) != 0;
    bad += shard_comm_bcast(cn, d_bb, bb, root) != 0;
    bad += shard_comm_sync(cn) != 0;
    CU(cudaMemcpy(bn, d_bb, bb, cudaMemcpyDeviceToHost));
    bad += memcmp(bm, bn, bb) != 0;
    for (size_t i = 0; i < bb; i++)
        bad += bm[i] != (unsigned char)(i * 11 + 1);

    shard_comm_destroy(cn);
    shard_comm_destroy(cm);
    cudaFree(d_sb);
    cudaFree(d_rb);
    cudaFree(d_v);
    cudaFree(d_p);
    cudaFree(d_bb);
    free(sb);
    free(rm);
    free(rn);
    free(vm);
    free(vn);
    free(pm);
    free(pn);
    free(bm);
    free(bn);
    free(sc);
    free(sd);
    free(rcn);
    free(rd);
    assert_int_equal(total_bad(bad), 0);
}

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
    const int gpus = shard_device_visible_gpus();
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
        cmocka_unit_test(test_nccl_vs_mpi),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    MPI_Finalize();
    return failed ? 1 : 0;
}
