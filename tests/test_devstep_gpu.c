/*
 * tests/test_devstep_gpu.c - the device step's CUDA runtime
 * (trainer/train_dev_cuda.cu, train_dev_dlrm.cu) against its host stand-in
 * on the same inputs, one dense call at a time: lr, fm with dense factors
 * and dlrm, 300 rows (not a multiple of any block size). The loss, every
 * dense gradient and dE agree to float32 rounding, and two calls on the GPU
 * give the same bits (the sums are in a fixed order). Then the exchange's
 * kernels (dedupe, permute, accum, combine) on skewed keys: the GPU's
 * results equal the stand-in's bit for bit. Labelled gpu; exits 77
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

static model_t *make_model(model_type_t type, int d)
{
    static const int bottom[] = {16, 4}, top[] = {16, 1};
    model_config_t cfg = {
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
        .opt = {.type = KERN_OPT_ADAGRAD, .lr = 0.05f, .eps = 1e-8f},
    };
    model_t *m = NULL;
    assert_int_equal(model_create(&cfg, &m), 0);
    return m;
}

/* What one dense call gave: the loss, the dense gradients and dE. */
typedef struct {
    double loss;
    double *grads; /* (nparams) */
    float *dE;     /* (N, S, d) */
} result_t;

/* One dense call of ops on in, through ops' own memory and copies. */
static void dense_on(const dev_ops_t *ops, model_t *m, const inputs_t *in, result_t *out)
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
    model_zero_grad(m);
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
    const size_t np = model_nparams(m);
    out->grads = malloc(sizeof(double) * np);
    out->dE = malloc(eb);
    memcpy(out->grads, model_grads(m), sizeof(double) * np);
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

static void check_model(model_type_t type, int d)
{
    inputs_t in;
    make_inputs(d, &in);
    model_t *mh = make_model(type, d), *mg = make_model(type, d);
    const size_t np = model_nparams(mh), ne = (size_t)N * S * (size_t)d;
    result_t h, g, g2;
    dense_on(&train_dev_host_ops, mh, &in, &h);
    dense_on(&train_dev_cuda_ops, mg, &in, &g);
    dense_on(&train_dev_cuda_ops, mg, &in, &g2);
    const char *name = model_type_name(type);
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
    model_destroy(mh);
    model_destroy(mg);
}

/* ---- the exchange's kernels ---- */

#define XT 3    /* tables */
#define XR 3    /* ranks */
#define XN 2000 /* keys of table 0 (table 1 has XN / 2, table 2 none) */
#define XD 5    /* dim */

/* What the exchange calls gave on one device. */
typedef struct {
    int64_t uniq[XN + XN / 2], cnt[XR * XT];
    int32_t inv[XN + XN / 2];
    uint32_t perm[4096];
    double tg[200 * XD];
    int32_t urows[XN];
    float ugrads[XN * XD];
    int64_t nu, nt[3]; /* distinct rows: all, per table of the combine */
} xresult_t;

/* Every buffer exchange_on allocates, released at its end. */
static struct {
    void *p;
    bool host;
} held[32];
static int nheld;

static void *alloc(const dev_ops_t *o, void *ctx, size_t bytes, bool host)
{
    void *p = NULL;
    assert_int_equal(o->alloc(ctx, bytes, host, &p), 0);
    assert_true(nheld < 32);
    held[nheld].p = p;
    held[nheld++].host = host;
    return p;
}

/* in (bytes) to a new device buffer through a pinned one. */
static void *to_dev(const dev_ops_t *o, void *ctx, const void *in, size_t bytes, void **pin)
{
    *pin = alloc(o, ctx, bytes, true);
    void *d = alloc(o, ctx, bytes, false);
    assert_int_equal(o->host_touch(ctx, *pin, bytes, true), 0);
    memcpy(*pin, in, bytes);
    assert_int_equal(o->copy(ctx, DEV_COMPUTE, d, *pin, bytes), 0);
    return d;
}

/* A device buffer back to out through its pinned twin. */
static void from_dev(const dev_ops_t *o, void *ctx, void *d, void *pin, size_t bytes, void *out)
{
    assert_int_equal(o->copy(ctx, DEV_COMPUTE, pin, d, bytes), 0);
    assert_int_equal(o->record(ctx, DEV_COMPUTE, 0), 0);
    assert_int_equal(o->sync(ctx, 0), 0);
    assert_int_equal(o->host_touch(ctx, pin, bytes, false), 0);
    memcpy(out, pin, bytes);
}

static void exchange_on(const dev_ops_t *o, xresult_t *r)
{
    uint64_t s = 77;
    const int64_t koff[XT + 1] = {0, XN, XN + XN / 2, XN + XN / 2};
    static int64_t keys[XN + XN / 2];
    /* Skewed: a few keys in most positions, negative keys, a long tail. */
    for (int i = 0; i < XN + XN / 2; i++) {
        const float u = uniform(&s);
        keys[i] = u < 0.6f ? (int64_t)(uniform(&s) * 4) - 2
                           : (int64_t)(uniform(&s) * 1e6) * (u < 0.8f ? -7919 : 104729);
    }
    void *ctx = NULL, *pins[6];
    assert_int_equal(o->create(0, &ctx), 0);
    const size_t kb = sizeof keys;
    int64_t *dkeys = to_dev(o, ctx, keys, kb, &pins[0]);
    void *duniq = alloc(o, ctx, kb, false), *dinv = alloc(o, ctx, sizeof r->inv, false);
    if (o->dedupe(ctx, XT, koff, dkeys, XR, duniq, dinv, r->cnt) != 0)
        fail_msg("%s: dedupe: %s", o->name, kiln_errmsg());
    /* Each table's distinct keys (the rest of its part is not written). */
    static int64_t all[XN + XN / 2];
    from_dev(o, ctx, duniq, pins[0], kb, all);
    memset(r->uniq, 0, sizeof r->uniq);
    for (int t = 0; t < XT; t++) {
        int64_t nu = 0;
        for (int q = 0; q < XR; q++)
            nu += r->cnt[q * XT + t];
        memcpy(r->uniq + koff[t], all + koff[t], sizeof(int64_t) * (size_t)nu);
    }
    from_dev(o, ctx, dinv, alloc(o, ctx, sizeof r->inv, true), sizeof r->inv, r->inv);

    /* permute: pieces of uneven sizes, in an order that crosses them. */
    static uint32_t words[4096];
    for (int i = 0; i < 4096; i++)
        words[i] = (uint32_t)i * 2654435761u;
    uint32_t *dw = to_dev(o, ctx, words, sizeof words, &pins[1]);
    void *dperm = alloc(o, ctx, sizeof words, false);
    assert_int_equal(o->zero(ctx, dperm, sizeof words), 0);
    dev_seg_t segs[100];
    size_t at = 0;
    for (int k = 0; k < 100; k++) {
        const size_t w = (size_t)(k * 7 % 31 + 1);
        segs[k] = (dev_seg_t){4 * (4096 - at - w), 4 * at, 4 * w};
        at += w;
    }
    assert_int_equal(o->permute(ctx, dperm, dw, 100, segs), 0);
    from_dev(o, ctx, dperm, pins[1], sizeof words, r->perm);

    /* accum twice, then combine: rows with repeats in no order. */
    static int32_t rows[XN];
    static float sums[XN * XD];
    static double grads[XN * XD];
    for (int i = 0; i < XN; i++)
        rows[i] = (int32_t)(uniform(&s) < 0.5f ? uniform(&s) * 5 : uniform(&s) * 200);
    for (int i = 0; i < XN * XD; i++) {
        sums[i] = uniform(&s) - 0.5f;
        grads[i] = (double)(uniform(&s) - 0.5f) * 1e-3 + (double)uniform(&s) * 1e-12;
    }
    int32_t distinct[200];
    for (int i = 0; i < 200; i++)
        distinct[i] = (int32_t)((i * 37) % 200);
    int32_t *ddist = to_dev(o, ctx, distinct, sizeof distinct, &pins[2]);
    float *dsums = to_dev(o, ctx, sums, sizeof sums, &pins[3]);
    void *dtg = alloc(o, ctx, sizeof r->tg, false);
    assert_int_equal(o->zero(ctx, dtg, sizeof r->tg), 0);
    assert_int_equal(o->accum(ctx, 200, ddist, dsums, XD, 200, dtg), 0);
    assert_int_equal(o->accum(ctx, 200, ddist, dsums + 200 * XD, XD, 200, dtg), 0);
    from_dev(o, ctx, dtg, alloc(o, ctx, sizeof r->tg, true), sizeof r->tg, r->tg);
    int32_t *drows = to_dev(o, ctx, rows, sizeof rows, &pins[4]);
    double *dgrads = to_dev(o, ctx, grads, sizeof grads, &pins[5]);
    /* Three tables in one call: the first half of the rows, none, the rest. */
    const int64_t coff[4] = {0, XN / 2, XN / 2, XN};
    int32_t *durows = alloc(o, ctx, sizeof r->urows, false);
    float *dugrads = alloc(o, ctx, sizeof r->ugrads, false);
    assert_int_equal(o->zero(ctx, durows, sizeof r->urows), 0);
    assert_int_equal(o->zero(ctx, dugrads, sizeof r->ugrads), 0);
    kern_row_grads_t out[3];
    for (int t = 0; t < 3; t++)
        out[t] = (kern_row_grads_t){durows + coff[t], dugrads + coff[t] * XD, -1};
    if (o->combine(ctx, 3, coff, drows, dgrads, XD, out) != 0)
        fail_msg("%s: combine: %s", o->name, kiln_errmsg());
    r->nu = 0;
    for (int t = 0; t < 3; t++) {
        r->nt[t] = out[t].n;
        r->nu += out[t].n;
    }
    from_dev(o, ctx, durows, pins[4], sizeof r->urows, r->urows);
    from_dev(o, ctx, dugrads, alloc(o, ctx, sizeof r->ugrads, true), sizeof r->ugrads, r->ugrads);
    while (nheld > 0) {
        nheld--;
        o->release(ctx, held[nheld].p, held[nheld].host);
    }
    o->destroy(ctx);
}

/* dedupe, permute, accum and combine on the GPU against the stand-in on
 * the same inputs: the same bits (integer work, and float64 sums in the
 * same order). */
static void test_exchange(void **state)
{
    (void)state;
    static xresult_t h, g, g2;
    exchange_on(&train_dev_host_ops, &h);
    exchange_on(&train_dev_cuda_ops, &g);
    exchange_on(&train_dev_cuda_ops, &g2);
    printf("exchange: table 0 has %lld distinct keys over %d ranks, combine %lld distinct rows\n",
           (long long)(h.cnt[0] + h.cnt[XT] + h.cnt[2 * XT]), XR, (long long)h.nu);
    assert_memory_equal(g.cnt, h.cnt, sizeof h.cnt);
    assert_memory_equal(g.uniq, h.uniq, sizeof h.uniq);
    assert_memory_equal(g.inv, h.inv, sizeof h.inv);
    assert_memory_equal(g.perm, h.perm, sizeof h.perm);
    assert_memory_equal(g.tg, h.tg, sizeof h.tg);
    assert_int_equal(g.nu, h.nu);
    assert_memory_equal(g.nt, h.nt, sizeof h.nt);
    assert_int_equal(h.nt[1], 0);
    assert_memory_equal(g.urows, h.urows, sizeof h.urows);
    assert_memory_equal(g.ugrads, h.ugrads, sizeof h.ugrads);
    if (memcmp(&g, &g2, sizeof g) != 0)
        fail_msg("two GPU runs of the exchange kernels differ");
}

/* lr, fm with dense factors and dlrm, each with its pooled width. */
static void test_models(void **state)
{
    (void)state;
    check_model(MODEL_LR, 1);
    check_model(MODEL_FM, 5);
    check_model(MODEL_DLRM, 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_models),
                                       cmocka_unit_test(test_exchange)};
    if (kern_cuda_device_count() > 0)
        return cmocka_run_group_tests(tests, NULL, NULL);
    puts("skipped: no CUDA device");
    return 77;
}
