/*
 * tests/fuzz/fuzz_http.c - libFuzzer harness for Kiln's two HTTP fronts:
 * kiln-serve's router and handlers (push, version, lookup, predict, stats,
 * metrics; serving/serve_http.c and serve_answer.c over the store) and kilnd's status page
 * and JSON API (web/). Both servers start once in this process on loopback
 * port 0 (kiln-serve with one pushed version, the web front on the fixture
 * database of tests/support/web_fixture.c); each input becomes one request
 * sent over a socket, and the answer is read to the end.
 *
 * Input layout (lines split at '\n'): byte 0 picks the server (bit 0), and
 * whether to send the bearer token (bit 1); line 1 is the method, line 2 the
 * request target, line 3 one extra header ("Name: value"), the rest the
 * body. CR and other control bytes in the first three lines become '_' so
 * that the request reaches the handlers instead of the HTTP parser's
 * rejection (raw bytes are still fuzzed in the body). Checked besides "no
 * crash": every request gets an HTTP/1.x status line.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "kiln.h"
#include "model.h"
#include "serve.h"
#include "serve_int.h"
#include "web.h"
#include "serve_fixture.h"
#include "web_fixture.h"

#define TOKEN "fuzz-token"

static int serve_port, web_port_no;

/* A tiny lr model pushed as version A of model "ctr", so that lookup and
 * predict reach a table. */
static void push_seed_version(sv_store_t *st)
{
    int64_t keys[4] = {1, 2, 3, 4};
    float vals[4] = {0.1f, -0.2f, 0.3f, -0.4f};
    serve_memsrc_t *m = NULL;
    if (fx_lr_version("ck-1", 4, keys, vals, 0.0f, &m) != 0)
        abort();
    serve_source_t *src = NULL;
    serve_enc_t *e = NULL;
    if (serve_memsrc_open(m, &src) != 0 || serve_enc_create(src, 2, &e) != 0)
        abort();
    sv_answer_t a = {0};
    sv_push_t *p = sv_answer_push_begin(st, "ctr", "A", "ck-1", "none", NULL, &a);
    if (p == NULL) {
        fprintf(stderr, "fuzz_http: seed push refused: %s\n", a.body ? a.body : "");
        abort();
    }
    char buf[4096];
    size_t n = 0;
    do {
        if (serve_enc_read(e, buf, sizeof buf, &n) != 0)
            abort();
        sv_push_feed(p, buf, n);
    } while (n > 0);
    sv_answer_push_end(p, &a);
    if (a.status != 200) {
        fprintf(stderr, "fuzz_http: seed push answered %d: %s\n", a.status, a.body);
        abort();
    }
    free(a.body);
    serve_enc_destroy(e);
    serve_memsrc_destroy(m);
}

static void start_servers(void)
{
    char root[64] = "/tmp/kiln-fuzz-http-XXXXXX", sdir[128], db[128];
    if (mkdtemp(root) == NULL)
        abort();
    snprintf(sdir, sizeof sdir, "%s/serve", root);
    snprintf(db, sizeof db, "%s/kiln.db", root);
    sv_store_t *st = NULL;
    if (sv_store_open(sdir, &st) != 0)
        abort();
    push_seed_version(st);
    sv_http_opts_t so = {.host = "127.0.0.1", .port = 0, .token = TOKEN, .max_connections = 16,
                         .timeout_s = 5, .max_body = 64 * 1024};
    sv_http_t *sh = NULL;
    if (sv_http_start(st, &so, &sh) != 0)
        abort();
    serve_port = sv_http_port(sh);
    web_fixture_t fx;
    if (web_fixture_build(db, root, &fx) < 0)
        abort();
    web_config_t cfg;
    web_config_init(&cfg);
    cfg.db_path = db;
    cfg.listen = "127.0.0.1:0";
    cfg.token = TOKEN;
    cfg.threads = 2;
    cfg.max_body = 64 * 1024;
    web_t *w = NULL;
    if (web_start(&cfg, &w) != 0) {
        fprintf(stderr, "fuzz_http: web_start: %s\n", kiln_errmsg());
        abort();
    }
    web_port_no = web_port(w);
    /* Both servers live until the process exits. */
}

/* Copies the next line of [*p, end) into out (control bytes -> '_'). */
static void next_line(const uint8_t **p, const uint8_t *end, char *out, size_t cap)
{
    size_t n = 0;
    while (*p < end && **p != '\n') {
        if (n + 1 < cap)
            out[n++] = (**p < 0x20 || **p == 0x7f) ? '_' : (char)**p;
        (*p)++;
    }
    if (*p < end)
        (*p)++;
    out[n] = '\0';
}

static int send_all(int fd, const void *buf, size_t len);

/* Whether the server on port answers GET / with a status line within 30 s. */
static int connect_to(int port);

static bool alive(int port)
{
    int fd = connect_to(port);
    if (fd < 0)
        return false;
    static const char req[] = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    char buf[16] = "";
    bool ok = send_all(fd, req, sizeof req - 1) == 0 && recv(fd, buf, 7, MSG_WAITALL) == 7 &&
              strncmp(buf, "HTTP/1.", 7) == 0;
    close(fd);
    return ok;
}

static int send_all(int fd, const void *buf, size_t len)
{
    const char *b = buf;
    while (len > 0) {
        ssize_t k = send(fd, b, len, MSG_NOSIGNAL);
        if (k <= 0)
            return -1;
        b += k;
        len -= (size_t)k;
    }
    return 0;
}

/* A connected socket to the server on port, or -1 (after printing why).
 * The client end closes with RST (SO_LINGER 0), so hundreds of thousands of
 * requests leave no TIME_WAIT sockets behind: a 5-minute run used to run
 * out of loopback ports and fail in connect() with the servers fine. A
 * refused connection (the server is gone) fails at once; running out of
 * local ports is waited out for a while. */
static int connect_to(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    a.sin_port = htons((uint16_t)port);
    for (int tries = 0; tries < 300; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0)
            break;
        struct timeval tv = {30, 0};
        struct linger lg = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
            return fd;
        int err = errno;
        close(fd);
        if (err != EADDRNOTAVAIL && err != EAGAIN && err != EINTR) {
            fprintf(stderr, "fuzz_http: connect to port %d: %s\n", port, strerror(err));
            return -1;
        }
        struct timespec ts = {0, 100000000L};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "fuzz_http: no local port to connect to port %d from\n", port);
    return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (serve_port == 0)
        start_servers();
    if (size < 1)
        return 0;
    const uint8_t *p = data + 1, *end = data + size;
    char method[32], target[1024], extra[512];
    next_line(&p, end, method, sizeof method);
    next_line(&p, end, target, sizeof target);
    next_line(&p, end, extra, sizeof extra);
    if (method[0] == '\0' || strchr(method, ' ') != NULL)
        snprintf(method, sizeof method, "GET");
    for (char *c = target; *c; c++)
        if (*c == ' ')
            *c = '+';
    if (target[0] != '/') {
        /* Prefix '/', dropping the last byte when full (the terminator
         * must survive: a 5-minute run found the copy that lost it). */
        size_t tl = strnlen(target, sizeof target - 2);
        memmove(target + 1, target, tl);
        target[0] = '/';
        target[tl + 1] = '\0';
    }
    size_t blen = (size_t)(end - p);
    char head[2048];
    int hn = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s%s"
                      "%s%s\r\nContent-Length: %zu\r\n\r\n",
                      method, target, (data[0] & 2) ? "Authorization: Bearer " TOKEN "\r\n" : "",
                      strchr(extra, ':') ? extra : "", strchr(extra, ':') ? "\r\n" : "",
                      (data[0] & 4) ? "Content-Type: application/x-www-form-urlencoded" : "",
                      (data[0] & 4) ? "" : "X-Fuzz: 1", blen);
    int fd = connect_to((data[0] & 1) ? web_port_no : serve_port);
    if (fd < 0)
        abort();
    char resp[256];
    size_t got = 0;
    if (send_all(fd, head, (size_t)hn) == 0 && send_all(fd, p, blen) == 0) {
        /* Read the answer to the end (the server closes: Connection: close). */
        char sink[4096];
        ssize_t k;
        while ((k = recv(fd, sink, sizeof sink, 0)) > 0) {
            if (got < sizeof resp - 1) {
                size_t take = (size_t)k < sizeof resp - 1 - got ? (size_t)k : sizeof resp - 1 - got;
                memcpy(resp + got, sink, take);
                got += take;
            }
        }
    }
    close(fd);
    resp[got] = '\0';
    /* A server may drop a connection it cannot parse (libmicrohttpd does for
     * some malformed requests) or answer late on a loaded machine; what must
     * never happen is that it stops answering. So without a status line,
     * check that the same server still answers a plain request. */
    if (strncmp(resp, "HTTP/1.", 7) != 0 && !alive((data[0] & 1) ? web_port_no : serve_port)) {
        fprintf(stderr, "fuzz_http: no status line for %s %s (got %zu bytes) and the server "
                        "no longer answers\n",
                method, target, got);
        abort();
    }
    return 0;
}
