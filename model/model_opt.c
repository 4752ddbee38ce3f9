/*
 * model/model_opt.c - the dense optimizer: one update of the flat dense
 * parameter vector from its (allreduced) gradient. sgd, adagrad and adam
 * with bias correction, coupled L2 weight decay (docs/models.md). The
 * element updates are the sparse optimizers' own (kernels/kern_ops.h), fed
 * the decayed gradient; only adam's bias correction is computed here, in
 * double as it always was.
 */
#define MODEL_IMPL
#include "model.h"
#include "kern_ops.h"

#include <math.h>

int model_step(model_t *m)
{
    const long P = (long)m->nparams;
    float *w = m->params;
    /* double-double sums (kern_ops.h), rounded once here */
    const double *g = m->grads, *gl = m->grads_lo;
    const float lr = m->opt.lr, wd = m->opt.weight_decay, eps = m->opt.eps;

    switch (m->opt.type) {
    case KERN_OPT_SGD:
#pragma omp parallel for simd schedule(static) if (P >= 65536)
        for (long i = 0; i < P; i++)
            kern_sgd_elem(&w[i], kern_dd_float(g[i], gl[i]) + wd * w[i], lr);
        break;
    case KERN_OPT_ADAGRAD: {
        float *acc = m->opt_a;
#pragma omp parallel for simd schedule(static) if (P >= 65536)
        for (long i = 0; i < P; i++) {
            kern_adagrad_elem(&w[i], &acc[i], kern_dd_float(g[i], gl[i]) + wd * w[i], lr, eps);
        }
        break;
    }
    case KERN_OPT_ADAM: {
        float *mm = m->opt_a, *vv = m->opt_b;
        const float b1 = m->opt.beta1, b2 = m->opt.beta2;
        m->opt_t++;
        const float bc1 = (float)(1.0 - pow(b1, (double)m->opt_t));
        const float bc2 = (float)(1.0 - pow(b2, (double)m->opt_t));
#pragma omp parallel for simd schedule(static) if (P >= 65536)
        for (long i = 0; i < P; i++) {
            kern_adam_elem(&w[i], &mm[i], &vv[i], kern_dd_float(g[i], gl[i]) + wd * w[i], lr, b1,
                           b2, eps, bc1, bc2);
        }
        break;
    }
    }
    if (m->opt.type != KERN_OPT_ADAM)
        m->opt_t++;
    /* bf16: the weights the next steps multiply by, rounded once here. */
    if (m->bf)
        model_bf16_sync_weights(m);
    return 0;
}
