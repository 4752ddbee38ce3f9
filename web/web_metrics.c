/*
 * web/web_metrics.c - /metrics in the Prometheus text exposition format
 * (version 0.0.4): runs by job and state, the queue depth, run durations as
 * a histogram per job, push outcomes per endpoint, and the time of the last
 * success per job. Everything comes from small aggregate reads (the trigger
 * kept tables of state/ and one row per job or endpoint), so a scrape costs
 * the same with 100 runs or 100k. The endpoints' online A/B figures come
 * from their kiln-serves, read and kept by web_online.c, so a scrape waits
 * on them at most WEB_ONLINE_WAIT_MS.
 */
#include "web_int.h"

#include <math.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Writes a label value: backslash, double quote and newline escaped. */
static void label_value(web_buf_t *b, const char *s)
{
    for (const char *p = s ? s : ""; *p; p++) {
        if (*p == '\\')
            web_buf_puts(b, "\\\\");
        else if (*p == '"')
            web_buf_puts(b, "\\\"");
        else if (*p == '\n')
            web_buf_puts(b, "\\n");
        else
            web_buf_put(b, p, 1);
    }
}

static void family(web_buf_t *b, const char *name, const char *type, const char *help)
{
    web_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static const char *job_name(const state_job_t *js, size_t n, int64_t id)
{
    for (size_t i = 0; i < n; i++)
        if (js[i].id == id)
            return js[i].name;
    return NULL;
}

static const int64_t bounds[] = {STATE_DURATION_BOUNDS};
#define NBOUNDS (sizeof bounds / sizeof bounds[0])

static void durations(web_buf_t *b, const state_job_t *js, size_t nj,
                      const state_duration_bucket_t *ds, size_t nd)
{
    family(b, "kiln_run_duration_seconds", "histogram",
           "Wall time of the runs that ended after they started (ended_at - started_at).");
    size_t i = 0;
    while (i < nd) {
        int64_t job = ds[i].job_id;
        int64_t counts[NBOUNDS + 1] = {0}, sum = 0;
        for (; i < nd && ds[i].job_id == job; i++) {
            size_t k = 0;
            while (k < NBOUNDS && bounds[k] < ds[i].le)
                k++;
            counts[k] += ds[i].n;
            sum += ds[i].sum_s;
        }
        const char *name = job_name(js, nj, job);
        if (name == NULL)
            continue; /* the job was deleted */
        int64_t cum = 0;
        for (size_t k = 0; k <= NBOUNDS; k++) {
            cum += counts[k];
            web_buf_puts(b, "kiln_run_duration_seconds_bucket{job=\"");
            label_value(b, name);
            if (k < NBOUNDS)
                web_buf_printf(b, "\",le=\"%lld\"} %lld\n", (long long)bounds[k], (long long)cum);
            else
                web_buf_printf(b, "\",le=\"+Inf\"} %lld\n", (long long)cum);
        }
        web_buf_puts(b, "kiln_run_duration_seconds_sum{job=\"");
        label_value(b, name);
        web_buf_printf(b, "\"} %lld\nkiln_run_duration_seconds_count{job=\"", (long long)sum);
        label_value(b, name);
        web_buf_printf(b, "\"} %lld\n", (long long)cum);
    }
}

/* Starts a series of an endpoint: NAME{endpoint="...",model="...",label="..." (the
 * caller adds more labels and the closing brace). */
static void endpoint_series(web_buf_t *b, const char *name, const state_endpoint_info_t *e)
{
    web_buf_printf(b, "%s{endpoint=\"", name);
    label_value(b, e->url);
    web_buf_puts(b, "\",model=\"");
    label_value(b, e->model);
    web_buf_puts(b, "\",label=\"");
    label_value(b, e->label);
    web_buf_puts(b, "\"");
}

/* The online figures of one endpoint, a value each (NAN: not written). */
typedef double (*online_value_fn)(const ops_online_t *o);
static double v_impressions(const ops_online_t *o)
{
    return (double)o->f.impressions;
}
static double v_positives(const ops_online_t *o)
{
    return (double)o->f.positives;
}
static double v_ctr(const ops_online_t *o)
{
    return o->f.ctr;
}
static double v_logloss(const ops_online_t *o)
{
    return o->f.logloss;
}
static double v_auc(const ops_online_t *o)
{
    return o->f.auc;
}
static double v_calibration(const ops_online_t *o)
{
    return o->f.calibration;
}
static double v_diff(const ops_online_t *o)
{
    return o->diff;
}
static double v_lo(const ops_online_t *o)
{
    return o->lo;
}
static double v_hi(const ops_online_t *o)
{
    return o->hi;
}

static const struct {
    const char *name, *help;
    online_value_fn value;
    bool vs_base; /* the series names the base label */
} online_families[] = {
    {"kiln_endpoint_online_impressions",
     "Joined rows (impressions past the feedback window) of the label, as its kiln-serve "
     "counts them.",
     v_impressions, false},
    {"kiln_endpoint_online_positives", "Joined rows of the label whose feedback was positive.",
     v_positives, false},
    {"kiln_endpoint_online_ctr", "Observed CTR of the label's joined rows.", v_ctr, false},
    {"kiln_endpoint_online_logloss",
     "Logloss of the probabilities the label served, over its "
     "joined rows.",
     v_logloss, false},
    {"kiln_endpoint_online_auc",
     "AUC of the probabilities the label served, over its joined "
     "rows.",
     v_auc, false},
    {"kiln_endpoint_online_calibration", "Mean probability served / observed CTR of the label.",
     v_calibration, false},
    {"kiln_endpoint_online_logloss_diff",
     "The label's online logloss minus the base label's (its kiln-serve's first by name).", v_diff,
     true},
    {"kiln_endpoint_online_logloss_diff_ci95_low",
     "Low end of the 95% interval of kiln_endpoint_online_logloss_diff.", v_lo, true},
    {"kiln_endpoint_online_logloss_diff_ci95_high",
     "High end of the 95% interval of kiln_endpoint_online_logloss_diff.", v_hi, true},
};

/* The endpoints' online A/B figures (es, n), as web_online.c keeps them. */
static void online(web_req_t *r, const state_endpoint_info_t *es, size_t n)
{
    web_buf_t *b = &r->out;
    int64_t *age = kiln_calloc(n + 1, sizeof *age);
    ops_online_t *on = age && r->online ? web_online_get(r->online, es, n, age) : NULL;
    family(b, "kiln_endpoint_online_up", "gauge",
           "1 when the endpoint's kiln-serve answered its online figures at the last reading; "
           "0 when it did not (down, or it logs no impressions).");
    for (size_t i = 0; i < n; i++) {
        endpoint_series(b, "kiln_endpoint_online_up", &es[i]);
        web_buf_printf(b, "} %d\n", ops_online_at(on, i)->known ? 1 : 0);
    }
    family(b, "kiln_endpoint_online_age_seconds", "gauge",
           "How old the last reading of the endpoint's online figures is (kilnd reads them "
           "again when a scrape finds them older than 5 s).");
    for (size_t i = 0; i < n; i++) {
        if (on == NULL || age[i] < 0)
            continue;
        endpoint_series(b, "kiln_endpoint_online_age_seconds", &es[i]);
        web_buf_printf(b, "} %.3f\n", (double)age[i] / 1000.0);
    }
    for (size_t k = 0; k < sizeof online_families / sizeof online_families[0]; k++) {
        family(b, online_families[k].name, "gauge", online_families[k].help);
        for (size_t i = 0; i < n; i++) {
            const ops_online_t *o = ops_online_at(on, i);
            double v = o->known ? online_families[k].value(o) : NAN;
            if (!isfinite(v) || (online_families[k].vs_base && o->base[0] == '\0'))
                continue;
            endpoint_series(b, online_families[k].name, &es[i]);
            if (online_families[k].vs_base) {
                web_buf_puts(b, ",base=\"");
                label_value(b, o->base);
                web_buf_puts(b, "\"");
            }
            web_buf_printf(b, "} %.9g\n", v);
        }
    }
    free(on);
    free(age);
}

int web_metrics(web_req_t *r)
{
    web_buf_t *b = &r->out;
    state_job_t *js = NULL;
    state_run_count_t *cs = NULL;
    state_duration_bucket_t *ds = NULL;
    state_endpoint_info_t *es = NULL;
    size_t nj = 0, nc = 0, nd = 0, ne = 0;
    int rc;
    r->content_type = "text/plain; version=0.0.4; charset=utf-8";
    KILN_CHECK_GOTO(state_job_list(r->st, &js, &nj), rc, out);
    KILN_CHECK_GOTO(state_run_counts(r->st, &cs, &nc), rc, out);
    KILN_CHECK_GOTO(state_run_durations(r->st, &ds, &nd), rc, out);
    KILN_CHECK_GOTO(state_endpoint_list(r->st, &es, &ne), rc, out);

    /* Runs by job and state, every state present so that series do not vanish. */
    family(b, "kiln_runs", "gauge", "Runs recorded in the database, by job and state.");
    int64_t queued = 0, active = 0;
    for (size_t j = 0; j < nj; j++) {
        int64_t per[STATE_RUN_NSTATES] = {0};
        for (size_t i = 0; i < nc; i++)
            if (cs[i].job_id == js[j].id)
                per[cs[i].state] += cs[i].n;
        queued += per[STATE_RUN_QUEUED];
        active += per[STATE_RUN_LAUNCHING] + per[STATE_RUN_RUNNING];
        for (int s = 0; s < STATE_RUN_NSTATES; s++) {
            web_buf_puts(b, "kiln_runs{job=\"");
            label_value(b, js[j].name);
            web_buf_printf(b, "\",state=\"%s\"} %lld\n", state_run_state_name((state_run_state_t)s),
                           (long long)per[s]);
        }
    }
    family(b, "kiln_queue_depth", "gauge", "Runs queued and waiting to launch.");
    web_buf_printf(b, "kiln_queue_depth %lld\n", (long long)queued);
    family(b, "kiln_runs_active", "gauge", "Runs launching or running now.");
    web_buf_printf(b, "kiln_runs_active %lld\n", (long long)active);

    durations(b, js, nj, ds, nd);

    family(b, "kiln_push_failures_total", "counter", "Pushes to an endpoint that failed.");
    for (size_t i = 0; i < ne; i++) {
        endpoint_series(b, "kiln_push_failures_total", &es[i]);
        web_buf_printf(b, "} %lld\n", (long long)es[i].pushes_failed);
    }
    family(b, "kiln_pushes_total", "counter", "Pushes to an endpoint that ended, by result.");
    for (size_t i = 0; i < ne; i++) {
        static const char *const results[] = {"succeeded", "failed", "held"};
        const int64_t v[] = {es[i].pushes_succeeded, es[i].pushes_failed, es[i].pushes_held};
        for (int k = 0; k < 3; k++) {
            endpoint_series(b, "kiln_pushes_total", &es[i]);
            web_buf_printf(b, ",result=\"%s\"} %lld\n", results[k], (long long)v[k]);
        }
    }
    family(b, "kiln_pushes_pending", "gauge",
           "Pushes queued for an endpoint that have not landed yet (pending or being sent).");
    for (size_t i = 0; i < ne; i++) {
        endpoint_series(b, "kiln_pushes_pending", &es[i]);
        web_buf_printf(b, "} %lld\n", (long long)es[i].pushes_pending);
    }
    family(b, "kiln_endpoint_holding_since_timestamp_seconds", "gauge",
           "When the endpoint started holding its current checkpoint (Unix seconds).");
    for (size_t i = 0; i < ne; i++) {
        if (es[i].checkpoint_id <= 0)
            continue;
        endpoint_series(b, "kiln_endpoint_holding_since_timestamp_seconds", &es[i]);
        web_buf_puts(b, ",checkpoint=\"");
        label_value(b, es[i].checkpoint_uid);
        web_buf_printf(b, "\"} %lld\n", (long long)es[i].since);
    }
    family(b, "kiln_endpoint_checkpoint_eval_logloss", "gauge",
           "The eval logloss measured on the checkpoint the endpoint holds.");
    for (size_t i = 0; i < ne; i++) {
        if (es[i].checkpoint_id <= 0 || isnan(es[i].eval_logloss))
            continue;
        endpoint_series(b, "kiln_endpoint_checkpoint_eval_logloss", &es[i]);
        web_buf_printf(b, "} %.6f\n", es[i].eval_logloss);
    }
    online(r, es, ne);

    family(b, "kiln_job_last_success_timestamp_seconds", "gauge",
           "When the newest succeeded run of the job ended (Unix seconds); absent before the "
           "first success.");
    for (size_t j = 0; j < nj; j++) {
        state_job_last_t last;
        KILN_CHECK_GOTO(state_job_last(r->st, js[j].id, &last), rc, out);
        if (last.last_success_at <= 0)
            continue;
        web_buf_puts(b, "kiln_job_last_success_timestamp_seconds{job=\"");
        label_value(b, js[j].name);
        web_buf_printf(b, "\"} %lld\n", (long long)last.last_success_at);
    }
    rc = 0;
out:
    state_jobs_free(js, nj);
    free(cs);
    free(ds);
    state_endpoint_infos_free(es, ne);
    return rc;
}
