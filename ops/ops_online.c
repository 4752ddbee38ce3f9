/*
 * ops/ops_online.c - the online A/B metrics as Kiln reads them: each
 * endpoint's figures from its kiln-serve's GET /v1/models/M/online (one
 * request per URL and model, a short timeout, so a down endpoint shows as
 * unknown and costs the page at most that), for the endpoints page,
 * /api/endpoints and `kiln endpoints`; and push.promote_when, the rule
 * `kiln promote` applies to them before it pushes.
 *
 * The figures are read when asked for, not stored: they are kiln-serve's
 * (kept across its restarts in its online.json), and a reading older than
 * the page would only mislead a promote.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln_json.h"
#include "ops.h"

/* Fills o from the answer ls (nl labels, sorted by name) for label: its
 * figures (zero rows when the label has none joined yet) and, unless it is
 * the first label, its difference from the first. */
static void fill(ops_online_t *o, const char *label, const serve_online_label_t *ls, size_t nl)
{
    o->known = true;
    o->diff = o->lo = o->hi = NAN;
    o->f = (serve_online_label_t){
        .ctr = NAN, .logloss = NAN, .auc = NAN, .calibration = NAN, .logloss_var = NAN};
    snprintf(o->f.label, sizeof o->f.label, "%s", label);
    for (size_t m = 0; m < nl; m++)
        if (strcmp(ls[m].label, label) == 0)
            o->f = ls[m];
    if (nl > 0 && strcmp(ls[0].label, label) != 0 && o->f.impressions > 0) {
        snprintf(o->base, sizeof o->base, "%s", ls[0].label);
        serve_logloss_diff(o->f.logloss, o->f.logloss_var, o->f.impressions, ls[0].logloss,
                           ls[0].logloss_var, ls[0].impressions, &o->diff, &o->lo, &o->hi);
    }
}

ops_online_t *ops_online_read(const state_endpoint_info_t *es, size_t n, int64_t timeout_ms)
{
    ops_online_t *out = kiln_calloc(n + 1, sizeof *out);
    bool *done = kiln_calloc(n + 1, sizeof *done);
    if (out == NULL || done == NULL) {
        free(out);
        free(done);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (done[i])
            continue;
        serve_online_label_t *ls = NULL;
        size_t nl = 0;
        int rc = serve_online_fetch(es[i].url, es[i].model, timeout_ms, &ls, &nl);
        for (size_t k = i; k < n; k++) {
            if (done[k] || strcmp(es[k].url, es[i].url) != 0 ||
                strcmp(es[k].model, es[i].model) != 0)
                continue;
            done[k] = true;
            if (rc == 0)
                fill(&out[k], es[k].label, ls, nl);
            else
                snprintf(out[k].error, sizeof out[k].error, "%s", kiln_errmsg());
            out[k].unlogged = rc == KILN_ENOENT;
        }
        free(ls);
    }
    free(done);
    return out;
}

const ops_online_t *ops_online_at(const ops_online_t *on, size_t i)
{
    static const ops_online_t oom = {.error = "out of memory", .diff = NAN, .lo = NAN, .hi = NAN};
    return on != NULL ? &on[i] : &oom;
}

json_t *ops_online_json(const ops_online_t *o)
{
    if (!o->known)
        return json_pack("{s:b, s:s}", "known", 0, "error", o->error);
    const serve_online_label_t *f = &o->f;
    return json_pack("{s:b, s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:[o,o]}", "known", 1,
                     "impressions", (json_int_t)f->impressions, "positives",
                     (json_int_t)f->positives, "ctr", kiln_json_num(f->ctr), "logloss",
                     kiln_json_num(f->logloss), "auc", kiln_json_num(f->auc), "calibration",
                     kiln_json_num(f->calibration), "base",
                     o->base[0] ? json_string(o->base) : json_null(), "logloss_diff",
                     kiln_json_num(o->diff), "ci95", kiln_json_num(o->lo), kiln_json_num(o->hi));
}

void ops_online_describe(const ops_online_t *o, char *buf, size_t cap)
{
    const serve_online_label_t *f = &o->f;
    if (o->unlogged)
        snprintf(buf, cap, "not logged");
    else if (!o->known)
        snprintf(buf, cap, "unknown");
    else if (f->impressions == 0 || isnan(f->logloss))
        snprintf(buf, cap, "no rows yet");
    else if (o->base[0] == '\0' || isnan(o->diff))
        snprintf(buf, cap, "%lld rows, ll %.4f, auc %.3f", (long long)f->impressions, f->logloss,
                 f->auc);
    else
        snprintf(buf, cap, "%lld rows, ll %.4f, auc %.3f, vs %s %+.4f [%+.4f, %+.4f]",
                 (long long)f->impressions, f->logloss, f->auc, o->base, o->diff, o->lo, o->hi);
}

/* ---- push.promote_when ------------------------------------------------------------------ */

/* The push.promote_when of the first job that pushes to model/from or
 * model/to and has one, into *pw and its name into job (cap); false when
 * none does. */
static bool find_rule(state_t *st, const char *model, const char *from, const char *to,
                      job_promote_when_t *pw, char *job, size_t cap)
{
    state_job_t *js = NULL;
    size_t n = 0;
    if (state_job_list(st, &js, &n) < 0)
        return false;
    bool found = false;
    for (size_t i = 0; i < n && !found; i++) {
        job_spec_t spec;
        if (js[i].deleted_at != 0 ||
            job_spec_parse(js[i].spec_yaml, strlen(js[i].spec_yaml), js[i].name, &spec, NULL) < 0)
            continue;
        for (int k = 0; k < spec.push.nendpoints && !found; k++) {
            const job_endpoint_t *e = &spec.push.endpoints[k];
            found = !isnan(spec.push.promote_when.online_logloss_better_by) &&
                    strcmp(e->model, model) == 0 &&
                    (strcmp(e->label, from) == 0 || strcmp(e->label, to) == 0);
        }
        if (found) {
            *pw = spec.push.promote_when;
            snprintf(job, cap, "%s", js[i].name);
        }
        job_spec_fini(&spec);
    }
    state_jobs_free(js, n);
    return found;
}

/* The figures of model/label from the first of its endpoints (es, n; their
 * online figures on) that answered, or NULL; *why: the last failure. */
static const ops_online_t *label_figures(const state_endpoint_info_t *es, const ops_online_t *on,
                                         size_t n, const char *model, const char *label,
                                         const char **why)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(es[i].model, model) != 0 || strcmp(es[i].label, label) != 0)
            continue;
        const ops_online_t *o = ops_online_at(on, i);
        if (o->known)
            return o;
        *why = o->error;
    }
    return NULL;
}

int ops_promote_check(state_t *st, const char *model, const char *from, const char *to, char *note,
                      size_t cap)
{
    job_promote_when_t pw;
    char job[128];
    note[0] = '\0';
    if (!find_rule(st, model, from, to, &pw, job, sizeof job))
        return 0;
    state_endpoint_info_t *es = NULL;
    size_t n = 0;
    KILN_CHECK(state_endpoint_list(st, &es, &n));
    ops_online_t *on = ops_online_read(es, n, OPS_ONLINE_TIMEOUT_MS);
    int rc = 0;
    char rule[400];
    snprintf(rule, sizeof rule,
             "push.promote_when of job %s (online_logloss_better_by %g, min_rows %lld)", job,
             pw.online_logloss_better_by, (long long)pw.min_rows);
    const char *why = "no endpoint recorded";
    const ops_online_t *a = label_figures(es, on, n, model, from, &why);
    const char *why_to = "no endpoint recorded";
    const ops_online_t *b = label_figures(es, on, n, model, to, &why_to);
    if (a == NULL || b == NULL) {
        rc = kiln_errf(KILN_ESTATE,
                       "promote %s -> %s of %s refused by %s: the online metrics "
                       "of %s are unknown: %s",
                       from, to, model, rule, a == NULL ? from : to, a == NULL ? why : why_to);
        goto out;
    }
    double d, lo, hi;
    serve_logloss_diff(a->f.logloss, a->f.logloss_var, a->f.impressions, b->f.logloss,
                       b->f.logloss_var, b->f.impressions, &d, &lo, &hi);
    char figures[600];
    snprintf(figures, sizeof figures,
             "%s %lld rows, online logloss %.5f; %s %lld rows, online logloss %.5f; %s - %s = "
             "%+.5f, 95%% CI [%+.5f, %+.5f]",
             from, (long long)a->f.impressions, a->f.logloss, to, (long long)b->f.impressions,
             b->f.logloss, from, to, d, lo, hi);
    if (a->f.impressions < pw.min_rows || b->f.impressions < pw.min_rows)
        rc = kiln_errf(KILN_ESTATE,
                       "promote %s -> %s of %s refused by %s: too few joined rows "
                       "(%s); kiln promote --force overrides",
                       from, to, model, rule, figures);
    else if (!(d <= -pw.online_logloss_better_by))
        rc = kiln_errf(KILN_ESTATE,
                       "promote %s -> %s of %s refused by %s: %s is not better by "
                       "%g (%s); kiln promote --force overrides",
                       from, to, model, rule, from, pw.online_logloss_better_by, figures);
    else
        snprintf(note, cap, "%s holds: %s", rule, figures);
out:
    free(on);
    state_endpoint_infos_free(es, n);
    return rc;
}
