/*
 * serving/serve_version.c - one version in memory: its tables (serve_table)
 * and its dense model (the trainer's own model_t, built from the push's
 * model description), its size, and finding it in the store's list by
 * (model, label); and where a label's files live. The store (serve_store.c),
 * its chains on disk (serve_chain.c) and the splits (serve_split.c) build on
 * it; it calls none of them.
 */
#include <stdlib.h>
#include <string.h>

#include "serve_store_int.h"

char *sv_label_dir(const sv_store_t *s, const char *model, const char *label)
{
    return kiln_asprintf("%s/models/%s/%s", s->dir, model, label);
}

void sv_version_destroy(sv_version_t *v)
{
    if (v == NULL)
        return;
    for (int t = 0; v->tables && t < v->desc.ntables; t++)
        serve_table_destroy(v->tables[t]);
    free(v->tables);
    free(v->dense);
    model_destroy(v->rtm);
    kiln_strv_free(v->files, (size_t)v->nfiles);
    free(v);
}

int sv_version_create(const serve_model_desc_t *desc, sv_version_t **out)
{
    sv_version_t *v = kiln_calloc(1, sizeof *v);
    if (v == NULL)
        return KILN_ENOMEM;
    v->desc = *desc;
    int rc = 0;
    v->tables = kiln_calloc((size_t)desc->ntables, sizeof *v->tables);
    v->dense = kiln_calloc((size_t)desc->nparams + 1, sizeof(float));
    if (v->tables == NULL || v->dense == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int t = 0; t < desc->ntables; t++)
        KILN_CHECK_GOTO(serve_table_create(desc->tables[t].dim, &v->tables[t]), rc, out);
    model_config_t cfg = {
        .type = (model_type_t)desc->model_type,
        .nslots = desc->nslots,
        .ndense = desc->ndense,
        .dim = desc->dim,
        .bottom = desc->bottom,
        .nbottom = desc->nbottom,
        .top = desc->top,
        .ntop = desc->ntop,
        .fm_dense_factors = desc->fm_dense_factors,
        .max_batch = PREDICT_BATCH,
        .seed = 0,
        .opt = {.type = KERN_OPT_SGD, .lr = 0.0f},
    };
    rc = model_create(&cfg, &v->rtm);
    if (rc < 0) {
        rc = kiln_errf(KILN_EINVAL, "the pushed model cannot be built: %s", kiln_errmsg());
        goto out;
    }
    if ((int64_t)model_nparams(v->rtm) != desc->nparams) {
        rc = kiln_errf(KILN_EINVAL, "the push carries %lld dense parameters; a %s model of this "
                                    "shape has %zu",
                       (long long)desc->nparams, model_type_name(cfg.type),
                       model_nparams(v->rtm));
        goto out;
    }
out:
    if (rc < 0) {
        sv_version_destroy(v);
        return rc;
    }
    *out = v;
    return 0;
}

int64_t sv_version_rows(const sv_version_t *v)
{
    int64_t n = 0;
    for (int t = 0; t < v->desc.ntables; t++)
        n += serve_table_size(v->tables[t]);
    return n;
}

sv_version_t *sv_version_find(const sv_store_t *s, const char *model, const char *label)
{
    for (int i = 0; i < s->nv; i++)
        if (strcmp(s->v[i]->model, model) == 0 && strcmp(s->v[i]->label, label) == 0)
            return s->v[i];
    return NULL;
}
