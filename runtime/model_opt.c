/*
 * runtime/model_opt.c - the dense optimizer: one update of the flat dense
 * parameter vector from its (allreduced) gradient. sgd, adagrad and adam
 * with bias correction, coupled L2 weight decay; the formulas are in
 * rt_model.h and docs/models.md and match the sparse ones in kernels/.
 */
#define RT_MODEL_IMPL
#include "rt_model.h"
#include "rt_dd.h"

#include <math.h>

int rt_model_step(rt_model_t *m)
{
    const long P = (long)m->nparams;
    float *w = m->params;
    /* double-double sums (rt_dd.h), rounded once here */
    const double *g = m->grads, *gl = m->grads_lo;
    const float lr = m->opt.lr, wd = m->opt.weight_decay, eps = m->opt.eps;

    switch (m->opt.type) {
    case RT_DENSE_SGD:
#pragma omp parallel for simd schedule(static) if (P >= 65536)
        for (long i = 0; i < P; i++)
            w[i] -= lr * (rt_dd_float(g[i], gl[i]) + wd * w[i]);
        break;
    case RT_DENSE_ADAGRAD: {
        float *acc = m->opt_a;
#pragma omp parallel for simd schedule(static) if (P >= 65536)
        for (long i = 0; i < P; i++) {
            float gi = rt_dd_float(g[i], gl[i]) + wd * w[i];
            float a = acc[i] + gi * gi;
            acc[i] = a;
            w[i] -= lr * gi / (sqrtf(a) + eps);
        }
        break;
    }
    case RT_DENSE_ADAM: {
        float *mm = m->opt_a, *vv = m->opt_b;
        const float b1 = m->opt.beta1, b2 = m->opt.beta2;
        m->opt_t++;
        const float bc1 = (float)(1.0 - pow(b1, (double)m->opt_t));
        const float bc2 = (float)(1.0 - pow(b2, (double)m->opt_t));
#pragma omp parallel for simd schedule(static) if (P >= 65536)
        for (long i = 0; i < P; i++) {
            float gi = rt_dd_float(g[i], gl[i]) + wd * w[i];
            float mi = b1 * mm[i] + (1.0f - b1) * gi;
            float vi = b2 * vv[i] + (1.0f - b2) * gi * gi;
            mm[i] = mi;
            vv[i] = vi;
            w[i] -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
        }
        break;
    }
    }
    if (m->opt.type != RT_DENSE_ADAM)
        m->opt_t++;
    return 0;
}
