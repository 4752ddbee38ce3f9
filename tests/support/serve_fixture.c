/*
 * tests/support/serve_fixture.c - a tiny lr model version and a fault
 * injecting push source for the serving tests (serve_fixture.h).
 */
#include "serve_fixture.h"

#include <stdio.h>
#include <stdlib.h>

#include "kiln.h"
#include "model.h"

int fx_lr_version(const char *uid, int64_t n, const int64_t *keys, const float *vals,
                  float dense0, serve_memsrc_t **out)
{
    serve_model_desc_t d = {0};
    d.model_type = 0;
    d.nslots = 2;
    d.ndense = 1;
    d.dim = 1;
    d.ntables = 1;
    snprintf(d.tables[0].name, SERVE_NAME_MAX, "t0");
    d.tables[0].dim = 1;
    model_config_t cfg = {.type = MODEL_LR, .nslots = 2, .ndense = 1, .dim = 1,
                             .max_batch = 8, .seed = 7,
                             .opt = {.type = KERN_OPT_SGD, .lr = 0.1f}};
    model_t *rm = NULL;
    KILN_CHECK(model_create(&cfg, &rm));
    d.nparams = (int64_t)model_nparams(rm);
    model_destroy(rm);
    serve_memsrc_t *m = NULL;
    float *dense = kiln_calloc((size_t)d.nparams + 1, sizeof *dense);
    int rc = KILN_ENOMEM;
    if (dense == NULL)
        goto out;
    dense[0] = dense0;
    KILN_CHECK_GOTO(serve_memsrc_create(&d, uid, "", &m), rc, out);
    KILN_CHECK_GOTO(serve_memsrc_add_rows(m, 0, n, keys, vals), rc, out);
    KILN_CHECK_GOTO(serve_memsrc_set_dense(m, d.nparams, dense), rc, out);
out:
    free(dense);
    if (rc != 0) {
        serve_memsrc_destroy(m);
        m = NULL;
    }
    *out = m;
    return rc;
}

typedef struct fault_src {
    serve_source_t *inner;
    int after, items;
    void (*fault)(void *ud);
    void *ud;
} fault_src_t;

static int fault_next(serve_source_t *s, serve_item_t *item)
{
    fault_src_t *f = s->impl;
    if (++f->items == f->after)
        f->fault(f->ud);
    return f->inner->ops->next(f->inner, item);
}

static void fault_destroy(serve_source_t *s)
{
    fault_src_t *f = s->impl;
    serve_source_destroy(f->inner);
    free(f);
    free(s);
}

static const serve_source_ops_t fault_ops = {fault_next, fault_destroy};

int fx_fault_source(serve_source_t *inner, int after, void (*fault)(void *ud), void *ud,
                    serve_source_t **out)
{
    serve_source_t *w = kiln_calloc(1, sizeof *w);
    fault_src_t *f = kiln_calloc(1, sizeof *f);
    if (w == NULL || f == NULL) {
        free(w);
        free(f);
        serve_source_destroy(inner);
        return KILN_ENOMEM;
    }
    *f = (fault_src_t){inner, after, 0, fault, ud};
    *w = *inner;
    w->ops = &fault_ops;
    w->impl = f;
    *out = w;
    return 0;
}
