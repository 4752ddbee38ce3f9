/*
 * serving/serve_http.c - kiln-serve's HTTP front on libmicrohttpd: the route
 * table, bearer-token auth for pushes, bounded request bodies (a push body
 * streams to the store chunk by chunk and is bounded by the chunk limit
 * instead), and JSON answers. One internal polling thread serves every
 * connection; MHD bounds the connection count, the connections of one
 * client address and idle time. A request whose Host is not one of this
 * server's names gets 403 before anything else (DNS rebinding:
 * kiln_host_allowed).
 */
#include <stdlib.h>
#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "serve_loop_int.h"
#include "web_guard.h"

typedef enum {
    R_PUSH, R_VERSION, R_LOOKUP, R_PREDICT, R_SPLIT_SET, R_SPLIT, R_STATS, R_METRICS, R_HEALTH,
    R_FEEDBACK, R_ONLINE
} route_id_t;

typedef struct route {
    const char *method;
    const char *pattern; /* '*' matches one path segment */
    route_id_t id;
    const char *token; /* the request needs Authorization: Bearer <token>: what it
                          is, for the 401 ("a push"); NULL: it does not */
} route_t;

static const route_t routes[] = {
    {"PUT", "/v1/models/*/versions/*", R_PUSH, "a push"},
    {"GET", "/v1/models/*/versions/*", R_VERSION, NULL},
    {"POST", "/v1/models/*/lookup", R_LOOKUP, NULL},
    {"POST", "/v1/models/*/predict", R_PREDICT, NULL},
    {"PUT", "/v1/models/*/split", R_SPLIT_SET, "setting a split"},
    {"GET", "/v1/models/*/split", R_SPLIT, NULL},
    {"POST", "/v1/models/*/feedback", R_FEEDBACK, "feedback"},
    {"GET", "/v1/models/*/online", R_ONLINE, NULL},
    {"GET", "/v1/stats", R_STATS, NULL},
    {"GET", "/metrics", R_METRICS, NULL},
    {"GET", "/healthz", R_HEALTH, NULL},
};

struct sv_http {
    struct MHD_Daemon *d;
    sv_store_t *store;
    sv_loop_t *loop; /* NULL: no impression log */
    char *token;
    size_t max_body;
    char bind[64];     /* the --listen address */
    char *allow_hosts; /* --allow-host, NULL: none */
    web_guard_t *guard; /* --max-connections and --max-per-client (web/web_guard.h) */
};

typedef struct conn {
    const route_t *route;
    char seg[2][SERVE_NAME_MAX]; /* the '*' parts: model, label */
    sv_push_t *push;
    char *body;
    size_t len, cap;
    bool too_big;
    bool answered;
} conn_t;

/* Matches url against pattern, capturing up to two '*' segments. */
static bool match(const char *pattern, const char *url, char seg[2][SERVE_NAME_MAX])
{
    int k = 0;
    while (*pattern && *url) {
        if (*pattern == '*') {
            const char *e = strchr(url, '/');
            size_t n = e ? (size_t)(e - url) : strlen(url);
            if (n == 0 || n >= SERVE_NAME_MAX || k == 2)
                return false;
            memcpy(seg[k], url, n);
            seg[k++][n] = '\0';
            url += n;
            pattern++;
            continue;
        }
        if (*pattern++ != *url++)
            return false;
    }
    return *pattern == '\0' && *url == '\0';
}

static enum MHD_Result send_answer(struct MHD_Connection *con, int status, char *body,
                                   const char *type)
{
    if (body == NULL) {
        status = 503;
        body = kiln_strdup("{\"error\":\"out of memory\"}");
    }
    size_t n = body ? strlen(body) : 0;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(n, body, body ? MHD_RESPMEM_MUST_FREE
                                                      : MHD_RESPMEM_PERSISTENT);
    if (r == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ret = MHD_queue_response(con, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *con, sv_answer_t *a)
{
    return send_answer(con, a->status, a->body, "application/json");
}

static enum MHD_Result send_error(struct MHD_Connection *con, int status, const char *msg)
{
    char *body = kiln_asprintf("{\"error\":\"%s\"}", msg);
    return send_answer(con, status, body, "application/json");
}

/* Appends the loop's families (impressions, feedback, join, online metrics)
 * to the store's /metrics text in a. */
static void metrics_append_loop(sv_loop_t *loop, sv_answer_t *a)
{
    char *more = a->body != NULL ? sv_loop_prometheus(loop) : NULL;
    char *all = more != NULL ? kiln_asprintf("%s%s", a->body, more) : NULL;
    free(more);
    free(a->body);
    a->body = all; /* NULL: send_answer answers 503 */
}

/* Constant-time comparison of the Authorization header with the token. */
static bool authorized(const sv_http_t *h, struct MHD_Connection *con)
{
    const char *a = MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Authorization");
    /* The scheme is case-insensitive (RFC 9110, 11.1): "bearer" is Bearer. */
    if (h->token == NULL || a == NULL || strncasecmp(a, "Bearer ", 7) != 0)
        return false;
    const char *given = a + 7;
    size_t n = strlen(h->token), m = strlen(given);
    unsigned char diff = (unsigned char)(n != m);
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)(h->token[i] ^ (i < m ? given[i] : 0));
    return diff == 0;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *con, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls)
{
    sv_http_t *h = cls;
    conn_t *c = *con_cls;
    if (c == NULL) {
        const char *host;
        bool host_ok;
        c = web_guard_begin(h->guard, con, sizeof *c, con_cls, h->bind, h->allow_hosts, &host,
                            &host_ok);
        if (c == NULL)
            return MHD_NO;
        if (!host_ok) {
            c->answered = true;
            char *msg = kiln_asprintf("Host '%.100s' is not a name of this kiln-serve; start it "
                                      "with --allow-host NAME to serve that name",
                                      host);
            json_t *j = json_pack("{s:s}", "error", msg ? msg : "Host not served");
            free(msg);
            char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
            json_decref(j);
            return send_answer(con, 403, body, "application/json");
        }
        bool path_known = false;
        for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
            char seg[2][SERVE_NAME_MAX];
            if (!match(routes[i].pattern, url, seg))
                continue;
            path_known = true;
            if (strcmp(routes[i].method, method) == 0) {
                c->route = &routes[i];
                memcpy(c->seg, seg, sizeof seg);
                break;
            }
        }
        if (c->route == NULL) {
            c->answered = true;
            return path_known ? send_error(con, 405, "method not allowed on this path")
                              : send_error(con, 404, "no such path (see docs/serving-protocol.md)");
        }
        if (c->route->token != NULL && !authorized(h, con)) {
            c->answered = true;
            char msg[128];
            snprintf(msg, sizeof msg, "%s needs Authorization: Bearer <token> with "
                                      "kiln-serve's token",
                     c->route->token);
            return send_error(con, 401, msg);
        }
        if (c->route->id == R_PUSH) {
            sv_answer_t a = {0};
            c->push = sv_answer_push_begin(
                h->store, c->seg[0], c->seg[1],
                MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Kiln-Checkpoint"),
                MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Kiln-Base"),
                MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Idempotency-Key"), &a);
            if (c->push == NULL) {
                c->answered = true;
                return send_json(con, &a);
            }
            const char *tr = MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Kiln-Traffic");
            char *end = NULL;
            long w = tr ? strtol(tr, &end, 10) : 0;
            if (tr != NULL && (end == tr || *end != '\0' || w < 0 || w > SV_MAX_WEIGHT)) {
                c->answered = true;
                sv_push_abort(c->push);
                c->push = NULL;
                return send_error(con, 400, "Kiln-Traffic must be a whole number from 0 to "
                                            "1000000");
            }
            sv_push_set_traffic(c->push, (int)w);
        }
        return MHD_YES;
    }
    if (*upload_size > 0) {
        if (c->answered) {
            *upload_size = 0;
            return MHD_YES;
        }
        if (c->push != NULL) {
            sv_push_feed(c->push, upload, *upload_size);
        } else if (!c->too_big) {
            if (c->len + *upload_size > h->max_body) {
                c->too_big = true;
            } else {
                if (c->len + *upload_size + 1 > c->cap) {
                    size_t cap = c->cap ? c->cap : 4096;
                    while (cap < c->len + *upload_size + 1)
                        cap *= 2;
                    char *p = kiln_reallocarray(c->body, cap, 1);
                    if (p == NULL)
                        return MHD_NO;
                    c->body = p;
                    c->cap = cap;
                }
                memcpy(c->body + c->len, upload, *upload_size);
                c->len += *upload_size;
                c->body[c->len] = '\0';
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (c->answered)
        return MHD_YES;
    c->answered = true;
    if (c->too_big) {
        char msg[96];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", h->max_body);
        return send_error(con, 413, msg);
    }
    sv_answer_t a = {0};
    switch (c->route->id) {
    case R_PUSH:
        sv_answer_push_end(c->push, &a);
        c->push = NULL;
        break;
    case R_VERSION:
        sv_answer_version(h->store, c->seg[0], c->seg[1], &a);
        break;
    case R_LOOKUP:
        sv_answer_lookup(h->store, c->seg[0], c->body ? c->body : "", c->len, &a);
        break;
    case R_PREDICT:
        sv_answer_predict(h->store, h->loop, c->seg[0],
                   MHD_lookup_connection_value(con, MHD_GET_ARGUMENT_KIND, "label"),
                   MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Kiln-Request-Key"),
                   c->body ? c->body : "", c->len, &a);
        break;
    case R_SPLIT_SET:
        sv_answer_split(h->store, c->seg[0], c->body ? c->body : "", c->len, &a);
        break;
    case R_SPLIT:
        sv_answer_split(h->store, c->seg[0], NULL, 0, &a);
        break;
    case R_STATS:
        sv_answer_stats(h->store, false, &a);
        break;
    case R_FEEDBACK:
        sv_answer_feedback(h->loop, c->seg[0], c->body ? c->body : "", c->len, &a);
        break;
    case R_ONLINE:
        sv_answer_online(h->loop, c->seg[0], &a);
        break;
    case R_METRICS:
        sv_answer_stats(h->store, true, &a);
        metrics_append_loop(h->loop, &a);
        return send_answer(con, a.status, a.body, "text/plain; version=0.0.4");
    case R_HEALTH:
        a.status = 200;
        a.body = kiln_strdup("{\"ok\":true}");
        break;
    }
    return send_json(con, &a);
}

static void completed(void *cls, struct MHD_Connection *con, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    sv_http_t *h = cls;
    web_guard_done(h->guard, con);
    conn_t *c = *con_cls;
    if (c == NULL)
        return;
    if (c->push != NULL) {
        KILN_WARN("a push to %s/%s ended before its body did (connection closed); dropped",
                  c->seg[0], c->seg[1]);
        sv_push_abort(c->push);
    }
    free(c->body);
    free(c);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n > 0 && buf[n - 1] == '\n')
        buf[--n] = '\0';
    KILN_DEBUG("microhttpd: %s", buf);
}

int sv_http_start(sv_store_t *store, const sv_http_opts_t *o, sv_http_t **out)
{
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    if (inet_pton(AF_INET, o->host, &addr.sin_addr) != 1)
        return kiln_errf(KILN_EINVAL, "--listen: '%s' is not an IPv4 address", o->host);
    sv_http_t *h = kiln_calloc(1, sizeof *h);
    if (h == NULL)
        return KILN_ENOMEM;
    h->store = store;
    h->loop = o->loop;
    h->token = o->token ? kiln_strdup(o->token) : NULL;
    h->allow_hosts = o->allow_hosts ? kiln_strdup(o->allow_hosts) : NULL;
    h->max_body = o->max_body ? o->max_body : (4u << 20);
    snprintf(h->bind, sizeof h->bind, "%s", o->host);
    unsigned conns = (unsigned)(o->max_connections > 0 ? o->max_connections : 64);
    unsigned per_client = o->max_per_client > 0 ? (unsigned)o->max_per_client
                                                : (conns + 3) / 4;
    if (per_client > conns)
        per_client = conns;
    /* The connection limits are the guard's: it makes room by evicting
     * idle connections instead of refusing new ones, so a flood from the
     * address kilnd's pusher shares (loopback) cannot lock it out. */
    if (web_guard_create((int)conns, (int)per_client, &h->guard) == 0)
        h->d = MHD_start_daemon(
            MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG, 0, NULL, NULL,
            handle, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
            MHD_OPTION_CONNECTION_LIMIT, conns + WEB_GUARD_SLACK, MHD_OPTION_NOTIFY_CONNECTION,
            web_guard_notify, h->guard, MHD_OPTION_CONNECTION_TIMEOUT,
            (unsigned)(o->timeout_s > 0 ? o->timeout_s : 30), MHD_OPTION_NOTIFY_COMPLETED,
            completed, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h, MHD_OPTION_END);
    if (h->d == NULL) {
        web_guard_destroy(h->guard);
        free(h->token);
        free(h->allow_hosts);
        free(h);
        return kiln_errf(KILN_EIO, "cannot listen on %s:%d (in use, or not an address of this "
                                   "host)",
                         o->host, o->port);
    }
    *out = h;
    return 0;
}

int sv_http_port(const sv_http_t *h)
{
    const union MHD_DaemonInfo *i = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    return i ? (int)i->port : 0;
}

void sv_http_stop(sv_http_t *h)
{
    if (h == NULL)
        return;
    MHD_stop_daemon(h->d);
    web_guard_destroy(h->guard);
    free(h->token);
    free(h->allow_hosts);
    free(h);
}
