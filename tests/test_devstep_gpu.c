/*
 * tests/test_devstep_gpu.c - the device step's CUDA runtime
 * (trainer/train_dev_cuda.cu, train_dev_dlrm.cu) against its host stand-in
 * on the same inputs, one dense call at a time: lr, fm with dense factors
 * and dlrm, 300 rows (not a multiple of any block size). The loss, every
 * dense gradient and dE agree to float32 rounding, and two calls on the GPU
 * give the same bits (the sums are in a fixed order). Labelled gpu; exits 77
 * (skipped) where no CUDA device is visible. test_train_gpu runs the whole
 * step; this is where a GPU host finds which model is wrong first.
 */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_cuda.h"
#include "kiln.h"
#include "train_dev.h"

#define N 300
#define S 5
#define F 7

/* One model's inputs: E (N, S, d), X (N, F), y (N), from a fixed seed. */
typedef struct {
    int d;
    float *E, *X, *y;
} inputs_t;

static float uniform(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) & 0xffffff) / 16777216.0f;
}

static void make_inputs(int d, inputs_t *in)
{
    uint64_t s = 20261124;
    in->d = d;
    in->E = malloc(sizeof(float) * N * S * (size_t)d);
    in->X = malloc(sizeof(float) * N * F);
    in->y = malloc(sizeof(float) * N);
    for (size_t i = 0; i < (size_t)N * S * (size_t)d; i++)
        in->E[i] = 0.5f * (uniform(&s) - 0.5f);
    for (size_t i = 0; i < (size_t)N * F; i++)
        in->X[i] = uniform(&s);
    for (int i = 0; i < N; i++)
        in->y[i] = uniform(&s) < 0.3f ? 1.0f : 0.0f;
}

static rt_model_t *make_model(rt_model_type_t type, int d)
{
    static const int bottom[] = {16, 4}, top[] = {16, 1};
    rt_model_config_t cfg = {
        .type = type,
        .nslots = S,
        .ndense = F,
        .dim = d,
        .bottom = bottom,
        .nbottom = 2,
        .top = top,
        .ntop = 2,
        .fm_dense_factors = 1,
        .max_batch = N,
        .seed = 7,
        .opt = {.type = RT_DENSE_ADAGRAD, .lr = 0.05f, .eps = 1e-8f},
    };
    rt_model_t *m = NULL;
    assert_int_equal(rt_model_create(&cfg, &m), 0);
    return m;
}

/* What one dense call gave: the loss, the dense gradients and dE. */
typedef struct {
    double loss;
    double *grads; /* (nparams) */
    float *dE;     /* (N, S, d) */
} result_t;

/* One dense call of ops on in, through ops' own memory and copies. */
static void dense_on(const dev_ops_t *ops, rt_model_t *m, const inputs_t *in, result_t *out)
{
    const size_t eb = sizeof(float) * N * S * (size_t)in->d, xb = sizeof(float) * N * F,
                 yb = sizeof(float) * N;
    void *ctx = NULL, *hE, *hX, *hy, *dE, *dX, *dy;
    assert_int_equal(ops->create(0, &ctx), 0);
    assert_int_equal(ops->alloc(ctx, eb, true, &hE), 0);
    assert_int_equal(ops->alloc(ctx, xb, true, &hX), 0);
    assert_int_equal(ops->alloc(ctx, yb, true, &hy), 0);
    assert_int_equal(ops->alloc(ctx, eb, false, &dE), 0);
    assert_int_equal(ops->alloc(ctx, xb, false, &dX), 0);
    assert_int_equal(ops->alloc(ctx, yb, false, &dy), 0);
    assert_int_equal(ops->host_touch(ctx, hE, eb, true), 0);
    assert_int_equal(ops->host_touch(ctx, hX, xb, true), 0);
    assert_int_equal(ops->host_touch(ctx, hy, yb, true), 0);
    memcpy(hE, in->E, eb);
    memcpy(hX, in->X, xb);
    memcpy(hy, in->y, yb);
    assert_int_equal(ops->copy(ctx, DEV_COMPUTE, dE, hE, eb), 0);
    assert_int_equal(ops->copy(ctx, DEV_COMPUTE, dX, hX, xb), 0);
    assert_int_equal(ops->copy(ctx, DEV_COMPUTE, dy, hy, yb), 0);
    rt_model_zero_grad(m);
    const dev_dense_t a = {.model = m,
                           .params_version = 1,
                           .n = N,
                           .E = dE,
                           .X = dX,
                           .y = dy,
                           .scale = 1.0f / N,
                           .dE = dE};
    if (ops->dense(ctx, &a, &out->loss) != 0)
        fail_msg("%s: dense: %s", ops->name, kiln_errmsg());
    assert_int_equal(ops->copy(ctx, DEV_COMPUTE, hE, dE, eb), 0);
    assert_int_equal(ops->record(ctx, DEV_COMPUTE, 0), 0);
    assert_int_equal(ops->sync(ctx, 0), 0);
    assert_int_equal(ops->host_touch(ctx, hE, eb, false), 0);
    const size_t np = rt_model_nparams(m);
    out->grads = malloc(sizeof(double) * np);
    out->dE = malloc(eb);
    memcpy(out->grads, rt_model_grads(m), sizeof(double) * np);
    memcpy(out->dE, hE, eb);
    void *host[] = {hE, hX, hy}, *dev[] = {dE, dX, dy};
    for (int i = 0; i < 3; i++) {
        ops->release(ctx, host[i], true);
        ops->release(ctx, dev[i], false);
    }
    ops->destroy(ctx);
}

/* Fails unless |a - b| <= tol (|b| + the largest |b|) for every element:
 * float32 rounding of the per-row products, not a wrong formula. */
static void close_d(const char *what, const double *a, const double *b, size_t n, double tol)
{
    double big = 0.0;
    for (size_t i = 0; i < n; i++)
        big = fmax(big, fabs(b[i]));
    for (size_t i = 0; i < n; i++)
        if (!(fabs(a[i] - b[i]) <= tol * (fabs(b[i]) + big)))
            fail_msg("%s[%zu]: GPU %.9g, stand-in %.9g (largest %.3g)", what, i, a[i], b[i], big);
}

static void check_model(rt_model_type_t type, int d)
{
    inputs_t in;
    make_inputs(d, &in);
    rt_model_t *mh = make_model(type, d), *mg = make_model(type, d);
    const size_t np = rt_model_nparams(mh), ne = (size_t)N * S * (size_t)d;
    result_t h, g, g2;
    dense_on(&train_dev_host_ops, mh, &in, &h);
    dense_on(&train_dev_cuda_ops, mg, &in, &g);
    dense_on(&train_dev_cuda_ops, mg, &in, &g2);
    const char *name = rt_model_type_name(type);
    printf("%s: loss GPU %.9g, stand-in %.9g\n", name, g.loss, h.loss);
    close_d("loss", &g.loss, &h.loss, 1, 1e-6);
    close_d("dense gradient", g.grads, h.grads, np, 1e-5);
    double *ga = malloc(sizeof(double) * ne), *ha = malloc(sizeof(double) * ne);
    for (size_t i = 0; i < ne; i++) {
        ga[i] = g.dE[i];
        ha[i] = h.dE[i];
    }
    close_d("dE", ga, ha, ne, 1e-5);
    if (g.loss != g2.loss || memcmp(g.grads, g2.grads, sizeof(double) * np) != 0 ||
        memcmp(g.dE, g2.dE, sizeof(float) * ne) != 0)
        fail_msg("%s: two GPU calls on the same inputs differ", name);
    result_t *all[] = {&h, &g, &g2};
    for (int i = 0; i < 3; i++)
        KILN_FREE_ALL(all[i]->grads, all[i]->dE);
    KILN_FREE_ALL(ga, ha, in.E, in.X, in.y);
    rt_model_destroy(mh);
    rt_model_destroy(mg);
}

/* lr, fm with dense factors and dlrm, each with its pooled width. */
static void test_models(void **state)
{
    (void)state;
    check_model(RT_MODEL_LR, 1);
    check_model(RT_MODEL_FM, 5);
    check_model(RT_MODEL_DLRM, 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_models)};
    if (kern_cuda_device_count() > 0)
        return cmocka_run_group_tests(tests, NULL, NULL);
    puts("skipped: no CUDA device");
    return 77;
}
