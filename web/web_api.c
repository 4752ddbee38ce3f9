/*
 * web/web_api.c - the JSON API under /api/ (the same data as the pages, read
 * through the same helpers of web_data.c) and the three state changes the
 * server accepts, all POSTs behind the token (checked by web.c before a
 * handler runs): cancel a run, retry a run, submit a job spec. The HTML forms
 * post to the same handlers and get a 303 back to the run's page.
 * docs/api.md describes every field.
 */
#include "kiln_json.h"
#include "web_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs.h"
#include "ops.h"

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
    json_object_set_new(o, "scheduled_at", kiln_json_time(run->scheduled_at));
    json_object_set_new(o, "queued_at", kiln_json_time(run->queued_at));
    json_object_set_new(o, "started_at", kiln_json_time(run->started_at));
    json_object_set_new(o, "ended_at", kiln_json_time(run->ended_at));
    json_object_set_new(o, "duration_s", dur >= 0 ? json_integer(dur) : json_null());
    json_object_set_new(o, "exit_code", state_run_state_terminal(run->state)
                                            ? json_integer(run->exit_code)
                                            : json_null());
    json_object_set_new(o, "error", kiln_json_str(run->error));
    json_object_set_new(o, "host", kiln_json_str(run->host));
    json_object_set_new(o, "run_dir", kiln_json_str(run->run_dir));
    json_object_set_new(o, "cancel_requested", json_boolean(run->cancel_requested));
    json_object_set_new(o, "samples_per_s", kiln_json_num(fig.samples_per_s));
    json_object_set_new(o, "eval_logloss", kiln_json_num(fig.eval_logloss));
    json_object_set_new(o, "eval_auc", kiln_json_num(fig.eval_auc));
    return o;
}

static json_t *push_json(const state_push_t *p)
{
    return json_pack("{s:I, s:s, s:I, s:s, s:s, s:s, s:s, s:s, s:i, s:o, s:i, s:s, s:o, s:o}", "id",
                     (json_int_t)p->id, "checkpoint", p->checkpoint_uid, "endpoint_id",
                     (json_int_t)p->endpoint_id, "url", p->url, "model", p->model, "label",
                     p->label, "mode", state_push_mode_name(p), "state",
                     state_push_state_name(p->state), "http_status", p->http_status, "error",
                     kiln_json_str(p->error), "attempts", p->attempts, "reason",
                     p->reason ? p->reason : "", "created_at", kiln_json_time(p->created_at),
                     "ended_at", kiln_json_time(p->ended_at));
}

/* The pushes of a run's checkpoints, oldest first. */
static json_t *run_pushes_json(state_t *st, int64_t run_id, int *rc)
{
    state_push_filter_t f = {.run_id = run_id};
    state_push_t *ps = NULL;
    size_t n = 0;
    json_t *arr = json_array();
    *rc = state_push_list(st, &f, STATE_PAGE_MAX, &ps, &n);
    ops_push_foresee(st, ps, n);
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
            arr, json_pack("{s:I, s:s, s:i, s:s, s:o, s:o, s:b, s:o, s:o, s:o, s:o, s:I, s:o, "
                           "s:o}",
                           "id", (json_int_t)js[i].id, "name", js[i].name, "version",
                           js[i].version, "spec_hash", js[i].spec_hash, "schedule",
                           kiln_json_str(js[i].schedule), "next_fire",
                           kiln_json_time(web_next_fire(&js[i], now)), "paused", js[i].paused,
                           "last_run", lr, "last_success_at",
                           kiln_json_time(last.last_success_at), "created_at",
                           kiln_json_time(js[i].created_at), "updated_at",
                           kiln_json_time(js[i].updated_at), "skipped_fires",
                           (json_int_t)js[i].skipped_fires, "last_checked_at",
                           kiln_json_time(js[i].last_checked_at), "last_skip_reason",
                           kiln_json_str(js[i].last_skip_reason)));
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
        json_array_append_new(arr, json_pack("{s:o, s:s, s:s}", "at", kiln_json_time(es[i].at),
                                             "kind", es[i].kind, "message", es[i].message));
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
                                             kiln_json_time(ins[i].mtime), "checksum",
                                             kiln_json_str(ins[i].checksum)));
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
                                 (json_int_t)sv[k].push_id, "state",
                                 kiln_json_str(sv[k].push_state), "http_status", sv[k].http_status,
                                 "endpoint_id", (json_int_t)sv[k].endpoint_id, "url",
                                 kiln_json_str(sv[k].url), "model", kiln_json_str(sv[k].model),
                                 "label", kiln_json_str(sv[k].label), "holding", sv[k].holding);
            json_array_append_new(
                served, json_pack("{s:I, s:o, s:o, s:o}", "export_id", (json_int_t)sv[k].export_id,
                                  "format", kiln_json_str(sv[k].format), "path",
                                  kiln_json_str(sv[k].export_path), "push", push));
        }
        state_served_free(sv, ns);
        json_array_append_new(
            arr, json_pack("{s:I, s:s, s:s, s:o, s:I, s:I, s:I, s:s, s:o, s:o, s:o}", "id",
                           (json_int_t)cs[i].id, "uid", cs[i].uid, "kind", cs[i].kind, "parent_id",
                           cs[i].parent_id ? json_integer(cs[i].parent_id) : json_null(), "step",
                           (json_int_t)cs[i].step, "keys", (json_int_t)cs[i].keys, "bytes",
                           (json_int_t)cs[i].bytes, "path", cs[i].path, "checksum",
                           kiln_json_str(cs[i].checksum), "created_at",
                           kiln_json_time(cs[i].created_at), "exports", served));
    }
    state_checkpoints_free(cs, n);
    return arr;
}

int web_api_run(web_req_t *r)
{
    state_run_t run;
    int rc = web_req_run(r, &run);
    KILN_CHECK(rc);
    json_t *doc = json_object();
    json_t *rj = run_json(r->st, &run);
    /* launcher: slurm: the Slurm job as kilnd last saw it; null for others. */
    state_slurm_job_t sj;
    if (state_slurm_job_get(r->st, run.id, &sj) == 0) {
        json_object_set_new(rj, "slurm",
                            json_pack("{s:I, s:o, s:o, s:o}", "job_id", (json_int_t)sj.job_id,
                                      "state", kiln_json_str(sj.state), "nodes",
                                      kiln_json_str(sj.nodes), "partition",
                                      kiln_json_str(sj.partition)));
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
            json_array_append_new(loss, kiln_json_num(y[i]));
        }
        json_object_set_new(doc, "loss", json_pack("{s:o, s:o}", "step", steps, "loss", loss));
        char *tail = web_log_tail(&run, 16 * 1024);
        json_object_set_new(doc, "log_tail", kiln_json_str(tail));
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
    int rc = web_req_run(r, &run);
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
    json_t *doc = NULL;
    KILN_CHECK(ops_endpoints_json(r->st, &doc));
    return web_json_reply(r, doc);
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
                                                 kiln_json_str(hs[i].checkpoint_uid), "since",
                                                 kiln_json_time(hs[i].since), "until",
                                                 kiln_json_time(hs[i].until_at)));
        json_object_set_new(doc, "holdings", arr);
        rc = web_json_reply(r, doc);
    }
    state_holdings_free(hs, nh);
    free(g);
    return rc;
}

/* ---- state changes (POST, token checked by web.c) -------------------------------------- */

/* Answers an action: a 303 to `page` (a format with one %lld, the id, or
 * none) for the HTML forms, JSON else. */
static int acted_at(web_req_t *r, const char *page, int64_t id, json_t *doc)
{
    if (r->kind == WEB_FORM) {
        json_decref(doc);
        r->status = 303;
        r->location = kiln_asprintf(page, (long long)id);
        web_buf_puts(&r->out, "<!DOCTYPE html><p>done</p>\n");
        return r->location ? 0 : KILN_ENOMEM;
    }
    return web_json_reply(r, doc);
}

static int acted(web_req_t *r, int64_t run_id, json_t *doc)
{
    return acted_at(r, "/runs/%lld", run_id, doc);
}

static int job_rc(const web_req_t *r, int rc)
{
    if (rc == KILN_ENOENT)
        return kiln_errf(KILN_ENOENT, "no job %lld", (long long)r->id);
    return rc;
}

static int job_pause(web_req_t *r, bool pause)
{
    bool changed = false;
    KILN_CHECK(job_rc(r, ops_job_pause(r->st, r->id, pause, &changed)));
    return acted_at(r, "/jobs/%lld", r->id,
                    json_pack("{s:I, s:b, s:b}", "job_id", (json_int_t)r->id, "paused", pause,
                              "changed", changed));
}

int web_act_pause(web_req_t *r)
{
    return job_pause(r, true);
}

int web_act_resume(web_req_t *r)
{
    return job_pause(r, false);
}

/* ?cancel=1 (the API) or a checked "cancel" box (the job page's form). */
int web_act_delete(web_req_t *r)
{
    const char *q = web_arg(r, "cancel");
    char *f = r->kind == WEB_FORM ? web_form_value(r->body, r->body_len, "cancel") : NULL;
    bool cancel = (q != NULL && strcmp(q, "0") != 0) || (f != NULL && strcmp(f, "0") != 0);
    free(f);
    int stopped = 0;
    KILN_CHECK(job_rc(r, ops_job_delete(r->st, r->id, cancel, &stopped)));
    return acted_at(r, "/jobs", r->id, /* the job's page is gone from the list: the list */
                    json_pack("{s:I, s:b, s:i}", "job_id", (json_int_t)r->id, "deleted", true,
                              "runs_stopped", stopped));
}

int web_act_cancel(web_req_t *r)
{
    bool done = false;
    KILN_CHECK(web_run_rc(r, ops_cancel(r->st, r->id, &done)));
    return acted(r, r->id,
                 json_pack("{s:I, s:b, s:s}", "run_id", (json_int_t)r->id, "canceled", done,
                           "state", done ? "canceled" : "cancel_requested"));
}

int web_act_retry(web_req_t *r)
{
    int64_t new_id = 0;
    int attempt = 0;
    KILN_CHECK(web_run_rc(r, ops_retry(r->st, r->id, "the web API", &new_id, &attempt)));
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
            json_array_append_new(probs, kiln_json_str(diags.items[i].message));
        job_diags_fini(&diags);
        r->status = 400;
        return web_json_reply(r, json_pack("{s:i, s:s, s:o}", "status", 400, "error",
                                           "invalid job spec; nothing was submitted", "problems",
                                           probs));
    }
    job_diags_fini(&diags);
    KILN_CHECK(rc);
    r->status = 201;
    rc = web_json_reply(
        r, json_pack("{s:s, s:I, s:i, s:b, s:o, s:o, s:o}", "job", sub.spec.name, "job_id",
                     (json_int_t)sub.r.job_id, "version", sub.r.version, "created", sub.r.created,
                     "run_id", sub.r.run_id ? json_integer(sub.r.run_id) : json_null(), "schedule",
                     kiln_json_str(sub.spec.schedule), "next_fire", kiln_json_time(sub.next_fire)));
    ops_submitted_fini(&sub);
    return rc;
}

/* POST /api/split {"model": M, "split": "A=90,B=10"} and the endpoints page's
 * form (model, split): sets the model's traffic split on its kiln-serves
 * (ops_split, with kilnd's push token). 200 (the form: 303 to /endpoints)
 * with what each kiln-serve holds now; 502 when one did not take it. */
int web_act_split(web_req_t *r)
{
    char *model = NULL, *split = NULL;
    if (r->kind == WEB_FORM) {
        model = web_form_value(r->body, r->body_len, "model");
        split = web_form_value(r->body, r->body_len, "split");
    } else {
        json_t *doc = json_loadb(r->body ? r->body : "", r->body_len, 0, NULL);
        const char *m = json_string_value(json_object_get(doc, "model"));
        const char *s = json_string_value(json_object_get(doc, "split"));
        model = m ? kiln_strdup(m) : NULL;
        split = s ? kiln_strdup(s) : NULL;
        json_decref(doc);
    }
    int rc = 0;
    ops_split_report_t rep = {0};
    if (model == NULL || split == NULL || model[0] == '\0' || split[0] == '\0') {
        rc = kiln_errf(KILN_EINVAL, "a split wants a model and a split, e.g. "
                                    "{\"model\": \"ctr\", \"split\": \"A=90,B=10\"}");
        goto out;
    }
    rc = ops_split(r->st, model, split, NULL, &rep);
    if (rc < 0 && rc != KILN_EHTTP)
        goto out;
    if (rc == 0 && r->kind == WEB_FORM) {
        r->status = 303;
        r->location = kiln_strdup("/endpoints");
        web_buf_puts(&r->out, "<!DOCTYPE html><p>done</p>\n");
        rc = r->location ? 0 : KILN_ENOMEM;
        goto out;
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < rep.n; i++) {
        const serve_split_result_t *e = &rep.results[i];
        json_array_append_new(arr, json_pack("{s:s, s:i, s:s, s:s, s:s}", "url", rep.urls[i],
                                             "http_status", e->http_status, "split", e->split,
                                             "no_traffic", e->no_traffic, "error", e->error));
    }
    json_t *doc = json_pack("{s:s, s:s, s:b, s:o}", "model", model, "split", split, "ok", rc == 0,
                            "endpoints", arr);
    if (rc < 0) {
        json_object_set_new(doc, "error", kiln_json_str(kiln_errmsg()));
        r->status = 502;
        r->kind = WEB_JSON;
    }
    rc = web_json_reply(r, doc);
out:
    ops_split_report_fini(&rep);
    free(model);
    free(split);
    return rc;
}
