/*
 * serving/serve_answer.c - the store's results as HTTP answers: which status
 * each Kiln error code gets (one table per kind of request), the JSON
 * bodies of docs/serving-protocol.md, the Prometheus text of /metrics, and
 * the request bodies of lookup and predict read into the store's terms.
 * serve_http.c routes a request here; the store (serve_store_int.h) knows
 * nothing of HTTP.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "serve_loop_int.h"

/* ---- statuses ------------------------------------------------------------------ */

typedef struct status_map {
    int code;   /* a KILN_E* code */
    int status; /* its HTTP status */
} status_map_t;

/* Before a push's body: the request is wrong, or the server cannot take it now. */
static const status_map_t push_begin_status[] = {
    {KILN_EUSAGE, 400}, {KILN_ECONFLICT, 409}, {0, 503}};
/* After a push's body: what is wrong with the body, else the server failed. */
static const status_map_t push_end_status[] = {
    {KILN_ECORRUPT, 400},  {KILN_ECHECKSUM, 400}, {KILN_EVERSION, 400}, {KILN_ERANGE, 413},
    {KILN_EINVAL, 422},    {KILN_ECONFLICT, 409}, {KILN_ENOENT, 404},   {KILN_ENOMEM, 503},
    {0, 500}};
/* Reads: a bad request body, nothing to read, or the server failed. */
static const status_map_t query_status[] = {
    {KILN_EINVAL, 400}, {KILN_ENOENT, 404}, {KILN_ENOMEM, 503}, {0, 500}};

/* The status of rc in map (which ends with {0, default}). */
static int status_of(const status_map_t *map, int rc)
{
    while (map->code != 0 && map->code != rc)
        map++;
    return map->status;
}

/* ---- bodies -------------------------------------------------------------------- */

static void answer(sv_answer_t *a, int status, json_t *obj)
{
    a->status = status;
    a->body = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
}

static void answer_error(sv_answer_t *a, int status, const char *msg)
{
    answer(a, status, json_pack("{s:s}", "error", msg));
}

/* The answer to a failed request: map's status and the error message. */
static void answer_failure(sv_answer_t *a, const status_map_t *map, int rc)
{
    answer_error(a, status_of(map, rc), kiln_errmsg());
}

static void answer_pushed(sv_answer_t *a, const sv_pushed_t *p)
{
    answer(a, 200, json_pack("{s:s,s:s,s:s,s:s,s:I,s:I,s:I,s:b}", "model", p->model, "label",
                             p->label, "checkpoint", p->uid, "base", p->base, "rows",
                             (json_int_t)p->rows, "applied_at", (json_int_t)p->applied_at,
                             "bytes", (json_int_t)p->bytes, "full", p->full));
}

/* A push's answer for rc (0: applied or repeated; < 0: its failure). */
static void answer_push(sv_answer_t *a, const status_map_t *map, int rc, const sv_pushed_t *p)
{
    if (rc >= 0)
        answer_pushed(a, p);
    else if (rc == KILN_ECONFLICT)
        answer(a, 409, json_pack("{s:s,s:s}", "error", kiln_errmsg(), "holds", p->holds));
    else
        answer_failure(a, map, rc);
}

sv_push_t *sv_answer_push_begin(sv_store_t *s, const char *model, const char *label,
                                const char *uid, const char *base, const char *idem,
                                sv_answer_t *ans)
{
    sv_pushed_t p;
    sv_push_t *push = NULL;
    int rc = sv_push_begin(s, model, label, uid, base, idem, &p, &push);
    if (rc != 0)
        answer_push(ans, push_begin_status, rc, &p);
    return push;
}

void sv_answer_push_end(sv_push_t *push, sv_answer_t *ans)
{
    sv_pushed_t p;
    int rc = sv_push_end(push, &p);
    answer_push(ans, push_end_status, rc, &p);
}

void sv_answer_version(sv_store_t *s, const char *model, const char *label, sv_answer_t *ans)
{
    sv_version_info_t *v = kiln_calloc(1, sizeof *v);
    if (v == NULL) {
        answer_error(ans, 503, "out of memory");
        return;
    }
    int rc = sv_version_get(s, model, label, v);
    if (rc == KILN_ENOENT && v->broken != NULL) {
        answer(ans, 404, json_pack("{s:s,s:s,s:s}", "error", kiln_errmsg(), "holds", "",
                                   "broken", v->broken));
    } else if (rc == KILN_ENOENT) {
        answer(ans, 404, json_pack("{s:s,s:s}", "error", kiln_errmsg(), "holds", ""));
    } else if (rc < 0) {
        answer_failure(ans, query_status, rc);
    } else {
        json_t *tables = json_array();
        for (int t = 0; t < v->ntables; t++)
            json_array_append_new(tables, json_pack("{s:s,s:i,s:I}", "name", v->tables[t].name,
                                                    "dim", v->tables[t].dim, "rows",
                                                    (json_int_t)v->tables[t].rows));
        answer(ans, 200,
               json_pack("{s:s,s:s,s:s,s:I,s:I,s:s,s:i,s:o}", "model", v->model, "label",
                         v->label, "checkpoint", v->uid, "rows", (json_int_t)v->rows,
                         "applied_at", (json_int_t)v->applied_at, "model_type", v->model_type,
                         "chain", v->chain, "tables", tables));
    }
    free(v->broken);
    free(v);
}

/* Key i of a lookup into *key: a JSON integer, or a decimal string of one
 * (what JavaScript clients send for 64-bit ids, which their numbers cannot
 * hold). Returns 0 or KILN_EINVAL saying what key i is. */
static int lookup_key(const json_t *k, size_t i, int64_t *key /* OUT */)
{
    if (json_is_integer(k)) {
        *key = json_integer_value(k);
        return 0;
    }
    const char *text = json_string_value(k);
    if (text != NULL) {
        const char *d = text + (text[0] == '-');
        char *end = NULL;
        errno = 0;
        long long v = strtoll(text, &end, 10);
        if (*d >= '0' && *d <= '9' && *end == '\0' && errno == 0) {
            *key = (int64_t)v;
            return 0;
        }
        return kiln_errf(KILN_EINVAL, "lookup key %zu is the string \"%.40s\", which is not a "
                                      "decimal integer from -9223372036854775808 to "
                                      "9223372036854775807: send keys as JSON integers or as "
                                      "decimal strings",
                         i, text);
    }
    return kiln_errf(KILN_EINVAL, "lookup key %zu is a JSON %s, not an integer: send keys as "
                                  "JSON integers or as decimal strings",
                     i, json_is_real(k) ? "number with a fraction or exponent"
                        : json_is_boolean(k) ? "boolean"
                        : json_is_null(k)    ? "null"
                                             : "array or object");
}

void sv_answer_lookup(sv_store_t *s, const char *model, const char *body, size_t len,
                      sv_answer_t *ans)
{
    json_error_t jerr;
    json_t *req = json_loadb(body, len, 0, &jerr);
    const char *label = json_string_value(json_object_get(req, "label"));
    const char *table = json_string_value(json_object_get(req, "table"));
    json_t *jkeys = json_object_get(req, "keys");
    if (req == NULL || !json_is_array(jkeys) || table == NULL) {
        answer_error(ans, 400, "lookup wants JSON {\"label\": \"A\", \"table\": \"slot0\", "
                               "\"keys\": [1, 2]}");
        json_decref(req);
        return;
    }
    size_t n = json_array_size(jkeys);
    int64_t *keys = kiln_calloc(n + 1, sizeof *keys);
    unsigned char *valid = kiln_calloc(n + 1, 1);
    sv_rows_t r = {0};
    int rc = keys && valid ? 0 : kiln_errf(KILN_ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < n; i++) {
        rc = lookup_key(json_array_get(jkeys, i), i, &keys[i]);
        valid[i] = 1;
    }
    if (rc == 0)
        rc = sv_lookup(s, model, label, table, (int64_t)n, keys, valid, &r);
    if (rc < 0) {
        answer_failure(ans, query_status, rc);
    } else {
        json_t *rows = json_array();
        for (int64_t i = 0; i < r.n; i++) {
            json_t *row = json_null();
            if (r.found[i]) {
                row = json_array();
                for (int j = 0; j < r.dim; j++) { /* finite: checked at push */
                    float x = r.values[i * r.dim + j];
                    json_array_append_new(row, isfinite(x) ? json_real(x) : json_null());
                }
            }
            json_array_append_new(rows, row);
        }
        answer(ans, 200, json_pack("{s:s,s:s,s:o}", "label", r.label, "checkpoint", r.uid,
                                   "rows", rows));
    }
    sv_rows_fini(&r);
    free(keys);
    free(valid);
    json_decref(req);
}

/* The lines of a predict body: JSON rows (an element that is not a string:
 * p NULL), else the TSV body's non-empty lines. Returns how many (*out
 * malloc'd), or -1 when out of memory. */
static int64_t predict_lines(json_t *rows, const char *body, size_t len, sv_line_t **out)
{
    size_t cap = rows ? json_array_size(rows) : 1;
    for (size_t i = 0; !rows && i < len; i++)
        cap += body[i] == '\n';
    sv_line_t *l = kiln_calloc(cap + 1, sizeof *l);
    if (l == NULL)
        return -1;
    int64_t n = 0;
    if (rows != NULL) {
        for (size_t i = 0; i < cap; i++, n++) {
            l[n].p = json_string_value(json_array_get(rows, i));
            l[n].len = l[n].p ? strlen(l[n].p) : 0;
        }
    } else {
        for (size_t pos = 0; pos < len;) {
            const char *lp = body + pos;
            const char *nl = memchr(lp, '\n', len - pos);
            size_t ll = nl ? (size_t)(nl - lp) : len - pos;
            pos += ll + (nl ? 1 : 0);
            if (ll == 0 || (ll == 1 && lp[0] == '\r'))
                continue;
            l[n++] = (sv_line_t){lp, ll};
        }
    }
    *out = l;
    return n;
}

/* The row ids of a JSON predict (NULL: none given, rows are logged by
 * index) into *ids (malloc'd, n). Returns 0 or KILN_EINVAL saying which id is
 * wrong. */
static int predict_row_ids(json_t *jids, int64_t n, char ***ids)
{
    *ids = NULL;
    if (jids == NULL)
        return 0;
    if (!json_is_array(jids) || (int64_t)json_array_size(jids) != n)
        return kiln_errf(KILN_EINVAL, "predict: row_ids must be an array with one id per row "
                                      "(%lld rows)",
                         (long long)n);
    char **out = kiln_calloc((size_t)n + 1, sizeof *out);
    int rc = out ? 0 : KILN_ENOMEM;
    for (int64_t i = 0; rc == 0 && i < n; i++) {
        json_t *e = json_array_get(jids, (size_t)i);
        out[i] = json_is_integer(e) ? kiln_asprintf("%lld", (long long)json_integer_value(e))
                 : json_is_string(e) ? kiln_strdup(json_string_value(e))
                                     : NULL;
        char what[48];
        snprintf(what, sizeof what, "predict: row_ids[%lld]", (long long)i);
        rc = out[i] == NULL ? kiln_errf(KILN_EINVAL, "%s must be a string or an integer", what)
                            : sv_loop_id_check(what, out[i]);
    }
    if (rc < 0) {
        for (int64_t i = 0; out != NULL && i < n; i++)
            free(out[i]);
        free(out);
        return rc;
    }
    *ids = out;
    return 0;
}

void sv_answer_predict(sv_store_t *s, sv_loop_t *loop, const char *model, const char *label,
                       const char *request_key, const char *body, size_t len, sv_answer_t *ans)
{
    json_t *jreq = NULL, *rows = NULL;
    if (len > 0 && body[0] == '{') { /* {"rows": ["tsv line", ...], "request_key": "..."} */
        json_error_t jerr;
        jreq = json_loadb(body, len, 0, &jerr);
        rows = json_object_get(jreq, "rows");
        if (jreq == NULL || !json_is_array(rows)) {
            answer_error(ans, 400, "predict wants Criteo TSV lines or JSON {\"rows\": [\"<tsv "
                                   "line>\", ...]}");
            json_decref(jreq);
            return;
        }
        if (request_key == NULL)
            request_key = json_string_value(json_object_get(jreq, "request_key"));
        if (label == NULL)
            label = json_string_value(json_object_get(jreq, "label"));
    }
    sv_line_t *lines = NULL;
    char **ids = NULL;
    sv_predicted_t r = {0};
    int64_t n = predict_lines(rows, body, len, &lines);
    int rc = n < 0 ? kiln_errf(KILN_ENOMEM, "out of memory") : 0;
    /* A request that is logged must carry ids the log can hold: checked
     * before predicting, so a refused request leaves no impression. */
    if (rc == 0 && loop != NULL && request_key != NULL)
        rc = sv_loop_id_check("the request key", request_key);
    if (rc == 0 && loop != NULL && request_key != NULL)
        rc = predict_row_ids(json_object_get(jreq, "row_ids"), n, &ids);
    if (rc == 0)
        rc = sv_predict(s, model, label, request_key, n, lines, &r);
    json_t *probs = rc == 0 ? json_array() : NULL, *bad = rc == 0 ? json_array() : NULL;
    if (rc == 0 && (probs == NULL || bad == NULL))
        rc = kiln_errf(KILN_ENOMEM, "out of memory");
    /* One entry per row, always: a probability that is not finite (weights
     * that overflow) is null and its row is listed, so rows never shift. */
    for (int64_t i = 0; rc == 0 && i < r.n; i++) {
        bool finite = isfinite(r.probs[i]);
        if (json_array_append_new(probs, finite ? json_real(r.probs[i]) : json_null()) < 0 ||
            (!finite && json_array_append_new(bad, json_integer(i)) < 0))
            rc = kiln_errf(KILN_ENOMEM, "out of memory");
    }
    if (rc < 0) {
        answer_failure(ans, query_status, rc);
    } else {
        answer(ans, 200, json_pack("{s:s,s:s,s:O,s:O}", "label", r.label, "checkpoint", r.uid,
                                   "probabilities", probs, "nonfinite_rows", bad));
        sv_loop_log(loop, model, &r, request_key, lines, (const char *const *)ids);
    }
    kiln_strv_free(ids, (size_t)n);
    json_decref(probs);
    json_decref(bad);
    json_decref(jreq);
    free(lines);
    free(r.probs);
}

/* Appends to b (cap bytes, *n used) what fits, never past cap. */
static void bput(char *b, size_t cap, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void bput(char *b, size_t cap, size_t *n, const char *fmt, ...)
{
    if (*n >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b + *n, cap - *n, fmt, ap);
    va_end(ap);
    *n = k < 0 ? *n : (*n + (size_t)k < cap ? *n + (size_t)k : cap - 1);
}

/* Starts a metric family of the Prometheus text format: its HELP and TYPE
 * lines, which its samples, all of them, follow (promtool check metrics
 * wants both lines and the samples of a family together). */
static void family(char *b, size_t cap, size_t *n, const char *name, const char *type,
                   const char *help)
{
    bput(b, cap, n, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The per-(model, label) predict counters: one family each. */
static const struct {
    const char *name, *help;
    size_t offset; /* of the int64_t in struct sv_stats_predict */
} predict_families[] = {
    {"kiln_serve_predict_requests_total", "Predict requests answered, by model and label.",
     offsetof(struct sv_stats_predict, requests)},
    {"kiln_serve_predict_rows_total", "Rows scored by predict, by model and label.",
     offsetof(struct sv_stats_predict, rows)},
    {"kiln_serve_predict_nonfinite_total",
     "Predict rows whose score was not finite, by model and label.",
     offsetof(struct sv_stats_predict, nonfinite)},
};

/* The Prometheus text of st (malloc'd), or NULL. */
static char *prometheus_text(const sv_stats_t *st)
{
    /* A line is at most ~100 bytes besides a model and a label (63 each). */
    size_t cap = 4096 + (size_t)(3 * st->npredict + st->nversions + st->nbroken) * 256, n = 0;
    char *b = kiln_malloc(cap);
    if (b == NULL)
        return NULL;
    for (size_t f = 0; f < sizeof predict_families / sizeof predict_families[0]; f++) {
        family(b, cap, &n, predict_families[f].name, "counter", predict_families[f].help);
        for (int i = 0; i < st->npredict; i++) {
            const struct sv_stats_predict *c = &st->predict[i];
            int64_t v;
            memcpy(&v, (const char *)c + predict_families[f].offset, sizeof v);
            bput(b, cap, &n, "%s{model=\"%s\",label=\"%s\"} %lld\n", predict_families[f].name,
                 c->model, c->label, (long long)v);
        }
    }
    family(b, cap, &n, "kiln_serve_version_rows", "gauge",
           "Rows (keys) of the version each model and label serves.");
    for (int i = 0; i < st->nversions; i++)
        bput(b, cap, &n, "kiln_serve_version_rows{model=\"%s\",label=\"%s\"} %lld\n",
             st->versions[i].model, st->versions[i].label, (long long)st->versions[i].rows);
    family(b, cap, &n, "kiln_serve_version_broken", "gauge",
           "1 for each model and label whose stored version could not be loaded.");
    for (int i = 0; i < st->nbroken; i++)
        bput(b, cap, &n, "kiln_serve_version_broken{model=\"%s\",label=\"%s\"} 1\n",
             st->broken[i].model, st->broken[i].label);
    family(b, cap, &n, "kiln_serve_pushes_total", "counter",
           "Pushes received, by result (applied or rejected).");
    bput(b, cap, &n,
         "kiln_serve_pushes_total{result=\"applied\"} %lld\n"
         "kiln_serve_pushes_total{result=\"rejected\"} %lld\n",
         (long long)st->pushes_applied, (long long)st->pushes_rejected);
    return b;
}

/* The JSON of /v1/stats. */
static json_t *stats_json(const sv_stats_t *st)
{
    json_t *labels = json_array(), *versions = json_array(), *broken = json_array();
    for (int i = 0; i < st->npredict; i++) {
        const struct sv_stats_predict *c = &st->predict[i];
        json_array_append_new(labels, json_pack("{s:s,s:s,s:I,s:I,s:I}", "model", c->model,
                                                "label", c->label, "requests",
                                                (json_int_t)c->requests, "rows",
                                                (json_int_t)c->rows, "nonfinite",
                                                (json_int_t)c->nonfinite));
    }
    for (int i = 0; i < st->nversions; i++)
        json_array_append_new(versions,
                              json_pack("{s:s,s:s,s:s,s:I}", "model", st->versions[i].model,
                                        "label", st->versions[i].label, "checkpoint",
                                        st->versions[i].uid, "rows",
                                        (json_int_t)st->versions[i].rows));
    for (int i = 0; i < st->nbroken; i++)
        json_array_append_new(broken, json_pack("{s:s,s:s,s:s}", "model", st->broken[i].model,
                                                "label", st->broken[i].label, "error",
                                                st->broken[i].error));
    return json_pack("{s:o,s:o,s:o,s:I,s:I}", "predict", labels, "versions", versions,
                     "broken", broken, "pushes_applied", (json_int_t)st->pushes_applied,
                     "pushes_rejected", (json_int_t)st->pushes_rejected);
}

/* Setting a split: a bad one, too many models, or it could not be kept. */
static const status_map_t split_status[] = {
    {KILN_EINVAL, 400}, {KILN_ERANGE, 507}, {KILN_ENOMEM, 503}, {0, 507}};

void sv_answer_split(sv_store_t *s, const char *model, const char *body, size_t len,
                     sv_answer_t *ans)
{
    char why[256];
    if (serve_name_check(model, why, sizeof why) < 0) {
        answer_error(ans, 400, why);
        return;
    }
    if (body != NULL) {
        json_error_t err;
        json_t *doc = json_loadb(body, len, 0, &err);
        const char *text = json_string_value(json_object_get(doc, "split"));
        sv_split_t split;
        int rc = text == NULL ? kiln_errf(KILN_EINVAL, "the body must be JSON {\"split\": "
                                                       "\"A=90,B=10\"}")
                              : sv_split_parse(text, true, &split);
        if (rc == 0)
            rc = sv_split_set(s, model, &split);
        json_decref(doc);
        if (rc < 0) {
            answer_failure(ans, split_status, rc);
            return;
        }
    }
    sv_split_info_t in;
    sv_split_get(s, model, &in);
    char text[SV_MAX_SPLIT * (SERVE_NAME_MAX + 12)];
    sv_split_format(&in.split, text, sizeof text);
    json_t *labels = json_array(), *idle = json_array();
    for (int i = 0; i < in.split.n; i++)
        json_array_append_new(labels, json_pack("{s:s,s:i,s:b}", "label", in.split.label[i],
                                                "weight", in.split.weight[i], "held",
                                                in.held[i]));
    for (int i = 0; i < in.nidle; i++)
        json_array_append_new(idle, json_string(in.idle[i]));
    answer(ans, 200, json_pack("{s:s,s:s,s:s,s:o,s:o}", "model", model, "split", text,
                               "source", in.source, "labels", labels, "no_traffic", idle));
}

void sv_answer_stats(sv_store_t *s, bool prometheus, sv_answer_t *ans)
{
    sv_stats_t st;
    if (sv_stats_get(s, &st) < 0) {
        answer_error(ans, 503, "out of memory");
        return;
    }
    if (prometheus) {
        ans->body = prometheus_text(&st);
        ans->status = ans->body ? 200 : 503;
    } else {
        answer(ans, 200, stats_json(&st));
    }
    sv_stats_fini(&st);
}
