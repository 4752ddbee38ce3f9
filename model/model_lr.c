/*
 * model/model_lr.c - logistic regression on Kiln's pooled inputs:
 *
 *   logit_i = sum_s E[i, s, 0] + w . X[i] + b          E (n, S, 1), X (n, F)
 *
 * The per-key weight of slot s IS its embedding (tables of width 1), so the
 * sparse side learns it; only w (F) and b are dense parameters here.
 */
#define MODEL_IMPL
#include "model.h"


void model_lr_forward(model_t *m, int n, const float *E, const float *X)
{
    const int S = m->S, F = m->F;
    const float *w = m->params + m->w_off;
    const float b = m->params[m->b_off];
    float *z = m->logits;
    /* z (n) = X (n, F) w (F) */
    if (F > 0)
        model_gemm_rows(m, n, 1, F, X, F, 0, w, 1, z, 1);
    /* S adds a row: below ~256k of them a parallel region costs more
     * than it saves (and on a busy machine, a wait for the other thread). */
#pragma omp parallel for schedule(static) if ((int64_t)n * S >= 262144)
    for (int i = 0; i < n; i++) {
        float acc = b + (F > 0 ? z[i] : 0.0f);
        const float *e = E + (size_t)i * (size_t)S;
        for (int s = 0; s < S; s++)
            acc += e[s];
        z[i] = acc;
    }
}

void model_lr_backward(model_t *m, int n, const float *E, const float *X, float *dE)
{
    const int S = m->S, F = m->F;
    const float *g = m->gz;
    /* dw (F) += X^T (F, n) g (n); db += sum g; in float64 (model_blas.c) */
    if (F > 0)
        model_grad_gemm(m, n, F, 1, X, F, g, 1, m->grads + m->w_off);
    model_grad_colsum(m, n, 1, g, 1, m->grads + m->b_off);
#pragma omp parallel for schedule(static) if ((int64_t)n * S >= 262144)
    for (int i = 0; i < n; i++) {
        float *de = dE + (size_t)i * (size_t)S;
        for (int s = 0; s < S; s++)
            de[s] = g[i];
    }
    (void)E;
}
