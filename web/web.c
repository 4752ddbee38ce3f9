/*
 * web/web.c - the HTTP server: libmicrohttpd with a thread pool, the route
 * table and the one loop that walks it, the token check that guards every
 * POST, the Host check (DNS rebinding), the limits (connections in all and
 * per client address, header memory, body size, idle time), and the pool of
 * database connections the workers borrow (a state_t serves one thread at a
 * time). Pages, API and metrics live in the other files.
 *
 * Slow clients: every worker of the thread pool polls its connections with
 * epoll, so an idle or trickling connection costs a slot, never a thread;
 * the limit per client address keeps one client from holding every slot,
 * and the idle timeout frees the slots it holds.
 */
#include "web_guard.h"
#include "web_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

struct web {
    struct MHD_Daemon *d;
    char *token; /* NULL: no POST is accepted */
    char bind[64];       /* the listen address, for the Host check */
    char *allowed_hosts; /* more Host names served; NULL: none */
    size_t max_body;
    int refresh_s;
    uint16_t port;
    /* the database connection pool: one per worker thread */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    state_t **all, **idle;
    int nall, nidle;
    web_guard_t *guard; /* the connection limits (web_guard.h) */
    web_online_t *online; /* the endpoints' online figures for /metrics (web_online.c) */
};

/* ---- the route table ---------------------------------------------------------------
 * A '#' segment matches a positive integer (the request's id). A GET route
 * answers HEAD too. POST routes need the token. */
typedef struct route {
    const char *method;
    const char *pattern;
    web_kind_t kind;
    web_handler_t fn;
} route_t;

static const route_t routes[] = {
    {"GET", "/", WEB_HTML, web_page_jobs},
    {"GET", "/jobs", WEB_HTML, web_page_jobs},
    {"GET", "/jobs/#", WEB_HTML, web_page_job},
    {"POST", "/jobs/#/pause", WEB_FORM, web_act_pause},
    {"POST", "/jobs/#/resume", WEB_FORM, web_act_resume},
    {"POST", "/jobs/#/delete", WEB_FORM, web_act_delete},
    {"GET", "/runs", WEB_HTML, web_page_runs},
    {"GET", "/runs/#", WEB_HTML, web_page_run},
    {"GET", "/runs/#/loss.svg", WEB_SVG, web_svg_loss},
    {"GET", "/endpoints", WEB_HTML, web_page_endpoints},
    {"GET", "/lineage/checkpoint/#", WEB_HTML, web_page_lineage_ckpt},
    {"GET", "/lineage/endpoint/#", WEB_HTML, web_page_lineage_endpoint},
    {"POST", "/runs/#/cancel", WEB_FORM, web_act_cancel},
    {"POST", "/runs/#/retry", WEB_FORM, web_act_retry},
    {"GET", "/api/jobs", WEB_JSON, web_api_jobs},
    {"POST", "/api/jobs", WEB_JSON, web_act_submit},
    {"POST", "/api/jobs/#/pause", WEB_JSON, web_act_pause},
    {"POST", "/api/jobs/#/resume", WEB_JSON, web_act_resume},
    {"POST", "/api/jobs/#/delete", WEB_JSON, web_act_delete},
    {"GET", "/api/runs", WEB_JSON, web_api_runs},
    {"GET", "/api/runs/#", WEB_JSON, web_api_run},
    {"GET", "/api/runs/#/log", WEB_TEXT, web_api_log},
    {"POST", "/api/runs/#/cancel", WEB_JSON, web_act_cancel},
    {"POST", "/api/runs/#/retry", WEB_JSON, web_act_retry},
    {"GET", "/api/endpoints", WEB_JSON, web_api_endpoints},
    {"POST", "/endpoints/split", WEB_FORM, web_act_split},
    {"POST", "/api/split", WEB_JSON, web_act_split},
    {"GET", "/api/lineage/checkpoint/#", WEB_JSON, web_api_lineage_ckpt},
    {"GET", "/api/lineage/endpoint/#", WEB_JSON, web_api_lineage_endpoint},
    {"GET", "/metrics", WEB_TEXT, web_metrics},
};

static const char *const kind_types[] = {
    [WEB_HTML] = "text/html; charset=utf-8",
    [WEB_JSON] = "application/json",
    [WEB_TEXT] = "text/plain; charset=utf-8",
    [WEB_SVG] = "image/svg+xml",
    [WEB_FORM] = "text/html; charset=utf-8",
};

/* How a KILN_E* code answers over HTTP. */
static const struct {
    int code, status;
} err_status[] = {
    {KILN_ENOENT, 404},   {KILN_EINVAL, 400}, {KILN_ESPEC, 400},     {KILN_EUSAGE, 400},
    {KILN_ERANGE, 400},   {KILN_EAUTH, 401},  {KILN_ESTATE, 409},    {KILN_ECONFLICT, 409},
    {KILN_EEXIST, 409},   {KILN_EBUSY, 503},  {KILN_ECRON, 400},
};

/* Matches path against pattern; sets *id for a '#' segment. */
static bool match(const char *pattern, const char *path, int64_t *id)
{
    const char *p = pattern, *s = path;
    while (*p && *s) {
        if (*p == '#') {
            int64_t v = 0;
            int digits = 0;
            while (*s >= '0' && *s <= '9' && digits < 18) {
                v = v * 10 + (*s - '0');
                s++;
                digits++;
            }
            if (digits == 0 || (*s >= '0' && *s <= '9') || v <= 0)
                return false;
            *id = v;
            p++;
            continue;
        }
        if (*p != *s)
            return false;
        p++;
        s++;
    }
    return *p == '\0' && *s == '\0';
}

/* ---- the connection pool ----------------------------------------------------------- */

static state_t *pool_get(web_t *w)
{
    pthread_mutex_lock(&w->mu);
    while (w->nidle == 0)
        pthread_cond_wait(&w->cv, &w->mu);
    state_t *st = w->idle[--w->nidle];
    pthread_mutex_unlock(&w->mu);
    return st;
}

static void pool_put(web_t *w, state_t *st)
{
    pthread_mutex_lock(&w->mu);
    w->idle[w->nidle++] = st;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* ---- answering -------------------------------------------------------------------- */

/* The state kept across the calls MHD makes for one request. */
typedef struct upload {
    web_buf_t body;
    bool too_big;
    bool wrong_host; /* Host is not a name of this server */
} upload_t;

static enum MHD_Result send_reply(struct MHD_Connection *c, web_req_t *r)
{
    if (r->out.oom) {
        web_buf_free(&r->out);
        r->status = 500;
        web_buf_puts(&r->out, "out of memory\n");
        r->content_type = kind_types[WEB_TEXT];
    }
    size_t len = r->out.len;
    char *body = r->out.p;
    r->out.p = NULL;
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, body ? body : (char *)"", body ? MHD_RESPMEM_MUST_FREE
                                                                            : MHD_RESPMEM_PERSISTENT);
    if (resp == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type",
                            r->content_type ? r->content_type : kind_types[r->kind]);
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "X-Frame-Options", "DENY");
    /* No script runs on these pages, inline styles only. */
    MHD_add_response_header(resp, "Content-Security-Policy",
                            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
                            "form-action 'self'; frame-ancestors 'none'");
    if (r->location != NULL)
        MHD_add_response_header(resp, "Location", r->location);
    if (r->status == 401)
        MHD_add_response_header(resp, "WWW-Authenticate", "Bearer realm=\"kiln\"");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static void fail(web_req_t *r, int status, const char *msg)
{
    web_buf_free(&r->out);
    free(r->location);
    r->location = NULL;
    r->status = status;
    r->content_type = NULL;
    if (r->kind == WEB_HTML || r->kind == WEB_FORM) {
        web_page_error(r, status, msg);
    } else if (r->kind == WEB_JSON) {
        json_t *doc = json_pack("{s:i, s:s}", "status", status, "error", msg);
        if (web_json_reply(r, doc) < 0)
            r->out.oom = true;
    } else {
        r->kind = WEB_TEXT;
        web_buf_printf(&r->out, "%d %s\n", status, msg);
    }
}

/* Compares without an early exit, so timing tells nothing about the token. */
static bool token_equal(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = (unsigned char)(la != lb);
    for (size_t i = 0; i < lb; i++)
        diff |= (unsigned char)(a[i % (la ? la : 1)] ^ b[i]);
    return diff == 0 && la == lb;
}

static bool authorized(web_t *w, struct MHD_Connection *c, const upload_t *u)
{
    if (w->token == NULL)
        return false;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (h != NULL && strncasecmp(h, "Bearer ", 7) == 0) /* a case-insensitive scheme */
        return token_equal(h + 7, w->token);
    h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Kiln-Token");
    if (h != NULL)
        return token_equal(h, w->token);
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    if (ct != NULL && strncmp(ct, "application/x-www-form-urlencoded", 33) == 0) {
        char *t = web_form_value(u->body.p, u->body.len, "token");
        bool ok = t != NULL && token_equal(t, w->token);
        free(t);
        return ok;
    }
    return false;
}

static enum MHD_Result dispatch(web_t *w, struct MHD_Connection *c, const char *url,
                                const char *method, upload_t *u)
{
    web_req_t r = {.w = w,
                   .online = w->online,
                   .conn = c,
                   .status = 200,
                   .kind = WEB_HTML,
                   .refresh_s = w->refresh_s};
    bool head = strcmp(method, "HEAD") == 0;
    bool path_known = false;
    const route_t *route = NULL;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        int64_t id = 0;
        if (!match(routes[i].pattern, url, &id))
            continue;
        path_known = true;
        r.kind = routes[i].kind;
        if (strcmp(routes[i].method, method) == 0 ||
            (head && strcmp(routes[i].method, "GET") == 0)) {
            route = &routes[i];
            r.id = id;
            break;
        }
    }
    if (strncmp(url, "/api/", 5) == 0)
        r.kind = route ? route->kind : WEB_JSON;
    if (u->wrong_host) {
        fail(&r, 403, "this server does not answer to that Host name (against DNS "
                      "rebinding); to serve it, add it to KILN_WEB_ALLOWED_HOSTS of kilnd");
        goto reply;
    }
    if (route == NULL) {
        if (path_known)
            fail(&r, 405, "method not allowed on this path; state changes are POSTs");
        else
            fail(&r, 404, "no such page");
        goto reply;
    }
    if (u->too_big) {
        fail(&r, 413, "request body too large");
        goto reply;
    }
    if (strcmp(route->method, "POST") == 0) {
        if (!authorized(w, c, u)) {
            fail(&r, 401, w->token ? "a valid token is required (Authorization: Bearer TOKEN)"
                                   : "state changes are disabled: kilnd has no web token "
                                     "(set KILN_WEB_TOKEN)");
            goto reply;
        }
        r.body = u->body.p ? u->body.p : "";
        r.body_len = u->body.len;
    }
    r.st = pool_get(w);
    kiln_errclear();
    int64_t t0 = kiln_mono_ns();
    int rc = route->fn(&r);
    pool_put(w, r.st);
    r.st = NULL;
    if (rc < 0) {
        int status = 500;
        for (size_t i = 0; i < sizeof err_status / sizeof err_status[0]; i++)
            if (err_status[i].code == rc)
                status = err_status[i].status;
        const char *msg = kiln_errmsg();
        fail(&r, status, msg && *msg ? msg : kiln_strerror(rc));
    }
    KILN_DEBUG("%s %s -> %d (%.2f ms)", method, url, r.status,
               (double)(kiln_mono_ns() - t0) / 1e6);
reply:;
    enum MHD_Result ok = send_reply(c, &r);
    web_buf_free(&r.out);
    free(r.location);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    web_t *w = cls;
    upload_t *u = *con_cls;
    bool post = strcmp(method, "POST") == 0;
    if (u == NULL) {
        bool host_ok;
        u = web_guard_begin(w->guard, c, sizeof *u, con_cls, w->bind, w->allowed_hosts, NULL,
                            &host_ok);
        if (u == NULL)
            return MHD_NO;
        if (!host_ok) {
            u->wrong_host = true;
            return dispatch(w, c, url, method, u); /* answer before reading a body */
        }
        if (post) {
            const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
            if (cl != NULL && strtoull(cl, NULL, 10) > w->max_body) {
                u->too_big = true;
                return dispatch(w, c, url, method, u); /* answer before reading it */
            }
            return MHD_YES;
        }
    }
    if (post && *upload_data_size != 0) {
        if (!u->too_big && u->body.len + *upload_data_size <= w->max_body)
            web_buf_put(&u->body, upload_data, *upload_data_size);
        else
            u->too_big = true;
        *upload_data_size = 0;
        return MHD_YES;
    }
    return dispatch(w, c, url, method, u);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    web_t *w = cls;
    web_guard_done(w->guard, c);
    upload_t *u = *con_cls;
    if (u != NULL) {
        web_buf_free(&u->body);
        free(u);
        *con_cls = NULL;
    }
}

/* ---- start and stop --------------------------------------------------------------- */

void web_config_init(web_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->listen = WEB_DEFAULT_LISTEN;
    cfg->threads = 4;
    cfg->max_connections = 64;
    cfg->max_per_client = 16;
    cfg->max_body = 1 << 20;
    cfg->timeout_s = 10;
    cfg->refresh_s = 5;
}

/* Reads the token: cfg->token, else $KILN_WEB_TOKEN, else the first line of
 * cfg->token_file. *out NULL when none is configured. */
static int read_token(const web_config_t *cfg, char **out)
{
    *out = NULL;
    const char *t = cfg->token;
    if (t == NULL || *t == '\0')
        t = getenv("KILN_WEB_TOKEN");
    if (t != NULL && *t != '\0') {
        *out = kiln_strdup(t);
        return *out ? 0 : KILN_ENOMEM;
    }
    if (cfg->token_file == NULL)
        return 0;
    FILE *f = fopen(cfg->token_file, "r");
    if (f == NULL)
        return kiln_errf(KILN_EIO, "cannot read the web token file %s: %s", cfg->token_file,
                         strerror(errno));
    char line[512] = "";
    if (fgets(line, sizeof line, f) == NULL)
        line[0] = '\0';
    fclose(f);
    line[strcspn(line, "\r\n")] = '\0';
    if (line[0] == '\0')
        return kiln_errf(KILN_EINVAL, "the web token file %s is empty", cfg->token_file);
    *out = kiln_strdup(line);
    return *out ? 0 : KILN_ENOMEM;
}

/* Parses "HOST:PORT" or "[V6]:PORT" into a numeric socket address; the
 * address goes to bind_host (64 bytes). */
static int parse_listen(const char *listen, struct sockaddr_storage *ss, bool *v6,
                        char *bind_host)
{
    char host[256];
    const char *colon = strrchr(listen, ':');
    if (colon == NULL || colon == listen || colon[1] == '\0')
        return kiln_errf(KILN_EINVAL, "listen address '%s' is not HOST:PORT (e.g. %s)", listen,
                         WEB_DEFAULT_LISTEN);
    size_t hl = (size_t)(colon - listen);
    const char *h = listen;
    if (h[0] == '[' && hl >= 2 && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl >= sizeof host)
        return kiln_errf(KILN_EINVAL, "listen address '%s' is too long", listen);
    memcpy(host, h, hl);
    host[hl] = '\0';
    char *end = NULL;
    long port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || port < 0 || port > 65535)
        return kiln_errf(KILN_EINVAL, "listen address '%s': port must be 0-65535", listen);
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
                             .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    char ps[8];
    snprintf(ps, sizeof ps, "%ld", port);
    if (getaddrinfo(host, ps, &hints, &ai) != 0 || ai == NULL)
        return kiln_errf(KILN_EINVAL,
                         "listen address '%s': '%s' is not a numeric IPv4 or IPv6 address",
                         listen, host);
    memset(ss, 0, sizeof *ss);
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *v6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);
    snprintf(bind_host, 64, "%.63s", host);
    return 0;
}

int web_start(const web_config_t *cfg, web_t **out)
{
    int rc;
    *out = NULL;
    if (cfg == NULL || cfg->db_path == NULL)
        return kiln_errf(KILN_EINVAL, "web_start: no database path");
    if (cfg->threads < 1 || cfg->threads > 64 || cfg->max_connections < 1 || cfg->max_body < 1 ||
        cfg->timeout_s < 1 || cfg->max_per_client < 1 ||
        cfg->max_per_client > cfg->max_connections)
        return kiln_errf(KILN_EINVAL, "web_start: threads 1-64, max_connections, max_body and "
                                      "timeout_s must be positive, max_per_client from 1 to "
                                      "max_connections");
    const char *listen = cfg->listen ? cfg->listen : WEB_DEFAULT_LISTEN;
    struct sockaddr_storage ss;
    bool v6 = false;
    char bind_host[64];
    KILN_CHECK(parse_listen(listen, &ss, &v6, bind_host));
    const char *allowed = cfg->allowed_hosts ? cfg->allowed_hosts
                                             : getenv("KILN_WEB_ALLOWED_HOSTS");
    if (allowed != NULL &&
        kiln_host_list_check(allowed, cfg->allowed_hosts ? "allowed_hosts"
                                                         : "KILN_WEB_ALLOWED_HOSTS") < 0)
        return KILN_EINVAL;

    web_t *w = kiln_calloc(1, sizeof *w);
    if (w == NULL)
        return KILN_ENOMEM;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->max_body = cfg->max_body;
    w->refresh_s = cfg->refresh_s > 0 ? cfg->refresh_s : 5;
    snprintf(w->bind, sizeof w->bind, "%s", bind_host);
    if (allowed != NULL && (w->allowed_hosts = kiln_strdup(allowed)) == NULL) {
        rc = KILN_ENOMEM;
        goto fail;
    }
    KILN_CHECK_GOTO(read_token(cfg, &w->token), rc, fail);
    w->all = kiln_calloc((size_t)cfg->threads, sizeof *w->all);
    w->idle = kiln_calloc((size_t)cfg->threads, sizeof *w->idle);
    if (w->all == NULL || w->idle == NULL) {
        rc = KILN_ENOMEM;
        goto fail;
    }
    for (int i = 0; i < cfg->threads; i++) {
        KILN_CHECK_GOTO(state_open(cfg->db_path, &w->all[i]), rc, fail);
        w->idle[w->nidle++] = w->all[i];
        w->nall++;
    }
    KILN_CHECK_GOTO(web_guard_create(cfg->max_connections, cfg->max_per_client, &w->guard), rc,
                    fail);
    KILN_CHECK_GOTO(web_online_create(&w->online), rc, fail);
    /* MHD_USE_ITC: MHD_stop_daemon wakes every pool thread through its own
     * channel. Without it a thread could miss the listen socket's shutdown
     * and sleep out the connection timeout, so kilnd took 10 s to stop on
     * SIGTERM about once in four tries on a loaded host (test_web's
     * test_kilnd_slow_clients; 30 of 30 stopped in 0.1 s with it). */
    unsigned flags =
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (v6)
        flags |= MHD_USE_IPv6;
    /* The limits of connections (all, and per client address) are the
     * guard's: it makes room by evicting idle ones instead of refusing new
     * ones, so a flood from the page's own address cannot lock it out. */
    w->d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, w, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)cfg->threads, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)(cfg->max_connections + WEB_GUARD_SLACK), MHD_OPTION_NOTIFY_CONNECTION,
        web_guard_notify, w->guard, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->timeout_s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024), MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, w, MHD_OPTION_END);
    if (w->d == NULL) {
        rc = kiln_errf(KILN_ENET,
                       "cannot serve the web page on %s (address in use, or not an address "
                       "of this host?); pick another with --listen",
                       listen);
        goto fail;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(w->d, MHD_DAEMON_INFO_BIND_PORT);
    w->port = info ? info->port : 0;
    KILN_INFO("web: serving http://%s (%d threads; POST %s)", listen, cfg->threads,
              w->token ? "needs the token" : "disabled: no KILN_WEB_TOKEN");
    *out = w;
    return 0;
fail:
    web_stop(w);
    return rc;
}

uint16_t web_port(const web_t *w)
{
    return w ? w->port : 0;
}

void web_stop(web_t *w)
{
    if (w == NULL)
        return;
    if (w->d != NULL)
        MHD_stop_daemon(w->d);
    web_online_destroy(w->online);
    web_guard_destroy(w->guard);
    for (int i = 0; i < w->nall; i++)
        state_close(w->all[i]);
    KILN_FREE_ALL(w->all, w->idle, w->token, w->allowed_hosts);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}
