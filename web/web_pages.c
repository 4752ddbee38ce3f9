/*
 * web/web_pages.c - the HTML pages: jobs, runs (paged), one run (timeline,
 * loss curve, inputs, checkpoints, exports and pushes, log tail, error,
 * cancel/retry forms), endpoints, and lineage graphs. Server-rendered, no
 * script: a running run's page refreshes itself with <meta http-equiv>.
 * Every value goes into the page through web_esc.
 */
#include "web_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char css[] =
    "body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#202124;background:#fafafa}"
    "header{background:#3c1f0f;color:#fff;padding:8px 16px;display:flex;gap:18px;"
    "align-items:baseline}header b{font-size:18px;margin-right:12px}"
    "header a{color:#ffd8b0;text-decoration:none}main{padding:12px 16px}"
    "table{border-collapse:collapse;background:#fff;margin:6px 0 14px}"
    "th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;white-space:nowrap}"
    "th{background:#f1f3f4}td.num{text-align:right;font-variant-numeric:tabular-nums}"
    ".st{padding:1px 6px;border-radius:8px;font-size:12px}"
    ".st-succeeded{background:#e6f4ea;color:#137333}.st-failed,.st-timed_out{background:#fce8e6;"
    "color:#a50e0e}.st-running,.st-launching{background:#e8f0fe;color:#1967d2}"
    ".st-queued,.st-paused{background:#fef7e0;color:#b06000}"
    ".st-active{background:#e6f4ea;color:#137333}"
    ".st-canceled,.st-skipped,.st-deleted{background:#eee;"
    "color:#555}pre.log{background:#111;color:#ddd;padding:8px;max-height:420px;overflow:auto;"
    "font-size:12px}.error{background:#fce8e6;border:1px solid #d93025;padding:6px 10px}"
    "dl.kv{display:grid;grid-template-columns:max-content auto;gap:2px 14px}dl.kv dt{color:#555}"
    "dl.kv dd{margin:0}form.act{display:inline-block;margin-right:12px}"
    "nav.pages a{margin-right:14px}h2{font-size:16px;margin:18px 0 4px}";

/* One navigation entry per top page. */
static const struct {
    const char *href, *label;
} nav[] = {
    {"/jobs", "Jobs"}, {"/runs", "Runs"}, {"/endpoints", "Endpoints"},
    {"/api/runs", "API"}, {"/metrics", "Metrics"},
};

static void head(web_req_t *r, const char *title, int refresh_s)
{
    web_buf_t *b = &r->out;
    web_buf_puts(b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    if (refresh_s > 0)
        web_buf_printf(b, "<meta http-equiv=\"refresh\" content=\"%d\">", refresh_s);
    web_buf_puts(b, "<title>");
    web_esc(b, title);
    web_buf_printf(b, " - kiln</title><style>%s</style></head>\n<body><header><b>kiln</b>", css);
    for (size_t i = 0; i < sizeof nav / sizeof nav[0]; i++)
        web_buf_printf(b, "<a href=\"%s\">%s</a>", nav[i].href, nav[i].label);
    web_buf_puts(b, "</header><main>\n<h1>");
    web_esc(b, title);
    web_buf_puts(b, "</h1>\n");
}

static void foot(web_req_t *r)
{
    web_buf_puts(&r->out, "</main></body></html>\n");
}

void web_page_error(web_req_t *r, int status, const char *msg)
{
    char title[32];
    snprintf(title, sizeof title, "Error %d", status);
    head(r, title, 0);
    web_buf_puts(&r->out, "<p class=\"error\">");
    web_esc(&r->out, msg);
    web_buf_puts(&r->out, "</p>\n");
    foot(r);
}

/* ---- cells --------------------------------------------------------------------------- */

static void td_time(web_buf_t *b, int64_t t)
{
    char iso[KILN_ISO_LEN];
    if (t <= 0) {
        web_buf_puts(b, "<td>-</td>");
        return;
    }
    web_buf_puts(b, "<td>");
    web_esc(b, kiln_time_iso(t, iso, sizeof iso));
    web_buf_puts(b, "</td>");
}

static void td_text(web_buf_t *b, const char *s)
{
    web_buf_puts(b, "<td>");
    web_esc(b, s && *s ? s : "-");
    web_buf_puts(b, "</td>");
}

static void td_num(web_buf_t *b, double v, const char *fmt)
{
    if (isnan(v)) {
        web_buf_puts(b, "<td class=\"num\">-</td>");
        return;
    }
    web_buf_puts(b, "<td class=\"num\">");
    web_buf_printf(b, fmt, v);
    web_buf_puts(b, "</td>");
}

/* A run's duration in seconds as the spec writes durations (kiln_duration_format),
 * to the minute past an hour: "45s", "2m5s", "1h5m". */
static void duration_text(web_buf_t *b, int64_t s)
{
    char buf[48];
    if (s < 0)
        web_buf_puts(b, "-");
    else if (s == 0)
        web_buf_puts(b, "0s");
    else
        web_buf_puts(b, kiln_duration_format((s < 3600 ? s : s / 60 * 60) * 1000, buf, sizeof buf));
}

static void state_badge(web_buf_t *b, state_run_state_t s)
{
    const char *name = state_run_state_name(s);
    web_buf_puts(b, "<span class=\"st st-");
    web_esc(b, name);
    web_buf_puts(b, "\">");
    web_esc(b, name);
    web_buf_puts(b, "</span>");
}

static void link_run(web_buf_t *b, int64_t id)
{
    web_buf_printf(b, "<a href=\"/runs/%lld\">%lld</a>", (long long)id, (long long)id);
}

/* ---- jobs ---------------------------------------------------------------------------- */

/* A job's last run, linked, then its state: open, link, mid, badge, close. */
static void last_run(web_buf_t *b, const state_job_last_t *l, const char *open, const char *mid,
                     const char *close)
{
    web_buf_puts(b, open);
    link_run(b, l->last_run_id);
    web_buf_puts(b, mid);
    state_badge(b, l->last_state);
    web_buf_puts(b, close);
}

int web_page_jobs(web_req_t *r)
{
    state_job_t *js = NULL;
    size_t n = 0;
    KILN_CHECK(state_job_list(r->st, &js, &n));
    web_buf_t *b = &r->out;
    head(r, "Jobs", 0);
    if (n == 0)
        web_buf_puts(b, "<p>No jobs yet: submit one with <code>kiln submit FILE</code>.</p>\n");
    web_buf_puts(b, "<table id=\"jobs\"><tr><th>job</th><th>version</th><th>schedule</th>"
                    "<th>next fire</th><th>last run</th><th>last state</th>"
                    "<th>last success</th><th>paused</th></tr>\n");
    int64_t now = kiln_now_s();
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        state_job_last_t last;
        rc = state_job_last(r->st, js[i].id, &last);
        if (rc < 0)
            break;
        web_buf_printf(b, "<tr><td><a href=\"/jobs/%lld\">", (long long)js[i].id);
        web_esc(b, js[i].name);
        web_buf_printf(b, "</a></td><td class=\"num\">%d</td>", js[i].version);
        td_text(b, js[i].schedule ? js[i].schedule : "one-off");
        td_time(b, web_next_fire(&js[i], now));
        if (last.last_run_id > 0) {
            last_run(b, &last, "<td>", "</td><td>", "</td>");
        } else {
            web_buf_puts(b, "<td>-</td><td>-</td>");
        }
        td_time(b, last.last_success_at);
        td_text(b, js[i].paused ? "paused" : "no");
        web_buf_puts(b, "</tr>\n");
    }
    web_buf_puts(b, "</table>\n");
    foot(r);
    state_jobs_free(js, n);
    return rc;
}

/* ---- runs ---------------------------------------------------------------------------- */

/* Reads ?job=NAME&state=S&before=ID&limit=N. */
typedef struct runs_query {
    const char *job, *state_name;
    int64_t job_id, before, limit;
    int state;
} runs_query_t;

static int runs_query(web_req_t *r, runs_query_t *q)
{
    memset(q, 0, sizeof *q);
    q->state = -1;
    q->job = web_arg(r, "job");
    q->state_name = web_arg(r, "state");
    KILN_CHECK(web_arg_i64(r, "before", 0, 0, INT64_MAX, &q->before));
    KILN_CHECK(web_arg_i64(r, "limit", WEB_PAGE_DEFAULT, 1, STATE_PAGE_MAX, &q->limit));
    if (q->job != NULL && *q->job) {
        state_job_t j;
        KILN_CHECK(state_job_get(r->st, q->job, &j));
        q->job_id = j.id;
        state_job_fini(&j);
    }
    if (q->state_name != NULL && *q->state_name) {
        state_run_state_t s;
        KILN_CHECK(state_run_state_parse(q->state_name, &s));
        q->state = (int)s;
    }
    return 0;
}

/* The query string of a runs page with the same filters. */
static void runs_href(web_buf_t *b, const runs_query_t *q, int64_t before)
{
    web_buf_puts(b, "/runs?limit=");
    web_buf_printf(b, "%lld", (long long)q->limit);
    if (q->job_id > 0) {
        web_buf_puts(b, "&amp;job=");
        web_esc(b, q->job);
    }
    if (q->state >= 0) {
        web_buf_puts(b, "&amp;state=");
        web_esc(b, q->state_name);
    }
    if (before > 0)
        web_buf_printf(b, "&amp;before=%lld", (long long)before);
}

int web_page_runs(web_req_t *r)
{
    runs_query_t q;
    KILN_CHECK(runs_query(r, &q));
    state_run_t *rs = NULL;
    size_t n = 0;
    KILN_CHECK(state_run_page(r->st, q.job_id, q.state, q.before, (int)q.limit + 1, &rs, &n));
    bool more = n > (size_t)q.limit;
    if (more)
        n--;
    bool live = false;
    for (size_t i = 0; i < n; i++)
        live |= !state_run_state_terminal(rs[i].state);
    web_buf_t *b = &r->out;
    head(r, "Runs", live && q.before == 0 ? r->refresh_s : 0);
    web_buf_puts(b, "<form method=\"get\" action=\"/runs\">job <input name=\"job\" value=\"");
    web_esc(b, q.job);
    web_buf_puts(b, "\"> state <select name=\"state\"><option value=\"\">any</option>");
    for (int s = 0; s < STATE_RUN_NSTATES; s++) {
        const char *name = state_run_state_name((state_run_state_t)s);
        web_buf_printf(b, "<option%s>%s</option>", s == q.state ? " selected" : "", name);
    }
    web_buf_puts(b, "</select> <button>filter</button></form>\n");
    web_buf_puts(b, "<table id=\"runs\"><tr><th>run</th><th>job</th><th>state</th>"
                    "<th>trigger</th><th>attempt</th><th>queued</th><th>started</th>"
                    "<th>duration</th><th>samples/s</th><th>eval logloss</th><th>exit</th></tr>\n");
    for (size_t i = 0; i < n; i++) {
        const state_run_t *run = &rs[i];
        web_run_figures_t fig;
        web_run_figures(r->st, run, &fig);
        web_buf_puts(b, "<tr><td>");
        link_run(b, run->id);
        web_buf_puts(b, "</td>");
        td_text(b, run->job_name);
        web_buf_puts(b, "<td>");
        state_badge(b, run->state);
        web_buf_puts(b, "</td>");
        td_text(b, state_trigger_name(run->trigger));
        web_buf_printf(b, "<td class=\"num\">%d</td>", run->attempt);
        td_time(b, run->queued_at);
        td_time(b, run->started_at);
        web_buf_puts(b, "<td class=\"num\">");
        duration_text(b, web_run_duration(run));
        web_buf_puts(b, "</td>");
        td_num(b, fig.samples_per_s, "%.0f");
        td_num(b, fig.eval_logloss, "%.5f");
        if (run->exit_code >= 0 && state_run_state_terminal(run->state))
            web_buf_printf(b, "<td class=\"num\">%d</td>", run->exit_code);
        else
            web_buf_puts(b, "<td>-</td>");
        web_buf_puts(b, "</tr>\n");
    }
    web_buf_puts(b, "</table>\n<nav class=\"pages\">");
    if (q.before > 0) {
        web_buf_puts(b, "<a rel=\"first\" href=\"");
        runs_href(b, &q, 0);
        web_buf_puts(b, "\">newest</a>");
    }
    if (more && n > 0) {
        web_buf_puts(b, "<a rel=\"next\" href=\"");
        runs_href(b, &q, rs[n - 1].id);
        web_buf_puts(b, "\">older runs</a>");
    }
    web_buf_puts(b, "</nav>\n");
    foot(r);
    state_runs_free(rs, n + (more ? 1 : 0));
    return 0;
}

/* ---- one run --------------------------------------------------------------------------- */

static void kv_text(web_buf_t *b, const char *k, const char *v)
{
    web_buf_puts(b, "<dt>");
    web_esc(b, k);
    web_buf_puts(b, "</dt><dd>");
    web_esc(b, v && *v ? v : "-");
    web_buf_puts(b, "</dd>");
}

static void kv_time(web_buf_t *b, const char *k, int64_t t)
{
    char iso[KILN_ISO_LEN];
    kv_text(b, k, t > 0 ? kiln_time_iso(t, iso, sizeof iso) : NULL);
}

/* A POST form to /WHAT/ID/ACTION guarded by the token (no script: the
 * browser sends the field); extra is more of the form's HTML, or "". */
static void action_form(web_buf_t *b, const char *what, int64_t id, const char *action,
                        const char *label, const char *extra)
{
    web_buf_printf(b,
                   "<form class=\"act\" method=\"post\" action=\"/%s/%lld/%s\">"
                   "<input type=\"password\" name=\"token\" placeholder=\"web token\" "
                   "autocomplete=\"off\">%s <button>%s</button></form>",
                   what, (long long)id, action, extra, label);
}

static int run_sections(web_req_t *r, const state_run_t *run);

/* ---- one job ----------------------------------------------------------------------------- */

int web_page_job(web_req_t *r)
{
    state_job_t j;
    state_job_last_t last;
    int rc = state_job_get_by_id(r->st, r->id, &j);
    if (rc == KILN_ENOENT)
        return kiln_errf(KILN_ENOENT, "no job %lld", (long long)r->id);
    KILN_CHECK(rc);
    KILN_CHECK_GOTO(state_job_last(r->st, j.id, &last), rc, out);
    web_buf_t *b = &r->out;
    char title[300], num[32];
    snprintf(title, sizeof title, "Job %s", j.name);
    head(r, title, 0);
    const char *status = j.deleted_at > 0 ? "deleted" : j.paused ? "paused" : "active";
    web_buf_printf(b, "<p><span class=\"st st-%s\" id=\"job-state\">%s</span> "
                      "<a href=\"/runs?job=", status, status);
    web_esc(b, j.name);
    web_buf_puts(b, "\">its runs</a></p>\n<dl class=\"kv\">");
    snprintf(num, sizeof num, "%d", j.version);
    kv_text(b, "version", num);
    kv_text(b, "schedule", j.schedule ? j.schedule : "one-off");
    kv_time(b, "next fire", j.deleted_at > 0 ? 0 : web_next_fire(&j, kiln_now_s()));
    if (last.last_run_id > 0)
        last_run(b, &last, "<dt>last run</dt><dd>", " ", "</dd>");
    kv_time(b, "last success", last.last_success_at);
    snprintf(num, sizeof num, "%lld", (long long)j.skipped_fires);
    web_buf_puts(b, "<dt>skipped fires</dt><dd id=\"skipped\">");
    web_esc(b, num);
    web_buf_puts(b, "</dd>");
    kv_time(b, "last checked", j.last_checked_at);
    kv_text(b, "last skipped because", j.last_skip_reason);
    kv_time(b, "deleted", j.deleted_at);
    web_buf_puts(b, "</dl>\n");
    if (j.deleted_at == 0) {
        if (j.paused)
            action_form(b, "jobs", j.id, "resume", "resume job", "");
        else
            action_form(b, "jobs", j.id, "pause", "pause job", "");
        action_form(b, "jobs", j.id, "delete", "delete job",
                    " <label><input type=\"checkbox\" name=\"cancel\" value=\"1\"> cancel its "
                    "runs</label>");
    }
    foot(r);
out:
    state_job_fini(&j);
    return rc;
}

int web_page_run(web_req_t *r)
{
    state_run_t run;
    int rc = web_req_run(r, &run);
    KILN_CHECK(rc);
    web_buf_t *b = &r->out;
    char title[64];
    snprintf(title, sizeof title, "Run %lld", (long long)run.id);
    head(r, title, state_run_state_terminal(run.state) ? 0 : r->refresh_s);
    web_buf_puts(b, "<p>");
    state_badge(b, run.state);
    web_buf_puts(b, " job <a href=\"/runs?job=");
    web_esc(b, run.job_name);
    web_buf_puts(b, "\">");
    web_esc(b, run.job_name);
    web_buf_printf(b, "</a> (spec version %d)", run.job_version);
    if (!state_run_state_terminal(run.state))
        web_buf_printf(b, " &middot; this page refreshes every %d s", r->refresh_s);
    web_buf_puts(b, "</p>\n");
    if (run.error != NULL) {
        web_buf_puts(b, "<p class=\"error\" id=\"error\">");
        web_esc(b, run.error);
        web_buf_puts(b, "</p>\n");
    }
    web_buf_puts(b, "<dl class=\"kv\">");
    char num[64];
    kv_text(b, "trigger", state_trigger_name(run.trigger));
    snprintf(num, sizeof num, "%d", run.attempt);
    kv_text(b, "attempt", num);
    if (run.retry_of > 0) {
        web_buf_printf(b, "<dt>retry of</dt><dd>");
        link_run(b, run.retry_of);
        web_buf_puts(b, "</dd>");
    }
    kv_time(b, "scheduled for", run.scheduled_at);
    kv_time(b, "queued", run.queued_at);
    kv_time(b, "started", run.started_at);
    kv_time(b, "ended", run.ended_at);
    web_buf_puts(b, "<dt>duration</dt><dd>");
    duration_text(b, web_run_duration(&run));
    web_buf_puts(b, "</dd>");
    if (state_run_state_terminal(run.state)) {
        snprintf(num, sizeof num, "%d", run.exit_code);
        kv_text(b, "exit code", num);
    }
    kv_text(b, "host", run.host);
    state_slurm_job_t sj; /* launcher: slurm */
    if (state_slurm_job_get(r->st, run.id, &sj) == 0) {
        web_buf_printf(b, "<dt>Slurm job</dt><dd id=\"slurm\">%lld ", (long long)sj.job_id);
        web_esc(b, sj.state);
        web_buf_puts(b, sj.nodes ? " on " : "");
        web_esc(b, sj.nodes ? sj.nodes : "");
        web_buf_puts(b, sj.partition ? " (partition " : "");
        web_esc(b, sj.partition ? sj.partition : "");
        web_buf_puts(b, sj.partition ? ")</dd>" : "</dd>");
        state_slurm_job_fini(&sj);
    }
    kv_text(b, "run directory", run.run_dir);
    web_run_figures_t fig;
    web_run_figures(r->st, &run, &fig);
    static const struct {
        const char *name, *fmt;
        size_t off;
    } figs[] = {
        {"samples/s", "%.0f", offsetof(web_run_figures_t, samples_per_s)},
        {"eval logloss", "%.5f", offsetof(web_run_figures_t, eval_logloss)},
        {"eval AUC", "%.5f", offsetof(web_run_figures_t, eval_auc)},
    };
    for (size_t i = 0; i < sizeof figs / sizeof figs[0]; i++) {
        double v = *(const double *)((const char *)&fig + figs[i].off);
        if (isnan(v))
            continue;
        snprintf(num, sizeof num, figs[i].fmt, v);
        kv_text(b, figs[i].name, num);
    }
    web_buf_puts(b, "</dl>\n");
    if (!state_run_state_terminal(run.state))
        action_form(b, "runs", run.id, "cancel", "cancel run", "");
    else if (run.state != STATE_RUN_SUCCEEDED)
        action_form(b, "runs", run.id, "retry", "retry run", "");
    rc = run_sections(r, &run);
    foot(r);
    state_run_fini(&run);
    return rc;
}

static int section_timeline(web_req_t *r, const state_run_t *run)
{
    web_buf_t *b = &r->out;
    state_event_t *es = NULL;
    size_t n = 0;
    KILN_CHECK(state_event_list(r->st, 0, run->id, &es, &n));
    web_buf_puts(b, "<h2>Timeline</h2><table id=\"timeline\"><tr><th>time</th><th>event</th>"
                    "<th>what</th></tr>\n");
    for (size_t i = 0; i < n; i++) {
        web_buf_puts(b, "<tr>");
        td_time(b, es[i].at);
        td_text(b, es[i].kind);
        td_text(b, es[i].message);
        web_buf_puts(b, "</tr>\n");
    }
    web_buf_puts(b, "</table>\n");
    state_events_free(es, n);
    return 0;
}

static int section_loss(web_req_t *r, const state_run_t *run)
{
    double *x = NULL, *y = NULL;
    size_t n = 0;
    KILN_CHECK(web_loss_series(r->st, run, &x, &y, &n));
    web_buf_puts(&r->out, "<h2>Loss</h2>\n");
    web_svg_plot(&r->out, x, y, n, "loss-plot", "step", "training loss");
    free(x);
    free(y);
    return 0;
}

static int section_inputs(web_req_t *r, const state_run_t *run)
{
    web_buf_t *b = &r->out;
    state_input_t *ins = NULL;
    size_t n = 0;
    KILN_CHECK(state_input_list(r->st, run->id, &ins, &n));
    web_buf_printf(b, "<h2>Inputs (%zu)</h2><table id=\"inputs\"><tr><th>path</th>"
                      "<th>bytes</th><th>modified</th><th>checksum</th></tr>\n", n);
    for (size_t i = 0; i < n; i++) {
        web_buf_puts(b, "<tr>");
        td_text(b, ins[i].path);
        web_buf_printf(b, "<td class=\"num\">%lld</td>", (long long)ins[i].size);
        td_time(b, ins[i].mtime);
        td_text(b, ins[i].checksum);
        web_buf_puts(b, "</tr>\n");
    }
    web_buf_puts(b, "</table>\n");
    state_inputs_free(ins, n);
    return 0;
}

static int section_outputs(web_req_t *r, const state_run_t *run)
{
    web_buf_t *b = &r->out;
    state_checkpoint_t *cs = NULL;
    size_t n = 0;
    int rc = 0;
    KILN_CHECK(state_checkpoint_list_by_run(r->st, run->id, &cs, &n));
    web_buf_printf(b, "<h2>Checkpoints (%zu)</h2><table id=\"checkpoints\"><tr><th>checkpoint"
                      "</th><th>kind</th><th>base</th><th>step</th><th>keys</th><th>bytes</th>"
                      "<th>written</th><th>path</th></tr>\n", n);
    for (size_t i = 0; i < n; i++) {
        web_buf_printf(b, "<tr><td><a href=\"/lineage/checkpoint/%lld\">", (long long)cs[i].id);
        web_esc(b, cs[i].uid);
        web_buf_puts(b, "</a></td>");
        td_text(b, cs[i].kind);
        if (cs[i].parent_id > 0)
            web_buf_printf(b, "<td><a href=\"/lineage/checkpoint/%lld\">%lld</a></td>",
                           (long long)cs[i].parent_id, (long long)cs[i].parent_id);
        else
            web_buf_puts(b, "<td>-</td>");
        web_buf_printf(b, "<td class=\"num\">%lld</td><td class=\"num\">%lld</td>"
                          "<td class=\"num\">%lld</td>",
                       (long long)cs[i].step, (long long)cs[i].keys, (long long)cs[i].bytes);
        td_time(b, cs[i].created_at);
        td_text(b, cs[i].path);
        web_buf_puts(b, "</tr>\n");
    }
    web_buf_puts(b, "</table>\n");
    /* The pushes of the run's export: how each checkpoint reached (or did
     * not yet reach) serving. */
    state_push_filter_t f = {.run_id = run->id};
    state_push_t *ps = NULL;
    size_t np = 0;
    rc = state_push_list(r->st, &f, STATE_PAGE_MAX, &ps, &np);
    if (rc == 0) {
        ops_push_foresee(r->st, ps, np);
        web_buf_printf(b, "<h2>Pushes (%zu)</h2><table id=\"pushes\"><tr><th>push</th>"
                          "<th>checkpoint</th><th>endpoint</th><th>model</th><th>label</th>"
                          "<th>mode</th><th>state</th><th>HTTP</th><th>attempts</th>"
                          "<th>why</th><th>queued</th><th>ended</th><th>problem</th></tr>\n",
                       np);
        for (size_t k = np; k-- > 0;) {
            const state_push_t *p = &ps[k];
            web_buf_printf(b, "<tr class=\"push st-%s\"><td class=\"num\">%lld</td>",
                           state_push_state_name(p->state), (long long)p->id);
            td_text(b, p->checkpoint_uid);
            web_buf_printf(b, "<td><a href=\"/lineage/endpoint/%lld\">",
                           (long long)p->endpoint_id);
            web_esc(b, p->url);
            web_buf_puts(b, "</a></td>");
            td_text(b, p->model);
            td_text(b, p->label);
            td_text(b, state_push_mode_name(p));
            td_text(b, state_push_state_name(p->state));
            web_buf_printf(b, "<td class=\"num\">%d</td><td class=\"num\">%d</td>",
                           p->http_status, p->attempts);
            td_text(b, p->reason);
            td_time(b, p->created_at);
            td_time(b, p->ended_at);
            td_text(b, p->error != NULL ? p->error : "");
            web_buf_puts(b, "</tr>\n");
        }
        web_buf_puts(b, "</table>\n");
    }
    state_pushes_free(ps, np);
    state_checkpoints_free(cs, n);
    return rc;
}

static int section_log(web_req_t *r, const state_run_t *run)
{
    web_buf_t *b = &r->out;
    char *tail = web_log_tail(run, 16 * 1024);
    web_buf_printf(b, "<h2>Log (tail; all of it: <a href=\"/api/runs/%lld/log\">text</a>)</h2>",
                   (long long)run->id);
    web_buf_puts(b, "<pre class=\"log\" id=\"log\">");
    web_esc(b, tail ? tail : "(no log yet)");
    web_buf_puts(b, "</pre>\n");
    free(tail);
    return 0;
}

/* The sections of a run's page, in order. */
static int (*const run_section[])(web_req_t *, const state_run_t *) = {
    section_timeline, section_loss, section_inputs, section_outputs, section_log,
};

static int run_sections(web_req_t *r, const state_run_t *run)
{
    for (size_t i = 0; i < sizeof run_section / sizeof run_section[0]; i++)
        KILN_CHECK(run_section[i](r, run));
    return 0;
}

int web_svg_loss(web_req_t *r)
{
    state_run_t run;
    int rc = web_req_run(r, &run);
    KILN_CHECK(rc);
    double *x = NULL, *y = NULL;
    size_t n = 0;
    rc = web_loss_series(r->st, &run, &x, &y, &n);
    if (rc == 0)
        web_svg_plot(&r->out, x, y, n, "loss-plot", "step", "training loss");
    free(x);
    free(y);
    state_run_fini(&run);
    return rc;
}

/* ---- endpoints and lineage ---------------------------------------------------------------- */

/* "3m", "2h", "4d": how long ago, for people. */
static void td_age(web_buf_t *b, int64_t secs)
{
    if (secs < 0) {
        web_buf_puts(b, "<td>-</td>");
        return;
    }
    char d[32] = "0s"; /* kiln_duration_format writes 0 as "0ms" */
    int64_t unit = secs >= 86400 ? 86400 : secs >= 3600 ? 3600 : secs >= 60 ? 60 : 1;
    if (secs > 0)
        kiln_duration_format(secs / unit * unit * 1000, d, sizeof d);
    web_buf_printf(b, "<td class=\"num\">%s</td>", d);
}

/* One form per model: its predict traffic split, set on every kiln-serve
 * serving it (POST /endpoints/split, web_act_split). es is sorted by model. */
static void split_forms(web_buf_t *b, const state_endpoint_info_t *es, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && strcmp(es[i].model, es[i - 1].model) == 0)
            continue;
        web_buf_puts(b, "<form class=\"act split\" method=\"post\" action=\"/endpoints/split\">"
                        "Traffic split of <b>");
        web_esc(b, es[i].model);
        web_buf_puts(b, "</b>: <input type=\"hidden\" name=\"model\" value=\"");
        web_esc(b, es[i].model);
        web_buf_puts(b, "\"><input name=\"split\" placeholder=\"");
        for (size_t k = i; k < n && strcmp(es[k].model, es[i].model) == 0; k++) {
            if (k > i && strcmp(es[k].label, es[k - 1].label) == 0)
                continue;
            web_buf_puts(b, k > i ? "," : "");
            web_esc(b, es[k].label);
            web_buf_puts(b, k > i ? "=0" : "=100");
        }
        web_buf_puts(b, "\" required> <input type=\"password\" name=\"token\" "
                        "placeholder=\"web token\" autocomplete=\"off\"> <button>set "
                        "split</button></form>\n");
    }
    web_buf_puts(b, "<p>A label gets predict traffic only from its model's split (kiln split "
                    "MODEL A=90,B=10); one pushed for the first time gets none.</p>\n");
}

/* The online A/B cells of one endpoint: rows, logloss, AUC, CTR,
 * calibration and the difference from the base label; one cell (its
 * reason as the title) when its kiln-serve logs no impressions ("not
 * logged") or did not answer ("unknown"). */
static void td_online(web_buf_t *b, const ops_online_t *o)
{
    if (!o->known) {
        web_buf_printf(b, "<td class=\"online %s\" colspan=\"6\" title=\"",
                       o->unlogged ? "unlogged" : "unknown");
        web_esc(b, o->error);
        web_buf_printf(b, "\">%s</td>", o->unlogged ? "not logged" : "unknown");
        return;
    }
    web_buf_printf(b, "<td class=\"num online-rows\">%lld</td>", (long long)o->f.impressions);
    td_num(b, o->f.logloss, "%.5f");
    td_num(b, o->f.auc, "%.4f");
    td_num(b, o->f.ctr, "%.4f");
    td_num(b, o->f.calibration, "%.3f");
    char what[200] = "-";
    if (o->base[0] != '\0' && !isnan(o->diff))
        snprintf(what, sizeof what, "%+.5f vs %s [%+.5f, %+.5f]", o->diff, o->base, o->lo, o->hi);
    web_buf_puts(b, "<td class=\"online-diff\">");
    web_esc(b, what);
    web_buf_puts(b, "</td>");
}

int web_page_endpoints(web_req_t *r)
{
    state_endpoint_info_t *es = NULL;
    size_t n = 0;
    KILN_CHECK(state_endpoint_list(r->st, &es, &n));
    ops_ramp_t *ramps = NULL;
    size_t nramps = 0;
    if (ops_ramp_list(r->st, kiln_now_s(), &ramps, &nramps) < 0)
        nramps = 0;
    ops_online_t *on = ops_online_read(es, n, OPS_ONLINE_TIMEOUT_MS);
    web_buf_t *b = &r->out;
    head(r, "Endpoints", 15);
    if (n == 0)
        web_buf_puts(b, "<p>No endpoint yet: a job's push.endpoints are listed here once the "
                        "job is submitted.</p>\n");
    web_buf_puts(b, "<table id=\"endpoints\"><tr><th>model</th><th>label</th><th>endpoint</th>"
                    "<th>holds checkpoint</th><th>age</th><th>eval logloss</th>"
                    "<th>eval AUC</th><th>traffic share</th><th>requests/s</th>"
                    "<th>pushes ok</th><th>failed</th><th>pending</th><th>held</th>"
                    "<th>last push</th><th>last problem</th><th>ramp</th>"
                    "<th>online rows</th><th>online logloss</th><th>online AUC</th>"
                    "<th>CTR</th><th>calibration</th><th>online logloss vs base (95% CI)</th>"
                    "</tr>\n");
    for (size_t i = 0; i < n; i++) {
        const state_endpoint_info_t *e = &es[i];
        ops_endpoint_view_t v;
        ops_endpoint_view(es, n, i, &v);
        web_buf_printf(b, "<tr data-label=\"");
        web_esc(b, e->label);
        web_buf_puts(b, "\">");
        td_text(b, e->model);
        td_text(b, e->label);
        web_buf_printf(b, "<td><a href=\"/lineage/endpoint/%lld\">", (long long)e->id);
        web_esc(b, e->url);
        web_buf_puts(b, "</a></td>");
        if (e->checkpoint_id > 0) {
            web_buf_printf(b, "<td class=\"holds\"><a href=\"/lineage/checkpoint/%lld\">",
                           (long long)e->checkpoint_id);
            web_esc(b, e->checkpoint_uid);
            web_buf_puts(b, "</a></td>");
        } else {
            web_buf_puts(b, "<td class=\"holds\">nothing yet</td>");
        }
        td_age(b, v.age_s);
        td_num(b, e->eval_logloss, "%.5f");
        td_num(b, e->eval_auc, "%.5f");
        if (isnan(v.share))
            web_buf_puts(b, "<td class=\"share\">-</td>");
        else
            web_buf_printf(b, "<td class=\"num share\">%.1f%%</td>", v.share * 100);
        td_num(b, e->request_rate, "%.2f");
        web_buf_printf(b, "<td class=\"num\">%lld</td><td class=\"num\">%lld</td>"
                          "<td class=\"num pending\">%lld</td><td class=\"num\">%lld</td>",
                       (long long)e->pushes_succeeded, (long long)e->pushes_failed,
                       (long long)e->pushes_pending, (long long)e->pushes_held);
        td_time(b, e->last_push_at);
        if (e->last_error != NULL) {
            char what[640];
            if (e->last_http_status)
                snprintf(what, sizeof what, "HTTP %d: %s", e->last_http_status, e->last_error);
            else
                snprintf(what, sizeof what, "%s", e->last_error);
            td_text(b, what);
        } else if (e->stats_error != NULL) {
            char what[640];
            snprintf(what, sizeof what, "stats: %s", e->stats_error);
            td_text(b, what);
        } else {
            web_buf_puts(b, "<td></td>");
        }
        const ops_ramp_t *ramp = ops_ramp_of(ramps, nramps, e->id);
        char what[900] = "";
        if (ramp != NULL)
            ops_ramp_describe(ramp, what, sizeof what);
        web_buf_puts(b, ramp && ramp->stopped ? "<td class=\"ramp stopped\">" : "<td class=\"ramp\">");
        web_esc(b, what);
        web_buf_puts(b, "</td>");
        td_online(b, ops_online_at(on, i));
        web_buf_puts(b, "</tr>\n");
    }
    web_buf_puts(b, "</table>\n<p>Traffic and request rate come from each endpoint's "
                    "/v1/stats, read by kilnd every few seconds; eval figures are those "
                    "measured on the checkpoint when it was written; online figures are "
                    "read now from each kiln-serve's /v1/models/M/online, over the rows "
                    "served and joined with their feedback (not logged: that kiln-serve runs "
                    "without --impressions-dir; unknown: it did not answer).</p>\n");
    split_forms(b, es, n);
    foot(r);
    free(on);
    free(ramps);
    state_endpoint_infos_free(es, n);
    return 0;
}

/* The head of a lineage page around g's focus, a `what` ("checkpoint",
 * "endpoint"), and the graph. */
static void graph_page(web_req_t *r, const char *what, const web_graph_t *g)
{
    char title[160];
    const char *focus = "";
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].focus)
            focus = g->nodes[i].title;
    snprintf(title, sizeof title, "Lineage of %s %s", what, focus);
    head(r, title, 0);
    web_buf_puts(&r->out, "<p>Runs write checkpoints; an incremental checkpoint is built on its "
                          "base; exports of a checkpoint are pushed to endpoints. A thick green "
                          "edge: the endpoint holds it now. Boxes are links.</p>\n");
    web_svg_graph(&r->out, g, "lineage");
    if (g->truncated)
        web_buf_puts(&r->out, "<p>(more lineage exists than is drawn)</p>\n");
}

int web_page_lineage_ckpt(web_req_t *r)
{
    web_graph_t *g = kiln_malloc(sizeof *g);
    if (g == NULL)
        return KILN_ENOMEM;
    int rc = web_graph_checkpoint(r->st, r->id, g);
    if (rc == 0) {
        graph_page(r, "checkpoint", g);
        foot(r);
    }
    free(g);
    return rc;
}

int web_page_lineage_endpoint(web_req_t *r)
{
    web_graph_t *g = kiln_malloc(sizeof *g);
    state_holding_t *hs = NULL;
    size_t nh = 0;
    if (g == NULL)
        return KILN_ENOMEM;
    int rc = web_graph_endpoint(r->st, r->id, g);
    if (rc == 0)
        rc = state_endpoint_history(r->st, r->id, 50, &hs, &nh);
    if (rc == 0) {
        graph_page(r, "endpoint", g);
        web_buf_t *b = &r->out;
        web_buf_puts(b, "<h2>What it held</h2><table id=\"holdings\"><tr><th>checkpoint</th>"
                        "<th>since</th><th>until</th></tr>\n");
        for (size_t i = 0; i < nh; i++) {
            web_buf_printf(b, "<tr><td><a href=\"/lineage/checkpoint/%lld\">",
                           (long long)hs[i].checkpoint_id);
            web_esc(b, hs[i].checkpoint_uid);
            web_buf_puts(b, "</a></td>");
            td_time(b, hs[i].since);
            if (hs[i].until_at > 0)
                td_time(b, hs[i].until_at);
            else
                web_buf_puts(b, "<td>now</td>");
            web_buf_puts(b, "</tr>\n");
        }
        web_buf_puts(b, "</table>\n");
        foot(r);
    }
    state_holdings_free(hs, nh);
    free(g);
    return rc;
}
