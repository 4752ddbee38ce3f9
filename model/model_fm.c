/*
 * model/model_fm.c - the factorization machine on Kiln's pooled inputs.
 * Each slot's pooled vector has d = 1 + k floats: element 0 is the slot's
 * linear weight, elements 1..k its factor v_s. With u = Vx X[i] (k), present
 * only when fm_dense_factors is on:
 *
 *   logit_i = b + w . X[i] + sum_s E[i,s,0]
 *             + 1/2 sum_f [ (sum_s v_sf + u_f)^2 - sum_s v_sf^2 - u_f^2 ]
 *
 * i.e. every pairwise dot product among the slot factors (and u), computed in
 * O(S k) per row. Without u the dense features enter only linearly.
 */
#define MODEL_IMPL
#include "model.h"

#include "kern_ops.h" /* KERN_CLONES */

/* Factors a pass over the slots takes: a row's factor sums and squares
 * stay in registers (64 floats: four AVX-512 vectors). */
enum { FM_CHUNK = 64 };

/* Row i's logit from lin (b + w . X[i]), its pooled vectors e (S, d) and
 * u (k, NULL without dense factors); acc (k) gets the factor sums that the
 * backward reads. Each factor's sum and sum of squares run across the
 * slots, factor by factor side by side, then fold over the factors in
 * order: element-wise (KERN_CLONES gives the same bits at every vector
 * width), and no add waits on the one before it (a single running sum of
 * squares, slot by slot, made the row a chain of S k dependent adds). */
KERN_CLONES static float fm_row_fwd(int S, int d, int k, const float *e, const float *u, float lin,
                                    float *acc)
{
    float inter = 0.0f, sq = 0.0f;
    for (int s = 0; s < S; s++)
        lin += e[(size_t)s * (size_t)d];
    for (int f0 = 0; f0 < k; f0 += FM_CHUNK) {
        const int nf = k - f0 < FM_CHUNK ? k - f0 : FM_CHUNK;
        float a[FM_CHUNK], q[FM_CHUNK];
#pragma omp simd
        for (int f = 0; f < nf; f++) {
            a[f] = u ? u[f0 + f] : 0.0f;
            q[f] = a[f] * a[f];
        }
        for (int s = 0; s < S; s++) {
            const float *v = e + (size_t)s * (size_t)d + 1 + f0;
#pragma omp simd
            for (int f = 0; f < nf; f++) {
                a[f] += v[f];
                q[f] += v[f] * v[f];
            }
        }
        for (int f = 0; f < nf; f++) {
            acc[f0 + f] = a[f];
            inter += a[f] * a[f];
            sq += q[f];
        }
    }
    return lin + 0.5f * (inter - sq);
}

/* Row i's dE: d logit / d e[s][0] = 1, d / d v_sf = sum_f - v_sf, times
 * gi. Element-wise (KERN_CLONES), so de may be e. */
KERN_CLONES static void fm_row_bwd(int S, int d, int k, float gi, const float *acc,
                                   const float *e, float *de)
{
    for (int s = 0; s < S; s++) {
        const float *es = e + (size_t)s * (size_t)d;
        float *ds = de + (size_t)s * (size_t)d;
        ds[0] = gi;
#pragma omp simd
        for (int f = 0; f < k; f++)
            ds[1 + f] = gi * (acc[f] - es[1 + f]);
    }
}

void model_fm_forward(model_t *m, int n, const float *E, const float *X)
{
    const int S = m->S, F = m->F, d = m->d, k = m->k, dense = m->fm_dense;
    const float *w = m->params + m->w_off;
    const float *vx = m->params + m->vx_off;
    const float b = m->params[m->b_off];
    float *z = m->logits, *sum = m->fm_sum, *u = m->fm_u;
    /* z (n) = X (n, F) w (F); u (n, k) = X (n, F) Vx^T (F, k) */
    if (F > 0)
        model_gemm_rows(m, n, 1, F, X, F, 0, w, 1, z, 1);
    if (dense)
        model_gemm_rows(m, n, k, F, X, F, 1, vx, F, u, k);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++)
        z[i] = fm_row_fwd(S, d, k, E + (size_t)i * (size_t)S * (size_t)d,
                          dense ? u + (size_t)i * (size_t)k : NULL, b + (F > 0 ? z[i] : 0.0f),
                          k > 0 ? sum + (size_t)i * (size_t)k : NULL);
}

void model_fm_backward(model_t *m, int n, const float *E, const float *X, float *dE)
{
    const int S = m->S, F = m->F, d = m->d, k = m->k, dense = m->fm_dense;
    const float *g = m->gz;
    const float *sum = m->fm_sum;
    float *u = m->fm_u;
    /* dw (F) += X^T g; db += sum g; in float64 (model_blas.c) */
    if (F > 0)
        model_grad_gemm(m, n, F, 1, X, F, g, 1, m->grads + m->w_off);
    model_grad_colsum(m, n, 1, g, 1, m->grads + m->b_off);
    /* d logit / d v_sf = (sum_f - v_sf); elementwise, so dE may alias E. */
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float gi = g[i];
        const float *acc = k > 0 ? sum + (size_t)i * (size_t)k : NULL;
        fm_row_bwd(S, d, k, gi, acc, E + (size_t)i * (size_t)S * (size_t)d,
                   dE + (size_t)i * (size_t)S * (size_t)d);
        if (dense) {
            float *ui = u + (size_t)i * (size_t)k; /* becomes du (n, k) */
            for (int f = 0; f < k; f++)
                ui[f] = gi * (acc[f] - ui[f]);
        }
    }
    /* dVx (k, F) += du^T (k, n) X (n, F) */
    if (dense)
        model_grad_gemm(m, n, k, F, u, k, X, F, m->grads + m->vx_off);
}
