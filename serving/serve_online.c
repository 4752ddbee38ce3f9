/*
 * serving/serve_online.c - online A/B metrics per model and label over the
 * joined rows (what each label served, and what the users did), and the
 * loop's part of /metrics.
 *
 * Per label: impressions (joined rows with a finite probability), positives,
 * CTR, logloss of the probabilities served (clipped to [1e-7, 1 - 1e-7], as
 * kiln-train's eval), AUC from LOOP_BINS-bin histograms of the probability
 * per outcome (rows in one bin count as ties: exact when no two served
 * probabilities of different outcomes share a bin of width 1/2048), and
 * calibration (mean predicted / observed CTR). Each label but the first (by
 * name) is compared with the first: the difference of their mean loglosses
 * with a 95% confidence interval, diff +- 1.96 * sqrt(s1^2/n1 + s2^2/n2)
 * (the labels' rows are independent samples: a request key sticks to one
 * label). Sums are kept, not rows, and saved in online.json with the last
 * segment joined, so a restart neither loses nor counts a row twice.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>

#include "serve_loop_int.h"

#define EPS 1e-7

void lp_online_add(lp_model_t *m, const char *label, float prob, int y)
{
    int i = 0;
    while (i < m->nacc && strcmp(m->acc[i].label, label) != 0)
        i++;
    if (i == m->nacc) {
        if (m->nacc == LOOP_LABELS)
            return;
        memset(&m->acc[i], 0, sizeof m->acc[i]);
        snprintf(m->acc[i].label, SERVE_NAME_MAX, "%s", label);
        m->nacc++;
    }
    lp_acc_t *a = &m->acc[i];
    if (!isfinite(prob)) {
        a->nonfinite++;
        return;
    }
    double p = prob < EPS ? EPS : prob > 1 - EPS ? 1 - EPS : prob;
    double ll = y ? -log(p) : -log(1 - p);
    int bin = (int)(prob * LOOP_BINS);
    bin = bin < 0 ? 0 : bin >= LOOP_BINS ? LOOP_BINS - 1 : bin;
    a->n++;
    a->pos += y;
    a->sum_p += prob;
    a->sum_ll += ll;
    a->sum_ll2 += ll * ll;
    a->hist[y][bin]++;
}

/* ---- online.json --------------------------------------------------------------- */

static json_t *hist_json(const int64_t *h)
{
    json_t *a = json_array();
    for (int b = 0; a != NULL && b < LOOP_BINS; b++)
        if (h[b] != 0)
            json_array_append_new(a, json_pack("[i,I]", b, (json_int_t)h[b]));
    return a;
}

int lp_online_save(const lp_model_t *m)
{
    json_t *labels = json_array();
    for (int i = 0; labels != NULL && i < m->nacc; i++) {
        const lp_acc_t *a = &m->acc[i];
        json_array_append_new(
            labels, json_pack("{s:s,s:I,s:I,s:I,s:f,s:f,s:f,s:o,s:o}", "label", a->label, "n",
                              (json_int_t)a->n, "pos", (json_int_t)a->pos, "nonfinite",
                              (json_int_t)a->nonfinite, "sum_p", a->sum_p, "sum_ll", a->sum_ll,
                              "sum_ll2", a->sum_ll2, "hist0", hist_json(a->hist[0]), "hist1",
                              hist_json(a->hist[1])));
    }
    json_t *doc = json_pack("{s:I,s:o}", "joined_through", (json_int_t)m->joined_through,
                            "labels", labels);
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    char *path = kiln_asprintf("%s/online.json", m->dir);
    int rc = text && path ? kiln_write_atomic(path, text, strlen(text)) : KILN_ENOMEM;
    free(text);
    free(path);
    return rc;
}

int lp_online_load(lp_model_t *m)
{
    char *path = kiln_asprintf("%s/online.json", m->dir);
    if (path == NULL)
        return KILN_ENOMEM;
    json_error_t err;
    json_t *doc = json_load_file(path, 0, &err);
    if (doc == NULL) {
        /* Missing: nothing joined yet. Unreadable: started over, and said so. */
        if (access(path, F_OK) == 0)
            KILN_WARN("%s cannot be read (%s); the online metrics of %s start from zero",
                      path, err.text, m->name);
        free(path);
        return 0;
    }
    free(path);
    m->joined_through = json_integer_value(json_object_get(doc, "joined_through"));
    json_t *labels = json_object_get(doc, "labels"), *e;
    size_t i;
    json_array_foreach(labels, i, e)
    {
        if (m->nacc == LOOP_LABELS || !json_is_string(json_object_get(e, "label")))
            break;
        lp_acc_t *a = &m->acc[m->nacc++];
        memset(a, 0, sizeof *a);
        snprintf(a->label, SERVE_NAME_MAX, "%s", json_string_value(json_object_get(e, "label")));
        a->n = json_integer_value(json_object_get(e, "n"));
        a->pos = json_integer_value(json_object_get(e, "pos"));
        a->nonfinite = json_integer_value(json_object_get(e, "nonfinite"));
        a->sum_p = json_number_value(json_object_get(e, "sum_p"));
        a->sum_ll = json_number_value(json_object_get(e, "sum_ll"));
        a->sum_ll2 = json_number_value(json_object_get(e, "sum_ll2"));
        for (int y = 0; y < 2; y++) {
            json_t *h = json_object_get(e, y ? "hist1" : "hist0"), *bc;
            size_t k;
            json_array_foreach(h, k, bc)
            {
                json_int_t b = json_integer_value(json_array_get(bc, 0));
                if (b >= 0 && b < LOOP_BINS)
                    a->hist[y][b] = json_integer_value(json_array_get(bc, 1));
            }
        }
    }
    json_decref(doc);
    return 0;
}

/* ---- the figures ------------------------------------------------------------------- */

typedef struct figures {
    char label[SERVE_NAME_MAX];
    int64_t n, pos, nonfinite;
    double ctr, logloss, auc, mean_p, calibration, var_ll; /* NAN: not defined yet */
} figures_t;

static void figures_of(const lp_acc_t *a, figures_t *f)
{
    snprintf(f->label, sizeof f->label, "%s", a->label);
    f->n = a->n;
    f->pos = a->pos;
    f->nonfinite = a->nonfinite;
    double n = (double)a->n;
    f->ctr = a->n ? a->pos / n : NAN;
    f->logloss = a->n ? a->sum_ll / n : NAN;
    f->mean_p = a->n ? a->sum_p / n : NAN;
    f->calibration = a->pos ? f->mean_p / f->ctr : NAN;
    f->var_ll = a->n > 1 ? (a->sum_ll2 - a->sum_ll * a->sum_ll / n) / (n - 1) : NAN;
    double num = 0, neg_below = 0;
    for (int b = 0; b < LOOP_BINS; b++) {
        num += (double)a->hist[1][b] * (neg_below + 0.5 * (double)a->hist[0][b]);
        neg_below += (double)a->hist[0][b];
    }
    int64_t neg = a->n - a->pos;
    f->auc = a->pos && neg ? num / ((double)a->pos * (double)neg) : NAN;
}

static int cmp_label(const void *a, const void *b)
{
    return strcmp(((const figures_t *)a)->label, ((const figures_t *)b)->label);
}

/* The difference of f's logloss from base's and its 95% interval (NAN: not defined). */
static void compare(const figures_t *f, const figures_t *base, double *diff, double *lo,
                    double *hi)
{
    serve_logloss_diff(f->logloss, f->var_ll, f->n, base->logloss, base->var_ll, base->n, diff,
                       lo, hi);
}

/* A snapshot of every model's figures, labels sorted by name. */
typedef struct snapshot {
    char model[SERVE_NAME_MAX];
    figures_t f[LOOP_LABELS];
    int n;
    int64_t joined_through, logged, partitions, joined_rows, join_failed, fb[FB_NRESULTS];
} snapshot_t;

static void snapshot_of(const lp_model_t *m, snapshot_t *s)
{
    memset(s, 0, sizeof *s);
    snprintf(s->model, sizeof s->model, "%s", m->name);
    for (int i = 0; i < m->nacc; i++)
        figures_of(&m->acc[i], &s->f[s->n++]);
    qsort(s->f, (size_t)s->n, sizeof s->f[0], cmp_label);
    s->joined_through = m->joined_through;
    s->logged = m->logged;
    s->partitions = m->partitions;
    s->joined_rows = m->joined_rows;
    s->join_failed = m->join_failed;
    memcpy(s->fb, m->fb, sizeof s->fb);
}

static json_t *num(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

void sv_answer_online(sv_loop_t *l, const char *model, sv_answer_t *ans)
{
    if (l == NULL) {
        ans->status = 404;
        ans->body = kiln_strdup("{\"error\":\"this kiln-serve logs no impressions: start it "
                                "with --impressions-dir and --join-dir\"}");
        return;
    }
    snapshot_t s;
    pthread_mutex_lock(&l->lock);
    lp_model_t *m = lp_model_find(l, model);
    if (m != NULL)
        snapshot_of(m, &s);
    pthread_mutex_unlock(&l->lock);
    if (m == NULL) {
        memset(&s, 0, sizeof s);
        snprintf(s.model, sizeof s.model, "%s", model);
    }
    json_t *labels = json_array(), *cmp = json_array();
    for (int i = 0; i < s.n; i++) {
        const figures_t *f = &s.f[i];
        json_array_append_new(
            labels, json_pack("{s:s,s:I,s:I,s:o,s:o,s:o,s:o,s:o,s:o,s:I}", "label", f->label,
                              "impressions", (json_int_t)f->n, "positives", (json_int_t)f->pos,
                              "ctr", num(f->ctr), "logloss", num(f->logloss), "logloss_var",
                              num(f->var_ll), "auc",
                              num(f->auc), "mean_predicted", num(f->mean_p), "calibration",
                              num(f->calibration), "nonfinite", (json_int_t)f->nonfinite));
        if (i == 0)
            continue;
        double d, lo, hi;
        compare(f, &s.f[0], &d, &lo, &hi);
        json_array_append_new(cmp, json_pack("{s:s,s:s,s:o,s:[o,o]}", "label", f->label, "base",
                                             s.f[0].label, "logloss_diff", num(d), "ci95",
                                             num(lo), num(hi)));
    }
    json_t *j = json_pack("{s:s,s:I,s:I,s:I,s:o,s:o}", "model", s.model, "window_ms",
                          (json_int_t)l->o.window_ms, "joined_through",
                          (json_int_t)s.joined_through, "joined_rows",
                          (json_int_t)s.joined_rows, "labels", labels, "comparisons", cmp);
    ans->status = 200;
    ans->body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
}

/* ---- /metrics ------------------------------------------------------------------------ */

static void family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The per-label gauges: one family each, from figures_t. */
static const struct {
    const char *name, *help;
    size_t offset; /* of the double in figures_t */
} label_families[] = {
    {"kiln_serve_online_ctr", "Observed CTR of the joined rows, by model and label.",
     offsetof(figures_t, ctr)},
    {"kiln_serve_online_logloss", "Logloss of the probabilities served, over joined rows.",
     offsetof(figures_t, logloss)},
    {"kiln_serve_online_auc", "AUC of the probabilities served, over joined rows.",
     offsetof(figures_t, auc)},
    {"kiln_serve_online_calibration", "Mean probability served / observed CTR.",
     offsetof(figures_t, calibration)},
};

/* The per-model counters: one family each, from snapshot_t. */
static const struct {
    const char *name, *help;
    size_t offset; /* of the int64_t in snapshot_t */
} model_families[] = {
    {"kiln_serve_impressions_logged_total",
     "Impressions written to the impression log since start, by model.",
     offsetof(snapshot_t, logged)},
    {"kiln_serve_join_partitions_total",
     "Training partitions written by the join since start, by model.",
     offsetof(snapshot_t, partitions)},
    {"kiln_serve_join_rows_total", "Rows joined into training partitions since start, by model.",
     offsetof(snapshot_t, joined_rows)},
    {"kiln_serve_join_failures_total",
     "Joins of a segment that failed since start (the join dir full or unwritable), by model; "
     "the segment stays and is joined again.",
     offsetof(snapshot_t, join_failed)},
};

char *sv_loop_prometheus(sv_loop_t *l)
{
    if (l == NULL)
        return kiln_strdup("");
    snapshot_t *s = kiln_calloc(LOOP_MODELS, sizeof *s);
    if (s == NULL)
        return NULL;
    int64_t drops[DROP_NREASONS], bytes;
    pthread_mutex_lock(&l->lock);
    int n = l->nmodels;
    for (int i = 0; i < n; i++)
        snapshot_of(l->models[i], &s[i]);
    memcpy(drops, l->drops, sizeof drops);
    bytes = l->bytes;
    pthread_mutex_unlock(&l->lock);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f == NULL) {
        free(s);
        return NULL;
    }
    for (size_t g = 0; g < sizeof model_families / sizeof model_families[0]; g++) {
        family(f, model_families[g].name, "counter", model_families[g].help);
        for (int i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, (const char *)&s[i] + model_families[g].offset, sizeof v);
            fprintf(f, "%s{model=\"%s\"} %lld\n", model_families[g].name, s[i].model,
                    (long long)v);
        }
    }
    family(f, "kiln_serve_impressions_dropped_total", "counter",
           "Impressions not logged (predicts answered all the same), by reason: queue full, "
           "--impressions-max reached, disk refused, a row that cannot be a line, too many "
           "models.");
    for (int r = 0; r < DROP_NREASONS; r++)
        fprintf(f, "kiln_serve_impressions_dropped_total{reason=\"%s\"} %lld\n",
                lp_drop_name(r), (long long)drops[r]);
    family(f, "kiln_serve_impressions_bytes", "gauge",
           "Bytes of impression segments on disk (bounded by --impressions-max).");
    fprintf(f, "kiln_serve_impressions_bytes %lld\n", (long long)bytes);
    family(f, "kiln_serve_feedback_total", "counter",
           "Feedback items by model and result (accepted, duplicate, unknown, late).");
    for (int i = 0; i < n; i++)
        for (int r = 0; r < FB_NRESULTS; r++)
            fprintf(f, "kiln_serve_feedback_total{model=\"%s\",result=\"%s\"} %lld\n",
                    s[i].model, lp_feedback_name(r), (long long)s[i].fb[r]);
    family(f, "kiln_serve_online_impressions_total", "counter",
           "Joined rows with a finite probability served, by model and label (kept across "
           "restarts).");
    for (int i = 0; i < n; i++)
        for (int k = 0; k < s[i].n; k++)
            fprintf(f, "kiln_serve_online_impressions_total{model=\"%s\",label=\"%s\"} %lld\n",
                    s[i].model, s[i].f[k].label, (long long)s[i].f[k].n);
    family(f, "kiln_serve_online_positives_total", "counter",
           "Joined rows whose label is 1, by model and label.");
    for (int i = 0; i < n; i++)
        for (int k = 0; k < s[i].n; k++)
            fprintf(f, "kiln_serve_online_positives_total{model=\"%s\",label=\"%s\"} %lld\n",
                    s[i].model, s[i].f[k].label, (long long)s[i].f[k].pos);
    for (size_t g = 0; g < sizeof label_families / sizeof label_families[0]; g++) {
        family(f, label_families[g].name, "gauge", label_families[g].help);
        for (int i = 0; i < n; i++)
            for (int k = 0; k < s[i].n; k++) {
                double v;
                memcpy(&v, (const char *)&s[i].f[k] + label_families[g].offset, sizeof v);
                if (isfinite(v))
                    fprintf(f, "%s{model=\"%s\",label=\"%s\"} %.9g\n", label_families[g].name,
                            s[i].model, s[i].f[k].label, v);
            }
    }
    static const char *const diff_names[3] = {"kiln_serve_online_logloss_diff",
                                              "kiln_serve_online_logloss_diff_ci95_low",
                                              "kiln_serve_online_logloss_diff_ci95_high"};
    for (int d = 0; d < 3; d++) {
        family(f, diff_names[d], "gauge",
               d == 0 ? "Logloss of a label minus that of the model's first label (base)."
                      : "Bound of the 95% confidence interval of that difference.");
        for (int i = 0; i < n; i++)
            for (int k = 1; k < s[i].n; k++) {
                double v[3];
                compare(&s[i].f[k], &s[i].f[0], &v[0], &v[1], &v[2]);
                if (isfinite(v[d]))
                    fprintf(f, "%s{model=\"%s\",label=\"%s\",base=\"%s\"} %.9g\n",
                            diff_names[d], s[i].model, s[i].f[k].label, s[i].f[0].label, v[d]);
            }
    }
    fclose(f);
    free(s);
    return text;
}
