/*
 * tests/test_model.c - model/'s dense models (model.h): every model's
 * forward against a naive double-precision reference written from the
 * formulas in docs/models.md, its gradients (dE and every dense parameter
 * group) against central differences of that reference, and a deliberately
 * wrong gradient that the checker must reject; the stable loss (known values,
 * |z| = 50); the dense optimizers against a plain reference for 3 steps;
 * deterministic init; checkpoint state round trips; config errors; that lr,
 * fm and dlrm learn a synthetic separable problem; and exact AUC with ties.
 * bf16 dense layers (model_bf16.c): every dlrm layer's three products
 * against a float64 reference within bf16's rounding, rank-count
 * invariance, and the refusal on a CPU without bf16 (test_bf16_*).
 */
/* cmocka.h needs these four first. */
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

/* The bf16 tests call a layer's forward and backward on their own inputs. */
#define MODEL_IMPL
#include "model.h"
#include "proc.h"

/* ---- helpers ------------------------------------------------------------------ */

/* splitmix64: the test's own deterministic stream. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = (*s += 0x9E3779B97F4A7C15ull);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Uniform in [lo, hi). */
static float rng_uniform(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0));
}

typedef struct {
    model_type_t type;
    int S, F, d;
    int bottom[4], nb;
    int top[4], nt;
    int fm_dense;
    model_dense_precision_t precision;
} shape_t;

/* A DLRM shape: S sparse and F dense features, embeddings of dim d, and the
 * widths of its bottom and top MLPs (each list ended by 0). */
static shape_t dlrm(int S, int F, int d, const int *bottom, const int *top)
{
    shape_t sh = {.type = MODEL_DLRM, .S = S, .F = F, .d = d};
    for (; bottom[sh.nb] != 0; sh.nb++)
        sh.bottom[sh.nb] = bottom[sh.nb];
    for (; top[sh.nt] != 0; sh.nt++)
        sh.top[sh.nt] = top[sh.nt];
    return sh;
}

static model_config_t make_cfg(const shape_t *sh, int max_batch, uint64_t seed,
                                  model_dense_opt_t opt)
{
    model_config_t c = {0};
    c.type = sh->type;
    c.nslots = sh->S;
    c.ndense = sh->F;
    c.dim = sh->d;
    c.bottom = sh->bottom;
    c.nbottom = sh->nb;
    c.top = sh->top;
    c.ntop = sh->nt;
    c.fm_dense_factors = sh->fm_dense;
    c.max_batch = max_batch;
    c.seed = seed;
    c.opt = opt;
    c.precision = sh->precision;
    return c;
}

static model_dense_opt_t sgd(float lr)
{
    model_dense_opt_t o = {KERN_OPT_SGD, lr, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    return o;
}

static model_t *make_model(const shape_t *sh, int max_batch, uint64_t seed, model_dense_opt_t opt)
{
    model_config_t c = make_cfg(sh, max_batch, seed, opt);
    model_t *m = NULL;
    int rc = model_create(&c, &m);
    if (rc != 0)
        fprintf(stderr, "model_create: %s\n", kiln_errmsg());
    assert_int_equal(rc, 0);
    assert_non_null(m);
    return m;
}

/* ---- the reference: docs/models.md's formulas, naively, in double ---------------- */
#define RMAX 256 /* the widest top input the checks use: 17 + 20 * 21 / 2 = 227 */

static double dotd(const double *a, const double *b, int d)
{
    double s = 0.0;
    for (int j = 0; j < d; j++)
        s += a[j] * b[j];
    return s;
}

/* y (out) = W (out, in) a (in) + b, optionally ReLU; returns floats used. */
static size_t ref_layer(const double *p, int in, int out, const double *a, double *y, int relu)
{
    for (int o = 0; o < out; o++) {
        double v = p[(size_t)out * in + o];
        for (int j = 0; j < in; j++)
            v += p[(size_t)o * in + j] * a[j];
        y[o] = relu && v < 0.0 ? 0.0 : v;
    }
    return (size_t)out * in + out;
}

/* Logit of one row: e (S, d), x (F), parameters p in the documented layout. */
static double ref_logit(const shape_t *sh, const double *p, const double *e, const double *x)
{
    const int S = sh->S, F = sh->F, d = sh->d;
    if (sh->type == MODEL_LR || sh->type == MODEL_FM) {
        /* [w (F), b, vx (k, F) when fm_dense] */
        double z = p[F];
        for (int j = 0; j < F; j++)
            z += p[j] * x[j];
        for (int s = 0; s < S; s++)
            z += e[s * d];
        if (sh->type == MODEL_LR)
            return z;
        int k = d - 1;
        double vec[9][RMAX];
        int nv = 0;
        for (int s = 0; s < S; s++, nv++)
            for (int f = 0; f < k; f++)
                vec[nv][f] = e[s * d + 1 + f];
        if (sh->fm_dense && k > 0 && F > 0) {
            for (int f = 0; f < k; f++) {
                vec[nv][f] = 0.0;
                for (int j = 0; j < F; j++)
                    vec[nv][f] += p[F + 1 + f * F + j] * x[j];
            }
            nv++;
        }
        for (int a = 0; a < nv; a++)
            for (int b = a + 1; b < nv; b++)
                z += dotd(vec[a], vec[b], k);
        return z;
    }
    /* dlrm: [bottom.0.weight, bottom.0.bias, ..., top.0.weight, top.0.bias, ...] */
    double a[RMAX], t[RMAX];
    size_t off = 0;
    int in = F;
    memcpy(a, x, sizeof(double) * (size_t)F);
    for (int l = 0; l < sh->nb; l++) {
        off += ref_layer(p + off, in, sh->bottom[l], a, t, 1);
        in = sh->bottom[l];
        memcpy(a, t, sizeof(double) * (size_t)in);
    }
    /* vectors [bot, e_0 .. e_S-1]; R = [bot | dots of pairs a < b, row-major] */
    double R[RMAX];
    int r = 0;
    for (int j = 0; j < d; j++)
        R[r++] = a[j];
    for (int va = 0; va <= S; va++)
        for (int vb = va + 1; vb <= S; vb++)
            R[r++] = dotd(va == 0 ? a : e + (va - 1) * d, e + (vb - 1) * d, d);
    in = r;
    memcpy(a, R, sizeof(double) * (size_t)r);
    for (int l = 0; l < sh->nt; l++) {
        off += ref_layer(p + off, in, sh->top[l], a, t, l + 1 < sh->nt);
        in = sh->top[l];
        memcpy(a, t, sizeof(double) * (size_t)in);
    }
    return a[0];
}

/* loss_scale * sum_i logloss(z_i, y_i) */
static double ref_loss(const shape_t *sh, const double *p, const double *E, const double *X,
                       const float *y, int n, double scale)
{
    double L = 0.0;
    for (int i = 0; i < n; i++) {
        double z = ref_logit(sh, p, E + (size_t)i * sh->S * sh->d, X + (size_t)i * sh->F);
        L += (z > 0 ? z : 0) - z * y[i] + log1p(exp(-fabs(z)));
    }
    return scale * L;
}

/* Mismatches of analytic against numeric under |a - r| <= 1e-4 + 1e-2 |r|. */
static int count_bad_at(const char *what, double (*at)(const void *, size_t), const void *a,
                        const double *r, size_t cnt, int loud)
{
    int bad = 0;
    for (size_t i = 0; i < cnt; i++) {
        double err = fabs(at(a, i) - r[i]);
        if (!(err <= 1e-4 + 1e-2 * fabs(r[i]))) {
            if (loud)
                fprintf(stderr, "%s[%zu]: analytic %.7g numeric %.7g\n", what, i, at(a, i),
                        r[i]);
            bad++;
        }
    }
    return bad;
}

static double at_f(const void *a, size_t i) { return (double)((const float *)a)[i]; }
static double at_d(const void *a, size_t i) { return ((const double *)a)[i]; }

/* dE is float32, the dense gradients float64 (model.h). */
static int count_bad(const char *what, const float *a, const double *r, size_t cnt, int loud)
{
    return count_bad_at(what, at_f, a, r, cnt, loud);
}
static int count_bad_d(const char *what, const double *a, const double *r, size_t cnt, int loud)
{
    return count_bad_at(what, at_d, a, r, cnt, loud);
}

/* The derivatives of ref_loss by the cnt values at x (which is pd or Ed,
 * changed and restored in place), by central differences of step h, into
 * num[cnt]. */
static void central_diff(const shape_t *sh, const double *pd, const double *Ed, const double *Xd,
                         const float *y, int n, double scale, double h, double *x, size_t cnt,
                         double *num)
{
    for (size_t i = 0; i < cnt; i++) {
        double keep = x[i];
        x[i] = keep + h;
        double lp = ref_loss(sh, pd, Ed, Xd, y, n, scale);
        x[i] = keep - h;
        double lm = ref_loss(sh, pd, Ed, Xd, y, n, scale);
        x[i] = keep;
        num[i] = (lp - lm) / (2 * h);
    }
}

/* ---- gradient checks --------------------------------------------------------------- */
static void grad_check(const shape_t *sh)
{
    const int n = 3, S = sh->S, F = sh->F, d = sh->d;
    const double h = 1e-5, scale = 1.0 / n;
    uint64_t rs = 1234 + (uint64_t)sh->type * 7 + (uint64_t)d;
    model_t *m = make_model(sh, 4, 99, sgd(0.1f));
    const size_t np = model_nparams(m), ne = (size_t)n * S * d;
    float *params = model_params(m);
    float *E = calloc(ne + 1, sizeof(float)), *X = calloc((size_t)n * F + 1, sizeof(float));
    float *dE = calloc(ne + 1, sizeof(float)), probs[3];
    double *pd = calloc(np, sizeof(double)), *Ed = calloc(ne + 1, sizeof(double));
    double *Xd = calloc((size_t)n * F + 1, sizeof(double));
    double *num = calloc((np > ne ? np : ne) + 1, sizeof(double));
    const float y[3] = {1.0f, 0.0f, 1.0f};
    assert_true(E && X && dE && pd && Ed && Xd && num);

    /* Random weights (nonzero biases, mixed ReLU patterns) and inputs. */
    for (size_t i = 0; i < np; i++)
        pd[i] = params[i] = rng_uniform(&rs, -0.6f, 0.6f);
    for (size_t i = 0; i < ne; i++)
        Ed[i] = E[i] = rng_uniform(&rs, -0.8f, 0.8f);
    for (size_t i = 0; i < (size_t)n * F; i++)
        Xd[i] = X[i] = rng_uniform(&rs, 0.0f, 2.0f);

    double loss = -1.0;
    assert_int_equal(model_forward(m, n, E, X, y, probs, &loss), 0);
    double want = ref_loss(sh, pd, Ed, Xd, y, n, 1.0);
    assert_true(fabs(loss - want) <= 1e-5 * (1.0 + fabs(want)));
    for (int i = 0; i < n; i++) {
        double z = ref_logit(sh, pd, Ed + (size_t)i * S * d, Xd + (size_t)i * F);
        assert_true(fabs(probs[i] - 1.0 / (1.0 + exp(-z))) < 1e-5);
    }
    model_zero_grad(m);
    assert_int_equal(model_backward(m, (float)scale, dE), 0);
    const double *grads = model_grads(m);

    /* dE against central differences. */
    central_diff(sh, pd, Ed, Xd, y, n, scale, h, Ed, ne, num);
    assert_int_equal(count_bad("dE", dE, num, ne, 1), 0);
    /* A wrong dE would fail: nudge one element past the tolerance. */
    if (ne > 1) {
        float keep = dE[1];
        dE[1] += 1e-3f + 0.05f * fabsf(dE[1]);
        assert_true(count_bad("dE(wrong)", dE, num, ne, 0) > 0);
        dE[1] = keep;
    }

    /* Every dense parameter group against central differences. */
    central_diff(sh, pd, Ed, Xd, y, n, scale, h, pd, np, num);
    for (int gi = 0; gi < model_ngroups(m); gi++) {
        const model_group_t *g = model_group(m, gi);
        size_t cnt = (size_t)g->rows * g->cols;
        assert_int_equal(count_bad_d(g->name, grads + g->offset, num + g->offset, cnt, 1), 0);
    }
    /* ... and a wrong parameter gradient would fail. */
    double *gw = model_grads(m);
    double keep = gw[0];
    gw[0] += 1e-3 + 0.05 * fabs(gw[0]);
    assert_true(count_bad_d("grad(wrong)", gw, num, np, 0) > 0);
    gw[0] = keep;

    /* Gradients accumulate: a second forward+backward doubles them. */
    double *g1 = malloc(np * sizeof(double));
    assert_non_null(g1);
    memcpy(g1, grads, np * sizeof(double));
    assert_int_equal(model_forward(m, n, E, X, y, NULL, NULL), 0);
    assert_int_equal(model_backward(m, (float)scale, dE), 0);
    for (size_t i = 0; i < np; i++)
        assert_true(fabs(grads[i] - 2.0 * g1[i]) <= 1e-12 + 1e-9 * fabs(g1[i]));

    /* dE may alias E: the gradient replaces the embeddings. */
    float *EE = malloc((ne + 1) * sizeof(float));
    assert_non_null(EE);
    memcpy(EE, E, ne * sizeof(float));
    assert_int_equal(model_forward(m, n, EE, X, y, NULL, NULL), 0);
    assert_int_equal(model_backward(m, (float)scale, EE), 0);
    for (size_t i = 0; i < ne; i++)
        assert_float_equal(EE[i], dE[i], 1e-7);

    /* predict gives forward's probabilities and leaves nothing for backward. */
    float pp[3];
    assert_int_equal(model_predict(m, n, E, X, pp), 0);
    for (int i = 0; i < n; i++)
        assert_float_equal(pp[i], probs[i], 1e-7);
    assert_int_equal(model_backward(m, 1.0f, dE), KILN_ESTATE);

    free(g1);
    free(EE);
    free(E);
    free(X);
    free(dE);
    free(pd);
    free(Ed);
    free(Xd);
    free(num);
    model_destroy(m);
}

static void test_grad_lr(void **state)
{
    (void)state;
    shape_t sh = {.type = MODEL_LR, .S = 4, .F = 3, .d = 1};
    grad_check(&sh);
}

static void test_grad_fm(void **state)
{
    (void)state;
    shape_t sh = {.type = MODEL_FM, .S = 4, .F = 3, .d = 4};
    grad_check(&sh);
    sh.fm_dense = 1;
    grad_check(&sh);
    sh.d = 3;
    sh.F = 2;
    grad_check(&sh);
    /* 69 factors: the forward's sums run 64 factors a pass, then 5. */
    sh.d = 70;
    grad_check(&sh);
}

static void test_grad_dlrm(void **state)
{
    (void)state;
    shape_t sh = dlrm(4, 3, 3, (const int[]){5, 3, 0}, (const int[]){6, 4, 1, 0});
    grad_check(&sh);
    shape_t small = dlrm(3, 2, 2, (const int[]){2, 0}, (const int[]){1, 0});
    grad_check(&small);
    /* 21 vectors (two 16-lane blocks of pairs, the last tasks through the
     * copy) of width 17 (a whole 16-column tile and one column past it). */
    shape_t wide = dlrm(20, 3, 17, (const int[]){5, 17, 0}, (const int[]){6, 1, 0});
    grad_check(&wide);
}

/* ---- the layout and the loss ---------------------------------------------------------- */
static void test_layout(void **state)
{
    (void)state;
    shape_t sh = dlrm(4, 3, 3, (const int[]){5, 3, 0}, (const int[]){6, 1, 0});
    model_t *m = make_model(&sh, 8, 1, sgd(0.1f));
    static const struct {
        const char *name;
        int rows, cols;
    } want[] = {{"bottom.0.weight", 5, 3}, {"bottom.0.bias", 5, 1},
                {"bottom.1.weight", 3, 5}, {"bottom.1.bias", 3, 1},
                {"top.0.weight", 6, 13},   {"top.0.bias", 6, 1}, /* 13 = d + S(S+1)/2 */
                {"top.1.weight", 1, 6},    {"top.1.bias", 1, 1}};
    assert_int_equal(model_ngroups(m), 8);
    size_t off = 0;
    for (int i = 0; i < 8; i++) {
        const model_group_t *g = model_group(m, i);
        assert_string_equal(g->name, want[i].name);
        assert_int_equal(g->rows, want[i].rows);
        assert_int_equal(g->cols, want[i].cols);
        assert_int_equal(g->offset, off);
        off += (size_t)g->rows * g->cols;
    }
    assert_int_equal(model_nparams(m), off);
    assert_null(model_group(m, 8));
    model_destroy(m);

    shape_t fm = {.type = MODEL_FM, .S = 2, .F = 4, .d = 3, .fm_dense = 1};
    m = make_model(&fm, 8, 1, sgd(0.1f));
    assert_int_equal(model_nparams(m), 4 + 1 + 2 * 4);
    assert_string_equal(model_group(m, 2)->name, "vx");
    model_destroy(m);

    assert_int_equal(model_table_dim(MODEL_LR, 16), 1);
    assert_int_equal(model_table_dim(MODEL_FM, 16), 17);
    assert_int_equal(model_table_dim(MODEL_DLRM, 16), 16);
    assert_int_equal(model_table_dim(MODEL_DLRM, 0), KILN_EINVAL);
}

static void test_loss_known(void **state)
{
    (void)state;
    /* lr, S = 2, F = 1: w = 0.5, b = -0.25, e = (0.1, 0.2), x = 2:
     * z = 0.1 + 0.2 + 1.0 - 0.25 = 1.05; loss(y=1) = log(1 + e^-1.05)
     * = 0.3000584796, loss(y=0) = z + that = 1.3500584796. */
    shape_t sh = {.type = MODEL_LR, .S = 2, .F = 1, .d = 1};
    model_t *m = make_model(&sh, 2, 1, sgd(0.1f));
    float *p = model_params(m);
    p[0] = 0.5f;
    p[1] = -0.25f;
    const float E[4] = {0.1f, 0.2f, 0.1f, 0.2f}, X[2] = {2.0f, 2.0f}, y[2] = {1.0f, 0.0f};
    float probs[2];
    double loss = 0.0;
    assert_int_equal(model_forward(m, 1, E, X, y, probs, &loss), 0);
    assert_float_equal(loss, 0.3000584796, 1e-6);
    assert_int_equal(model_forward(m, 2, E, X, y, probs, &loss), 0);
    assert_float_equal(loss, 0.3000584796 + 1.3500584796, 2e-6);
    assert_float_equal(probs[0], 1.0 / (1.0 + exp(-1.05)), 1e-6);
    model_destroy(m);

    /* fm, S = 2, k = 2: e0 = (0.1 | 1, 2), e1 = (0.2 | 3, -1), w = b = 0:
     * z = 0.3 + <(1,2),(3,-1)> = 1.3; loss(y=1) = log(1 + e^-1.3) = 0.2410084538. */
    shape_t fm = {.type = MODEL_FM, .S = 2, .F = 1, .d = 3};
    m = make_model(&fm, 1, 1, sgd(0.1f));
    const float Ef[6] = {0.1f, 1.0f, 2.0f, 0.2f, 3.0f, -1.0f};
    assert_int_equal(model_forward(m, 1, Ef, X, y, probs, &loss), 0);
    assert_float_equal(loss, 0.2410084538, 1e-6);
    assert_float_equal(probs[0], 0.7858349831, 1e-6);
    model_destroy(m);
}

static void test_loss_stable(void **state)
{
    (void)state;
    /* log1p(e^-50) = 1.9287498479639178e-22 */
    assert_float_equal(model_logloss(50.0, 1.0) / 1.9287498479639178e-22, 1.0, 1e-9);
    assert_float_equal(model_logloss(50.0, 0.0), 50.0, 1e-12);
    assert_float_equal(model_logloss(-50.0, 1.0), 50.0, 1e-12);
    assert_float_equal(model_logloss(-50.0, 0.0) / 1.9287498479639178e-22, 1.0, 1e-9);
    assert_float_equal(model_logloss(1000.0, 0.0), 1000.0, 1e-9);
    assert_true(isfinite(model_logloss(-1e4, 1.0)));
    assert_true(model_sigmoid(-50.0f) > 0.0f && model_sigmoid(-50.0f) < 1e-21f);
    assert_float_equal(model_sigmoid(50.0f), 1.0f, 0.0);
    assert_float_equal(model_sigmoid(-1000.0f), 0.0f, 0.0);
    assert_float_equal(model_sigmoid(0.0f), 0.5f, 0.0);

    /* Through a model: b = 50 with y = 0, and b = -50 with y = 1; the
     * gradient stays finite and is ~(p - y). */
    shape_t sh = {.type = MODEL_LR, .S = 1, .F = 0, .d = 1};
    model_t *m = make_model(&sh, 1, 1, sgd(0.1f));
    const float E[1] = {0.0f};
    float dE[1];
    for (int sign = -1; sign <= 1; sign += 2) {
        model_params(m)[0] = 50.0f * (float)sign;
        const float y[1] = {sign > 0 ? 0.0f : 1.0f};
        double loss = 0.0;
        assert_int_equal(model_forward(m, 1, E, NULL, y, NULL, &loss), 0);
        assert_float_equal(loss, 50.0, 1e-5);
        assert_int_equal(model_backward(m, 1.0f, dE), 0);
        assert_float_equal(dE[0], (float)sign, 1e-6);
    }
    model_destroy(m);
}

/* ---- the dense optimizers ------------------------------------------------------------- */
static void opt_check(model_dense_opt_t opt)
{
    shape_t sh = {.type = MODEL_LR, .S = 1, .F = 3, .d = 1}; /* 4 params */
    model_t *m = make_model(&sh, 1, 1, opt);
    assert_int_equal(model_nparams(m), 4);
    float *p = model_params(m);
    double *g = model_grads(m);
    double w[4] = {0.5, -1.0, 2.0, 0.0}, a[4], mo[4] = {0}, v[4] = {0};
    for (int i = 0; i < 4; i++) {
        p[i] = (float)w[i];
        a[i] = opt.initial_accumulator;
    }
    for (int t = 1; t <= 3; t++) {
        for (int i = 0; i < 4; i++)
            g[i] = 0.3 * (i + 1) * (t % 2 ? 1 : -1) + 0.05 * t;
        assert_int_equal(model_step(m), 0);
        for (int i = 0; i < 4; i++) {
            double gi = (double)(float)g[i] + opt.weight_decay * w[i];
            switch (opt.type) {
            case KERN_OPT_SGD:
                w[i] -= opt.lr * gi;
                break;
            case KERN_OPT_ADAGRAD:
                a[i] += gi * gi;
                w[i] -= opt.lr * gi / (sqrt(a[i]) + opt.eps);
                break;
            case KERN_OPT_ADAM:
                mo[i] = opt.beta1 * mo[i] + (1 - opt.beta1) * gi;
                v[i] = opt.beta2 * v[i] + (1 - opt.beta2) * gi * gi;
                w[i] -= opt.lr * (mo[i] / (1 - pow(opt.beta1, t))) /
                        (sqrt(v[i] / (1 - pow(opt.beta2, t))) + opt.eps);
                break;
            }
            assert_float_equal(p[i], w[i], 1e-5 * (1 + fabs(w[i])));
        }
    }
    model_array_t arr[MODEL_MAX_STATE];
    int na = 0;
    int64_t step = -1;
    model_state(m, arr, &na, &step);
    assert_int_equal(step, 3);
    assert_int_equal(na, opt.type == KERN_OPT_SGD ? 1 : opt.type == KERN_OPT_ADAGRAD ? 2 : 3);
    if (opt.type == KERN_OPT_ADAGRAD)
        assert_float_equal(arr[1].data[2], a[2], 1e-5 * a[2]);
    if (opt.type == KERN_OPT_ADAM)
        assert_float_equal(arr[2].data[3], v[3], 1e-5 * v[3]);
    model_destroy(m);
}

static void test_optimizers(void **state)
{
    (void)state;
    opt_check((model_dense_opt_t){KERN_OPT_SGD, 0.1f, 0, 0, 0, 0, 0});
    opt_check((model_dense_opt_t){KERN_OPT_SGD, 0.1f, 0, 0, 0, 0.01f, 0});
    opt_check((model_dense_opt_t){KERN_OPT_ADAGRAD, 0.05f, 1e-8f, 0, 0, 0, 0.1f});
    opt_check((model_dense_opt_t){KERN_OPT_ADAGRAD, 0.05f, 1e-6f, 0, 0, 0.02f, 0.0f});
    opt_check((model_dense_opt_t){KERN_OPT_ADAM, 0.01f, 1e-8f, 0.9f, 0.999f, 0, 0});
    opt_check((model_dense_opt_t){KERN_OPT_ADAM, 0.01f, 1e-8f, 0.8f, 0.99f, 0.05f, 0});
}

/* ---- init, state, errors --------------------------------------------------------------- */
static void test_init_deterministic(void **state)
{
    (void)state;
    shape_t sh = dlrm(5, 4, 4, (const int[]){8, 4, 0}, (const int[]){8, 1, 0});
    model_t *a = make_model(&sh, 16, 42, sgd(0.1f));
    model_t *b = make_model(&sh, 64, 42, sgd(0.1f)); /* batch size is not an input */
    model_t *c = make_model(&sh, 16, 43, sgd(0.1f));
    size_t np = model_nparams(a);
    assert_memory_equal(model_params(a), model_params(b), np * sizeof(float));
    assert_memory_not_equal(model_params(a), model_params(c), np * sizeof(float));
    /* nn.Linear's init: a layer's weight (out, in) and bias (out, 1) both
     * U(+-1/sqrt(in)), most values nonzero. */
    int fan_in = 0;
    for (int gi = 0; gi < model_ngroups(a); gi++) {
        const model_group_t *g = model_group(a, gi);
        const float *p = model_params(a) + g->offset;
        size_t cnt = (size_t)g->rows * g->cols;
        int nonzero = 0;
        if (strstr(g->name, ".weight") != NULL)
            fan_in = g->cols;
        assert_true(fan_in > 0);
        double lim = 1.0 / sqrt((double)fan_in);
        for (size_t i = 0; i < cnt; i++) {
            assert_true(fabs(p[i]) <= lim);
            nonzero += p[i] != 0.0f;
        }
        assert_true(nonzero > (int)cnt / 2);
    }
    model_destroy(a);
    model_destroy(b);
    model_destroy(c);
}

static void test_state_roundtrip(void **state)
{
    (void)state;
    shape_t sh = dlrm(3, 2, 2, (const int[]){4, 2, 0}, (const int[]){3, 1, 0});
    model_dense_opt_t adam = {KERN_OPT_ADAM, 0.01f, 1e-8f, 0.9f, 0.999f, 0.0f, 0.0f};
    model_t *a = make_model(&sh, 4, 1, adam);
    model_t *b = make_model(&sh, 4, 2, adam);
    size_t np = model_nparams(a);
    for (int t = 0; t < 2; t++) {
        for (size_t i = 0; i < np; i++)
            model_grads(a)[i] = 0.01 * (double)((i % 7) + 1);
        model_step(a);
    }
    model_array_t arr[MODEL_MAX_STATE];
    int na;
    int64_t step;
    model_state(a, arr, &na, &step);
    assert_int_equal(na, 3);
    assert_int_equal(step, 2);
    assert_string_equal(arr[0].name, "dense.params");
    assert_int_equal(model_load_arrays(b, arr, na, step), 0);
    /* The same next step gives bit-identical weights. */
    for (size_t i = 0; i < np; i++)
        model_grads(a)[i] = model_grads(b)[i] = 0.02;
    model_step(a);
    model_step(b);
    assert_memory_equal(model_params(a), model_params(b), np * sizeof(float));

    /* Without optimizer state: params load, adam starts fresh. */
    model_state(a, arr, &na, &step);
    assert_int_equal(model_load_arrays(b, arr, 1, step), 0);
    model_array_t barr[MODEL_MAX_STATE];
    int nb;
    int64_t bstep;
    model_state(b, barr, &nb, &bstep);
    assert_int_equal(bstep, 0);
    assert_true(barr[1].data[0] == 0.0f && barr[2].data[np - 1] == 0.0f);

    /* A model of another shape refuses the state; nothing changes. */
    shape_t other = sh;
    other.top[0] = 5;
    model_t *c = make_model(&other, 4, 1, adam);
    float before = model_params(c)[0];
    assert_int_equal(model_load_arrays(c, arr, na, step), KILN_ECONFLICT);
    assert_non_null(strstr(kiln_errmsg(), "dense.params"));
    assert_true(model_params(c)[0] == before);
    assert_int_equal(model_load_arrays(c, arr + 1, 2, step), KILN_ENOENT);
    model_destroy(a);
    model_destroy(b);
    model_destroy(c);

    /* fm with and without dense factors differ by vx: the message says
     * which setting wrote the checkpoint. */
    shape_t fm = {.type = MODEL_FM, .S = 3, .F = 2, .d = 4, .fm_dense = 1};
    model_t *with = make_model(&fm, 4, 1, adam);
    fm.fm_dense = 0;
    model_t *without = make_model(&fm, 4, 1, adam);
    model_state(with, arr, &na, &step);
    assert_int_equal(model_load_arrays(without, arr, na, step), KILN_ECONFLICT);
    assert_non_null(strstr(kiln_errmsg(), "it was written with model.fm_dense_factors: true"));
    model_state(without, arr, &na, &step);
    assert_int_equal(model_load_arrays(with, arr, na, step), KILN_ECONFLICT);
    assert_non_null(strstr(kiln_errmsg(), "it was written with model.fm_dense_factors: false"));
    model_destroy(with);
    model_destroy(without);
}

static void test_config_errors(void **state)
{
    (void)state;
    model_t *m = (model_t *)&m; /* must become NULL */
    shape_t sh = dlrm(3, 2, 4, (const int[]){8, 3, 0}, (const int[]){4, 1, 0});
    model_config_t c = make_cfg(&sh, 8, 1, sgd(0.1f));
    assert_int_equal(model_create(&c, &m), KILN_EINVAL);
    assert_null(m);
    assert_non_null(strstr(kiln_errmsg(), "bottom_mlp"));
    sh.bottom[1] = 4;
    sh.top[1] = 2;
    c = make_cfg(&sh, 8, 1, sgd(0.1f));
    assert_int_equal(model_create(&c, &m), KILN_EINVAL);
    assert_non_null(strstr(kiln_errmsg(), "top_mlp"));
    shape_t lr = {.type = MODEL_LR, .S = 3, .F = 2, .d = 4};
    c = make_cfg(&lr, 8, 1, sgd(0.1f));
    assert_int_equal(model_create(&c, &m), KILN_EINVAL);
    lr.d = 1;
    c = make_cfg(&lr, 0, 1, sgd(0.1f));
    assert_int_equal(model_create(&c, &m), KILN_EINVAL);
    c = make_cfg(&lr, 8, 1, (model_dense_opt_t){KERN_OPT_ADAM, 0.1f, 1e-8f, 1.0f, 0.9f, 0, 0});
    assert_int_equal(model_create(&c, &m), KILN_EINVAL);
    assert_non_null(strstr(kiln_errmsg(), "betas"));

    /* Calls out of order or out of range. */
    c = make_cfg(&lr, 2, 1, sgd(0.1f));
    assert_int_equal(model_create(&c, &m), 0);
    float E[9] = {0}, X[6] = {0}, y[3] = {0}, dE[9];
    assert_int_equal(model_backward(m, 1.0f, dE), KILN_ESTATE);
    assert_int_equal(model_forward(m, 3, E, X, y, NULL, NULL), KILN_EINVAL);
    assert_int_equal(model_forward(m, 2, E, NULL, y, NULL, NULL), KILN_EINVAL);
    double loss = -1;
    assert_int_equal(model_forward(m, 2, E, X, NULL, NULL, &loss), KILN_EINVAL);
    assert_int_equal(model_forward(m, 2, E, X, NULL, NULL, NULL), 0);
    assert_int_equal(model_backward(m, 1.0f, dE), KILN_ESTATE); /* no labels */
    assert_int_equal(model_forward(m, 2, E, X, y, NULL, &loss), 0);
    assert_int_equal(model_backward(m, 1.0f, dE), 0);
    assert_int_equal(model_backward(m, 1.0f, dE), KILN_ESTATE); /* once per forward */
    assert_int_equal(model_forward(m, 0, NULL, NULL, NULL, NULL, &loss), 0);
    assert_float_equal(loss, 0.0, 0.0);
    assert_int_equal(model_backward(m, 1.0f, NULL), 0);
    model_destroy(m);
    model_destroy(NULL);
}

/* ---- learning a synthetic separable problem --------------------------------------------
 * S slots of V keys; each key has a hidden score in [-1, 1]; y = 1 when the
 * row's scores plus 0.8 (x0 - x1) are positive. The test keeps the embedding
 * tables (one key per slot per row) and updates them with adagrad from dE,
 * as the sparse side would. Returns the mean loss of the first step and of
 * the last 20 steps. */
#define TS 4
#define TV 10
#define TF 3
#define TN 64

static void train_synthetic(const shape_t *sh, int steps, double *first, double *last)
{
    const int d = sh->d;
    uint64_t rs = 777;
    float score[TS][TV];
    for (int s = 0; s < TS; s++)
        for (int v = 0; v < TV; v++)
            score[s][v] = rng_uniform(&rs, -1.0f, 1.0f);
    model_dense_opt_t ada = {KERN_OPT_ADAGRAD, 0.1f, 1e-8f, 0, 0, 0, 0};
    model_t *m = make_model(sh, TN, 5, ada);
    float *tab = malloc(sizeof(float) * TS * TV * d), *acc = calloc(TS * TV * d, sizeof(float));
    float *tg = malloc(sizeof(float) * TS * TV * d);
    float *E = malloc(sizeof(float) * TN * TS * d), *dE = malloc(sizeof(float) * TN * TS * d);
    float X[TN * TF], y[TN];
    int keys[TN][TS];
    assert_true(tab && acc && tg && E && dE);
    for (int i = 0; i < TS * TV * d; i++)
        tab[i] = rng_uniform(&rs, -0.1f, 0.1f);
    *first = *last = 0.0;
    for (int t = 0; t < steps; t++) {
        for (int i = 0; i < TN; i++) {
            float sc = 0.0f;
            for (int s = 0; s < TS; s++) {
                keys[i][s] = (int)(rng_next(&rs) % TV);
                sc += score[s][keys[i][s]];
                memcpy(E + ((size_t)i * TS + s) * d, tab + ((size_t)s * TV + keys[i][s]) * d,
                       sizeof(float) * d);
            }
            for (int f = 0; f < TF; f++)
                X[i * TF + f] = rng_uniform(&rs, 0.0f, 2.0f);
            y[i] = sc + 0.8f * (X[i * TF] - X[i * TF + 1]) > 0.0f ? 1.0f : 0.0f;
        }
        double loss = 0.0;
        assert_int_equal(model_forward(m, TN, E, X, y, NULL, &loss), 0);
        if (t == 0)
            *first = loss / TN;
        if (t >= steps - 20)
            *last += loss / TN / 20;
        model_zero_grad(m);
        assert_int_equal(model_backward(m, 1.0f / TN, dE), 0);
        assert_int_equal(model_step(m), 0);
        memset(tg, 0, sizeof(float) * TS * TV * d);
        for (int i = 0; i < TN; i++)
            for (int s = 0; s < TS; s++)
                for (int j = 0; j < d; j++)
                    tg[((size_t)s * TV + keys[i][s]) * d + j] += dE[((size_t)i * TS + s) * d + j];
        for (int i = 0; i < TS * TV * d; i++) {
            if (tg[i] == 0.0f)
                continue;
            acc[i] += tg[i] * tg[i];
            tab[i] -= 0.1f * tg[i] / (sqrtf(acc[i]) + 1e-8f);
        }
    }
    free(tab);
    free(acc);
    free(tg);
    free(E);
    free(dE);
    model_destroy(m);
}

/* ---- rank-count invariance ----------------------------------------------------------
 * One call over n rows vs the same rows as two calls of cut and n - cut (two
 * ranks' batches, each a multiple of MODEL_ROW_BLOCK), on models made for the
 * batch sizes the trainer would give them: the probabilities and dE
 * must be bit-identical and the dense gradients, rounded to float32 as the
 * optimizer reads them, too. Plain float32 BLAS over the whole batch fails
 * this (docs/models.md, "Rank-count invariance"). The shapes are big enough
 * for the threaded and DGEMM paths and have a padded last block. */
static void split_check(const shape_t *sh, int n, int cut, int max_a, int max_b)
{
    const int S = sh->S, F = sh->F, d = sh->d;
    model_t *a = make_model(sh, max_a, 5, sgd(0.1f));
    model_t *b = make_model(sh, max_b, 5, sgd(0.1f));
    size_t ne = (size_t)n * S * d, np = model_nparams(a);
    float *E = malloc(ne * sizeof(float)), *X = malloc((size_t)n * F * sizeof(float));
    float *y = malloc(n * sizeof(float)), *pa = malloc(n * sizeof(float)), *pb = malloc(n * sizeof(float));
    float *dEa = malloc(ne * sizeof(float)), *dEb = malloc(ne * sizeof(float));
    assert_true(E && X && y && pa && pb && dEa && dEb);
    uint64_t r = 77;
    for (size_t i = 0; i < ne; i++)
        E[i] = rng_uniform(&r, -0.5f, 0.5f);
    for (size_t i = 0; i < (size_t)n * F; i++)
        X[i] = rng_uniform(&r, 0.0f, 3.0f);
    for (int i = 0; i < n; i++)
        y[i] = rng_uniform(&r, 0.0f, 1.0f) < 0.3f ? 1.0f : 0.0f;
    const float scale = 1.0f / (float)n;
    assert_int_equal(model_forward(a, n, E, X, y, pa, NULL), 0);
    assert_int_equal(model_backward(a, scale, dEa), 0);
    const size_t rowE = (size_t)S * d;
    assert_int_equal(model_forward(b, cut, E, X, y, pb, NULL), 0);
    assert_int_equal(model_backward(b, scale, dEb), 0);
    assert_int_equal(model_forward(b, n - cut, E + cut * rowE, X + (size_t)cut * F, y + cut,
                                      pb + cut, NULL), 0);
    assert_int_equal(model_backward(b, scale, dEb + cut * rowE), 0);
    assert_memory_equal(pa, pb, n * sizeof(float));
    assert_memory_equal(dEa, dEb, ne * sizeof(float));
    const double *ga = model_grads(a), *gb = model_grads(b);
    const double *la = model_grads_lo(a), *lb = model_grads_lo(b);
    size_t differ = 0;
    for (size_t i = 0; i < np; i++)
        differ += (float)(ga[i] + la[i]) != (float)(gb[i] + lb[i]);
    assert_int_equal(differ, 0);
    free(E), free(X), free(y), free(pa), free(pb), free(dEa), free(dEb);
    model_destroy(a);
    model_destroy(b);
}

static void test_split_invariance(void **state)
{
    (void)state;
    shape_t lr = {.type = MODEL_LR, .S = 26, .F = 13, .d = 1};
    shape_t fm = {.type = MODEL_FM, .S = 26, .F = 13, .d = 17, .fm_dense = 1};
    shape_t dl = dlrm(8, 13, 8, (const int[]){64, 8, 0}, (const int[]){128, 64, 1, 0});
    /* float64 weight gradients (batch sizes not multiples of 256) */
    split_check(&lr, 240, 80, 240, 160);
    split_check(&fm, 240, 80, 240, 160);
    split_check(&dl, 240, 80, 240, 160);
    /* 256-row float32 blocks: 512 = 256 + 256, and a short last batch of
     * 368 = one whole block on the first "rank" + 112 rows in float64 */
    split_check(&fm, 512, 256, 512, 256);
    split_check(&dl, 512, 256, 512, 256);
    split_check(&dl, 368, 256, 512, 256);
}

/* ---- bf16 dense layers ---------------------------------------------------------------- */

static shape_t bf16(shape_t sh)
{
    sh.precision = MODEL_DENSE_BF16;
    return sh;
}

static bool cpu_has_bf16(void)
{
    model_cpu_t cpu;
    model_cpu_detect(&cpu);
    return model_bf16_check(&cpu) == 0;
}

/* Worst |got - ref| / (2^-6 sum |a_k b_k| + 1e-30) over the outputs, where
 * mag holds the sums of term magnitudes: bf16 rounds each operand to 8
 * significant bits (relative error <= 2^-8 each, so about 2^-7 a product),
 * the float32 sum adds K 2^-24 at most; 2^-6 leaves a factor of 2. */
static double worst_bf16(const float *got, int ldg, const double *ref, const double *mag, int rows,
                         int cols)
{
    double worst = 0.0;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            const size_t k = (size_t)i * (size_t)cols + (size_t)j;
            const double e = fabs((double)got[(size_t)i * (size_t)ldg + (size_t)j] - ref[k]) /
                             (ldexp(mag[k], -6) + 1e-30);
            worst = e > worst ? e : worst;
        }
    return worst;
}

/* C (rows, cols) = sum over K of a(i, k) b(k, j), with the magnitudes. */
static void ref_gemm(int rows, int cols, int K, const float *a, size_t ai, size_t ak,
                     const float *b, size_t bk, size_t bj, double *C, double *mag)
{
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            double s = 0.0, g = 0.0;
            for (int k = 0; k < K; k++) {
                const double t = (double)a[i * ai + k * ak] * (double)b[k * bk + j * bj];
                s += t;
                g += fabs(t);
            }
            C[(size_t)i * cols + j] = s;
            mag[(size_t)i * cols + j] = g;
        }
}

/* Each layer of dlrm's default shape (Criteo: bottom 13-64-16, top
 * 367-256-128-1) through the bf16 layer: Y = A W^T (before bias and ReLU:
 * the bias is zeroed and the check reads the pre-ReLU part where positive),
 * dA = dY W, dW = dY^T A, each element within bf16's bound of a float64
 * reference. n = 512 runs the 256-row weight-gradient blocks, n = 300 a
 * padded last block and float64 leftover rows. That bf16 really ran: some
 * element must be off by more than float32 could be. */
static void test_bf16_layers(void **state)
{
    (void)state;
    if (!cpu_has_bf16())
        skip();
    const shape_t sh =
        bf16(dlrm(26, 13, 16, (const int[]){64, 16, 0}, (const int[]){256, 128, 1, 0}));
    model_t *m = make_model(&sh, 512, 3, sgd(0.1f));
    const size_t big = 512 * 400;
    float *A = malloc(big * sizeof(float)), *dY = malloc(big * sizeof(float));
    float *Y = malloc(big * sizeof(float)), *dA = malloc(big * sizeof(float));
    double *ref = malloc(big * sizeof(double)), *mag = malloc(big * sizeof(double));
    assert_true(A && dY && Y && dA && ref && mag);
    uint64_t r = 11;
    for (size_t i = 0; i < big; i++) {
        A[i] = rng_uniform(&r, 0.0f, 2.0f);
        dY[i] = rng_uniform(&r, -1.0f, 1.0f);
    }
    float *p = model_params(m);
    double beyond_fp32 = 0.0;
    const int ns[2] = {512, 300};
    for (int l = 0; l < m->nbottom + m->ntop; l++) {
        const model_layer_t *L = &m->layers[l];
        const int in = L->in, out = L->out;
        const int ldy = l == m->nbottom - 1 ? m->ldr : out;
        memset(p + L->b_off, 0, (size_t)out * sizeof(float));
        for (int c = 0; c < 2; c++) {
            const int n = ns[c];
            char what[64];
            /* forward: the relu layers keep only positive outputs; compare
             * where the reference is clearly positive or the layer is linear */
            m->bf_stale = 1;
            model_bf16_sync_weights(m);
            model_dense_linear_fwd(m, n, L, A, in, Y, ldy);
            ref_gemm(n, out, in, A, (size_t)in, 1, p + L->w_off, 1, (size_t)in, ref, mag);
            for (size_t k = 0; L->relu && k < (size_t)n * out; k++)
                if (ref[k] < 0.0) {
                    ref[k] = 0.0; /* ReLU: 0 where the reference is negative, ... */
                    if (Y[(k / out) * ldy + k % out] > 0.0f)
                        ref[k] = Y[(k / out) * ldy + k % out]; /* ... or nearly 0 */
                }
            double w = worst_bf16(Y, ldy, ref, mag, n, out);
            snprintf(what, sizeof what, "layer %d (%d-%d) forward, n %d", l, in, out, n);
            printf("# bf16 %s: worst error %.3f of the bound\n", what, w);
            assert_true(w <= 1.0);
            /* backward */
            model_zero_grad(m);
            model_dense_linear_bwd(m, n, L, A, in, dY, out, l > 0 ? dA : NULL, in);
            if (l > 0) {
                ref_gemm(n, in, out, dY, (size_t)out, 1, p + L->w_off, (size_t)in, 1, ref, mag);
                w = worst_bf16(dA, in, ref, mag, n, in);
                printf("# bf16 layer %d input gradient, n %d: %.3f of the bound\n", l, n, w);
                assert_true(w <= 1.0);
                beyond_fp32 = fmax(beyond_fp32, w);
            }
            ref_gemm(out, in, n, dY, 1, (size_t)out, A, (size_t)in, 1, ref, mag);
            float *dW = Y; /* the float64 gradient, as the optimizer reads it */
            for (size_t k = 0; k < (size_t)out * in; k++)
                dW[k] = (float)(m->grads[L->w_off + k] + m->grads_lo[L->w_off + k]);
            w = worst_bf16(dW, in, ref, mag, out, in);
            printf("# bf16 layer %d weight gradient, n %d: %.3f of the bound\n", l, n, w);
            assert_true(w <= 1.0);
            beyond_fp32 = fmax(beyond_fp32, w);
        }
    }
    /* float32 would stay near 2^-24 K / 2^-6 of the bound: under 0.01 */
    assert_true(beyond_fp32 > 0.05);
    free(A), free(dY), free(Y), free(dA), free(ref), free(mag);
    model_destroy(m);
}

/* bf16 keeps rank-count invariance: the same rows split over two "ranks"
 * give the same probabilities, dE and gradients bit for bit. */
static void test_bf16_split_invariance(void **state)
{
    (void)state;
    if (!cpu_has_bf16())
        skip();
    const shape_t dl = bf16(dlrm(8, 13, 8, (const int[]){64, 8, 0}, (const int[]){128, 64, 1, 0}));
    split_check(&dl, 240, 80, 240, 160);
    split_check(&dl, 512, 256, 512, 256);
    split_check(&dl, 368, 256, 512, 256);
}

/* bf16 is refused, saying what is missing and what to do: on a CPU without
 * AVX512_BF16 or AMX-BF16 (an injected Skylake-SP), and for lr and fm. */
static void test_bf16_refused(void **state)
{
    (void)state;
    model_cpu_t skx = {.family = 6, .model = 85, .avx = true, .fma = true, .avx2 = true,
                       .avx512f = true, .avx512bw = true, .avx512vl = true, .avx512dq = true};
    assert_int_equal(model_bf16_check(&skx), KILN_EINVAL);
    printf("# %s\n", kiln_errmsg());
    assert_non_null(strstr(kiln_errmsg(), "AVX512_BF16 or AMX-BF16"));
    assert_non_null(strstr(kiln_errmsg(), "family 6 model 85"));
    assert_non_null(strstr(kiln_errmsg(), "model.dense_precision: fp32"));
    model_cpu_t spr = skx, cpx = skx;
    spr.amx_bf16 = true;
    cpx.avx512_bf16 = true;
    assert_int_equal(model_bf16_check(&spr), 0);
    assert_int_equal(model_bf16_check(&cpx), 0);
    model_t *m = NULL;
    shape_t lr = {.type = MODEL_LR, .S = 3, .F = 2, .d = 1, .precision = MODEL_DENSE_BF16};
    model_config_t c = make_cfg(&lr, 8, 1, sgd(0.1f));
    assert_int_equal(model_create(&c, &m), KILN_EINVAL);
    assert_null(m);
    assert_non_null(strstr(kiln_errmsg(), "lr: model.dense_precision: bf16"));
    assert_non_null(strstr(kiln_errmsg(), "use fp32"));
}

static void test_trains(void **state)
{
    (void)state;
    const shape_t shapes[] = {
        {.type = MODEL_LR, .S = TS, .F = TF, .d = 1},
        {.type = MODEL_FM, .S = TS, .F = TF, .d = 5, .fm_dense = 1},
        dlrm(TS, TF, 4, (const int[]){8, 4, 0}, (const int[]){16, 1, 0}),
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double first, last;
        train_synthetic(&shapes[i], 200, &first, &last);
        printf("# %s: mean loss %.4f at the first step, %.4f over the last 20\n",
               model_type_name(shapes[i].type), first, last);
        assert_true(first > 0.6);
        assert_true(last < 0.5 * first);
    }
}

/* ---- metrics ------------------------------------------------------------------------------ */
static double auc_brute(const float *s, const float *l, size_t n)
{
    double num = 0.0, pairs = 0.0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            if (l[i] > 0.5f && l[j] <= 0.5f) {
                pairs += 1.0;
                num += s[i] > s[j] ? 1.0 : s[i] == s[j] ? 0.5 : 0.0;
            }
    return num / pairs;
}

static void test_auc(void **state)
{
    (void)state;
    double auc = -1.0;
    const float l4[4] = {0, 0, 1, 1};
    const float perfect[4] = {0.1f, 0.2f, 0.8f, 0.9f}, reversed[4] = {0.9f, 0.8f, 0.2f, 0.1f};
    assert_int_equal(model_metrics_auc(perfect, l4, 4, &auc), 0);
    assert_float_equal(auc, 1.0, 1e-12);
    assert_int_equal(model_metrics_auc(reversed, l4, 4, &auc), 0);
    assert_float_equal(auc, 0.0, 1e-12);
    /* scikit-learn's roc_auc_score docstring example: 0.75. */
    const float sk[4] = {0.1f, 0.4f, 0.35f, 0.8f};
    assert_int_equal(model_metrics_auc(sk, l4, 4, &auc), 0);
    assert_float_equal(auc, 0.75, 1e-12);
    /* A positive tied with a negative counts one half: (0.5 + 1 + 1 + 1) / 4. */
    const float ts[4] = {0.5f, 0.5f, 0.2f, 0.8f}, tl[4] = {1, 0, 0, 1};
    assert_int_equal(model_metrics_auc(ts, tl, 4, &auc), 0);
    assert_float_equal(auc, 0.875, 1e-12);
    const float same[4] = {0.3f, 0.3f, 0.3f, 0.3f};
    assert_int_equal(model_metrics_auc(same, l4, 4, &auc), 0);
    assert_float_equal(auc, 0.5, 1e-12);
    const float ones[3] = {1, 1, 1};
    assert_int_equal(model_metrics_auc(perfect, ones, 3, &auc), 0);
    assert_true(isnan(auc));

    /* Against all pairs, with many ties (scores on 12 levels). */
    enum { N = 600 };
    float s[N], l[N];
    uint64_t rs = 5;
    for (int i = 0; i < N; i++) {
        l[i] = rng_next(&rs) % 3 == 0 ? 1.0f : 0.0f;
        s[i] = (float)(rng_next(&rs) % 12) / 12.0f + 0.05f * l[i] * (float)(i % 2);
    }
    assert_int_equal(model_metrics_auc(s, l, N, &auc), 0);
    assert_float_equal(auc, auc_brute(s, l, N), 1e-12);

    /* logloss: -(log 0.8 + log 0.6) / 2, and clamping keeps p = 0 finite. */
    const float pr[2] = {0.8f, 0.4f}, lb[2] = {1, 0};
    assert_float_equal(model_metrics_logloss(pr, lb, 2), -(log(0.8) + log(0.6)) / 2, 1e-6);
    const float zero[1] = {0.0f}, one[1] = {1.0f};
    assert_float_equal(model_metrics_logloss(zero, one, 1), -log(1e-7), 1e-6);
}

/* Which OpenBLAS kernels kiln-train asks for (model_kernels_decide): the
 * library's generic pick on a newer CPU is replaced by the CPU's own; a core
 * type the user set, a second pass and a name Kiln does not know are kept. */
static void test_kernels_decide(void **state)
{
    (void)state;
    model_cpu_t emerald = {.family = 6, .model = 207, .avx = true, .fma = true, .avx2 = true,
                           .avx512f = true, .avx512bw = true, .avx512vl = true,
                           .avx512dq = true, .avx512_bf16 = true};
    model_cpu_t skx = emerald, hsw = {.avx = true, .fma = true, .avx2 = true}, old = {0};
    skx.avx512_bf16 = false;
    assert_string_equal(model_kernels_decide("Prescott", &emerald, NULL, NULL), "Cooperlake");
    assert_string_equal(model_kernels_decide("Prescott", &skx, "", NULL), "SkylakeX");
    assert_string_equal(model_kernels_decide("Haswell", &skx, NULL, NULL), "SkylakeX");
    assert_string_equal(model_kernels_decide("Core2", &hsw, NULL, NULL), "Haswell");
    assert_null(model_kernels_decide("Haswell", &hsw, NULL, NULL));      /* already the best */
    assert_null(model_kernels_decide("cooperlake", &emerald, NULL, NULL));
    assert_null(model_kernels_decide("Prescott", &emerald, "Prescott", NULL)); /* the user's */
    assert_null(model_kernels_decide("Prescott", &emerald, NULL, "Prescott")); /* once only */
    assert_null(model_kernels_decide("SapphireRapids2", &emerald, NULL, NULL)); /* unknown */
    assert_null(model_kernels_decide("Prescott", &old, NULL, NULL));    /* nothing better */
    /* This machine's own kernels pass the check at dlrm's default shapes. */
    const model_gemm_shape_t sh[] = {{"fwd", 256, 64, 13, false, true, false},
                                     {"grad", 256, 367, 256, true, false, false},
                                     {"grad64", 128, 256, 256, true, false, true}};
    assert_int_equal(model_kernels_check(sh, 3), 0);
}

PROC_TEST_MAIN_EACH(NULL, NULL, NULL, NULL,
    test_grad_lr, test_grad_fm, test_grad_dlrm, test_layout, test_loss_known, test_loss_stable,
    test_optimizers, test_init_deterministic, test_state_roundtrip, test_config_errors, test_trains,
    test_split_invariance, test_auc, test_kernels_decide, test_bf16_layers,
    test_bf16_split_invariance, test_bf16_refused)
