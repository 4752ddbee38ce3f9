/*
 * ops/ops_push.c - what gets pushed where. After a run succeeds, kilnd
 * queues its final checkpoint for every `auto` endpoint of the job, as
 * export.on_success says (full or a delta), in the transaction that records
 * the success; an online export is queued the same way while the run trains.
 * `kiln push`, `kiln promote` and `kiln rollback` queue theirs claimed by the
 * command and deliver them at once (ops_deliver.c).
 */
#include "ops_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ops_push_report_fini(ops_push_report_t *r)
{
    if (r == NULL)
        return;
    state_pushes_free(r->pushes, r->n);
    memset(r, 0, sizeof *r);
}

/* One push request per endpoint of spec with label (NULL: any), only the
 * `auto` ones when only_auto. *reqs is malloc'd; its strings are borrowed
 * from spec. */
static int reqs_for(const job_spec_t *spec, const char *label, bool only_auto, int64_t ckpt_id,
                    bool full, bool gated, const char *reason, const char *token_env,
                    state_push_req_t **reqs, size_t *n)
{
    *reqs = kiln_calloc((size_t)spec->push.nendpoints + 1, sizeof **reqs);
    *n = 0;
    if (*reqs == NULL)
        return KILN_ENOMEM;
    for (int i = 0; i < spec->push.nendpoints; i++) {
        const job_endpoint_t *e = &spec->push.endpoints[i];
        if ((label != NULL && strcmp(e->label, label) != 0) || (only_auto && !e->auto_push))
            continue;
        (*reqs)[(*n)++] = (state_push_req_t){e->url,  e->model, e->label,  ckpt_id,
                                             full,    reason,   token_env, !gated};
    }
    return 0;
}

/* ---- after a run, after an export (kilnd) ------------------------------------------------- */

int ops_run_succeeded(state_t *st, int64_t run_id, const job_spec_t *spec, const char *ckpt_uid,
                      int exit_code, int64_t ended_at, int *npushes)
{
    state_push_req_t *reqs = NULL;
    size_t n = 0;
    state_checkpoint_t c = {0};
    char reason[64];
    int rc = 0;
    if (npushes != NULL)
        *npushes = 0;
    snprintf(reason, sizeof reason, "run %lld succeeded", (long long)run_id);
    bool wants = spec != NULL && spec->export_.on_success != JOB_EXPORT_NONE &&
                 spec->push.nendpoints > 0;
    if (wants && (ckpt_uid == NULL || ckpt_uid[0] == '\0' ||
                  state_checkpoint_get(st, ckpt_uid, &c) < 0)) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s with export.on_success: %s but recorded no checkpoint%s%s: "
                 "nothing to push",
                 reason, job_export_mode_name(spec->export_.on_success),
                 ckpt_uid && ckpt_uid[0] ? " " : "", ckpt_uid ? ckpt_uid : "");
        state_event_add(st, 0, run_id, "push", msg);
        wants = false;
    }
    if (wants)
        KILN_CHECK_GOTO(reqs_for(spec, NULL, true, c.id,
                                 spec->export_.on_success == JOB_EXPORT_FULL, true, reason, NULL,
                                 &reqs, &n),
                        rc, out);
    rc = state_run_succeed(st, run_id, STATE_RUN_RUNNING, exit_code, ended_at, reqs, n, NULL);
    if (rc == KILN_ESTATE) /* it ended before kilnd saw it running */
        rc = state_run_succeed(st, run_id, STATE_RUN_LAUNCHING, exit_code, ended_at, reqs, n,
                               NULL);
    if (rc == 0 && npushes != NULL)
        *npushes = (int)n;
out:
    free(reqs);
    state_checkpoint_fini(&c);
    return rc;
}

int ops_after_export(state_t *st, int64_t run_id, const job_spec_t *spec, int64_t checkpoint_id,
                     int *npushes)
{
    *npushes = 0;
    state_push_filter_t f = {.checkpoint_id = checkpoint_id};
    state_push_t *old = NULL;
    size_t nold = 0;
    KILN_CHECK(state_push_list(st, &f, 1, &old, &nold));
    state_pushes_free(old, nold);
    if (nold > 0)
        return 0; /* queued before: a restarted kilnd sees the export again */
    state_run_t r;
    KILN_CHECK(state_run_get(st, run_id, &r));
    int64_t job_id = r.job_id;
    state_run_fini(&r);
    char reason[64];
    snprintf(reason, sizeof reason, "online export of run %lld", (long long)run_id);
    state_push_req_t *reqs = NULL;
    size_t n = 0;
    int rc = reqs_for(spec, NULL, true, checkpoint_id,
                      spec->export_.on_success == JOB_EXPORT_FULL, true, reason, NULL, &reqs, &n);
    if (rc == 0 && n > 0)
        rc = state_push_enqueue(st, job_id, run_id, reqs, n, NULL, 0, NULL);
    if (rc == 0)
        *npushes = (int)n;
    free(reqs);
    return rc;
}

/* ---- deliberate pushes (CLI, web) ----------------------------------------------------------- */

/* A claim's lease for pushes delivered by the command that queued them: long
 * enough for any push; a command that dies is noticed by its pid. */
#define OPS_CLAIM_LEASE_MS (3600 * 1000)

/* Queues reqs for job_id / run_id claimed by this process, delivers them and
 * fills rep. spec: the job's current spec (of version `version`) when the
 * caller parsed it, so that delivery does not parse it again; or NULL. */
static int queue_and_deliver(state_t *st, int64_t job_id, int64_t run_id,
                             const state_push_req_t *reqs, size_t n, const char *uid,
                             const job_spec_t *spec, int version, ops_push_report_t *rep)
{
    int64_t *ids = kiln_calloc(n + 1, sizeof *ids);
    state_push_t *ps = kiln_calloc(n + 1, sizeof *ps);
    char *claimer = ops_claimer("kiln");
    size_t got = 0;
    int rc = 0;
    snprintf(rep->checkpoint, sizeof rep->checkpoint, "%s", uid);
    if (ids == NULL || ps == NULL || claimer == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    KILN_CHECK_GOTO(state_push_enqueue(st, job_id, run_id, reqs, n, claimer, OPS_CLAIM_LEASE_MS,
                                       ids),
                    rc, out);
    for (; got < n; got++)
        KILN_CHECK_GOTO(state_push_get(st, ids[got], &ps[got]), rc, out);
    KILN_CHECK_GOTO(spec != NULL ? ops_deliver_spec(st, claimer, ps, got, spec, version)
                                 : ops_deliver(st, claimer, ps, got),
                    rc, out);
    /* How each stands now. */
    for (size_t i = 0; i < got; i++) {
        state_push_fini(&ps[i]);
        KILN_CHECK_GOTO(state_push_get(st, ids[i], &ps[i]), rc, out);
        rep->nsucceeded += ps[i].state == STATE_PUSH_SUCCEEDED;
        rep->nfailed += ps[i].state == STATE_PUSH_FAILED;
        rep->nheld += ps[i].state == STATE_PUSH_HELD;
        rep->npending += ps[i].state == STATE_PUSH_PENDING || ps[i].state == STATE_PUSH_SENDING;
    }
    rep->pushes = ps;
    rep->n = got;
    ps = NULL;
    /* The first push that did not land names the endpoint and the status. */
    for (size_t i = 0; i < rep->n; i++) {
        const state_push_t *p = &rep->pushes[i];
        if (p->state == STATE_PUSH_SUCCEEDED)
            continue;
        const char *what = p->state == STATE_PUSH_HELD      ? "held back by the quality gate"
                           : p->state == STATE_PUSH_FAILED  ? "failed"
                                                            : "did not land yet (kilnd retries it)";
        char status[32] = "";
        if (p->http_status != 0)
            snprintf(status, sizeof status, "HTTP %d: ", p->http_status);
        rc = kiln_errf(p->state == STATE_PUSH_HELD ? KILN_ECONFLICT : KILN_EHTTP,
                       "push %lld of %s to %s (%s/%s) %s: %s%s", (long long)p->id, uid, p->url,
                       p->model, p->label, what, status,
                       p->error != NULL ? p->error : "no error recorded");
        break;
    }
out:
    state_pushes_free(ps, got);
    free(ids);
    free(claimer);
    return rc;
}

/* Whether checkpoint `held` is ckpt_id or one of its bases back to the full
 * dump it builds on: a delta from held can then be sent. */
static bool in_chain(state_t *st, int64_t ckpt_id, int64_t held)
{
    for (int hops = 0; ckpt_id > 0 && hops < 100000; hops++) {
        if (ckpt_id == held)
            return true;
        state_checkpoint_t c = {0};
        if (state_checkpoint_get_by_id(st, ckpt_id, &c) < 0)
            return false;
        bool full = c.kind != NULL && strcmp(c.kind, "full") == 0;
        ckpt_id = full ? 0 : c.parent_id;
        state_checkpoint_fini(&c);
    }
    return false;
}

void ops_push_foresee(state_t *st, state_push_t *ps, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        state_push_t *p = &ps[i];
        if (p->full || p->export_id > 0 || p->state == STATE_PUSH_SUCCEEDED)
            continue; /* asked for full, or it sent a body: its own mode says */
        int64_t held = 0, since = 0;
        if (state_endpoint_holding(st, p->endpoint_id, &held, &since) < 0 ||
            !in_chain(st, p->checkpoint_id, held))
            p->full = true;
    }
}

/* The job that wrote checkpoint c (0 when unknown). */
static int64_t job_of_checkpoint(state_t *st, const state_checkpoint_t *c)
{
    state_run_t r;
    if (c->run_id <= 0 || state_run_get(st, c->run_id, &r) < 0)
        return 0;
    int64_t id = r.job_id;
    state_run_fini(&r);
    return id;
}

int ops_push_job(state_t *st, const char *job_name, const char *label, const char *ckpt_uid,
                 bool full, bool force, ops_push_report_t *rep)
{
    state_job_t job = {0};
    job_spec_t spec = {0};
    state_checkpoint_t c = {0};
    state_push_req_t *reqs = NULL;
    size_t n = 0;
    bool have_spec = false;
    int rc;
    memset(rep, 0, sizeof *rep);
    KILN_CHECK(state_job_get(st, job_name, &job));
    KILN_CHECK_GOTO(job_spec_parse(job.spec_yaml, strlen(job.spec_yaml), job.name, &spec, NULL),
                    rc, out);
    have_spec = true;
    if (ckpt_uid != NULL)
        rc = state_checkpoint_get(st, ckpt_uid, &c);
    else if ((rc = state_checkpoint_latest(st, job.id, &c)) == KILN_ENOENT)
        rc = kiln_errf(KILN_ENOENT, "job %s has no checkpoint yet", job_name);
    if (rc < 0)
        goto out;
    const char *reason = full ? "kiln push --full" : "kiln push";
    KILN_CHECK_GOTO(reqs_for(&spec, label, false, c.id, full, !force, reason, NULL, &reqs, &n), rc,
                    out);
    if (n == 0) {
        rc = kiln_errf(KILN_ENOENT, "job %s has no push endpoint with label %s (spec push."
                                    "endpoints)",
                       job_name, label ? label : "(any)");
        goto out;
    }
    rc = queue_and_deliver(st, job.id, c.run_id, reqs, n, c.uid, &spec, job.version, rep);
out:
    free(reqs);
    state_checkpoint_fini(&c);
    if (have_spec)
        job_spec_fini(&spec);
    state_job_fini(&job);
    return rc;
}

/* The endpoints of model/label, and the checkpoint the newest of them holds. */
static int label_endpoints(state_t *st, const char *model, const char *label,
                           state_endpoint_info_t **eps, size_t *n, int64_t *held)
{
    state_endpoint_info_t *all = NULL;
    size_t na = 0, k = 0;
    int64_t since = -1;
    *held = 0;
    KILN_CHECK(state_endpoint_list(st, &all, &na));
    /* Keep the label's endpoints at the front, in order; drop the rest. */
    for (size_t i = 0; i < na; i++) {
        if (strcmp(all[i].model, model) != 0 || strcmp(all[i].label, label) != 0) {
            state_endpoint_info_fini(&all[i]);
            continue;
        }
        if (all[i].checkpoint_id > 0 && all[i].since > since) {
            since = all[i].since;
            *held = all[i].checkpoint_id;
        }
        all[k++] = all[i];
    }
    if (k == 0) {
        free(all);
        return kiln_errf(KILN_ENOENT,
                         "no endpoint of model %s has label %s; list it in a job's "
                         "push.endpoints (with auto: false for one that only promote and "
                         "rollback change) and submit the job",
                         model, label);
    }
    *eps = all;
    *n = k;
    return 0;
}

/* Pushes checkpoint ckpt_id to every endpoint of model/label, without the
 * quality gate (a person decided). */
static int push_to_label(state_t *st, int64_t ckpt_id, const char *model, const char *label,
                         const char *token_env, const char *reason, ops_push_report_t *rep)
{
    state_checkpoint_t c = {0};
    state_endpoint_info_t *eps = NULL;
    size_t n = 0;
    int64_t unused;
    state_push_req_t *reqs = NULL;
    int rc;
    KILN_CHECK(state_checkpoint_get_by_id(st, ckpt_id, &c));
    KILN_CHECK_GOTO(label_endpoints(st, model, label, &eps, &n, &unused), rc, out);
    reqs = kiln_calloc(n + 1, sizeof *reqs);
    if (reqs == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        reqs[i] = (state_push_req_t){eps[i].url, eps[i].model, eps[i].label, c.id, false, reason,
                                     token_env, true};
    rc = queue_and_deliver(st, job_of_checkpoint(st, &c), c.run_id, reqs, n, c.uid, NULL, 0,
                           rep);
out:
    free(reqs);
    state_endpoint_infos_free(eps, n);
    state_checkpoint_fini(&c);
    return rc;
}

int ops_promote(state_t *st, const char *model, const char *from, const char *to,
                const char *token_env, bool force, ops_push_report_t *rep)
{
    state_endpoint_info_t *eps = NULL;
    size_t n = 0;
    int64_t held = 0;
    memset(rep, 0, sizeof *rep);
    KILN_CHECK(label_endpoints(st, model, from, &eps, &n, &held));
    state_endpoint_infos_free(eps, n);
    if (held == 0)
        return kiln_errf(KILN_ENOENT, "no endpoint of %s/%s holds a checkpoint yet", model, from);
    if (!force)
        KILN_CHECK(ops_promote_check(st, model, from, to, rep->note, sizeof rep->note));
    char why[160];
    snprintf(why, sizeof why, "promote %s -> %s", from, to);
    return push_to_label(st, held, model, to, token_env, why, rep);
}

int ops_rollback(state_t *st, const char *model, const char *label, const char *token_env,
                 ops_push_report_t *rep)
{
    state_endpoint_info_t *eps = NULL;
    size_t n = 0;
    int64_t held = 0;
    memset(rep, 0, sizeof *rep);
    KILN_CHECK(label_endpoints(st, model, label, &eps, &n, &held));
    /* The previous checkpoint: the newest holding of the label's endpoints
     * that is not the current one. */
    int64_t prev = 0, prev_since = -1;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
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
    state_endpoint_infos_free(eps, n);
    KILN_CHECK(rc);
    if (prev == 0)
        return kiln_errf(KILN_ENOENT, "%s/%s never held another checkpoint: nothing to roll "
                                      "back to",
                         model, label);
    char why[160];
    snprintf(why, sizeof why, "rollback of %s", label);
    return push_to_label(st, prev, model, label, token_env, why, rep);
}
