/*
 * model/model_dlrm.c - DLRM (Naumov et al. 2019) on Kiln's pooled inputs,
 * and the BLAS-backed dense layer the models share.
 *
 *   bot (n, d)   = bottom MLP of X (n, F), ReLU after every layer
 *   vectors      = [bot, E[i,0], ..., E[i,S-1]]           (S + 1 of width d)
 *   R (n, d + P) = [bot | <v_a, v_b> for a < b]            P = S (S + 1) / 2
 *   logit (n)    = top MLP of R, ReLU between layers, none after the last
 *
 * The last bottom layer writes straight into R's first d columns, so the top
 * input is built without a copy. The pairwise dot products are a tight
 * per-row loop (docs/models.md has the measurement against per-row BLAS).
 */
#define MODEL_IMPL
#include "model.h"

#include <string.h>

#include "kern_ops.h"

/* ---- the dense layer ------------------------------------------------------------ */
void model_dense_linear_fwd(model_t *m, int n, const model_layer_t *L, const float *A, int lda,
                         float *Y, int ldy)
{
    const int in = L->in, out = L->out, relu = L->relu;
    const float *W = m->params + L->w_off, *b = m->params + L->b_off;
    /* Y (n, out) = A (n, in) W^T (in, out), in fixed row blocks (model_blas.c);
     * bf16: A rounded once, kept for the weight gradient (model_bf16.c) */
    if (m->bf) {
        model_bf16_round_rows(m, n, in, A, lda, L->bf_in);
        model_bf16_fwd(m, n, L, Y, ldy);
    } else {
        model_gemm_rows(m, n, out, in, A, lda, 1, W, in, Y, ldy);
    }
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        float *yi = Y + (size_t)i * (size_t)ldy;
        if (relu) {
#pragma omp simd
            for (int j = 0; j < out; j++) {
                float v = yi[j] + b[j];
                yi[j] = v > 0.0f ? v : 0.0f;
            }
        } else {
#pragma omp simd
            for (int j = 0; j < out; j++)
                yi[j] += b[j];
        }
    }
}

void model_dense_linear_bwd(model_t *m, int n, const model_layer_t *L, const float *A, int lda,
                         const float *dY, int ldy, float *dA, int ldda)
{
    const int in = L->in, out = L->out;
    /* db (out) += the column sums of dY */
    model_grad_colsum(m, n, out, dY, ldy, m->grads + L->b_off);
    if (m->bf) {
        /* dY rounded once, for both products */
        uint16_t *dYb = model_bf16_dy(m);
        model_bf16_round_rows(m, n, out, dY, ldy, dYb);
        model_grad_gemm_bf16(m, n, L, dYb, dY, ldy, A, lda);
        if (dA)
            model_bf16_bwd_input(m, n, L, dYb, dA, ldda);
        return;
    }
    /* dW (out, in) += dY^T (out, n) A (n, in), in float64 (model_blas.c) */
    model_grad_gemm(m, n, out, in, dY, ldy, A, lda, m->grads + L->w_off);
    /* dA (n, in) = dY (n, out) W (out, in), in fixed row blocks */
    if (dA)
        model_gemm_rows(m, n, in, out, dY, ldy, 0, m->params + L->w_off, in, dA, ldda);
}

/* dA *= (act > 0): the ReLU's gradient, act (n, w; lda), dA (n, w; ldd). */
static void relu_mask(int n, int w, const float *act, int lda, float *dA, int ldd)
{
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float *a = act + (size_t)i * (size_t)lda;
        float *g = dA + (size_t)i * (size_t)ldd;
#pragma omp simd
        for (int j = 0; j < w; j++)
            g[j] = a[j] > 0.0f ? g[j] : 0.0f;
    }
}

/* Vector v of a row: v_0 = bot, v_s+1 = the row's slot s. */
static inline const float *vec_of(const float *bot, const float *e, int d, int v)
{
    return v == 0 ? bot : e + (size_t)(v - 1) * (size_t)d;
}

/* The index of pair (x, y), x != y, among the N vectors' pairs in the
 * order (0,1) .. (0,N-1), (1,2) ..: the forward's order of the dots. */
static inline int pair_at(int N, int x, int y)
{
    if (x > y) {
        const int s = x;
        x = y;
        y = s;
    }
    return x * (2 * N - x - 1) / 2 + y - x - 1;
}

static inline float dot(const float *a, const float *b, int d)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < d; j++)
        s += a[j] * b[j];
    return s;
}

static inline void axpy(float c, const float *x, float *y, int d)
{
#pragma omp simd
    for (int j = 0; j < d; j++)
        y[j] += c * x[j];
}

/* ---- forward -------------------------------------------------------------------- */
void model_dlrm_forward(model_t *m, int n, const float *E, const float *X)
{
    const int S = m->S, d = m->d, nb = m->nbottom, nl = m->nbottom + m->ntop;
    const size_t ldr = (size_t)m->ldr, rowE = (size_t)S * (size_t)d;

    const float *A = X;
    int lda = m->F;
    for (int l = 0; l < nb; l++) {
        int ldy = l == nb - 1 ? m->ldr : m->layers[l].out;
        model_dense_linear_fwd(m, n, &m->layers[l], A, lda, m->act[l], ldy);
        A = m->act[l];
        lda = ldy;
    }

    /* R[i, d + p] = <v_a, v_b> for the p-th pair a < b, v_0 = bot, v_s+1 = E[i,s]. */
    float *R = m->R;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float *bot = R + (size_t)i * ldr;
        const float *e = E + (size_t)i * rowE;
        float *dots = R + (size_t)i * ldr + d;
        int p = 0;
        for (int s = 0; s < S; s++)
            dots[p++] = dot(bot, e + (size_t)s * (size_t)d, d);
        for (int a = 0; a < S; a++) {
            const float *va = e + (size_t)a * (size_t)d;
            for (int b = a + 1; b < S; b++)
                dots[p++] = dot(va, e + (size_t)b * (size_t)d, d);
        }
    }

    A = R;
    lda = m->ldr;
    for (int l = nb; l < nl; l++) {
        model_dense_linear_fwd(m, n, &m->layers[l], A, lda, m->act[l], m->layers[l].out);
        A = m->act[l];
        lda = m->layers[l].out;
    }
}

/* ---- backward ------------------------------------------------------------------- */

/* One row's interaction backward: dr (its row of dR: d bot, then the pair
 * gradients gd) -> d bot in place and the row's dE, through dt ((S + 1, d)
 * scratch, so de may alias e). d v_t = the sum over u != t, in ascending
 * order, of g(t, u) v_u (the GPU's order too), kept in a 16-wide register
 * tile while u runs rather than added into dt pair by pair. Every sum is
 * element-wise over the vector's columns, so every vector width gives the
 * same bits (KERN_CLONES). */
KERN_CLONES static void interaction_bwd(int S, int d, const float *bot, const float *e, float *dr,
                                        float *dt, float *de)
{
    enum { TILE = 16 };
    const int N = S + 1;
    const float *gd = dr + d;
    for (int t = 0; t < N; t++) {
        float *dtt = dt + (size_t)t * (size_t)d;
        int j0 = 0;
        for (; j0 + TILE <= d; j0 += TILE) {
            float acc[TILE] = {0}; /* a constant width, so it stays in registers */
            for (int u = 0; u < N; u++) {
                if (u == t)
                    continue;
                const float c = gd[pair_at(N, t, u)], *vu = vec_of(bot, e, d, u) + j0;
#pragma omp simd
                for (int j = 0; j < TILE; j++)
                    acc[j] += c * vu[j];
            }
            for (int j = 0; j < TILE; j++)
                dtt[j0 + j] = acc[j];
        }
        if (j0 < d) { /* the columns past the last whole tile, summed in place */
            for (int j = j0; j < d; j++)
                dtt[j] = 0.0f;
            for (int u = 0; u < N; u++)
                if (u != t)
                    axpy(gd[pair_at(N, t, u)], vec_of(bot, e, d, u) + j0, dtt + j0, d - j0);
        }
    }
    /* d bot = (direct part + interaction part) * ReLU'(bot) */
    for (int j = 0; j < d; j++)
        dr[j] = bot[j] > 0.0f ? dr[j] + dt[j] : 0.0f;
    if (S > 0)
        memcpy(de, dt + d, (size_t)S * (size_t)d * sizeof(float));
}

void model_dlrm_backward(model_t *m, int n, const float *E, const float *X, float *dE)
{
    const int S = m->S, d = m->d, nb = m->nbottom, nl = m->nbottom + m->ntop;
    const size_t ldr = (size_t)m->ldr, rowE = (size_t)S * (size_t)d;
    const size_t rowT = (size_t)(S + 1) * (size_t)d;

    /* Top MLP, last layer first; cur is d loss / d (layer output). */
    const float *cur = m->gz;
    int ldc = 1, cb = 1; /* cur lives in gbuf[cb] (gz at first) */
    for (int l = nl - 1; l >= nb; l--) {
        const model_layer_t *L = &m->layers[l];
        const float *Ap = l == nb ? m->R : m->act[l - 1];
        int lda = l == nb ? m->ldr : m->layers[l - 1].out;
        float *dA = m->gbuf[cb ^ 1];
        model_dense_linear_bwd(m, n, L, Ap, lda, cur, ldc, dA, L->in);
        if (l > nb)
            relu_mask(n, L->in, Ap, lda, dA, L->in);
        cur = dA;
        ldc = L->in;
        cb ^= 1;
    }

    /* Interaction: dR (n, d + P) -> d bot (in place, R's first d columns of
     * dR) and dE. dT holds a row's (S + 1, d) gradients before dE is
     * written, so dE may alias E. */
    float *dR = m->gbuf[cb];
    const float *R = m->R;
    float *dT = m->dT;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++)
        interaction_bwd(S, d, R + (size_t)i * ldr, E + (size_t)i * rowE, dR + (size_t)i * ldr,
                        dT + (size_t)i * rowT, dE + (size_t)i * rowE);

    /* Bottom MLP, last layer first; the top's input gradient dR carries d bot
     * in its first d columns (leading dimension d + P). */
    cur = dR;
    ldc = m->ldr;
    for (int l = nb - 1; l >= 0; l--) {
        const model_layer_t *L = &m->layers[l];
        const float *Ap = l == 0 ? X : m->act[l - 1];
        int lda = l == 0 ? m->F : m->layers[l - 1].out;
        float *dA = l == 0 ? NULL : m->gbuf[cb ^ 1];
        model_dense_linear_bwd(m, n, L, Ap, lda, cur, ldc, dA, L->in);
        if (l > 0)
            relu_mask(n, L->in, Ap, lda, dA, L->in);
        cur = dA;
        ldc = L->in;
        cb ^= 1;
    }
}
