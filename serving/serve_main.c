/*
 * serving/serve_main.c - kiln-serve, Kiln's reference serving endpoint:
 *
 *   kiln-serve --listen 127.0.0.1:8501 --state-dir DIR --token-env VAR
 *              [--split A=90,B=10] [--port-file FILE] [--max-connections N]
 *              [--max-per-client N] [--timeout SECONDS] [--max-body BYTES]
 *              [--allow-host NAMES] [--log-level LEVEL]
 *              [--impressions-dir DIR --join-dir DIR [--impressions-max BYTES]
 *               [--feedback-window DURATION]]
 *
 * Loads the versions persisted in DIR, serves the API of
 * docs/serving-protocol.md until SIGINT or SIGTERM, and exits 0 (1 on a
 * startup failure, 2 on a bad command line). Every value is checked here,
 * once, before anything starts.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "serve_loop_int.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kiln-serve --listen HOST:PORT --state-dir DIR --token-env VAR [options]\n\n"
            "Holds model versions pushed by `kiln push` and answers lookup/predict.\n\n"
            "  --listen HOST:PORT     IPv4 address and port (port 0: any free port)\n"
            "  --state-dir DIR        where versions persist (created)\n"
            "  --token-env VAR        environment variable holding the push token\n"
            "  --split A=90,B=10      predict traffic split between labels (sticky per\n"
            "                         Kiln-Request-Key) for the models without a split\n"
            "                         set through the API (kiln split)\n"
            "  --port-file FILE       write the bound port to FILE once listening\n"
            "  --max-connections N    concurrent connections, 1-1000 (default 64)\n"
            "  --max-per-client N     of those from one client address (default a\n"
            "                         quarter of --max-connections)\n"
            "  --timeout SECONDS      idle connection timeout, 1-86400 (default 30)\n"
            "  --max-body BYTES       largest lookup/predict body, 1-1073741824 (default\n"
            "                         4194304)\n"
            "  --allow-host NAMES     Host names served besides those of the --listen\n"
            "                         address (comma-separated; * for any)\n"
            "  --impressions-dir DIR  log an impression per row of each predict with a\n"
            "                         request key (needs --join-dir)\n"
            "  --join-dir DIR         write joined training partitions here\n"
            "  --impressions-max BYTES  impression segments on disk, 65536-2^50\n"
            "                         (default 1073741824); past it rows are dropped,\n"
            "                         counted in /metrics\n"
            "  --feedback-window DURATION  how long feedback may follow an impression\n"
            "                         before the join (1s-7d, default 15m)\n"
            "  --table-memory BYTES   RAM each served table's rows may take, 4096-2^50;\n"
            "                         rows past it live in a file under DIR/spill and\n"
            "                         lookups read them from there (default: all in RAM)\n"
            "  --log-level LEVEL      debug, info, warn, error (default info)\n"
            "  --version              print kiln-serve's version and exit\n");
}

/* The numeric limits: one rule each (a whole number in [lo, hi]). */
typedef struct limit {
    const char *flag;
    long long lo, hi;
    const char *unit;
} limit_t;

enum { L_CONNECTIONS, L_PER_CLIENT, L_TIMEOUT, L_BODY, L_IMPRESSIONS, L_TABLE_MEMORY, L_COUNT };

static const limit_t limits[L_COUNT] = {
    [L_CONNECTIONS] = {"--max-connections", 1, 1000, "connections"}, /* select(): < FD_SETSIZE */
    [L_PER_CLIENT] = {"--max-per-client", 1, 1000, "connections"},
    [L_TIMEOUT] = {"--timeout", 1, 86400, "seconds"},
    [L_BODY] = {"--max-body", 1, 1LL << 30, "bytes"},
    [L_IMPRESSIONS] = {"--impressions-max", 65536, 1LL << 50, "bytes"},
    [L_TABLE_MEMORY] = {"--table-memory", 4096, 1LL << 50, "bytes"},
};

/* The index in limits of flag, or -1. */
static int find_limit(const char *flag)
{
    for (int i = 0; i < L_COUNT; i++)
        if (strcmp(limits[i].flag, flag) == 0)
            return i;
    return -1;
}

/* Parses v for limit l into *out. Returns 0, or 2 after saying what is wrong. */
static int parse_limit(const limit_t *l, const char *v, long long *out)
{
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end != '\0' || errno != 0 || x < l->lo || x > l->hi) {
        fprintf(stderr, "kiln-serve: %s must be a whole number of %s from %lld to %lld, got "
                        "'%s'\n",
                l->flag, l->unit, l->lo, l->hi, v);
        return 2;
    }
    *out = x;
    return 0;
}

/* What the command line asks for. */
typedef struct {
    const char *listen, *state_dir, *token_env, *split, *port_file, *level, *window;
    sv_http_opts_t o;
    sv_loop_opts_t lo;
    long long table_memory; /* 0: every row in RAM */
} args_t;

/* Reads argv into a. Returns -1 to go on, else the exit code (0 after
 * --help, 2 for a bad option). */
static int read_args(int argc, char **argv, args_t *a)
{
    long long num;
    int li;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (v == NULL) {
            fprintf(stderr, "kiln-serve: %s needs a value (or is unknown)\n", o);
            usage(stderr);
            return 2;
        }
        i++;
        if (strcmp(o, "--listen") == 0)
            a->listen = v;
        else if (strcmp(o, "--state-dir") == 0)
            a->state_dir = v;
        else if (strcmp(o, "--token-env") == 0)
            a->token_env = v;
        else if (strcmp(o, "--split") == 0)
            a->split = v;
        else if (strcmp(o, "--port-file") == 0)
            a->port_file = v;
        else if ((li = find_limit(o)) >= 0) {
            if (parse_limit(&limits[li], v, &num) != 0)
                return 2;
            switch (li) {
            case L_CONNECTIONS: a->o.max_connections = (int)num; break;
            case L_PER_CLIENT: a->o.max_per_client = (int)num; break;
            case L_TIMEOUT: a->o.timeout_s = (int)num; break;
            case L_IMPRESSIONS: a->lo.max_bytes = num; break;
            case L_TABLE_MEMORY: a->table_memory = num; break;
            default: a->o.max_body = (size_t)num; break;
            }
        } else if (strcmp(o, "--allow-host") == 0) {
            if (kiln_host_list_check(v, "--allow-host") < 0) {
                fprintf(stderr, "kiln-serve: %s\n", kiln_errmsg());
                return 2;
            }
            a->o.allow_hosts = v;
        } else if (strcmp(o, "--impressions-dir") == 0)
            a->lo.impressions_dir = v;
        else if (strcmp(o, "--join-dir") == 0)
            a->lo.join_dir = v;
        else if (strcmp(o, "--feedback-window") == 0)
            a->window = v;
        else if (strcmp(o, "--log-level") == 0)
            a->level = v;
        else {
            fprintf(stderr, "kiln-serve: unknown option %s\n", o);
            usage(stderr);
            return 2;
        }
    }
    return -1;
}

/* The checks between the options, and the values that need parsing: the
 * split, the log level, the address (host into host), the token. Returns -1
 * to go on, else 2 with the reason on stderr. */
static int check_args(args_t *a, sv_split_t *split, char *host, size_t hostsz)
{
    if (a->listen == NULL || a->state_dir == NULL || a->token_env == NULL) {
        fprintf(stderr, "kiln-serve: --listen, --state-dir and --token-env are required\n");
        usage(stderr);
        return 2;
    }
    if (a->o.max_per_client > a->o.max_connections) {
        fprintf(stderr, "kiln-serve: --max-per-client %d is more than --max-connections %d\n",
                a->o.max_per_client, a->o.max_connections);
        return 2;
    }
    const sv_loop_opts_t *lo = &a->lo;
    if ((lo->impressions_dir == NULL) != (lo->join_dir == NULL)) {
        fprintf(stderr, "kiln-serve: %s %s was given without %s: the impressions are logged "
                        "to be joined into training partitions, so the two go together\n",
                lo->join_dir ? "--join-dir" : "--impressions-dir",
                lo->join_dir ? lo->join_dir : lo->impressions_dir,
                lo->join_dir ? "--impressions-dir" : "--join-dir");
        return 2;
    }
    if (a->window != NULL && (kiln_duration_parse(a->window, &a->lo.window_ms) < 0 ||
                              a->lo.window_ms < 1000 || a->lo.window_ms > 7LL * 86400 * 1000)) {
        fprintf(stderr, "kiln-serve: --feedback-window must be a duration from 1s to 7d "
                        "(15m, 90s), got '%s'\n",
                a->window);
        return 2;
    }
    if (a->split != NULL && sv_split_parse(a->split, false, split) < 0) {
        fprintf(stderr, "kiln-serve: %s\n", kiln_errmsg());
        return 2;
    }
    kiln_log_level_t lv;
    if (kiln_log_level_parse(a->level, &lv) < 0) {
        fprintf(stderr, "kiln-serve: %s\n", kiln_errmsg());
        return 2;
    }
    kiln_log_set_level(lv);
    const char *colon = strrchr(a->listen, ':');
    if (colon == NULL || (size_t)(colon - a->listen) >= hostsz) {
        fprintf(stderr, "kiln-serve: --listen wants HOST:PORT, got '%s'\n", a->listen);
        return 2;
    }
    snprintf(host, hostsz, "%.*s", (int)(colon - a->listen), a->listen);
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || port < 0 || port > 65535) {
        fprintf(stderr, "kiln-serve: bad port in --listen '%s'\n", a->listen);
        return 2;
    }
    a->o.host = host;
    a->o.port = (int)port;
    a->o.token = getenv(a->token_env);
    if (a->o.token == NULL || a->o.token[0] == '\0') {
        fprintf(stderr, "kiln-serve: the environment variable %s (--token-env) is not set; "
                        "kiln-serve refuses to run without a push token\n",
                a->token_env);
        return 2;
    }
    return -1;
}

/* Opens the store (and the impression loop), serves until SIGINT or
 * SIGTERM. Returns the exit code. */
static int serve(args_t *a, const sv_split_t *split)
{
    /* Block the stop signals in every thread; main waits for them. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* A file-size limit (ulimit -f) is a full disk to the impression log. */
    signal(SIGXFSZ, SIG_IGN);

    sv_store_t *store = NULL;
    sv_http_t *http = NULL;
    sv_loop_t *loop = NULL;
    char *spill = a->table_memory > 0 ? kiln_asprintf("%s/spill", a->state_dir) : NULL;
    if (a->table_memory > 0)
        serve_table_spill(spill ? a->table_memory : 0, spill);
    free(spill);
    int rc = sv_store_open(a->state_dir, &store);
    if (rc == 0)
        sv_store_set_split(store, split);
    if (rc == 0 && a->lo.impressions_dir != NULL)
        rc = sv_loop_open(&a->lo, &loop);
    a->o.loop = loop;
    if (rc == 0)
        rc = sv_http_start(store, &a->o, &http);
    if (rc < 0) {
        fprintf(stderr, "kiln-serve: %s\n", kiln_errmsg());
        sv_loop_close(loop);
        sv_store_close(store);
        return 1;
    }
    int bound = sv_http_port(http);
    if (a->port_file != NULL) {
        char text[16];
        int n = snprintf(text, sizeof text, "%d\n", bound);
        if (kiln_write_atomic(a->port_file, text, (size_t)n) < 0) {
            fprintf(stderr, "kiln-serve: cannot write --port-file %s: %s\n", a->port_file,
                    kiln_errmsg());
            sv_http_stop(http);
            sv_loop_close(loop);
            sv_store_close(store);
            return 1;
        }
    }
    KILN_INFO("kiln-serve listening on %s:%d, state in %s", a->o.host, bound, a->state_dir);
    int sig = 0;
    sigwait(&stop, &sig);
    KILN_INFO("signal %d: stopping", sig);
    sv_http_stop(http);
    sv_loop_close(loop);
    sv_store_close(store);
    return 0;
}

int main(int argc, char **argv)
{
    args_t a = {.level = "info",
                .o = {.max_connections = 64, .timeout_s = 30, .max_body = 4u << 20},
                .lo = {.max_bytes = 1LL << 30, .window_ms = 15 * 60 * 1000}};
    sv_split_t split = {0};
    char host[64];
    if (kiln_version_flag(argc, argv, "kiln-serve"))
        return 0;
    /* Predict runs the models' GEMMs: the CPU's own kernels, not OpenBLAS's
     * generic ones (model_kernels.c; may execute kiln-serve again). */
    if (model_kernels_ensure(argv) < 0)
        fprintf(stderr, "kiln-serve: %s\n", kiln_errmsg());
    int code = read_args(argc, argv, &a);
    if (code < 0)
        code = check_args(&a, &split, host, sizeof host);
    return code >= 0 ? code : serve(&a, &split);
}
