/*
 * serving/serve_ops.c - what `kiln push`, `kiln promote` and `kiln rollback`
 * do: find the checkpoint and the endpoints in SQLite and the job spec,
 * push (serve_push: a delta on what each endpoint holds per our records, a
 * full push otherwise or on 409), and record every push: an exports row
 * (format push-full | push-delta, the body's bytes, the base), a pushes row
 * (endpoint, HTTP status, attempts, error; the endpoint's holding moves on
 * success) and a "push" event with the label, bytes and duration in ms.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs.h"
#include "rt_model.h"
#include "serve.h"
#include "state.h"

int serve_desc_from_spec(const job_spec_t *sp, serve_model_desc_t *d)
{
    memset(d, 0, sizeof *d);
    rt_model_type_t mt = sp->model.type == JOB_MODEL_FM     ? RT_MODEL_FM
                         : sp->model.type == JOB_MODEL_DLRM ? RT_MODEL_DLRM
                                                            : RT_MODEL_LR;
    d->model_type = (int)mt;
    d->nslots = sp->data.cat_slots;
    d->ndense = sp->data.dense_features;
    d->dim = rt_model_table_dim(mt, sp->model.embedding.dim);
    d->fm_dense_factors = sp->model.fm_dense_factors; /* as kiln-train builds it */
    if (d->nslots > SERVE_MAX_SLOTS || sp->model.ntables > SERVE_MAX_TABLES ||
        sp->model.nbottom > SERVE_MAX_LAYERS || sp->model.ntop > SERVE_MAX_LAYERS)
        return kiln_errf(KILN_ERANGE, "the model of job %s is too large for the push format",
                         sp->name);
    d->nbottom = sp->model.nbottom;
    memcpy(d->bottom, sp->model.bottom_mlp, (size_t)d->nbottom * sizeof(int));
    d->ntop = sp->model.ntop;
    memcpy(d->top, sp->model.top_mlp, (size_t)d->ntop * sizeof(int));
    d->ntables = sp->model.ntables;
    for (int t = 0; t < d->ntables; t++) {
        const job_table_t *jt = &sp->model.tables[t];
        snprintf(d->tables[t].name, SERVE_NAME_MAX, "%s", jt->name);
        d->tables[t].dim = rt_model_table_dim(mt, jt->emb.dim);
        for (int i = 0; i < jt->nslots; i++)
            if (jt->slots[i] >= 0 && jt->slots[i] < d->nslots) {
                d->slot_table[jt->slots[i]] = t;
                d->slot_mean[jt->slots[i]] = jt->emb.combiner == JOB_COMB_MEAN;
            }
    }
    rt_model_config_t cfg = {.type = mt, .nslots = d->nslots, .ndense = d->ndense,
                             .dim = d->dim, .bottom = d->bottom, .nbottom = d->nbottom,
                             .top = d->top, .ntop = d->ntop,
                             .fm_dense_factors = d->fm_dense_factors,
                             .max_batch = 1, .opt = {.type = RT_DENSE_SGD}};
    rt_model_t *m = NULL;
    KILN_CHECK(rt_model_create(&cfg, &m));
    d->nparams = (int64_t)rt_model_nparams(m);
    rt_model_destroy(m);
    return serve_desc_check(d);
}

typedef struct opener {
    const char *path;
    const serve_model_desc_t *desc;
} opener_t;

static int open_ckpt(void *ctx, const char *held, serve_source_t **out)
{
    const opener_t *o = ctx;
    return serve_ckptsrc_open(o->path, o->desc, held, out);
}

typedef struct ep {
    int64_t id;
    char *url, *model, *label;
    char held[SERVE_UID_MAX];
} ep_t;

/* The job (and its parsed spec) that wrote checkpoint c. */
static int job_of(state_t *st, const state_checkpoint_t *c, state_job_t *job, job_spec_t *spec)
{
    state_run_t run = {0};
    KILN_CHECK(state_run_get(st, c->run_id, &run));
    int rc = state_job_get_by_id(st, run.job_id, job);
    state_run_fini(&run);
    KILN_CHECK(rc);
    rc = job_spec_parse(job->spec_yaml, strlen(job->spec_yaml), job->name, spec, NULL);
    if (rc < 0)
        state_job_fini(job);
    return rc;
}

/* Pushes checkpoint c to eps and records everything. */
static int push_and_record(state_t *st, const state_job_t *job, const job_spec_t *spec,
                           const state_checkpoint_t *c, ep_t *eps, int n, const char *token,
                           bool full, const char *why, serve_op_result_t *res)
{
    serve_model_desc_t *desc = kiln_calloc(1, sizeof *desc);
    serve_target_t *t = kiln_calloc((size_t)n + 1, sizeof *t);
    serve_push_result_t *r = kiln_calloc((size_t)n + 1, sizeof *r);
    int rc = 0;
    if (desc == NULL || t == NULL || r == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    KILN_CHECK_GOTO(serve_desc_from_spec(spec, desc), rc, out);
    opener_t o = {c->path, desc};
    for (int i = 0; i < n; i++) {
        int64_t held_id = 0;
        eps[i].held[0] = '\0';
        if (!full && state_endpoint_holding(st, eps[i].id, &held_id, NULL) == 0) {
            state_checkpoint_t h = {0};
            if (state_checkpoint_get_by_id(st, held_id, &h) == 0)
                snprintf(eps[i].held, sizeof eps[i].held, "%s", h.uid);
            state_checkpoint_fini(&h);
        }
        t[i] = (serve_target_t){eps[i].url, eps[i].model, eps[i].label, eps[i].held, open_ckpt,
                                &o};
    }
    serve_push_opts_t opts = {.token = token,
                              .retries = spec->push.retries,
                              .timeout_ms = spec->push.timeout_ms};
    int prc = serve_push(t, n, &opts, r);
    char first_err[600] = "";
    if (prc < 0)
        snprintf(first_err, sizeof first_err, "%s", kiln_errmsg());
    snprintf(res->checkpoint, sizeof res->checkpoint, "%s", c->uid);
    for (int i = 0; i < n; i++) {
        int64_t base_id = 0, export_id = 0, push_id = 0;
        if (r[i].base[0]) {
            state_checkpoint_t b = {0};
            if (state_checkpoint_get(st, r[i].base, &b) == 0)
                base_id = b.id;
            state_checkpoint_fini(&b);
        }
        KILN_CHECK_GOTO(state_export_add(st, c->id, base_id, r[i].full ? "push-full"
                                                                        : "push-delta",
                                         c->path, (int64_t)r[i].bytes, &export_id),
                        rc, out);
        KILN_CHECK_GOTO(state_push_add(st, export_id, eps[i].id, &push_id), rc, out);
        KILN_CHECK_GOTO(state_push_finish(st, push_id, r[i].ok, r[i].http_status,
                                          r[i].ok ? NULL : r[i].error, r[i].attempts, c->id),
                        rc, out);
        char msg[1024];
        snprintf(msg, sizeof msg,
                 "%s: %s %s of %s to %s (%s/%s): HTTP %d, %d attempt(s), %llu bytes, %lld ms%s%s",
                 why, r[i].ok ? "pushed" : "FAILED to push", r[i].full ? "full" : "delta",
                 c->uid, eps[i].url, eps[i].model, eps[i].label, r[i].http_status,
                 r[i].attempts, (unsigned long long)r[i].bytes, (long long)r[i].duration_ms,
                 r[i].ok ? "" : ": ", r[i].ok ? "" : r[i].error);
        state_event_add(st, job->id, 0, "push", msg);
        res->npushes++;
        res->nfailed += !r[i].ok;
    }
    if (prc < 0)
        rc = kiln_errf(prc, "%s", first_err);
out:
    free(desc);
    free(t);
    free(r);
    return rc;
}

static void eps_free(ep_t *eps, int n)
{
    for (int i = 0; eps != NULL && i < n; i++) {
        free(eps[i].url);
        free(eps[i].model);
        free(eps[i].label);
    }
    free(eps);
}

/* Endpoints of model/label from the endpoints table. */
static int eps_of_label(state_t *st, const char *model, const char *label, ep_t **out, int *n,
                        int64_t *held_ckpt /* OUT: newest holding, 0 none */)
{
    state_endpoint_info_t *all = NULL;
    size_t na = 0;
    KILN_CHECK(state_endpoint_list(st, &all, &na));
    ep_t *eps = kiln_calloc(na + 1, sizeof *eps);
    int k = 0;
    int64_t since = -1;
    *held_ckpt = 0;
    for (size_t i = 0; eps != NULL && i < na; i++) {
        if (strcmp(all[i].model, model) != 0 || all[i].label == NULL ||
            strcmp(all[i].label, label) != 0)
            continue;
        eps[k].id = all[i].id;
        eps[k].url = kiln_strdup(all[i].url);
        eps[k].model = kiln_strdup(all[i].model);
        eps[k].label = kiln_strdup(all[i].label);
        k++;
        if (all[i].checkpoint_id > 0 && all[i].since > since) {
            since = all[i].since;
            *held_ckpt = all[i].checkpoint_id;
        }
    }
    state_endpoint_infos_free(all, na);
    if (eps == NULL)
        return KILN_ENOMEM;
    if (k == 0) {
        free(eps);
        return kiln_errf(KILN_ENOENT, "no endpoint of model %s has label %s (endpoints are "
                                      "registered by `kiln push --job NAME --label %s`)",
                         model, label, label);
    }
    *out = eps;
    *n = k;
    return 0;
}

static const char *token_of(const job_spec_t *spec, const char *token_env)
{
    const char *var = token_env ? token_env : spec->push.token_env;
    return var ? getenv(var) : NULL;
}

int serve_op_push_job(state_t *st, const char *job_name, const char *label, const char *ckpt_uid,
                      bool full, serve_op_result_t *res)
{
    state_job_t job = {0};
    job_spec_t spec = {0};
    state_checkpoint_t c = {0};
    ep_t *eps = NULL;
    int n = 0, rc;
    memset(res, 0, sizeof *res);
    KILN_CHECK(state_job_get(st, job_name, &job));
    rc = job_spec_parse(job.spec_yaml, strlen(job.spec_yaml), job.name, &spec, NULL);
    if (rc < 0)
        goto out;
    if (ckpt_uid != NULL)
        rc = state_checkpoint_get(st, ckpt_uid, &c);
    else if ((rc = state_checkpoint_latest(st, job.id, &c)) == KILN_ENOENT)
        rc = kiln_errf(KILN_ENOENT, "job %s has no checkpoint yet", job_name);
    if (rc < 0)
        goto out;
    eps = kiln_calloc((size_t)spec.push.nendpoints + 1, sizeof *eps);
    if (eps == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int i = 0; i < spec.push.nendpoints; i++) {
        const job_endpoint_t *je = &spec.push.endpoints[i];
        if (label != NULL && (je->label == NULL || strcmp(je->label, label) != 0))
            continue;
        KILN_CHECK_GOTO(state_endpoint_put(st, je->url, je->model ? je->model : "", je->label,
                                           &eps[n].id),
                        rc, out);
        eps[n].url = kiln_strdup(je->url);
        eps[n].model = kiln_strdup(je->model ? je->model : "");
        eps[n].label = kiln_strdup(je->label ? je->label : "");
        n++;
    }
    if (n == 0) {
        rc = kiln_errf(KILN_ENOENT, "job %s has no push endpoint with label %s (spec push."
                                    "endpoints)",
                       job_name, label ? label : "(any)");
        goto out;
    }
    const char *token = token_of(&spec, NULL);
    if (token == NULL) {
        rc = kiln_errf(KILN_EAUTH, "the push token variable %s is not set",
                       spec.push.token_env ? spec.push.token_env : "(push.token_env unset)");
        goto out;
    }
    rc = push_and_record(st, &job, &spec, &c, eps, n, token, full, full ? "full push" : "push",
                         res);
out:
    eps_free(eps, n);
    state_checkpoint_fini(&c);
    job_spec_fini(&spec);
    state_job_fini(&job);
    return rc;
}

/* Pushes checkpoint id ckpt_id to model/label's endpoints. */
static int push_ckpt_to_label(state_t *st, int64_t ckpt_id, const char *model, const char *label,
                              const char *token_env, const char *why, serve_op_result_t *res)
{
    state_checkpoint_t c = {0};
    state_job_t job = {0};
    job_spec_t spec = {0};
    ep_t *eps = NULL;
    int n = 0;
    int64_t unused;
    int rc = state_checkpoint_get_by_id(st, ckpt_id, &c);
    if (rc < 0)
        goto out;
    KILN_CHECK_GOTO(job_of(st, &c, &job, &spec), rc, out);
    KILN_CHECK_GOTO(eps_of_label(st, model, label, &eps, &n, &unused), rc, out);
    const char *token = token_of(&spec, token_env);
    if (token == NULL) {
        rc = kiln_errf(KILN_EAUTH, "no push token: set %s",
                       token_env ? token_env : spec.push.token_env ? spec.push.token_env
                                                                   : "--token-env VAR");
        goto out;
    }
    rc = push_and_record(st, &job, &spec, &c, eps, n, token, false, why, res);
out:
    eps_free(eps, n);
    job_spec_fini(&spec);
    state_job_fini(&job);
    state_checkpoint_fini(&c);
    return rc;
}

int serve_op_promote(state_t *st, const char *model, const char *from, const char *to,
                     const char *token_env, serve_op_result_t *res)
{
    ep_t *eps = NULL;
    int n = 0;
    int64_t held = 0;
    memset(res, 0, sizeof *res);
    KILN_CHECK(eps_of_label(st, model, from, &eps, &n, &held));
    eps_free(eps, n);
    if (held == 0)
        return kiln_errf(KILN_ENOENT, "no endpoint of %s/%s holds a checkpoint yet", model, from);
    char why[160];
    snprintf(why, sizeof why, "promote %s -> %s", from, to);
    return push_ckpt_to_label(st, held, model, to, token_env, why, res);
}

int serve_op_rollback(state_t *st, const char *model, const char *label, const char *token_env,
                      serve_op_result_t *res)
{
    ep_t *eps = NULL;
    int n = 0;
    int64_t held = 0;
    memset(res, 0, sizeof *res);
    KILN_CHECK(eps_of_label(st, model, label, &eps, &n, &held));
    /* The previous checkpoint: the newest holding of the label's endpoints
     * that is not the current one. */
    int64_t prev = 0, prev_since = -1;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        state_holding_t *hs = NULL;
        size_t nh = 0;
        rc = state_endpoint_history(st, eps[i].id, 0, &hs, &nh);
        for (size_t k = 0; rc == 0 && k < nh; k++)
            if (hs[k].checkpoint_id != held && hs[k].since > prev_since) {
                prev = hs[k].checkpoint_id;
                prev_since = hs[k].since;
                break;
            }
        state_holdings_free(hs, nh);
    }
    eps_free(eps, n);
    KILN_CHECK(rc);
    if (prev == 0)
        return kiln_errf(KILN_ENOENT, "%s/%s never held another checkpoint: nothing to roll "
                                      "back to",
                         model, label);
    char why[160];
    snprintf(why, sizeof why, "rollback of %s", label);
    return push_ckpt_to_label(st, prev, model, label, token_env, why, res);
}
