/*
 * ops/ops_deliver.c - delivering queued pushes. A deliverer (kilnd, or the
 * kiln command that queued its own pushes) holds a claim on each push it
 * sends. For each: the quality gate (push.max_regression: the pushed
 * checkpoint's eval logloss against the one the endpoint holds), the token
 * (the job's push.token_env, or the push's own), a delta on what the
 * endpoint holds per our records (or a full push), every push of the batch
 * in parallel over one libcurl multi handle with its job's retries and
 * timeout; then how each ended is recorded with its event: succeeded (the
 * endpoint's holding moves), failed (a refusal a retry cannot fix), held, or
 * back to pending with a backoff when a retry may help. The idempotency key
 * of a push is derived from its id, its checkpoint and its base, so a push
 * sent again after a crash is applied at most once.
 *
 * Also here: reading each endpoint's /v1/stats for the endpoints page, and
 * the push description of a job's model (ops_model_desc; kiln export's too).
 */
#include "ops_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model.h" /* model_table_dim: no BLAS, nothing built */

/* Test hook (tests/test_loop.c): KILN_TEST_PUSH_HOLD_MS holds the outcomes
 * of a delivery that long after the endpoints answered and before they are
 * recorded, so that a test can kill -9 the deliverer in between. */
static void test_hold(void)
{
    kiln_test_pause("KILN_TEST_PUSH_HOLD_MS");
}

/* ---- claimers ----------------------------------------------------------------------- */

char *ops_claimer(const char *role)
{
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    pid_t pid = getpid();
    return kiln_asprintf("%s@%s:%d:%llu", role, host, (int)pid,
                         (unsigned long long)kiln_pid_start(pid));
}

bool ops_claimer_dead(const char *claimer, void *ctx)
{
    (void)ctx;
    const char *at = strrchr(claimer, '@');
    char host[256] = "", mine[256] = "?";
    int pid = 0;
    unsigned long long start = 0;
    if (at == NULL || sscanf(at + 1, "%255[^:]:%d:%llu", host, &pid, &start) != 3)
        return false; /* not ours to judge; its lease runs out */
    gethostname(mine, sizeof mine - 1);
    if (strcmp(host, mine) != 0)
        return false;
    return !kiln_pid_alive((pid_t)pid, start);
}

int64_t ops_push_backoff_ms(int rounds)
{
    return kiln_backoff_ms(2000, 300000, rounds, (uint64_t)kiln_mono_ns());
}

/* ---- what each push needs -------------------------------------------------------------- */

/* A job's settings for its pushes: the current spec (token, retries,
 * timeout, gate), parsed once per delivery, or borrowed from the caller
 * that parsed it already (kiln push). */
typedef struct job_ctx {
    int64_t job_id;
    int version; /* the current spec's version */
    bool ok;
    bool borrowed; /* spec is the caller's: not freed here */
    job_spec_t spec;
} job_ctx_t;

/* One push being delivered. */
typedef struct item {
    state_push_t *p;
    job_ctx_t *job;
    serve_model_desc_t desc;
    char held[SERVE_UID_MAX];
    int64_t held_id;
    serve_push_opts_t opts;
    char nonce[64];
    bool send;          /* still to go out */
    state_push_outcome_t out;
    char error[640], event[1024];
} item_t;

static job_ctx_t *job_ctx(state_t *st, job_ctx_t *jobs, size_t *njobs, int64_t job_id)
{
    for (size_t i = 0; i < *njobs; i++)
        if (jobs[i].job_id == job_id)
            return &jobs[i];
    job_ctx_t *j = &jobs[(*njobs)++];
    j->job_id = job_id;
    state_job_t row = {0};
    if (job_id > 0 && state_job_get_by_id(st, job_id, &row) == 0) {
        j->version = row.version;
        j->ok = job_spec_parse(row.spec_yaml, strlen(row.spec_yaml), row.name, &j->spec, NULL) == 0;
    }
    state_job_fini(&row);
    return j;
}

/* The push description of a job's model (tables, slots, layers), as kiln-train
 * builds it. */
int ops_model_desc(const job_spec_t *sp, serve_model_desc_t *d)
{
    memset(d, 0, sizeof *d);
    model_type_t mt = sp->model.type;
    d->model_type = (int)mt; /* the wire's number is model_type_t's value */
    d->nslots = sp->data.cat_slots;
    d->ndense = sp->data.dense_features;
    d->dim = model_table_dim(mt, sp->model.embedding.dim);
    d->fm_dense_factors = sp->model.fm_dense_factors; /* as kiln-train builds it */
    if (d->nslots > SERVE_MAX_SLOTS || sp->model.ntables > SERVE_MAX_TABLES ||
        sp->model.nbottom > SERVE_MAX_LAYERS || sp->model.ntop > SERVE_MAX_LAYERS)
        return kiln_errf(KILN_ERANGE, "the model of job %s is too large for the push format",
                         sp->name);
    d->nbottom = sp->model.nbottom; /* 0 with no list (lr, fm): nothing to copy */
    if (d->nbottom > 0)
        memcpy(d->bottom, sp->model.bottom_mlp, (size_t)d->nbottom * sizeof(int));
    d->ntop = sp->model.ntop;
    if (d->ntop > 0)
        memcpy(d->top, sp->model.top_mlp, (size_t)d->ntop * sizeof(int));
    d->ntables = sp->model.ntables;
    for (int t = 0; t < d->ntables; t++) {
        const job_table_t *jt = &sp->model.tables[t];
        snprintf(d->tables[t].name, SERVE_NAME_MAX, "%s", jt->name);
        d->tables[t].dim = model_table_dim(mt, jt->emb.dim);
        for (int i = 0; i < jt->nslots; i++)
            if (jt->slots[i] >= 0 && jt->slots[i] < d->nslots) {
                d->slot_table[jt->slots[i]] = t;
                d->slot_mean[jt->slots[i]] = jt->emb.combiner == KERN_COMBINE_MEAN;
            }
    }
    /* nparams: the checkpoint source reads it from the checkpoint itself. */
    return serve_desc_check(d);
}

/* The model description of checkpoint c: from the spec version its run
 * trained with. Two documents, because they answer two questions: the
 * version the run trained with says what model the checkpoint holds, while
 * the push settings (token, retries, gate) are the job's as they are now.
 * They are one document, parsed once (job_ctx), unless the job's spec has
 * changed since the run; only then is the run's version parsed here. */
static int desc_of(state_t *st, const state_push_t *p, const job_ctx_t *job,
                   serve_model_desc_t *desc)
{
    state_run_t r;
    char *yaml = NULL;
    int rc = p->run_id > 0 ? state_run_get(st, p->run_id, &r) : KILN_ENOENT;
    if (rc == 0) {
        bool current = job->ok && r.job_id == job->job_id && r.job_version == job->version;
        if (!current)
            rc = state_job_version_spec(st, r.job_id, r.job_version, &yaml);
        state_run_fini(&r);
        if (current)
            return ops_model_desc(&job->spec, desc);
    }
    if (rc == 0) {
        job_spec_t sp;
        rc = job_spec_parse(yaml, strlen(yaml), "spec version", &sp, NULL);
        free(yaml);
        if (rc == 0) {
            rc = ops_model_desc(&sp, desc);
            job_spec_fini(&sp);
            return rc;
        }
    }
    /* No run (a checkpoint recorded by hand): the job's current spec. */
    if (!job->ok)
        return kiln_errf(KILN_ENOENT, "push %lld: no spec describes the model of checkpoint %s",
                         (long long)p->id, p->checkpoint_uid);
    return ops_model_desc(&job->spec, desc);
}

/* Ends it->p now with state s (not sent) and an error or event. */
static void settle(item_t *it, state_push_state_t s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void settle(item_t *it, state_push_state_t s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(it->error, sizeof it->error, fmt, ap);
    va_end(ap);
    it->send = false;
    it->out.state = s;
    it->out.error = it->error;
    if (s == STATE_PUSH_PENDING)
        it->out.not_before_ms = kiln_now_ms() + ops_push_backoff_ms(it->p->rounds + 1);
    snprintf(it->event, sizeof it->event, "push %lld of %s to %s (%s/%s) %s: %s",
             (long long)it->p->id, it->p->checkpoint_uid, it->p->url, it->p->model, it->p->label,
             s == STATE_PUSH_HELD      ? "held back"
             : s == STATE_PUSH_PENDING ? "not sent, will retry"
                                       : "failed",
             it->error);
    it->out.event = it->event;
}

/* Whether an eval logloss was measured: a logloss is positive, and a 0.0
 * can only be an older kiln-train's figure over 0 eval rows, which the gate
 * must not take for a perfect model. */
static bool measured(double logloss)
{
    return isfinite(logloss) && logloss > 0.0;
}

/* The quality gate: false (and the push settled as held) when the pushed
 * checkpoint's eval logloss is worse than the held one's by more than the
 * job allows. */
static bool gate_passes(state_t *st, item_t *it)
{
    const job_ctx_t *j = it->job;
    if (!it->p->gated || !j->ok || isnan(j->spec.push.max_regression) || it->held_id <= 0)
        return true;
    state_checkpoint_t now = {0}, held = {0};
    bool pass = true;
    if (state_checkpoint_get_by_id(st, it->p->checkpoint_id, &now) == 0 &&
        state_checkpoint_get_by_id(st, it->held_id, &held) == 0) {
        double limit = j->spec.push.max_regression;
        if (!measured(now.eval_logloss) || !measured(held.eval_logloss)) {
            char msg[512];
            snprintf(msg, sizeof msg,
                     "push %lld: the quality gate (push.max_regression %g) was not applied to "
                     "%s (%s/%s): %s has no eval logloss recorded (set data.eval; a logloss of "
                     "0 is one measured over no eval row)",
                     (long long)it->p->id, limit, it->p->url, it->p->model, it->p->label,
                     !measured(now.eval_logloss) ? now.uid : held.uid);
            state_event_add(st, it->p->job_id, it->p->run_id, "push", msg);
        } else if (now.eval_logloss > held.eval_logloss + limit) {
            settle(it, STATE_PUSH_HELD,
                   "eval logloss %.5f of %s is worse than %.5f of %s, which the endpoint holds, "
                   "by %.5f > push.max_regression %g; push it with kiln push --force to override",
                   now.eval_logloss, now.uid, held.eval_logloss, held.uid,
                   now.eval_logloss - held.eval_logloss, limit);
            pass = false;
        }
    }
    state_checkpoint_fini(&now);
    state_checkpoint_fini(&held);
    return pass;
}

/* Prepares one push: its job, model, base, token and gate. */
static void prepare(state_t *st, item_t *it, job_ctx_t *jobs, size_t *njobs, const char *role)
{
    state_push_t *p = it->p;
    it->send = true;
    it->job = job_ctx(st, jobs, njobs, p->job_id);
    int64_t since = 0;
    if (state_endpoint_holding(st, p->endpoint_id, &it->held_id, &since) == 0) {
        state_checkpoint_t h = {0};
        if (state_checkpoint_get_by_id(st, it->held_id, &h) == 0)
            snprintf(it->held, sizeof it->held, "%s", h.uid);
        state_checkpoint_fini(&h);
    }
    if (p->full)
        it->held[0] = '\0';
    if (desc_of(st, p, it->job, &it->desc) < 0) {
        settle(it, STATE_PUSH_FAILED, "the model cannot be described: %s", kiln_errmsg());
        return;
    }
    if (!gate_passes(st, it))
        return;
    const char *var = p->token_env != NULL ? p->token_env
                      : it->job->ok        ? it->job->spec.push.token_env
                                           : "KILN_SERVE_TOKEN";
    const char *token = var != NULL ? getenv(var) : NULL;
    if (token == NULL) {
        settle(it, STATE_PUSH_PENDING,
               "the push token variable %s is not set in the environment of %s; set it there "
               "(and restart it) or push with kiln push",
               var ? var : "(push.token_env)", role);
        return;
    }
    snprintf(it->nonce, sizeof it->nonce, "push-%lld", (long long)p->id);
    it->opts = (serve_push_opts_t){.token = token,
                                   .retries = it->job->ok ? it->job->spec.push.retries : 5,
                                   .timeout_ms = it->job->ok ? it->job->spec.push.timeout_ms
                                                             : 30000,
                                   .idem_nonce = it->nonce};
    /* The share of traffic the spec gives the label if this push creates it. */
    for (int k = 0; it->job->ok && k < it->job->spec.push.nendpoints; k++) {
        const job_endpoint_t *e = &it->job->spec.push.endpoints[k];
        if (strcmp(e->url, p->url) == 0 && strcmp(e->model, p->model) == 0 &&
            strcmp(e->label, p->label) == 0)
            it->opts.traffic = e->traffic;
    }
}

/* What a serve_push result means for the push. */
static void outcome(item_t *it, const serve_push_result_t *r)
{
    state_push_outcome_t *o = &it->out;
    const state_push_t *p = it->p;
    o->http_status = r->http_status;
    o->attempts = r->attempts;
    o->sent = r->attempts > 0 && r->bytes > 0;
    o->full = r->full;
    o->bytes = (int64_t)r->bytes;
    snprintf(it->error, sizeof it->error, "%s", r->error);
    if (r->ok) {
        o->state = STATE_PUSH_SUCCEEDED;
        o->error = NULL;
    } else {
        /* Nothing went out (the checkpoint could not be read), or the endpoint
         * refused what it was sent: a retry sends the same and gets the same. */
        int s = r->http_status;
        bool final = r->attempts == 0 || s == 400 || s == 404 || s == 413 || s == 422;
        o->state = final ? STATE_PUSH_FAILED : STATE_PUSH_PENDING;
        o->error = it->error;
        if (!final)
            o->not_before_ms = kiln_now_ms() + ops_push_backoff_ms(p->rounds + 1);
    }
    char when[64] = "";
    if (o->state == STATE_PUSH_PENDING)
        snprintf(when, sizeof when, "; retrying in %.0f s",
                 (double)(o->not_before_ms - kiln_now_ms()) / 1000.0);
    snprintf(it->event, sizeof it->event,
             "push %lld (%s) of %s to %s (%s/%s) %s as %s: HTTP %d, %d attempt(s), %llu bytes, "
             "%lld ms%s%s%s",
             (long long)p->id, p->reason != NULL ? p->reason : "", p->checkpoint_uid, p->url,
             p->model, p->label,
             o->state == STATE_PUSH_SUCCEEDED ? "landed"
             : o->state == STATE_PUSH_FAILED  ? "FAILED"
                                              : "did not land",
             r->full ? "a full push" : "a delta", r->http_status, r->attempts,
             (unsigned long long)r->bytes, (long long)r->duration_ms, r->ok ? "" : ": ",
             r->ok ? "" : r->error, when);
    o->event = it->event;
}

int ops_deliver(state_t *st, const char *claimer, state_push_t *ps, size_t n)
{
    return ops_deliver_spec(st, claimer, ps, n, NULL, 0);
}

int ops_deliver_spec(state_t *st, const char *claimer, state_push_t *ps, size_t n,
                     const job_spec_t *spec, int version)
{
    if (n == 0)
        return 0;
    item_t *items = kiln_calloc(n, sizeof *items);
    job_ctx_t *jobs = kiln_calloc(n, sizeof *jobs);
    serve_target_t *targets = kiln_calloc(n, sizeof *targets);
    serve_push_result_t *res = kiln_calloc(n, sizeof *res);
    serve_ckptsrc_at_t *openers = kiln_calloc(n, sizeof *openers);
    size_t *which = kiln_calloc(n, sizeof *which);
    size_t njobs = 0, nt = 0;
    int rc = 0;
    if (items == NULL || jobs == NULL || targets == NULL || res == NULL || openers == NULL ||
        which == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    if (spec != NULL) /* every push is of ps[0]'s job, whose spec the caller parsed */
        jobs[njobs++] = (job_ctx_t){ps[0].job_id, version, true, true, *spec};
    char role[64];
    snprintf(role, sizeof role, "%.*s", (int)strcspn(claimer, "@"), claimer);
    for (size_t i = 0; i < n; i++) {
        items[i].p = &ps[i];
        prepare(st, &items[i], jobs, &njobs, role);
        if (!items[i].send)
            continue;
        openers[nt] = (serve_ckptsrc_at_t){ps[i].checkpoint_path, &items[i].desc};
        targets[nt] = (serve_target_t){ps[i].url,     ps[i].model,          ps[i].label,
                                       items[i].held, serve_ckptsrc_opener, &openers[nt],
                                       &items[i].opts};
        which[nt++] = i;
    }
    if (nt > 0) {
        serve_push_opts_t call = {0};
        (void)serve_push(targets, (int)nt, &call, res); /* each result says how it went */
        for (size_t k = 0; k < nt; k++)
            outcome(&items[which[k]], &res[k]);
        test_hold();
    }
    for (size_t i = 0; i < n; i++) {
        item_t *it = &items[i];
        if (it->out.sent && it->held_id > 0 && !it->out.full)
            it->out.base_checkpoint_id = it->held_id;
        int erc = state_push_end(st, ps[i].id, claimer, &it->out);
        if (erc == KILN_ESTATE) /* our lease ran out and another deliverer took it */
            KILN_WARN("%s", kiln_errmsg());
        else if (erc < 0 && rc == 0)
            rc = erc;
        if (it->out.state == STATE_PUSH_SUCCEEDED)
            KILN_INFO("%s", it->event);
        else
            KILN_WARN("%s", it->event);
    }
out:
    for (size_t i = 0; jobs != NULL && i < njobs; i++)
        if (jobs[i].ok && !jobs[i].borrowed)
            job_spec_fini(&jobs[i].spec);
    KILN_FREE_ALL(items, jobs, targets, res, openers, which);
    return rc;
}

/* ---- endpoints' stats ---------------------------------------------------------------------- */

int ops_poll_stats(state_t *st, int64_t timeout_ms)
{
    state_endpoint_info_t *es = NULL;
    size_t n = 0;
    KILN_CHECK(state_endpoint_list(st, &es, &n));
    bool *done = kiln_calloc(n + 1, sizeof *done);
    int rc = done == NULL ? KILN_ENOMEM : 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (done[i])
            continue;
        /* One request per URL serves every (model, label) it holds. */
        serve_label_stats_t *ls = NULL;
        size_t nl = 0;
        int frc = serve_stats_fetch(es[i].url, timeout_ms, &ls, &nl);
        char why[512];
        snprintf(why, sizeof why, "%s", frc < 0 ? kiln_errmsg() : "");
        int64_t now = kiln_now_s();
        for (size_t k = i; rc == 0 && k < n; k++) {
            if (done[k] || strcmp(es[k].url, es[i].url) != 0)
                continue;
            done[k] = true;
            state_endpoint_stats_t x = {.at = now, .request_rate = NAN,
                                        .error = frc < 0 ? why : NULL};
            for (size_t m = 0; frc == 0 && m < nl; m++)
                if (strcmp(ls[m].model, es[k].model) == 0 && strcmp(ls[m].label, es[k].label) == 0) {
                    x.predict_requests = ls[m].predict_requests;
                    x.predict_rows = ls[m].predict_rows;
                }
            /* The rate since the last good read; none across a restart of
             * the endpoint (its counters start again). */
            if (frc == 0 && es[k].stats_at > 0 && es[k].stats_error == NULL && now > es[k].stats_at &&
                x.predict_requests >= es[k].predict_requests)
                x.request_rate = (double)(x.predict_requests - es[k].predict_requests) /
                                 (double)(now - es[k].stats_at);
            rc = state_endpoint_set_stats(st, es[k].id, &x);
        }
        free(ls);
    }
    free(done);
    state_endpoint_infos_free(es, n);
    return rc;
}
