/*
 * serving/serve_query.c - the store's reads: a version's description, lookup
 * of embedding rows, predict (the trainer's own gather kernel and dense
 * model over parsed TSV lines; the label a request goes to is serve_split.c's),
 * and the counters behind /v1/stats and /metrics. Each takes the
 * read lock, so it sees a version before a push or after it, never half.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern.h"
#include "data.h"
#include "serve_store_int.h"

static void count(sv_store_t *s, const char *model, const char *label, int64_t rows,
                  int64_t nonfinite)
{
    pthread_mutex_lock(&s->stats_lock);
    int i = 0;
    while (i < s->ncounters && (strcmp(s->counters[i].model, model) != 0 ||
                                strcmp(s->counters[i].label, label) != 0))
        i++;
    if (i == s->ncounters && i < MAX_LABELS) {
        snprintf(s->counters[i].model, SERVE_NAME_MAX, "%s", model);
        snprintf(s->counters[i].label, SERVE_NAME_MAX, "%s", label);
        s->ncounters++;
    }
    if (i < s->ncounters) {
        s->counters[i].requests++;
        s->counters[i].rows += rows;
        s->counters[i].nonfinite += nonfinite;
    }
    pthread_mutex_unlock(&s->stats_lock);
}

/* Predicts n parsed rows with v: the trainer's gather kernel pools the
 * rows of each slot (missing keys and empty fields read as zeros, as in
 * kiln-train's eval) and the trainer's dense model gives probabilities. */
static int predict_rows(const sv_version_t *v, int n, const float *X, const int64_t *keys,
                        const unsigned char *has, float *probs)
{
    const serve_model_desc_t *d = &v->desc;
    const int S = d->nslots, D = d->dim;
    float *V = kiln_calloc((size_t)n * (size_t)S * (size_t)D + 1, sizeof(float));
    float *E = kiln_calloc((size_t)n * (size_t)S * (size_t)D + 1, sizeof(float));
    int64_t *off = kiln_calloc((size_t)S * (size_t)(n + 1), sizeof(int64_t));
    int32_t *rows = kiln_calloc((size_t)S * (size_t)n + 1, sizeof(int32_t));
    kern_bags_t *bags = kiln_calloc((size_t)S + 1, sizeof *bags);
    int64_t *sk = kiln_malloc(sizeof *sk * (size_t)n + 1);
    float *sv = kiln_malloc(sizeof *sv * (size_t)n * (size_t)D + 1);
    uint8_t *sf = kiln_malloc((size_t)n + 1);
    int rc = 0;
    if (V == NULL || E == NULL || off == NULL || rows == NULL || bags == NULL || sk == NULL ||
        sv == NULL || sf == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    /* V row (i*S + s) holds the looked-up row of row i, slot s: a slot's
     * keys are looked up in one call (one batch of reads for those on disk). */
    for (int s = 0; s < S; s++) {
        int64_t *o = off + (int64_t)s * (n + 1);
        int32_t *r = rows + (int64_t)s * n;
        int m = 0;
        for (int i = 0; i < n; i++)
            if (has[(int64_t)i * S + s])
                sk[m++] = keys[(int64_t)i * S + s];
        KILN_CHECK_GOTO(serve_table_lookup(v->tables[d->slot_table[s]], m, sk, sv, sf), rc, out);
        m = 0;
        for (int i = 0; i < n; i++) {
            o[i + 1] = o[i];
            if (!has[(int64_t)i * S + s])
                continue;
            int64_t vr = (int64_t)i * S + s;
            if (sf[m])
                memcpy(V + vr * D, sv + (int64_t)m * D, (size_t)D * sizeof(float));
            m++;
            r[o[i + 1]++] = (int32_t)vr;
        }
        bags[s] = (kern_bags_t){.values = V,
                                .capacity = (int64_t)n * S,
                                .dim = D,
                                .combine = d->slot_mean[s] ? KERN_COMBINE_MEAN : KERN_COMBINE_SUM,
                                .offsets = o,
                                .rows = r,
                                .out_col = (int64_t)s * D};
    }
    if (S > 0)
        KILN_CHECK_GOTO(kern_cpu_gather_combine(S, bags, n, (int64_t)S * D, E), rc, out);
    rc = model_predict(v->rtm, n, E, X, probs);
out:
    KILN_FREE_ALL(V, E, off, rows, bags, sk, sv, sf);
    return rc;
}

/* The KILN_ENOENT of a read of model/label (label NULL: any) that found no
 * version, with the message none (or why, when the label is broken: also a
 * copy in *broken unless broken is NULL). */
static int not_held(const sv_store_t *s, const char *model, const char *label,
                    const char *none, char **broken)
{
    const sv_broken_t *b = label ? sv_broken_find(s, model, label) : NULL;
    if (broken != NULL)
        *broken = b ? kiln_strdup(b->error) : NULL;
    if (b != NULL)
        return kiln_errf(KILN_ENOENT, "this version could not be loaded at start (%s); a full "
                                      "push replaces it",
                         b->error);
    return kiln_errf(KILN_ENOENT, "%s", none);
}

int sv_version_get(sv_store_t *s, const char *model, const char *label, sv_version_info_t *out)
{
    memset(out, 0, sizeof *out);
    pthread_rwlock_rdlock(&s->lock);
    const sv_version_t *v = sv_version_find(s, model, label);
    int rc = 0;
    if (v == NULL) {
        rc = not_held(s, model, label, "this endpoint holds no such version", &out->broken);
    } else {
        snprintf(out->model, sizeof out->model, "%s", v->model);
        snprintf(out->label, sizeof out->label, "%s", v->label);
        snprintf(out->uid, sizeof out->uid, "%s", v->uid);
        out->rows = sv_version_rows(v);
        out->applied_at = v->applied_at;
        out->model_type = model_type_name((model_type_t)v->desc.model_type);
        out->chain = v->nfiles;
        out->ntables = v->desc.ntables;
        for (int t = 0; t < v->desc.ntables; t++) {
            snprintf(out->tables[t].name, SERVE_NAME_MAX, "%s", v->desc.tables[t].name);
            out->tables[t].dim = v->desc.tables[t].dim;
            out->tables[t].rows = serve_table_size(v->tables[t]);
        }
    }
    pthread_rwlock_unlock(&s->lock);
    return rc;
}

int sv_lookup(sv_store_t *s, const char *model, const char *label, const char *table,
              int64_t n, const int64_t *keys, const unsigned char *valid, sv_rows_t *out)
{
    memset(out, 0, sizeof *out);
    pthread_rwlock_rdlock(&s->lock);
    const sv_version_t *v = NULL;
    for (int i = 0; i < s->nv && v == NULL; i++)
        if (strcmp(s->v[i]->model, model) == 0 &&
            (label == NULL || strcmp(s->v[i]->label, label) == 0))
            v = s->v[i];
    int t = -1, rc = 0;
    for (int i = 0; v != NULL && i < v->desc.ntables; i++)
        if (strcmp(v->desc.tables[i].name, table) == 0)
            t = i;
    if (v == NULL || t < 0) {
        rc = kiln_errf(KILN_ENOENT, v == NULL ? "no such model or label" : "no such table");
        goto out;
    }
    const int dim = v->desc.tables[t].dim;
    snprintf(out->label, sizeof out->label, "%s", v->label);
    snprintf(out->uid, sizeof out->uid, "%s", v->uid);
    out->dim = dim;
    out->n = n;
    out->values = kiln_calloc((size_t)n * (size_t)dim + 1, sizeof(float));
    out->found = kiln_calloc((size_t)n + 1, 1);
    if (out->values == NULL || out->found == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    rc = serve_table_lookup(v->tables[t], n, keys, out->values, out->found);
    for (int64_t i = 0; i < n && rc == 0; i++) {
        if (!valid[i] && out->found[i]) { /* an invalid key is never found */
            out->found[i] = 0;
            memset(out->values + i * dim, 0, (size_t)dim * sizeof(float));
        }
    }
out:
    pthread_rwlock_unlock(&s->lock);
    if (rc < 0)
        sv_rows_fini(out);
    return rc;
}

void sv_rows_fini(sv_rows_t *r)
{
    free(r->values);
    free(r->found);
    r->values = NULL;
    r->found = NULL;
}

/* Parses line number lineno (1-based) of a predict into row i of X, keys
 * and has: a line without the label column gets a dummy one. buf holds
 * DATA_TSV_MAX_LINE + 3 bytes. Returns 0 or KILN_EINVAL saying why. */
static int parse_line(const sv_line_t *l, int64_t lineno, int F, int S, char *buf, float *X,
                      int64_t *keys, unsigned char *has)
{
    if (l->p == NULL)
        return kiln_errf(KILN_EINVAL, "predict: every element of rows must be a string");
    const char *lp = l->p;
    size_t ll = l->len;
    if (ll > DATA_TSV_MAX_LINE)
        return kiln_errf(KILN_EINVAL, "predict: line %lld is longer than %d bytes",
                         (long long)lineno, DATA_TSV_MAX_LINE);
    size_t tabs = 0;
    for (size_t i = 0; i < ll; i++)
        tabs += lp[i] == '\t';
    if ((int)tabs == F + S - 1) {
        buf[0] = '0';
        buf[1] = '\t';
        memcpy(buf + 2, lp, ll);
        lp = buf;
        ll += 2;
    }
    float y;
    char why[DATA_MESSAGE_LEN];
    if (data_tsv_parse_line(lp, ll, F, S, &y, X, keys, has, why, sizeof why) < 0)
        return kiln_errf(KILN_EINVAL, "predict: line %lld: %s", (long long)lineno, why);
    return 0;
}

int sv_predict(sv_store_t *s, const char *model, const char *label, const char *request_key,
               int64_t n, const sv_line_t *lines, sv_predicted_t *out)
{
    memset(out, 0, sizeof *out);
    pthread_rwlock_rdlock(&s->lock);
    const sv_version_t *v = label ? sv_version_find(s, model, label)
                                  : sv_split_choose(s, model, request_key);
    float *X = NULL;
    int64_t *keys = NULL;
    unsigned char *has = NULL;
    char *buf = NULL;
    int rc = 0;
    if (v == NULL) {
        if (label == NULL && sv_model_held(s, model))
            rc = kiln_errf(KILN_ENOENT, "no label of model %s held here has traffic: a label "
                                        "gets traffic from a split (kiln split %s A=100, or "
                                        "PUT /v1/models/%s/split); or ask for one with ?label=",
                           model, model, model);
        else
            rc = not_held(s, model, label,
                          "this endpoint holds no version of that model (and label)", NULL);
        goto out;
    }
    const int S = v->desc.nslots, F = v->desc.ndense;
    X = kiln_calloc((size_t)PREDICT_BATCH * (size_t)F + 1, sizeof(float));
    keys = kiln_calloc((size_t)PREDICT_BATCH * (size_t)S + 1, sizeof(int64_t));
    has = kiln_calloc((size_t)PREDICT_BATCH * (size_t)S + 1, 1);
    buf = kiln_malloc(DATA_TSV_MAX_LINE + 3);
    out->probs = kiln_calloc((size_t)n + 1, sizeof(float));
    if (X == NULL || keys == NULL || has == NULL || buf == NULL || out->probs == NULL) {
        rc = kiln_errf(KILN_ENOMEM, "out of memory");
        goto out;
    }
    snprintf(out->label, sizeof out->label, "%s", v->label);
    snprintf(out->uid, sizeof out->uid, "%s", v->uid);
    out->nfields = F + S;
    int64_t nonfinite = 0;
    for (int64_t done = 0; done < n;) {
        int b = n - done < PREDICT_BATCH ? (int)(n - done) : PREDICT_BATCH;
        for (int i = 0; i < b; i++)
            KILN_CHECK_GOTO(parse_line(&lines[done + i], done + i + 1, F, S, buf,
                                       X + (size_t)i * F, keys + (size_t)i * S,
                                       has + (size_t)i * S),
                            rc, out);
        if (predict_rows(v, b, X, keys, has, out->probs + done) < 0) {
            rc = kiln_errf(KILN_EINTERNAL, "%s", kiln_errmsg()); /* not the request's fault */
            goto out;
        }
        for (int i = 0; i < b; i++)
            nonfinite += !isfinite(out->probs[done + i]);
        done += b;
    }
    out->n = n;
    count(s, v->model, v->label, n, nonfinite);
out:
    pthread_rwlock_unlock(&s->lock);
    KILN_FREE_ALL(X, keys, has, buf);
    if (rc < 0) {
        free(out->probs);
        out->probs = NULL;
    }
    return rc;
}

int sv_stats_get(sv_store_t *s, sv_stats_t *out)
{
    memset(out, 0, sizeof *out);
    pthread_rwlock_rdlock(&s->lock);
    pthread_mutex_lock(&s->stats_lock);
    int rc = 0;
    out->predict = kiln_calloc((size_t)s->ncounters + 1, sizeof *out->predict);
    out->versions = kiln_calloc((size_t)s->nv + 1, sizeof *out->versions);
    out->broken = kiln_calloc((size_t)s->nbroken + 1, sizeof *out->broken);
    if (out->predict == NULL || out->versions == NULL || out->broken == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int i = 0; i < s->ncounters; i++, out->npredict++) {
        const sv_counter_t *c = &s->counters[i];
        struct sv_stats_predict *o = &out->predict[i];
        snprintf(o->model, sizeof o->model, "%s", c->model);
        snprintf(o->label, sizeof o->label, "%s", c->label);
        o->requests = c->requests;
        o->rows = c->rows;
        o->nonfinite = c->nonfinite;
    }
    for (int i = 0; i < s->nv; i++, out->nversions++) {
        struct sv_stats_version *o = &out->versions[i];
        snprintf(o->model, sizeof o->model, "%s", s->v[i]->model);
        snprintf(o->label, sizeof o->label, "%s", s->v[i]->label);
        snprintf(o->uid, sizeof o->uid, "%s", s->v[i]->uid);
        o->rows = sv_version_rows(s->v[i]);
    }
    for (int i = 0; i < s->nbroken; i++, out->nbroken++) {
        struct sv_stats_broken *o = &out->broken[i];
        snprintf(o->model, sizeof o->model, "%s", s->broken[i].model);
        snprintf(o->label, sizeof o->label, "%s", s->broken[i].label);
        o->error = kiln_strdup(s->broken[i].error);
        if (o->error == NULL) {
            rc = KILN_ENOMEM;
            goto out;
        }
    }
    out->pushes_applied = s->pushes_applied;
    out->pushes_rejected = s->pushes_rejected;
out:
    pthread_mutex_unlock(&s->stats_lock);
    pthread_rwlock_unlock(&s->lock);
    if (rc < 0)
        sv_stats_fini(out);
    return rc;
}

void sv_stats_fini(sv_stats_t *st)
{
    for (int i = 0; st->broken != NULL && i < st->nbroken; i++)
        free(st->broken[i].error);
    KILN_FREE_ALL(st->predict, st->versions, st->broken);
    memset(st, 0, sizeof *st);
}
