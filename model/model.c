/*
 * model/model.c - the model object shared by lr, fm and dlrm: config
 * checks, the flat parameter layout, deterministic initialisation, the
 * workspaces, forward/backward around the per-type halves (model_lr.c,
 * model_fm.c, model_dlrm.c), the stable logistic loss, and checkpoint state.
 */
#define MODEL_IMPL
#include "model.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>



/* ---- initialisation ------------------------------------------------------------
 * A counter-based generator: the value of parameter idx depends only on
 * (seed, idx), so every rank, thread count and build starts identical. */
static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Uniform in [-1, 1) from the top 24 bits, exact in float. */
static float uniform_pm1(uint64_t seed, uint64_t idx)
{
    uint64_t h = mix64(mix64(seed) ^ idx);
    return (float)(h >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

/* Xavier/Glorot uniform: U(-sqrt(6 / (fan_in + fan_out)), +...). */
static void init_xavier(model_t *m, size_t off, int fan_out, int fan_in)
{
    float lim = sqrtf(6.0f / (float)(fan_in + fan_out));
    size_t cnt = (size_t)fan_out * (size_t)fan_in;
    for (size_t i = 0; i < cnt; i++)
        m->params[off + i] = lim * uniform_pm1(m->seed, off + i);
}

/* ---- layout -------------------------------------------------------------------- */
static size_t add_group(model_t *m, const char *name, int rows, int cols)
{
    model_group_t *g = &m->groups[m->ngroups++];
    snprintf(g->name, sizeof g->name, "%s", name);
    g->offset = m->nparams;
    g->rows = rows;
    g->cols = cols;
    m->nparams += (size_t)rows * (size_t)cols;
    return g->offset;
}

static size_t add_layer(model_t *m, int li, const char *part, int idx, int in, int out, int relu)
{
    char name[32];
    model_layer_t *L = &m->layers[li];
    L->in = in;
    L->out = out;
    L->relu = relu;
    snprintf(name, sizeof name, "%s.%d.weight", part, idx);
    L->w_off = add_group(m, name, out, in);
    snprintf(name, sizeof name, "%s.%d.bias", part, idx);
    L->b_off = add_group(m, name, out, 1);
    return (size_t)out;
}

static int check_widths(const char *what, const int *w, int n)
{
    if (n < 1 || n > MODEL_MAX_LAYERS || !w)
        return kiln_errf(KILN_EINVAL, "dlrm: model.%s needs 1 to %d layer widths, got %d", what,
                         MODEL_MAX_LAYERS, n);
    for (int i = 0; i < n; i++)
        if (w[i] < 1 || w[i] > (1 << 20))
            return kiln_errf(KILN_EINVAL, "dlrm: model.%s[%d] = %d is not a width in 1..%d", what,
                             i, w[i], 1 << 20);
    return 0;
}

static int check_config(const model_config_t *c)
{
    if (c->type != MODEL_LR && c->type != MODEL_FM && c->type != MODEL_DLRM)
        return kiln_errf(KILN_EINVAL, "unknown model type %d (lr, fm or dlrm)", (int)c->type);
    const char *t = model_type_name(c->type);
    if (c->nslots < 0 || c->nslots > 4096)
        return kiln_errf(KILN_EINVAL, "%s: %d categorical slots, expected 0..4096", t, c->nslots);
    if (c->ndense < 0 || c->ndense > 65536)
        return kiln_errf(KILN_EINVAL, "%s: %d dense features, expected 0..65536", t, c->ndense);
    if (c->dim < 1 || c->dim > 65536)
        return kiln_errf(KILN_EINVAL, "%s: embedding width %d, expected 1..65536", t, c->dim);
    if (c->type == MODEL_LR && c->dim != 1)
        return kiln_errf(KILN_EINVAL,
                         "lr: pooled vectors must have width 1 (the per-key weight), got %d; "
                         "size the tables with model_table_dim",
                         c->dim);
    if (c->max_batch < 1 || c->max_batch > (1 << 24))
        return kiln_errf(KILN_EINVAL, "%s: max_batch %d, expected 1..%d", t, c->max_batch, 1 << 24);
    if (c->type == MODEL_DLRM) {
        KILN_CHECK(check_widths("bottom_mlp", c->bottom, c->nbottom));
        KILN_CHECK(check_widths("top_mlp", c->top, c->ntop));
        if (c->ndense < 1)
            return kiln_errf(KILN_EINVAL, "dlrm: the bottom MLP needs dense features, got 0");
        if (c->bottom[c->nbottom - 1] != c->dim)
            return kiln_errf(KILN_EINVAL,
                             "dlrm: the last bottom_mlp width (%d) must equal the embedding "
                             "dim (%d), since its output joins the pairwise interactions",
                             c->bottom[c->nbottom - 1], c->dim);
        if (c->top[c->ntop - 1] != 1)
            return kiln_errf(KILN_EINVAL,
                             "dlrm: the last top_mlp width must be 1 (the logit), got %d",
                             c->top[c->ntop - 1]);
    }
    if (c->precision != MODEL_DENSE_FP32 && c->precision != MODEL_DENSE_BF16)
        return kiln_errf(KILN_EINVAL, "unknown dense precision %d (fp32 or bf16)",
                         (int)c->precision);
    if (c->precision == MODEL_DENSE_BF16 && c->type != MODEL_DLRM)
        return kiln_errf(KILN_EINVAL,
                         "%s: model.dense_precision: bf16 applies to dlrm's MLP layers, and %s "
                         "has none (its dense math is a dot product per row); use fp32",
                         t, t);
    if (c->precision == MODEL_DENSE_BF16)
        KILN_CHECK(model_bf16_check_here());
    const model_dense_opt_t *o = &c->opt;
    if (o->type != KERN_OPT_SGD && o->type != KERN_OPT_ADAGRAD && o->type != KERN_OPT_ADAM)
        return kiln_errf(KILN_EINVAL, "unknown dense optimizer %d (sgd, adagrad or adam)",
                         (int)o->type);
    if (!(o->lr >= 0.0f) || !isfinite(o->lr))
        return kiln_errf(KILN_EINVAL, "dense optimizer: lr must be >= 0, got %g", o->lr);
    if (!(o->weight_decay >= 0.0f))
        return kiln_errf(KILN_EINVAL, "dense optimizer: weight_decay must be >= 0, got %g",
                         o->weight_decay);
    if (o->type != KERN_OPT_SGD && !(o->eps >= 0.0f))
        return kiln_errf(KILN_EINVAL, "dense optimizer: eps must be >= 0, got %g", o->eps);
    if (o->type == KERN_OPT_ADAGRAD && !(o->initial_accumulator >= 0.0f))
        return kiln_errf(KILN_EINVAL, "dense optimizer: initial_accumulator must be >= 0, got %g",
                         o->initial_accumulator);
    if (o->type == KERN_OPT_ADAM &&
        !(o->beta1 >= 0.0f && o->beta1 < 1.0f && o->beta2 >= 0.0f && o->beta2 < 1.0f))
        return kiln_errf(KILN_EINVAL,
                         "dense optimizer: adam betas must be in [0, 1), got %g and %g", o->beta1,
                         o->beta2);
    return 0;
}

/* Lays out the parameters (nparams, groups, layers) without allocating. */
static void layout(model_t *m, const model_config_t *c)
{
    if (m->type == MODEL_LR || m->type == MODEL_FM) {
        m->w_off = m->F > 0 ? add_group(m, "w", 1, m->F) : 0;
        m->b_off = add_group(m, "b", 1, 1);
        if (m->fm_dense)
            m->vx_off = add_group(m, "vx", m->k, m->F);
        return;
    }
    int in = m->F;
    for (int l = 0; l < c->nbottom; l++)
        in = (int)add_layer(m, l, "bottom", l, in, c->bottom[l], 1);
    in = m->ldr;
    for (int l = 0; l < c->ntop; l++)
        in = (int)add_layer(m, c->nbottom + l, "top", l, in, c->top[l], l + 1 < c->ntop);
}

/* U(-1/sqrt(fan_in), +1/sqrt(fan_in)) over cnt values: PyTorch's nn.Linear
 * default for weights (kaiming_uniform_ with a = sqrt(5)) and biases. */
static void init_fan_in(model_t *m, size_t off, size_t cnt, int fan_in)
{
    float lim = 1.0f / sqrtf((float)fan_in);
    for (size_t i = 0; i < cnt; i++)
        m->params[off + i] = lim * uniform_pm1(m->seed, off + i);
}

/* dlrm's layers start as PyTorch's nn.Linear does (weights and biases
 * U(+-1/sqrt(fan_in))): with Xavier weights and zero biases Kiln's dlrm
 * trained 0.013 logloss worse than a stock PyTorch DLRM on data neither was
 * developed on, and varied more by seed (docs/models.md, "Initialisation";
 * bench/quality_vs_torch.py --defaults own --data teacher). */
static void init_params(model_t *m)
{
    memset(m->params, 0, m->nparams * sizeof(float));
    if (m->type == MODEL_FM && m->fm_dense)
        init_xavier(m, m->vx_off, m->k, m->F);
    if (m->type == MODEL_DLRM)
        for (int l = 0; l < m->nbottom + m->ntop; l++) {
            const model_layer_t *L = &m->layers[l];
            init_fan_in(m, L->w_off, (size_t)L->out * (size_t)L->in, L->in);
            init_fan_in(m, L->b_off, (size_t)L->out, L->in);
        }
}

static void reset_opt_state(model_t *m)
{
    m->opt_t = 0;
    if (m->opt.type == KERN_OPT_ADAGRAD)
        for (size_t i = 0; i < m->nparams; i++)
            m->opt_a[i] = m->opt.initial_accumulator;
    if (m->opt.type == KERN_OPT_ADAM) {
        memset(m->opt_a, 0, m->nparams * sizeof(float));
        memset(m->opt_b, 0, m->nparams * sizeof(float));
    }
}

static float *alloc_f(size_t count)
{
    return kiln_calloc(count ? count : 1, sizeof(float));
}

int model_create(const model_config_t *cfg, model_t **out /* OUT */)
{
    int rc = 0;
    model_t *m = NULL;
    *out = NULL;
    KILN_CHECK(check_config(cfg));
    /* The models split their GEMMs over OpenMP threads themselves
     * (model_dlrm.c); OpenBLAS's own thread pool would compete with them. */
    openblas_set_num_threads(1);
    m = kiln_calloc(1, sizeof *m);
    if (!m)
        return KILN_ENOMEM;
    m->type = cfg->type;
    m->S = cfg->nslots;
    m->F = cfg->ndense;
    m->d = cfg->dim;
    m->k = cfg->type == MODEL_FM ? cfg->dim - 1 : 0;
    m->fm_dense = cfg->type == MODEL_FM && cfg->fm_dense_factors && m->k > 0 && m->F > 0;
    m->max_batch = cfg->max_batch;
    m->seed = cfg->seed;
    m->opt = cfg->opt;
    m->precision = cfg->precision;
    if (m->type == MODEL_DLRM) {
        m->nbottom = cfg->nbottom;
        m->ntop = cfg->ntop;
        m->P = m->S * (m->S + 1) / 2;
        m->ldr = m->d + m->P;
    }
    layout(m, cfg);

    size_t B = (size_t)m->max_batch;
    m->params = alloc_f(m->nparams);
    m->grads = kiln_calloc(m->nparams ? m->nparams : 1, sizeof(double));
    m->grads_lo = kiln_calloc(m->nparams ? m->nparams : 1, sizeof(double));
    m->logits = alloc_f(B);
    m->probs = alloc_f(B);
    m->gz = alloc_f(B);
    m->loss = kiln_calloc(B ? B : 1, sizeof(double));
    if (!m->params || !m->grads || !m->grads_lo || !m->logits || !m->probs || !m->gz || !m->loss)
        goto nomem;
    if (m->opt.type != KERN_OPT_SGD && !(m->opt_a = alloc_f(m->nparams)))
        goto nomem;
    if (m->opt.type == KERN_OPT_ADAM && !(m->opt_b = alloc_f(m->nparams)))
        goto nomem;

    if (m->type == MODEL_FM && m->k > 0) {
        if (!(m->fm_sum = alloc_f(B * (size_t)m->k)) || !(m->fm_u = alloc_f(B * (size_t)m->k)))
            goto nomem;
    }
    if (m->type == MODEL_DLRM) {
        int nl = m->nbottom + m->ntop;
        m->maxw = m->ldr > m->F ? m->ldr : m->F;
        for (int l = 0; l < nl; l++)
            if (m->layers[l].out > m->maxw)
                m->maxw = m->layers[l].out;
        if (!(m->R = alloc_f(B * (size_t)m->ldr)) ||
            !(m->gbuf[0] = alloc_f(B * (size_t)m->maxw)) ||
            !(m->gbuf[1] = alloc_f(B * (size_t)m->maxw)))
            goto nomem;
        /* The last bottom layer writes into R, the last top layer into logits. */
        for (int l = 0; l < nl; l++) {
            if (l == m->nbottom - 1)
                m->act[l] = m->R;
            else if (l == nl - 1)
                m->act[l] = m->logits;
            else if (!(m->act[l] = alloc_f(B * (size_t)m->layers[l].out)))
                goto nomem;
        }
    }
    /* model_grad_gemm's float64 operand copies: as wide as any operand. */
    m->maxc = m->F > m->k ? m->F : m->k;
    if (m->maxw > m->maxc)
        m->maxc = m->maxw;
    if (m->maxc < 1)
        m->maxc = 1;
    /* Batches that are multiples of 256 rows per rank run the per-row GEMMs
     * in 256-row calls and the weight gradients in 256-row float32 blocks;
     * others in 16-row calls and float64 (model_blas.c). */
    m->row_block = m->max_batch % MODEL_GRAD_BLOCK == 0 ? MODEL_GRAD_BLOCK : MODEL_ROW_BLOCK;
    /* The per-thread buffers (m->wgT): model_grad_gemm's float32 product, dlrm's tiles. */
    m->wgT_cap = 1;
    if (m->type == MODEL_DLRM)
        for (int l = 0; l < m->nbottom + m->ntop; l++)
            if ((size_t)m->layers[l].out * (size_t)m->layers[l].in > m->wgT_cap)
                m->wgT_cap = (size_t)m->layers[l].out * (size_t)m->layers[l].in;
    if ((size_t)m->k * (size_t)m->F > m->wgT_cap)
        m->wgT_cap = (size_t)m->k * (size_t)m->F;
    if ((size_t)m->F > m->wgT_cap)
        m->wgT_cap = (size_t)m->F;
    m->wgT_n = omp_get_max_threads() > 0 ? omp_get_max_threads() : 1;
    if (!(m->wgT = kiln_calloc((size_t)m->wgT_n, sizeof *m->wgT)))
        goto nomem;
    const size_t tiles = m->type == MODEL_DLRM ? model_dlrm_scratch(m->S, m->d) : 0;
    const size_t tbuf = tiles > m->wgT_cap ? tiles : m->wgT_cap;
    for (int t = 0; t < m->wgT_n; t++)
        if (!(m->wgT[t] = alloc_f(tbuf)))
            goto nomem;
    /* model_grad_gemm's 256-row path: the threads but the first sum their
     * blocks into their own double-double buffer (m->wgP). */
    if (m->row_block == MODEL_GRAD_BLOCK && m->wgT_n > 1) {
        if (!(m->wgP = kiln_calloc((size_t)m->wgT_n, sizeof *m->wgP)))
            goto nomem;
        for (int t = 0; t < m->wgT_n; t++)
            if (!(m->wgP[t] = kiln_calloc(2 * m->wgT_cap + 2 * (size_t)m->maxc, sizeof(double))))
                goto nomem;
    }
    if (!(m->wgA = kiln_malloc(B * (size_t)m->maxc * sizeof(double))) ||
        !(m->wgB = kiln_malloc(B * (size_t)m->maxc * sizeof(double))) ||
        !(m->tailA = alloc_f((size_t)m->row_block * (size_t)m->maxc)) ||
        !(m->tailC = alloc_f((size_t)m->row_block * (size_t)m->maxc)))
        goto nomem;
    if (m->precision == MODEL_DENSE_BF16 && (rc = model_bf16_create(m)) < 0)
        goto fail;
    init_params(m);
    reset_opt_state(m);
    m->bf_stale = 1;
    *out = m;
    return 0;
nomem:
    rc = kiln_errf(KILN_ENOMEM,
                   "%s model: out of memory for %zu dense parameters and workspaces for "
                   "%d rows; lower train.batch_size",
                   model_type_name(cfg->type), m->nparams, cfg->max_batch);
fail:
    model_destroy(m);
    return rc;
}

void model_destroy(model_t *m)
{
    if (!m)
        return;
    int nl = m->nbottom + m->ntop;
    model_bf16_destroy(m);
    for (int l = 0; l < nl; l++)
        if (m->act[l] != m->R && m->act[l] != m->logits)
            free(m->act[l]);
    KILN_FREE_ALL(m->params, m->grads, m->grads_lo, m->opt_a, m->opt_b, m->wgA, m->wgB, m->tailA,
                  m->tailC);
    for (int t = 0; m->wgT && t < m->wgT_n; t++)
        free(m->wgT[t]);
    for (int t = 0; m->wgP && t < m->wgT_n; t++)
        free(m->wgP[t]);
    free(m->wgP);
    KILN_FREE_ALL(m->wgT, m->logits, m->probs, m->gz, m->loss, m->fm_sum, m->fm_u, m->R,
                  m->gbuf[0], m->gbuf[1]);
    free(m);
}

/* ---- accessors ------------------------------------------------------------------ */
size_t model_nparams(const model_t *m)
{
    return m->nparams;
}
float *model_params(model_t *m)
{
    m->bf_stale = 1; /* the caller may write: the bf16 copy is made again */
    return m->params;
}
const float *model_params_read(const model_t *m)
{
    return m->params;
}
double *model_grads(model_t *m)
{
    return m->grads;
}

double *model_grads_lo(model_t *m)
{
    return m->grads_lo;
}
int model_ngroups(const model_t *m)
{
    return m->ngroups;
}
model_info_t model_info(const model_t *m)
{
    return (model_info_t){.type = m->type,
                          .precision = m->precision,
                          .nslots = m->S,
                          .ndense = m->F,
                          .dim = m->d,
                          .max_batch = m->max_batch};
}

const model_group_t *model_group(const model_t *m, int i)
{
    return i >= 0 && i < m->ngroups ? &m->groups[i] : NULL;
}

void model_zero_grad(model_t *m)
{
    memset(m->grads, 0, m->nparams * sizeof(double));
    memset(m->grads_lo, 0, m->nparams * sizeof(double));
}

/* ---- loss ------------------------------------------------------------------------ */
float model_sigmoid(float z)
{
    if (z >= 0.0f)
        return 1.0f / (1.0f + expf(-z));
    float e = expf(z);
    return e / (1.0f + e);
}

double model_logloss(double z, double y)
{
    return (z > 0.0 ? z : 0.0) - z * y + log1p(exp(-fabs(z)));
}

/* ---- forward / backward -------------------------------------------------------------- */
static int check_inputs(const model_t *m, const char *fn, int n, const float *E, const float *X)
{
    if (n < 0 || n > m->max_batch)
        return kiln_errf(KILN_EINVAL, "%s: %d rows, expected 0..%d (the model's max_batch)", fn, n,
                         m->max_batch);
    if (n > 0 && ((m->S > 0 && !E) || (m->F > 0 && !X)))
        return kiln_errf(KILN_EINVAL, "%s: missing %s input", fn,
                         m->S > 0 && !E ? "embedding (E)" : "dense feature (X)");
    return 0;
}

static void run_forward(model_t *m, int n, const float *E, const float *X)
{
    if (n == 0)
        return;
    if (m->bf && m->bf_stale)
        model_bf16_sync_weights(m);
    switch (m->type) {
    case MODEL_LR:
        model_lr_forward(m, n, E, X);
        break;
    case MODEL_FM:
        model_fm_forward(m, n, E, X);
        break;
    case MODEL_DLRM:
        model_dlrm_forward(m, n, E, X);
        break;
    }
}

int model_forward(model_t *m, int n, const float *E, const float *X, const float *y,
                     float *probs /* OUT (n), may be NULL */,
                     double *loss_sum /* OUT, may be NULL */)
{
    m->saved = 0;
    KILN_CHECK(check_inputs(m, "model_forward", n, E, X));
    if (loss_sum && n > 0 && !y)
        return kiln_errf(KILN_EINVAL, "model_forward: a loss needs labels (y is NULL)");
    run_forward(m, n, E, X);

    const float *z = m->logits;
    float *p = m->probs;
    double sum = 0.0, *loss = m->loss;
    /* The rows' exp and log1p on the team (on one thread they were 3% of an
     * lr step, the other thread waiting), their sum in row order after it:
     * the same bits on any thread count. */
#pragma omp parallel for schedule(static) if (n >= 512)
    for (int i = 0; i < n; i++) {
        p[i] = model_sigmoid(z[i]);
        if (y)
            loss[i] = model_logloss(z[i], y[i]);
    }
    if (y)
        for (int i = 0; i < n; i++)
            sum += loss[i];
    if (probs && n > 0)
        memcpy(probs, p, (size_t)n * sizeof(float));
    if (loss_sum)
        *loss_sum = sum;
    m->n = n;
    m->E = E;
    m->X = X;
    m->y = y;
    m->saved = y != NULL || n == 0;
    return 0;
}

int model_backward(model_t *m, float loss_scale, float *dE /* OUT (n, S, d) */)
{
    if (!m->saved)
        return kiln_errf(KILN_ESTATE, "model_backward: no forward with labels to differentiate "
                                      "(call model_forward with y first, once per backward)");
    m->saved = 0;
    int n = m->n;
    if (n == 0)
        return 0;
    if (m->S > 0 && !dE)
        return kiln_errf(KILN_EINVAL, "model_backward: dE is NULL");
    const float *p = m->probs, *y = m->y;
    float *gz = m->gz;
    for (int i = 0; i < n; i++)
        gz[i] = (p[i] - y[i]) * loss_scale;
    switch (m->type) {
    case MODEL_LR:
        model_lr_backward(m, n, m->E, m->X, dE);
        break;
    case MODEL_FM:
        model_fm_backward(m, n, m->E, m->X, dE);
        break;
    case MODEL_DLRM:
        model_dlrm_backward(m, n, m->E, m->X, dE);
        break;
    }
    return 0;
}

int model_predict(model_t *m, int n, const float *E, const float *X,
                     float *probs /* OUT (n) */)
{
    m->saved = 0;
    KILN_CHECK(check_inputs(m, "model_predict", n, E, X));
    if (n > 0 && !probs)
        return kiln_errf(KILN_EINVAL, "model_predict: probs is NULL");
    run_forward(m, n, E, X);
    for (int i = 0; i < n; i++)
        probs[i] = model_sigmoid(m->logits[i]);
    return 0;
}

/* ---- checkpoint state ------------------------------------------------------------------ */
void model_state(model_t *m, model_array_t arrays[MODEL_MAX_STATE] /* OUT */,
                    int *narrays /* OUT */, int64_t *step /* OUT */)
{
    int k = 0;
    arrays[k++] = (model_array_t){"dense.params", m->params, m->nparams};
    if (m->opt.type == KERN_OPT_ADAGRAD)
        arrays[k++] = (model_array_t){"dense.adagrad_acc", m->opt_a, m->nparams};
    if (m->opt.type == KERN_OPT_ADAM) {
        arrays[k++] = (model_array_t){"dense.adam_m", m->opt_a, m->nparams};
        arrays[k++] = (model_array_t){"dense.adam_v", m->opt_b, m->nparams};
    }
    *narrays = k;
    *step = m->opt_t;
}

static const model_array_t *find_array(const model_array_t *a, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (a[i].name && strcmp(a[i].name, name) == 0)
            return &a[i];
    return NULL;
}

int model_load_arrays(model_t *m, const model_array_t *arrays, int narrays, int64_t step)
{
    model_array_t mine[MODEL_MAX_STATE];
    int nmine = 0;
    int64_t t = 0;
    model_state(m, mine, &nmine, &t);
    /* Check every size before changing anything. */
    int have_opt = nmine > 1;
    for (int i = 0; i < nmine; i++) {
        const model_array_t *a = find_array(arrays, narrays, mine[i].name);
        if (!a) {
            if (i == 0)
                return kiln_errf(KILN_ENOENT,
                                 "dense state: the checkpoint has no '%s' array; was it "
                                 "written by a Kiln trainer?",
                                 mine[i].name);
            have_opt = 0;
            continue;
        }
        /* An fm checkpoint differs by exactly vx (k, F) when it was
         * written with the other model.fm_dense_factors. */
        size_t vx = (size_t)m->k * (size_t)m->F;
        const char *fm_hint =
            m->type != MODEL_FM || vx == 0 ? ""
            : a->count + vx == mine[i].count ? "; it was written with model.fm_dense_factors: false"
            : a->count == mine[i].count + vx ? "; it was written with model.fm_dense_factors: true"
                                             : "";
        if (a->count != mine[i].count || !a->data)
            return kiln_errf(KILN_ECONFLICT,
                             "dense state: '%s' has %zu floats but this %s model needs %zu; "
                             "the model's shape (slots, dense features, dim, MLP widths) "
                             "differs from the checkpoint's%s",
                             mine[i].name, a->count, model_type_name(m->type), mine[i].count,
                             fm_hint);
    }
    for (int i = 0; i < nmine; i++) {
        const model_array_t *a = find_array(arrays, narrays, mine[i].name);
        if (a && (i == 0 || have_opt) && a->data != mine[i].data)
            memcpy(mine[i].data, a->data, mine[i].count * sizeof(float));
    }
    m->bf_stale = 1;
    if (nmine > 1 && !have_opt) {
        reset_opt_state(m);
        KILN_INFO("dense state: no %s optimizer state in the checkpoint; starting it fresh",
                  m->opt.type == KERN_OPT_ADAM ? "adam" : "adagrad");
    } else {
        m->opt_t = step < 0 ? 0 : step;
    }
    m->saved = 0;
    return 0;
}
