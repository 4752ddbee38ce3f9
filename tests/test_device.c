/*
 * tests/test_device.c - the backend choice (shard_device_pick's table of cases)
 * and shard_comm's MPI backend under a real mpirun (CTest runs this file as
 * `mpirun -np 2 --oversubscribe test_device`; run by hand it is one rank).
 *
 * The comm tests are collective: every rank runs them in the same order,
 * counts its own mismatches, and the ranks agree on the total before
 * asserting, so a failure fails every rank instead of leaving one waiting.
 * In a build with CUDA, SHARD_COMM_NCCL is checked to fail cleanly when no GPU
 * is visible; the NCCL backend's results are in tests/test_runtime_gpu.c.
 */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"
#include "shard.h"

static int g_rank, g_size;

/* ---- shard_device_pick ------------------------------------------------------------ */

static const struct {
    job_device_t want;
    bool built;
    int visible;
    int rc;
    shard_device_t dev;
    const char *why; /* exact line */
} pick_cases[] = {
    {JOB_DEVICE_AUTO, true, 2, 0, SHARD_DEVICE_CUDA,
     "device auto: 2 CUDA devices visible; using the CUDA backend"},
    {JOB_DEVICE_AUTO, true, 1, 0, SHARD_DEVICE_CUDA,
     "device auto: 1 CUDA device visible; using the CUDA backend"},
    {JOB_DEVICE_AUTO, true, 0, 0, SHARD_DEVICE_CPU,
     "device auto: no CUDA device visible; using the CPU backend"},
    {JOB_DEVICE_AUTO, false, 4, 0, SHARD_DEVICE_CPU,
     "device auto: this kiln-train was built without CUDA; using the CPU backend"},
    {JOB_DEVICE_AUTO, false, 0, 0, SHARD_DEVICE_CPU,
     "device auto: this kiln-train was built without CUDA; using the CPU backend"},
    {JOB_DEVICE_CPU, true, 8, 0, SHARD_DEVICE_CPU, "device cpu: using the CPU backend"},
    {JOB_DEVICE_CPU, false, 0, 0, SHARD_DEVICE_CPU, "device cpu: using the CPU backend"},
    {JOB_DEVICE_CUDA, true, 1, 0, SHARD_DEVICE_CUDA,
     "device cuda: 1 CUDA device visible; using the CUDA backend"},
    {JOB_DEVICE_CUDA, true, 0, KILN_EINVAL, SHARD_DEVICE_CPU,
     "device cuda: no CUDA device visible to this rank; run on a GPU host (check nvidia-smi "
     "and CUDA_VISIBLE_DEVICES), or set device: auto or cpu in the job spec"},
    {JOB_DEVICE_CUDA, false, 2, KILN_EINVAL, SHARD_DEVICE_CPU,
     "device cuda: this kiln-train was built without CUDA; rebuild with -DKILN_CUDA=ON on a "
     "host with nvcc and NCCL, or set device: auto or cpu in the job spec"},
    {(job_device_t)42, true, 1, KILN_EINVAL, SHARD_DEVICE_CPU,
     "shard_device_pick: unknown device value 42"},
    {JOB_DEVICE_AUTO, true, -1, KILN_EINVAL, SHARD_DEVICE_CPU,
     "shard_device_pick: visible_gpus is -1 (must be >= 0)"},
};

static void test_pick_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof pick_cases / sizeof pick_cases[0]; i++) {
        char why[400];
        shard_device_t dev = (shard_device_t)77;
        kiln_errclear();
        int rc = shard_device_pick(pick_cases[i].want, pick_cases[i].built, pick_cases[i].visible,
                                &dev, why, sizeof why);
        if (rc != pick_cases[i].rc || dev != pick_cases[i].dev ||
            strcmp(why, pick_cases[i].why) != 0)
            print_error("case %zu: rc %d dev %d why '%s'\n", i, rc, (int)dev, why);
        assert_int_equal(rc, pick_cases[i].rc);
        assert_int_equal(dev, pick_cases[i].dev);
        assert_string_equal(why, pick_cases[i].why);
        if (rc < 0) {
            /* The failure is also the thread's error, for callers that log it. */
            assert_int_equal(kiln_errcode(), rc);
            assert_string_equal(kiln_errmsg(), pick_cases[i].why);
        }
    }
}

static void test_pick_edges(void **state)
{
    (void)state;
    shard_device_t dev;
    /* why may be absent, or too small (truncated, still terminated). */
    assert_int_equal(shard_device_pick(JOB_DEVICE_AUTO, true, 0, &dev, NULL, 0), 0);
    assert_int_equal(dev, SHARD_DEVICE_CPU);
    char small[8];
    memset(small, 'x', sizeof small);
    assert_int_equal(shard_device_pick(JOB_DEVICE_CPU, false, 0, &dev, small, sizeof small), 0);
    assert_string_equal(small, "device ");
    assert_int_equal(shard_device_pick(JOB_DEVICE_AUTO, true, 1, NULL, NULL, 0), KILN_EINVAL);

    assert_string_equal(shard_device_name(SHARD_DEVICE_CPU), "cpu");
    assert_string_equal(shard_device_name(SHARD_DEVICE_CUDA), "cuda");
    assert_string_equal(shard_device_name((shard_device_t)9), "?");

    int n = shard_device_visible_gpus();
    assert_true(n >= 0);
#ifdef KILN_HAVE_CUDA
    assert_true(shard_device_built_cuda());
#else
    assert_false(shard_device_built_cuda());
    assert_int_equal(n, 0);
#endif
}

/* ---- shard_comm, MPI backend ------------------------------------------------------ */

/* Every rank's mismatch count summed, so all ranks pass or fail together. */
static int total_bad(int bad)
{
    int all = 0;
    assert_int_equal(MPI_Allreduce(&bad, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD), MPI_SUCCESS);
    return all;
}

/* Bytes rank s sends rank d: uneven, and zero for some pairs (for 2 ranks:
 * 0->0 5, 0->1 15, 1->0 10, 1->1 0). */
static size_t pair_bytes(int s, int d)
{
    return (size_t)((s + 2 * d + 1) % 4) * 5;
}

static unsigned char pair_byte(int s, int d, size_t i)
{
    return (unsigned char)(s * 31 + d * 7 + (int)i * 13 + 1);
}

/* This rank's side of the all-to-all-v: for a send (to every rank d,
 * blocks in reverse rank order) or a receive (from every rank s, in rank
 * order), each block's size and displacement, blocks gap bytes apart, so
 * the displacements must be honoured. Returns the buffer size. */
static size_t layout(int me, int n, bool send, size_t gap, size_t *cnt, size_t *dsp)
{
    size_t off = 0;
    for (int k = 0; k < n; k++) {
        const int r = send ? n - 1 - k : k;
        cnt[r] = send ? pair_bytes(me, r) : pair_bytes(r, me);
        dsp[r] = off;
        off += cnt[r] + gap;
    }
    return off;
}

static void test_comm_basics(void **state)
{
    (void)state;
    shard_comm_t *c = NULL;
    assert_int_equal(shard_comm_create(SHARD_COMM_MPI, MPI_COMM_WORLD, &c), 0);
    assert_non_null(c);
    const shard_comm_info_t ci = shard_comm_info(c);
    assert_int_equal(ci.kind, SHARD_COMM_MPI);
    assert_int_equal(ci.rank, g_rank);
    assert_int_equal(ci.size, g_size);
    assert_int_equal(ci.device, -1);
    assert_null(shard_comm_stream(c));
    assert_int_equal(shard_comm_sync(c), 0);
    assert_string_equal(shard_comm_kind_name(SHARD_COMM_MPI), "mpi");
    assert_string_equal(shard_comm_kind_name(SHARD_COMM_NCCL), "nccl");

    /* Argument errors are found before any message moves (every rank
     * passes the same bad argument, so none waits for another). */
    double x = 1.0;
    assert_int_equal(shard_comm_bcast(c, &x, sizeof x, g_size), KILN_EINVAL);
    assert_int_equal(shard_comm_bcast(c, &x, sizeof x, -1), KILN_EINVAL);
    assert_int_equal(shard_comm_allreduce_sum_f64(c, NULL, 3), KILN_EINVAL);
    assert_int_equal(shard_comm_alltoallv(c, NULL, NULL, NULL, NULL, NULL, NULL), KILN_EINVAL);
    shard_comm_destroy(c);

    shard_comm_t *bad = (shard_comm_t *)&x;
    assert_int_equal(shard_comm_create((shard_comm_kind_t)5, MPI_COMM_WORLD, &bad), KILN_EINVAL);
    assert_null(bad);
    assert_int_equal(shard_comm_create(SHARD_COMM_MPI, MPI_COMM_WORLD, NULL), KILN_EINVAL);
    shard_comm_destroy(NULL);
}

static void test_comm_alltoallv(void **state)
{
    (void)state;
    const int n = g_size, me = g_rank;
    size_t *sc = calloc((size_t)n, sizeof *sc), *sd = calloc((size_t)n, sizeof *sd);
    size_t *rc = calloc((size_t)n, sizeof *rc), *rd = calloc((size_t)n, sizeof *rd);
    assert_true(sc && sd && rc && rd);

    /* 3-byte gaps between the send blocks, 2-byte between the receive blocks. */
    size_t off = layout(me, n, true, 3, sc, sd);
    unsigned char *sbuf = malloc(off + 1);
    assert_non_null(sbuf);
    memset(sbuf, 0xAB, off + 1);
    for (int d = 0; d < n; d++)
        for (size_t i = 0; i < sc[d]; i++)
            sbuf[sd[d] + i] = pair_byte(me, d, i);
    size_t roff = layout(me, n, false, 2, rc, rd);
    unsigned char *rbuf = malloc(roff + 1);
    assert_non_null(rbuf);
    memset(rbuf, 0xEE, roff + 1);

    shard_comm_t *c = NULL;
    assert_int_equal(shard_comm_create(SHARD_COMM_MPI, MPI_COMM_WORLD, &c), 0);
    int rc1 = shard_comm_alltoallv(c, sbuf, sc, sd, rbuf, rc, rd);
    int bad = rc1 != 0;
    if (rc1 != 0)
        fprintf(stderr, "rank %d: alltoallv: %s\n", me, kiln_errmsg());
    for (int s = 0; s < n; s++) {
        for (size_t i = 0; i < rc[s]; i++)
            if (rbuf[rd[s] + i] != pair_byte(s, me, i)) {
                if (bad++ < 5)
                    fprintf(stderr, "rank %d: byte %zu from %d is %u\n", me, i, s, rbuf[rd[s] + i]);
            }
        /* The gap after each block is untouched. */
        if (rbuf[rd[s] + rc[s]] != 0xEE || rbuf[rd[s] + rc[s] + 1] != 0xEE)
            bad++;
    }

    /* All counts zero, NULL buffers: a valid, empty exchange. */
    for (int r = 0; r < n; r++)
        sc[r] = sd[r] = rc[r] = rd[r] = 0;
    bad += shard_comm_alltoallv(c, NULL, sc, sd, NULL, rc, rd) != 0;

    /* One rank asks for more than MPI's int can say: every rank gets the
     * error (the others through the agreement), nobody hangs. */
    if (me == 0)
        sc[0] = rc[0] = (size_t)3 << 30;
    int rc2 = shard_comm_alltoallv(c, NULL, sc, sd, NULL, rc, rd);
    bad += rc2 != KILN_ERANGE;
    if (me == 0)
        bad += strstr(kiln_errmsg(), "INT_MAX") == NULL;

    /* The communicator still works after the refused call. */
    for (int r = 0; r < n; r++) {
        sc[r] = rc[r] = 1;
        sd[r] = rd[r] = (size_t)r;
    }
    unsigned char one[64], got[64];
    for (int r = 0; r < n && r < 64; r++)
        one[r] = (unsigned char)(me * 10 + r);
    if (n <= 64) {
        bad += shard_comm_alltoallv(c, one, sc, sd, got, rc, rd) != 0;
        for (int s = 0; s < n; s++)
            bad += got[s] != (unsigned char)(s * 10 + me);
    }
    shard_comm_destroy(c);
    free(sbuf);
    free(rbuf);
    free(sc);
    free(sd);
    free(rc);
    free(rd);
    assert_int_equal(total_bad(bad), 0);
}

static void test_comm_allreduce_bcast(void **state)
{
    (void)state;
    const size_t count = 1001;
    double *v = malloc(count * sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < count; i++)
        v[i] = (double)g_rank + 0.5 * (double)i - 0.25 * (double)(i % 3);
    shard_comm_t *c = NULL;
    assert_int_equal(shard_comm_create(SHARD_COMM_MPI, MPI_COMM_WORLD, &c), 0);
    int bad = shard_comm_allreduce_sum_f64(c, v, count) != 0;
    const double ranks_sum = (double)g_size * (double)(g_size - 1) / 2.0;
    for (size_t i = 0; i < count; i++) {
        const double want = ranks_sum + (double)g_size * (0.5 * (double)i - 0.25 * (double)(i % 3));
        if (v[i] != want && bad++ < 5)
            fprintf(stderr, "rank %d: sum[%zu] = %.17g, want %.17g\n", g_rank, i, v[i], want);
    }
    bad += shard_comm_allreduce_sum_f64(c, v, 0) != 0; /* empty is fine */

    /* Broadcast from the last rank (rank 0 is the easy case). */
    const int root = g_size - 1;
    unsigned char b[777];
    for (size_t i = 0; i < sizeof b; i++)
        b[i] = g_rank == root ? (unsigned char)(i * 7 + 3) : 0;
    bad += shard_comm_bcast(c, b, sizeof b, root) != 0;
    for (size_t i = 0; i < sizeof b; i++)
        bad += b[i] != (unsigned char)(i * 7 + 3);
    bad += shard_comm_bcast(c, NULL, 0, 0) != 0;
    shard_comm_destroy(c);
    free(v);
    assert_int_equal(total_bad(bad), 0);
}

/* SHARD_COMM_NCCL without a usable GPU fails on every rank with a message that
 * says what to do, and leaves nothing behind. */
static void test_comm_nccl_refused(void **state)
{
    (void)state;
    shard_comm_t *c = NULL;
#ifdef KILN_HAVE_CUDA
    int gpus = shard_device_visible_gpus(), most = 0;
    MPI_Allreduce(&gpus, &most, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (most > 0)
        skip(); /* tests/test_runtime_gpu.c runs NCCL for real */
    int rc = shard_comm_create(SHARD_COMM_NCCL, MPI_COMM_WORLD, &c);
    int bad = rc != KILN_ENODEV || c != NULL;
    if (bad)
        fprintf(stderr, "rank %d: nccl create gave %s: %s\n", g_rank, kiln_errname(rc),
                kiln_errmsg());
    bad += strstr(kiln_errmsg(), "device: cpu") == NULL;
    assert_int_equal(total_bad(bad), 0);
#else
    int rc = shard_comm_create(SHARD_COMM_NCCL, MPI_COMM_WORLD, &c);
    assert_int_equal(rc, KILN_EINVAL);
    assert_null(c);
    assert_non_null(strstr(kiln_errmsg(), "-DKILN_CUDA=ON"));
#endif
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pick_table),           cmocka_unit_test(test_pick_edges),
        cmocka_unit_test(test_comm_basics),          cmocka_unit_test(test_comm_alltoallv),
        cmocka_unit_test(test_comm_allreduce_bcast), cmocka_unit_test(test_comm_nccl_refused),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    MPI_Finalize();
    return failed ? 1 : 0;
}
