/*
 * web/web_api.c - the JSON API under /api/ (the same data as the pages, read
 * through the same helpers of web_data.c) and the three state changes the
 * server accepts, all POSTs behind the token (checked by web.c before a
 * handler runs): cancel a run, retry a run, submit a job spec. The HTML forms
 * post to the same handlers and get a 303 back to the run's page.
 * docs/api.md describes every field.
 */
#include "web_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs.h"
#include "ops.h"

static json_t *jtime(int64_t t)
{
    if (t <= 0)
        return json_null();
    char buf[KILN_ISO_LEN];
    return json_string(kiln_time_iso(t, buf, sizeof buf));
}

static json_t *jnum(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *jstr(const char *s)
{
    return s ? json_string(s) : json_null();
}

static json_t *run_json(state_t *st, const state_run_t *run)
{
    web_run_figures_t fig;
    web_run_figures(st, run, &fig);
    int64_t dur = web_run_duration(run);
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(run->id));
    json_object_set_new(o, "job", json_string(run->job_name));
    json_object_set_new(o, "job_version", json_integer(run->job_version));
    json_object_set_new(o, "state", json_string(state_run_state_name(run->state)));
    json_object_set_new(o, "trigger", json_string(state_trigger_name(run->trigger)));
    json_object_set_new(o, "attempt", json_integer(run->attempt));
    json_object_set_new(o, "retry_of", run->retry_of ? json_integer(run->retry_of) : json_null());
    json_object_set_new(o, "scheduled_at", jtime(run->scheduled_at));
    json_object_set_new(o, "queued_at", jtime(run->queued_at));
    json_object_set_new(o, "started_at", jtime(run->started_at));
    json_object_set_new(o, "ended_at", jtime(run->ended_at));
    json_object_set_new(o, "duration_s", dur >= 0 ? json_integer(dur) : json_null());
    json_object_set_new(o, "exit_code", state_run_state_terminal(run->state)
                                            ? json_integer(run->exit_code)
                                            : json_null());
    json_object_set_new(o, "error", jstr(run->error));
    json_object_set_new(o, "host", jstr(run->host));
    json_object_set_new(o, "run_dir", jstr(run->run_dir));
    json_object_set_new(o, "cancel_requested", json_boolean(run->cancel_requested));
    json_object_set_new(o, "samples_per_s", jnum(fig.samples_per_s));
    json_object_set_new(o, "eval_logloss", jnum(fig.eval_logloss));
    json_object_set_new(o, "eval_auc", jnum(fig.eval_auc));
    return o;
}

static json_t *push_json(const state_push_t *p)
{
    return json_pack("{s:I, s:s, s:I, s:s, s:s, s:s, s:s, s:s, s:i, s:o, s:i, s:s, s:o, s:o}",
                     "id", (json_int_t)p->id, "checkpoint", p->checkpoint_uid, "endpoint_id",
                     (json_int_t)p->endpoint_id, "url", p->url, "model", p->model, "label",
                     p->label, "mode", state_push_mode_name(p), "state",
                     state_push_state_name(p->state), "http_status", p->http_status, "error",
                     jstr(p->error), "attempts", p->attempts, "reason",
                     p->reason ? p->reason : "", "created_at", jtime(p->created_at), "ended_at",
                     jtime(p->ended_at));
}

/* The pushes of a run's checkpoints, oldest first. */
static json_t *run_pushes_json(state_t *st, int64_t run_id, int *rc)
{
    state_push_filter_t f = {.run_id = run_id};
    state_push_t *ps = NULL;
    size_t n = 0;
    json_t *arr = json_array();
    *rc = state_push_list(st, &f, STATE_PAGE_MAX, &ps, &n);
    for (size_t i = n; i-- > 0;)
        json_array_append_new(arr, push_json(&ps[i]));
    state_pushes_free(ps, n);
    return arr;
}

/* ---- reads ----------------------------------------------------------------------------- */

int web_api_jobs(web_req_t *r)
{
    state_job_t *js = NULL;
    size_t n = 0;
    int rc = 0;
    KILN_CHECK(state_job_list(r->st, &js, &n));
    json_t *arr = json_array();
    int64_t now = kiln_now_s();
    for (size_t i = 0; i < n && rc == 0; i++) {
        state_job_last_t last;
        rc = state_job_last(r->st, js[i].id, &last);
        if (rc < 0)
            break;
        json_t *lr = last.last_run_id > 0
                         ? json_pack("{s:I, s:s}", "id", (json_int_t)last.last_run_id, "state",
                                     state_run_state_name(last.last_state))
                         : json_null();
        json_array_append_new(
            arr, json_pack("{s:I, s:s, s:i, s:s, s:o, s:o, s:b, s:o, s:o, s:o, s:o}", "id",
                           (json_int_t)js[i].id, "name", js[i].name, "version", js[i].version,
                           "spec_hash", js[i].spec_hash, "schedule", jstr(js[i].schedule),
                           "next_fire", jtime(web_next_fire(&js[i], now)), "paused",
                           js[i].paused, "last_run", lr, "last_success_at",
                           jtime(last.last_success_at), "created_at", jtime(js[i].created_at),
                           "updated_at", jtime(js[i].updated_at)));
    }
    state_jobs_free(js, n);
    if (rc < 0) {
        json_decref(arr);
        return rc;
    }
    return web_json_reply(r, json_pack("{s:o}", "jobs", arr));
}

int web_api_runs(web_req_t *r)
{
    int64_t before, limit, job_id = 0;
    int state = -1;
    KILN_CHECK(web_arg_i64(r, "before", 0, 0, INT64_MAX, &before));
    KILN_CHECK(web_arg_i64(r, "limit", WEB_PAGE_DEFAULT, 1, STATE_PAGE_MAX, &limit));
    const char *job = web_arg(r, "job"), *sname = web_arg(r, "state");
    if (job != NULL && *job) {
        state_job_t j;
        KILN_CHECK(state_job_get(r->st, job, &j));
        job_id = j.id;
        state_job_fini(&j);
    }
    if (sname != NULL && *sname) {
        state_run_state_t s;
        KILN_CHECK(state_run_state_parse(sname, &s));
        state = (int)s;
    }
    state_run_t *rs = NULL;
    size_t n = 0;
    KILN_CHECK(state_run_page(r->st, job_id, state, before, (int)limit + 1, &rs, &n));
    bool more = n > (size_t)limit;
    size_t shown = more ? n - 1 : n;
    json_t *arr = json_array();
    for (size_t i = 0; i < shown; i++)
        json_array_append_new(arr, run_json(r->st, &rs[i]));
    json_t *next = json_null();
    if (more && shown > 0)
        next = json_integer(rs[shown - 1].id);
    state_runs_free(rs, n);
    return web_json_reply(r, json_pack("{s:o, s:o, s:I}", "runs", arr, "next_before", next,
                                       "limit", (json_int_t)limit));
}

static json_t *events_json(state_t *st, int64_t run_id, int *rc)
{
    state_event_t *es = NULL;
    size_t n = 0;
    json_t *arr = json_array();
    *rc = state_event_list(st, 0, run_id, &es, &n);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, json_pack("{s:o, s:s, s:s}", "at", jtime(es[i].at), "kind",
                                             es[i].kind, "message", es[i].message));
    state_events_free(es, n);
    return arr;
}

static json_t *inputs_json(state_t *st, int64_t run_id, int *rc)
{
    state_input_t *ins = NULL;
    size_t n = 0;
    json_t *arr = json_array();
    *rc = state_input_list(st, run_id, &ins, &n);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, json_pack("{s:s, s:I, s:o, s:o}", "path", ins[i].path, "size",
                                             (json_int_t)ins[i].size, "mtime",
                                             jtime(ins[i].mtime), "checksum",
                                             jstr(ins[i].checksum)));
    state_inputs_free(ins, n);
    return arr;
}

/* Checkpoints of a run, each with its exports and pushes. */
static json_t *outputs_json(state_t *st, int64_t run_id, int *rc)
{
    state_checkpoint_t *cs = NULL;
    size_t n = 0;
    json_t *arr = json_array();
    *rc = state_checkpoint_list_by_run(st, run_id, &cs, &n);
    for (size_t i = 0; i < n && *rc == 0; i++) {
        state_served_t *sv = NULL;
        size_t ns = 0;
        json_t *served = json_array();
        *rc = state_lineage_served(st, cs[i].id, &sv, &ns);
        for (size_t k = 0; k < ns; k++) {
            json_t *push = json_null();
            if (sv[k].push_id > 0)
                push = json_pack("{s:I, s:o, s:i, s:I, s:o, s:o, s:o, s:b}", "id",
                                 (json_int_t)sv[k].push_id, "state", jstr(sv[k].push_state),
                                 "http_status", sv[k].http_status, "endpoint_id",
                                 (json_int_t)sv[k].endpoint_id, "url", jstr(sv[k].url),
                                 "model", jstr(sv[k].model), "label", jstr(sv[k].label),
                                 "holding", sv[k].holding);
            json_array_append_new(served,
                                  json_pack("{s:I, s:o, s:o, s:o}", "export_id",
                                            (json_int_t)sv[k].export_id, "format",
                                            jstr(sv[k].format), "path", jstr(sv[k].export_path),
                                            "push", push));
        }
        state_served_free(sv, ns);
        json_array_append_new(
            arr, json_pack("{s:I, s:s, s:s, s:o, s:I, s:I, s:I, s:s, s:o, s:o, s:o}", "id",
                           (json_int_t)cs[i].id, "uid", cs[i].uid, "kind", cs[i].kind,
                           "parent_id",
                           cs[i].parent_id ? json_integer(cs[i].parent_id) : json_null(), "step",
                           (json_int_t)cs[i].step, "keys", (json_int_t)cs[i].keys, "bytes",
                           (json_int_t)cs[i].bytes, "path", cs[i].path, "checksum",
                           jstr(cs[i].checksum), "created_at", jtime(cs[i].created_at),
                           "exports", served));
    }
    state_checkpoints_free(cs, n);
    return arr;
}

int web_api_run(web_req_t *r)
{
    state_run_t run;
    int rc = state_run_get(r->st, r->id, &run);
    if (rc == KILN_ENOENT)
        return kiln_errf(KILN_ENOENT, "no run %lld", (long long)r->id);
    KILN_CHECK(rc);
    json_t *doc = json_object();
    json_t *rj = run_json(r->st, &run);
    /* launcher: slurm: the Slurm job as kilnd last saw it; null for others. */
    state_slurm_job_t sj;
    if (state_slurm_job_get(r->st, run.id, &sj) == 0) {
        json_object_set_new(rj, "slurm",
                            json_pack("{s:I, s:o, s:o, s:o}", "job_id", (json_int_t)sj.job_id,
                                      "state", jstr(sj.state), "nodes", jstr(sj.nodes),
                                      "partition", jstr(sj.partition)));
        state_slurm_job_fini(&sj);
    } else {
        json_object_set_new(rj, "slurm", json_null());
    }
    json_object_set_new(doc, "run", rj);
    json_object_set_new(doc, "events", events_json(r->st, run.id, &rc));
    if (rc == 0)
        json_object_set_new(doc, "inputs", inputs_json(r->st, run.id, &rc));
    if (rc == 0)
        json_object_set_new(doc, "checkpoints", outputs_json(r->st, run.id, &rc));
    if (rc == 0)
        json_object_set_new(doc, "pushes", run_pushes_json(r->st, run.id, &rc));
    double *x = NULL, *y = NULL;
    size_t n = 0;
    if (rc == 0)
        rc = web_loss_series(r->st, &run, &x, &y, &n);
    if (rc == 0) {
        json_t *steps = json_array(), *loss = json_array();
        for (size_t i = 0; i < n; i++) {
            json_array_append_new(steps, json_integer((json_int_t)x[i]));
            json_array_append_new(loss, jnum(y[i]));
        }
        json_object_set_new(doc, "loss", json_pack("{s:o, s:o}", "step", steps, "loss", loss));
        char *tail = web_log_tail(&run, 16 * 1024);
        json_object_set_new(doc, "log_tail", jstr(tail));
        free(tail);
    }
    free(x);
    free(y);
    state_run_fini(&run);
    if (rc < 0) {
        json_decref(doc);
        return rc;
    }
    return web_json_reply(r, doc);
}

int web_api_log(web_req_t *r)
{
    state_run_t run;
    int rc = state_run_get(r->st, r->id, &run);
    if (rc == KILN_ENOENT)
        return kiln_errf(KILN_ENOENT, "no run %lld", (long long)r->id);
    KILN_CHECK(rc);
    char *tail = web_log_tail(&run, 1 << 20);
    state_run_fini(&run);
    if (tail == NULL)
        return kiln_errf(KILN_ENOENT, "run %lld has no log yet", (long long)r->id);
    web_buf_puts(&r->out, tail);
    free(tail);
    return 0;
}

int web_api_endpoints(web_req_t *r)
{
    state_endpoint_info_t *es = NULL;
    size_t n = 0;
    KILN_CHECK(state_endpoint_list(r->st, &es, &n));
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        const state_endpoint_info_t *e = &es[i];
        web_endpoint_view_t v;
        web_endpoint_view(es, n, i, &v);
        json_t *holds = e->checkpoint_id > 0
                            ? json_pack("{s:I, s:o, s:o, s:o, s:o, s:o}", "checkpoint_id",
                                        (json_int_t)e->checkpoint_id, "uid",
                                        jstr(e->checkpoint_uid), "since", jtime(e->since),
                                        "age_s", v.age_s >= 0 ? json_integer(v.age_s) : json_null(),
                                        "eval_logloss", jnum(e->eval_logloss), "eval_auc",
                                        jnum(e->eval_auc))
                            : json_null();
        json_t *traffic = json_pack("{s:o, s:I, s:I, s:o, s:o, s:o}", "share", jnum(v.share),
                                    "predict_requests", (json_int_t)e->predict_requests,
                                    "predict_rows", (json_int_t)e->predict_rows, "request_rate",
                                    jnum(e->request_rate), "read_at", jtime(e->stats_at),
                                    "error", jstr(e->stats_error));
        json_array_append_new(
            arr, json_pack("{s:I, s:s, s:o, s:o, s:o, s:o, s:{s:I, s:I, s:I, s:I}, s:o, s:o, "
                           "s:o}",
                           "id", (json_int_t)e->id, "url", e->url, "model", jstr(e->model),
                           "label", jstr(e->label), "holds", holds, "traffic", traffic,
                           "pushes", "succeeded", (json_int_t)e->pushes_succeeded, "failed",
                           (json_int_t)e->pushes_failed, "pending",
                           (json_int_t)e->pushes_pending, "held", (json_int_t)e->pushes_held,
                           "last_push_at", jtime(e->last_push_at), "last_error",
                           jstr(e->last_error), "last_http_status",
                           e->last_http_status ? json_integer(e->last_http_status)
                                               : json_null()));
    }
    state_endpoint_infos_free(es, n);
    return web_json_reply(r, json_pack("{s:o}", "endpoints", arr));
}

int web_api_lineage_ckpt(web_req_t *r)
{
    web_graph_t *g = kiln_malloc(sizeof *g);
    if (g == NULL)
        return KILN_ENOMEM;
    int rc = web_graph_checkpoint(r->st, r->id, g);
    if (rc == 0)
        rc = web_json_reply(r, web_graph_json(g));
    free(g);
    return rc;
}

int web_api_lineage_endpoint(web_req_t *r)
{
    web_graph_t *g = kiln_malloc(sizeof *g);
    if (g == NULL)
        return KILN_ENOMEM;
    state_holding_t *hs = NULL;
    size_t nh = 0;
    int rc = web_graph_endpoint(r->st, r->id, g);
    if (rc == 0)
        rc = state_endpoint_history(r->st, r->id, 50, &hs, &nh);
    if (rc == 0) {
        json_t *doc = web_graph_json(g);
        json_t *arr = json_array();
        for (size_t i = 0; i < nh; i++)
            json_array_append_new(arr, json_pack("{s:I, s:o, s:o, s:o}", "checkpoint_id",
                                                 (json_int_t)hs[i].checkpoint_id, "uid",
                                                 jstr(hs[i].checkpoint_uid), "since",
                                                 jtime(hs[i].since), "until",
                                                 jtime(hs[i].until_at)));
        json_object_set_new(doc, "holdings", arr);
        rc = web_json_reply(r, doc);
    }
    state_holdings_free(hs, nh);
    free(g);
    return rc;
}

/* ---- state changes (POST, token checked by web.c) -------------------------------------- */

/* Answers an action: a 303 to the run's page for the HTML forms, JSON else. */
static int acted(web_req_t *r, int64_t run_id, json_t *doc)
{
    if (r->kind == WEB_FORM) {
        json_decref(doc);
        r->status = 303;
        r->location = kiln_asprintf("/runs/%lld", (long long)run_id);
        web_buf_puts(&r->out, "<!DOCTYPE html><p>done</p>\n");
        return r->location ? 0 : KILN_ENOMEM;
    }
    return web_json_reply(r, doc);
}

int web_act_cancel(web_req_t *r)
{
    bool done = false;
    int rc = ops_cancel(r->st, r->id, &done);
    if (rc == KILN_ENOENT)
        return kiln_errf(KILN_ENOENT, "no run %lld", (long long)r->id);
    KILN_CHECK(rc);
    return acted(r, r->id,
                 json_pack("{s:I, s:b, s:s}", "run_id", (json_int_t)r->id, "canceled", done,
                           "state", done ? "canceled" : "cancel_requested"));
}

int web_act_retry(web_req_t *r)
{
    int64_t new_id = 0;
    int attempt = 0;
    int rc = ops_retry(r->st, r->id, "the web API", &new_id, &attempt);
    if (rc == KILN_ENOENT)
        return kiln_errf(KILN_ENOENT, "no run %lld", (long long)r->id);
    KILN_CHECK(rc);
    return acted(r, new_id,
                 json_pack("{s:I, s:I, s:i}", "run_id", (json_int_t)new_id, "retry_of",
                           (json_int_t)r->id, "attempt", attempt));
}

int web_act_submit(web_req_t *r)
{
    job_diags_t diags;
    job_diags_init(&diags);
    ops_submitted_t sub;
    ops_submit_t in = {r->body, r->body_len, NULL, "the web API", false};
    int rc = ops_submit(r->st, &in, &diags, &sub);
    if (rc == KILN_ESPEC) {
        json_t *probs = json_array();
        for (size_t i = 0; i < diags.n; i++)
            json_array_append_new(probs, json_string(diags.items[i].message));
        job_diags_fini(&diags);
        r->status = 400;
        return web_json_reply(r, json_pack("{s:i, s:s, s:o}", "status", 400, "error",
                                           "invalid job spec; nothing was submitted", "problems",
                                           probs));
    }
    job_diags_fini(&diags);
    KILN_CHECK(rc);
    r->status = 201;
    rc = web_json_reply(r, json_pack("{s:s, s:I, s:i, s:b, s:o, s:o, s:o}", "job", sub.spec.name,
                                     "job_id", (json_int_t)sub.r.job_id, "version", sub.r.version,
                                     "created", sub.r.created, "run_id",
                                     sub.r.run_id ? json_integer(sub.r.run_id) : json_null(),
                                     "schedule", jstr(sub.spec.schedule), "next_fire",
                                     jtime(sub.next_fire)));
    ops_submitted_fini(&sub);
    return rc;
}
