/*
 * serving/serve_push.c - the push client: one libcurl multi handle drives a
 * PUT to every target at once, each body streamed from its encoder by a
 * read callback (chunked transfer encoding; never the whole push in
 * memory). A transfer that fails on the network or with a 5xx is retried
 * after an exponential backoff with +-50% jitter, up to opts->retries more
 * times; a 409 (the endpoint holds something other than the delta's base)
 * is re-sent once as a full push; 401, 400, 404, 413 and 422 are final. A
 * 2xx counts only when its answer confirms the push (kiln-serve's JSON with
 * the model, label and checkpoint pushed and the size of the whole body).
 * Beside it, the small requests Kiln makes of an endpoint: its /v1/stats
 * and a model's traffic split (GET or PUT /v1/models/M/split).
 * The only file in Kiln besides the CLI's callers that includes curl.h.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "serve.h"

typedef struct xfer {
    const serve_target_t *t;
    serve_push_result_t *res;
    CURL *easy;
    struct curl_slist *hdrs;
    serve_enc_t *enc;
    char held[SERVE_UID_MAX];
    bool force_full, running, done;
    int64_t next_at_ms;
    int64_t t0_ms;
    char resp[4096];
    size_t resp_len;
    int enc_err;
    char enc_msg[256];
    bool enc_end; /* the whole body was handed to libcurl */
} xfer_t;

static size_t on_read(char *buf, size_t size, size_t nitems, void *ud)
{
    xfer_t *x = ud;
    size_t n = 0;
    int rc = serve_enc_read(x->enc, buf, size * nitems, &n);
    if (rc < 0) {
        x->enc_err = rc;
        snprintf(x->enc_msg, sizeof x->enc_msg, "%s", kiln_errmsg());
        return CURL_READFUNC_ABORT;
    }
    x->enc_end = x->enc_end || n == 0;
    return n;
}

static size_t on_write(char *buf, size_t size, size_t nitems, void *ud)
{
    xfer_t *x = ud;
    size_t n = size * nitems, room = sizeof x->resp - 1 - x->resp_len;
    size_t take = n < room ? n : room;
    memcpy(x->resp + x->resp_len, buf, take);
    x->resp_len += take;
    x->resp[x->resp_len] = '\0';
    return n;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void fail(xfer_t *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(xfer_t *x, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(x->res->error, sizeof x->res->error, "%s (%s/%s): %s", x->t->url, x->t->model,
             x->t->label, msg);
    x->res->ok = false;
    x->done = true;
}

/* Starts one attempt: opens a source for what the endpoint holds (or a
 * full one), builds the request and adds it to the multi handle. */
static int start(CURLM *multi, xfer_t *x, const serve_push_opts_t *call)
{
    const serve_push_opts_t *o = x->t->opts != NULL ? x->t->opts : call;
    serve_source_t *src = NULL;
    int rc = x->t->open(x->t->open_ctx, x->force_full ? "" : x->held, &src);
    if (rc < 0) {
        fail(x, "cannot build the push: %s", kiln_errmsg());
        return rc;
    }
    serve_enc_destroy(x->enc);
    x->enc = NULL;
    if ((rc = serve_enc_create(src, 0, &x->enc)) < 0) {
        serve_source_destroy(src);
        fail(x, "out of memory");
        return rc;
    }
    x->res->attempts++;
    x->res->full = src->base[0] == '\0';
    snprintf(x->res->base, sizeof x->res->base, "%s", src->base);
    x->resp_len = 0;
    x->resp[0] = '\0';
    x->enc_err = 0;
    x->enc_end = false;

    /* The idempotency key names this push (nonce, endpoint, uid, base): a
     * retry of it carries the same key, a fallback to full a new one. */
    char idem_src[1024], idem[17];
    snprintf(idem_src, sizeof idem_src, "%s|%s|%s|%s|%s|%s", o->idem_nonce ? o->idem_nonce : "",
             x->t->url, x->t->model, x->t->label, src->uid, src->base);
    kiln_hash_hex(kiln_xxh64(idem_src, strlen(idem_src), 0), idem, sizeof idem);

    char line[512];
    curl_slist_free_all(x->hdrs);
    x->hdrs = NULL;
    const char *hv[6];
    char h0[600], h1[128], h2[128], h3[64], h5[48];
    snprintf(h0, sizeof h0, "Authorization: Bearer %s", o->token ? o->token : "");
    snprintf(h1, sizeof h1, "Kiln-Checkpoint: %s", src->uid);
    snprintf(h2, sizeof h2, "Kiln-Base: %s", src->base[0] ? src->base : "none");
    snprintf(h3, sizeof h3, "Idempotency-Key: %s", idem);
    snprintf(h5, sizeof h5, "Kiln-Traffic: %d", o->traffic);
    hv[0] = h0;
    hv[1] = h1;
    hv[2] = h2;
    hv[3] = h3;
    hv[4] = "Content-Type: application/x-kiln-push";
    hv[5] = h5;
    for (int i = 0; i < 6; i++) {
        if ((i == 0 && o->token == NULL) || (i == 5 && o->traffic <= 0))
            continue;
        struct curl_slist *l = curl_slist_append(x->hdrs, hv[i]);
        if (l == NULL) {
            fail(x, "out of memory");
            return KILN_ENOMEM;
        }
        x->hdrs = l;
    }
    snprintf(line, sizeof line, "%s/v1/models/%s/versions/%s", x->t->url, x->t->model,
             x->t->label);
    if (x->easy == NULL)
        x->easy = curl_easy_init();
    else
        curl_easy_reset(x->easy);
    if (x->easy == NULL) {
        fail(x, "curl_easy_init failed");
        return KILN_ENOMEM;
    }
    CURL *e = x->easy;
    curl_easy_setopt(e, CURLOPT_URL, line);
    curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(e, CURLOPT_READDATA, x);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, x->hdrs);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_UPLOAD_BUFFERSIZE, 512L * 1024);
    curl_easy_setopt(e, CURLOPT_EXPECT_100_TIMEOUT_MS, 2000L);
    if (o->timeout_ms > 0) {
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)o->timeout_ms);
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
                         (long)(o->timeout_ms < 5000 ? o->timeout_ms : 5000));
    }
    curl_easy_setopt(e, CURLOPT_PRIVATE, x);
    if (curl_multi_add_handle(multi, e) != CURLM_OK) {
        fail(x, "curl_multi_add_handle failed");
        return KILN_EINTERNAL;
    }
    x->running = true;
    return 0;
}

/* What the endpoint says it holds, from a 409 or 200 body ("" if none). */
static void json_field(const char *body, const char *field, char *out, size_t cap)
{
    json_error_t err;
    json_t *j = json_loads(body, 0, &err);
    const char *v = json_string_value(json_object_get(j, field));
    snprintf(out, cap, "%s", v ? v : "");
    json_decref(j);
}

/* The size of the whole push body: what was sent, plus (when the endpoint
 * answered before reading it all, as a repeated push's stored answer does)
 * the rest, encoded and counted. Returns 0 or the encoder's failure. */
static int body_size(xfer_t *x, uint64_t *size /* OUT */)
{
    char buf[1 << 16];
    size_t n = 1;
    while (!x->enc_end && n > 0) {
        int rc = serve_enc_read(x->enc, buf, sizeof buf, &n);
        if (rc < 0)
            return rc;
        x->enc_end = n == 0;
    }
    *size = serve_enc_bytes(x->enc);
    return 0;
}

/* Whether a 2xx answer confirms the push: kiln-serve's JSON naming the
 * model, label and checkpoint pushed and the bytes of the whole body. An
 * endpoint that answers 200 with anything else (not JSON, another
 * checkpoint, fewer bytes: a proxy, a stub, a server that never read the
 * body) is not believed. Returns NULL, or why not in why. */
static const char *unconfirmed(xfer_t *x, const serve_source_t *src, char *why, size_t cap)
{
    json_error_t jerr;
    json_t *j = json_loads(x->resp, 0, &jerr);
    const char *uid = json_string_value(json_object_get(j, "checkpoint"));
    const char *model = json_string_value(json_object_get(j, "model"));
    const char *label = json_string_value(json_object_get(j, "label"));
    json_t *jb = json_object_get(j, "bytes");
    uint64_t size = 0;
    if (!json_is_object(j))
        snprintf(why, cap, "its answer is not kiln-serve's JSON (%.60s%s)", x->resp,
                 strlen(x->resp) > 60 ? "..." : "");
    else if (uid == NULL || strcmp(uid, src->uid) != 0)
        snprintf(why, cap, "its answer names checkpoint '%s', not the pushed %s", uid ? uid : "",
                 src->uid);
    else if (model == NULL || label == NULL || strcmp(model, x->t->model) != 0 ||
             strcmp(label, x->t->label) != 0)
        snprintf(why, cap, "its answer is for %s/%s, not %s/%s", model ? model : "?",
                 label ? label : "?", x->t->model, x->t->label);
    else if (body_size(x, &size) < 0)
        snprintf(why, cap, "reading the checkpoint failed: %s", kiln_errmsg());
    else if (!json_is_integer(jb) || (uint64_t)json_integer_value(jb) != size)
        snprintf(why, cap, "it says it took %lld bytes of the %llu-byte push",
                 json_is_integer(jb) ? (long long)json_integer_value(jb) : -1LL,
                 (unsigned long long)size);
    else
        why = NULL;
    json_decref(j);
    return why;
}

/* An attempt ended: decide ok / retry / fallback / fail. */
static void finished(xfer_t *x, CURLcode cc, const serve_push_opts_t *call, uint64_t *rng)
{
    const serve_push_opts_t *o = x->t->opts != NULL ? x->t->opts : call;
    long status = 0;
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &status);
    x->running = false;
    x->res->http_status = (int)status;
    x->res->bytes = serve_enc_bytes(x->enc);
    const serve_source_t *src = serve_enc_source(x->enc);
    char err[256];
    json_field(x->resp, "error", err, sizeof err);
    if (x->enc_err < 0) {
        fail(x, "reading the checkpoint failed: %s", x->enc_msg);
        return;
    }
    char unbelieved[300];
    if (cc == CURLE_OK && status >= 200 && status < 300 &&
        unconfirmed(x, src, unbelieved, sizeof unbelieved) != NULL) {
        fail(x, "HTTP %ld, but %s; the push is not counted as delivered (is this URL a "
                "kiln-serve?)",
             status, unbelieved);
        return;
    }
    if (cc == CURLE_OK && status >= 200 && status < 300) {
        x->res->ok = true;
        snprintf(x->res->uid, sizeof x->res->uid, "%s", src->uid);
        x->done = true;
        return;
    }
    if (cc == CURLE_OK && status == 409) {
        char holds[SERVE_UID_MAX];
        json_field(x->resp, "holds", holds, sizeof holds);
        if (strcmp(holds, src->uid) == 0) { /* it already holds what we push */
            x->res->ok = true;
            snprintf(x->res->uid, sizeof x->res->uid, "%s", src->uid);
            x->done = true;
            return;
        }
        if (!x->force_full && src->base[0] != '\0') {
            KILN_INFO("%s (%s/%s) holds '%s', not the delta's base %s: pushing in full",
                      x->t->url, x->t->model, x->t->label, holds, src->base);
            x->force_full = true;
            x->next_at_ms = 0;
            return;
        }
    }
    bool retryable = cc != CURLE_OK || status >= 500 || status == 408 || status == 429;
    if (cc == CURLE_ABORTED_BY_CALLBACK)
        retryable = false;
    if (retryable && x->res->attempts <= o->retries) {
        int64_t base = o->backoff_ms > 0 ? o->backoff_ms : 200;
        int64_t cap = o->max_backoff_ms > 0 ? o->max_backoff_ms : 10000;
        int64_t d = base;
        for (int i = 1; i < x->res->attempts && d < cap; i++)
            d *= 2;
        if (d > cap)
            d = cap;
        d = d / 2 + (int64_t)(rng_next(rng) % (uint64_t)(d + 1)); /* [d/2, 3d/2] */
        char why[400];
        if (cc != CURLE_OK)
            snprintf(why, sizeof why, "%s", curl_easy_strerror(cc));
        else
            snprintf(why, sizeof why, "HTTP %ld%s%s", status, err[0] ? ": " : "", err);
        KILN_WARN("push to %s (%s/%s) attempt %d failed (%s): retrying in %lld ms", x->t->url,
                  x->t->model, x->t->label, x->res->attempts, why, (long long)d);
        x->next_at_ms = kiln_now_ms() + d;
        return;
    }
    if (cc != CURLE_OK)
        fail(x, "no HTTP response after %d attempt(s): %s", x->res->attempts,
             curl_easy_strerror(cc));
    else
        fail(x, "HTTP %ld after %d attempt(s)%s%s", status, x->res->attempts, err[0] ? ": " : "",
             err);
}

/* libcurl's global set-up, once per process, whichever thread comes first
 * (kilnd pushes and reads stats from threads of its own). */
static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_ready;

static void curl_setup(void)
{
    curl_ready = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static int client_init(void)
{
    pthread_once(&curl_once, curl_setup);
    return curl_ready == CURLE_OK ? 0
                                  : kiln_errf(KILN_EINTERNAL, "curl_global_init failed: %s",
                                              curl_easy_strerror(curl_ready));
}

int serve_push(const serve_target_t *targets, int n, const serve_push_opts_t *opts,
               serve_push_result_t *results)
{
    KILN_CHECK(client_init());
    serve_push_opts_t o = *opts;
    char nonce[64];
    if (o.idem_nonce == NULL) {
        snprintf(nonce, sizeof nonce, "%lld-%d", (long long)kiln_now_ms(), (int)getpid());
        o.idem_nonce = nonce;
    }
    xfer_t *xs = kiln_calloc((size_t)n + 1, sizeof *xs);
    CURLM *multi = curl_multi_init();
    if (xs == NULL || multi == NULL) {
        free(xs);
        if (multi)
            curl_multi_cleanup(multi);
        return KILN_ENOMEM;
    }
    uint64_t rng = (uint64_t)kiln_mono_ns() | 1;
    for (int i = 0; i < n; i++) {
        memset(&results[i], 0, sizeof results[i]);
        xs[i].t = &targets[i];
        xs[i].res = &results[i];
        snprintf(xs[i].held, sizeof xs[i].held, "%s", targets[i].held ? targets[i].held : "");
        xs[i].t0_ms = kiln_now_ms();
    }
    for (;;) {
        int pending = 0;
        int64_t now = kiln_now_ms(), wake = now + 1000;
        for (int i = 0; i < n; i++) {
            xfer_t *x = &xs[i];
            if (x->done)
                continue;
            pending++;
            if (!x->running && x->next_at_ms <= now)
                start(multi, x, &o);
            if (!x->running && !x->done && x->next_at_ms < wake)
                wake = x->next_at_ms;
        }
        if (pending == 0)
            break;
        int still = 0;
        curl_multi_perform(multi, &still);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(multi, &left)) != NULL) {
            if (m->msg != CURLMSG_DONE)
                continue;
            xfer_t *x = NULL;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
            CURLcode cc = m->data.result;
            curl_multi_remove_handle(multi, m->easy_handle);
            finished(x, cc, &o, &rng);
            if (x->done)
                x->res->duration_ms = kiln_now_ms() - x->t0_ms;
        }
        int64_t wait = wake - kiln_now_ms();
        if (wait < 0)
            wait = 0;
        if (wait > 100)
            wait = 100;
        curl_multi_poll(multi, NULL, 0, (int)wait, NULL);
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        xfer_t *x = &xs[i];
        if (x->easy != NULL)
            curl_easy_cleanup(x->easy);
        curl_slist_free_all(x->hdrs);
        serve_enc_destroy(x->enc);
        if (!results[i].ok && rc == 0)
            rc = kiln_errf(KILN_EHTTP, "push failed: %s", results[i].error);
    }
    curl_multi_cleanup(multi);
    free(xs);
    return rc;
}

/* ---- endpoint stats ----------------------------------------------------------------- */

static size_t on_body(char *buf, size_t size, size_t nitems, void *ud)
{
    char **body = ud;
    size_t n = size * nitems, have = *body ? strlen(*body) : 0;
    if (have + n > (1u << 20))
        return 0; /* a stats answer is small; more is not one */
    char *nb = realloc(*body, have + n + 1);
    if (nb == NULL)
        return 0;
    memcpy(nb + have, buf, n);
    nb[have + n] = '\0';
    *body = nb;
    return n;
}

/* Runs e's request to where (timeout_ms in all), its answer into *body
 * (malloc'd, at most 1 MiB) and its HTTP status into *status (0: none). */
static CURLcode perform(CURL *e, const char *where, int64_t timeout_ms, char **body,
                        long *status)
{
    curl_easy_setopt(e, CURLOPT_URL, where);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, body);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)timeout_ms);
    CURLcode cc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
    return cc;
}

/* GETs where (one request, timeout_ms) and parses its 200 answer into *doc
 * (json_decref it). Returns 0, KILN_ENOENT (HTTP 404) or KILN_EHTTP naming
 * where and the status or network error, or KILN_ENOMEM. */
static int get_json(const char *where, int64_t timeout_ms, json_t **doc /* OUT */)
{
    *doc = NULL;
    KILN_CHECK(client_init());
    CURL *e = curl_easy_init();
    if (e == NULL)
        return KILN_ENOMEM;
    char *body = NULL;
    long status = 0;
    int rc = 0;
    CURLcode cc = perform(e, where, timeout_ms, &body, &status);
    if (cc != CURLE_OK)
        rc = kiln_errf(KILN_EHTTP, "%s: %s", where, curl_easy_strerror(cc));
    else if (status == 404) /* it answered: nothing there */
        rc = kiln_errf(KILN_ENOENT, "%s: HTTP 404", where);
    else if (status != 200)
        rc = kiln_errf(KILN_EHTTP, "%s: HTTP %ld", where, status);
    else if ((*doc = body != NULL ? json_loads(body, 0, NULL) : NULL) == NULL)
        rc = kiln_errf(KILN_EHTTP, "%s: the answer is not JSON", where);
    free(body);
    curl_easy_cleanup(e);
    return rc;
}

/* GETs url + path (timeout_ms) and finds the list `key` of its answer: *doc
 * is the answer (json_decref it, also on failure), *list borrowed from it,
 * *items a zeroed array of as many elements of elem bytes (free() it).
 * Returns 0, KILN_EHTTP (no answer, not 200, or no such list; the message
 * names the URL) or KILN_ENOMEM. */
static int get_list(const char *url, const char *path, int64_t timeout_ms, const char *key,
                    size_t elem, json_t **doc, json_t **list, void **items)
{
    *doc = *list = NULL;
    *items = NULL;
    char *where = kiln_asprintf("%s%s", url, path);
    int rc = where == NULL ? KILN_ENOMEM : get_json(where, timeout_ms, doc);
    if (rc == 0 && !json_is_array(*list = json_object_get(*doc, key)))
        rc = kiln_errf(KILN_EHTTP, "%s: the answer has no \"%s\" list", where, key);
    if (rc == 0 && (*items = kiln_calloc(json_array_size(*list) + 1, elem)) == NULL)
        rc = KILN_ENOMEM;
    free(where);
    return rc;
}

int serve_stats_fetch(const char *url, int64_t timeout_ms, serve_label_stats_t **out, size_t *n)
{
    json_t *doc, *labels;
    serve_label_stats_t *ls;
    int rc =
        get_list(url, "/v1/stats", timeout_ms, "predict", sizeof *ls, &doc, &labels, (void **)&ls);
    *n = rc == 0 ? json_array_size(labels) : 0;
    for (size_t i = 0; i < *n; i++) {
        json_t *l = json_array_get(labels, i);
        const char *m = json_string_value(json_object_get(l, "model"));
        const char *lab = json_string_value(json_object_get(l, "label"));
        snprintf(ls[i].model, sizeof ls[i].model, "%s", m ? m : "");
        snprintf(ls[i].label, sizeof ls[i].label, "%s", lab ? lab : "");
        ls[i].predict_requests = json_integer_value(json_object_get(l, "requests"));
        ls[i].predict_rows = json_integer_value(json_object_get(l, "rows"));
    }
    *out = ls;
    json_decref(doc);
    return rc;
}

/* ---- online A/B metrics -------------------------------------------------------------- */

/* A JSON number, or NAN for null or anything else. */
static double num_or_nan(const json_t *j)
{
    return json_is_number(j) ? json_number_value(j) : NAN;
}

int serve_online_fetch(const char *url, const char *model, int64_t timeout_ms,
                       serve_online_label_t **out, size_t *n)
{
    char path[SERVE_NAME_MAX + 32];
    snprintf(path, sizeof path, "/v1/models/%s/online", model);
    json_t *doc, *labels;
    serve_online_label_t *ls;
    int rc = get_list(url, path, timeout_ms, "labels", sizeof *ls, &doc, &labels, (void **)&ls);
    *n = rc == 0 ? json_array_size(labels) : 0;
    for (size_t i = 0; i < *n; i++) {
        json_t *l = json_array_get(labels, i);
        const char *lab = json_string_value(json_object_get(l, "label"));
        snprintf(ls[i].label, sizeof ls[i].label, "%s", lab ? lab : "");
        ls[i].impressions = json_integer_value(json_object_get(l, "impressions"));
        ls[i].positives = json_integer_value(json_object_get(l, "positives"));
        ls[i].ctr = num_or_nan(json_object_get(l, "ctr"));
        ls[i].logloss = num_or_nan(json_object_get(l, "logloss"));
        ls[i].logloss_var = num_or_nan(json_object_get(l, "logloss_var"));
        ls[i].auc = num_or_nan(json_object_get(l, "auc"));
        ls[i].calibration = num_or_nan(json_object_get(l, "calibration"));
    }
    *out = ls;
    json_decref(doc);
    return rc;
}

/* ---- traffic split -------------------------------------------------------------------- */

/* Joins the strings of arr with commas into buf (cap). */
static void join(const json_t *arr, char *buf, size_t cap)
{
    size_t n = 0, i;
    json_t *v;
    buf[0] = '\0';
    json_array_foreach(arr, i, v)
    {
        if (n < cap)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? "," : "",
                                  json_string_value(v) ? json_string_value(v) : "");
    }
}

int serve_split_call(const char *url, const char *token, const char *model, const char *split,
                     int64_t timeout_ms, serve_split_result_t *out)
{
    memset(out, 0, sizeof *out);
    KILN_CHECK(client_init());
    char *where = kiln_asprintf("%s/v1/models/%s/split", url, model);
    char *auth = kiln_asprintf("Authorization: Bearer %s", token ? token : "");
    json_t *req = split ? json_pack("{s:s}", "split", split) : NULL;
    char *reqbody = req ? json_dumps(req, JSON_COMPACT) : NULL;
    CURL *e = curl_easy_init();
    struct curl_slist *hdrs = NULL;
    char *body = NULL;
    json_t *doc = NULL;
    int rc = 0;
    if (where == NULL || auth == NULL || e == NULL || (split != NULL && reqbody == NULL) ||
        (hdrs = curl_slist_append(NULL, "Content-Type: application/json")) == NULL ||
        (split != NULL && (hdrs = curl_slist_append(hdrs, auth)) == NULL)) {
        rc = KILN_ENOMEM;
        goto out;
    }
    if (split != NULL) {
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "PUT");
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, reqbody);
    }
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
    long status = 0;
    CURLcode cc = perform(e, where, timeout_ms, &body, &status);
    out->http_status = (int)status;
    doc = body != NULL ? json_loads(body, 0, NULL) : NULL;
    const char *text = json_string_value(json_object_get(doc, "split"));
    if (cc != CURLE_OK) {
        snprintf(out->error, sizeof out->error, "%s: %s", url, curl_easy_strerror(cc));
    } else if (status != 200 || text == NULL) {
        const char *why = json_string_value(json_object_get(doc, "error"));
        snprintf(out->error, sizeof out->error, "%s (%s): HTTP %ld: %s", url, model, status,
                 why ? why : "the answer is not kiln-serve's split (is this URL a kiln-serve?)");
    } else {
        snprintf(out->split, sizeof out->split, "%s", text);
        const char *src = json_string_value(json_object_get(doc, "source"));
        snprintf(out->source, sizeof out->source, "%s", src ? src : "");
        join(json_object_get(doc, "no_traffic"), out->no_traffic, sizeof out->no_traffic);
        goto out;
    }
    rc = kiln_errf(status == 400 ? KILN_EINVAL : KILN_EHTTP, "%s", out->error);
out:
    json_decref(doc);
    json_decref(req);
    free(reqbody);
    free(body);
    free(where);
    free(auth);
    curl_slist_free_all(hdrs);
    if (e != NULL)
        curl_easy_cleanup(e);
    return rc;
}
