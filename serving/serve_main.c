/*
 * serving/serve_main.c - kiln-serve, Kiln's reference serving endpoint:
 *
 *   kiln-serve --listen 127.0.0.1:8501 --state-dir DIR --token-env VAR
 *              [--split A=90,B=10] [--port-file FILE] [--max-connections N]
 *              [--timeout SECONDS] [--max-body BYTES] [--log-level LEVEL]
 *
 * Loads the versions persisted in DIR, serves the API of
 * docs/serving-protocol.md until SIGINT or SIGTERM, and exits 0 (1 on a
 * startup failure, 2 on a bad command line).
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_int.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kiln-serve --listen HOST:PORT --state-dir DIR --token-env VAR [options]\n\n"
            "Holds model versions pushed by `kiln push` and answers lookup/predict.\n\n"
            "  --listen HOST:PORT     IPv4 address and port (port 0: any free port)\n"
            "  --state-dir DIR        where versions persist (created)\n"
            "  --token-env VAR        environment variable holding the push token\n"
            "  --split A=90,B=10      predict traffic split between labels (sticky per\n"
            "                         Kiln-Request-Key)\n"
            "  --port-file FILE       write the bound port to FILE once listening\n"
            "  --max-connections N    concurrent connections (default 64)\n"
            "  --timeout SECONDS      idle connection timeout (default 30)\n"
            "  --max-body BYTES       largest lookup/predict body (default 4194304)\n"
            "  --log-level LEVEL      debug, info, warn, error (default info)\n");
}

int main(int argc, char **argv)
{
    const char *listen = NULL, *state_dir = NULL, *token_env = NULL, *split = NULL,
               *port_file = NULL, *level = "info";
    sv_http_opts_t o = {.max_connections = 64, .timeout_s = 30, .max_body = 4u << 20};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (v == NULL) {
            fprintf(stderr, "kiln-serve: %s needs a value (or is unknown)\n", a);
            usage(stderr);
            return 2;
        }
        i++;
        if (strcmp(a, "--listen") == 0)
            listen = v;
        else if (strcmp(a, "--state-dir") == 0)
            state_dir = v;
        else if (strcmp(a, "--token-env") == 0)
            token_env = v;
        else if (strcmp(a, "--split") == 0)
            split = v;
        else if (strcmp(a, "--port-file") == 0)
            port_file = v;
        else if (strcmp(a, "--max-connections") == 0)
            o.max_connections = atoi(v);
        else if (strcmp(a, "--timeout") == 0)
            o.timeout_s = atoi(v);
        else if (strcmp(a, "--max-body") == 0)
            o.max_body = (size_t)strtoull(v, NULL, 10);
        else if (strcmp(a, "--log-level") == 0)
            level = v;
        else {
            fprintf(stderr, "kiln-serve: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (listen == NULL || state_dir == NULL || token_env == NULL) {
        fprintf(stderr, "kiln-serve: --listen, --state-dir and --token-env are required\n");
        usage(stderr);
        return 2;
    }
    kiln_log_level_t lv;
    if (kiln_log_level_parse(level, &lv) < 0) {
        fprintf(stderr, "kiln-serve: %s\n", kiln_errmsg());
        return 2;
    }
    kiln_log_set_level(lv);
    char host[64];
    const char *colon = strrchr(listen, ':');
    if (colon == NULL || (size_t)(colon - listen) >= sizeof host) {
        fprintf(stderr, "kiln-serve: --listen wants HOST:PORT, got '%s'\n", listen);
        return 2;
    }
    snprintf(host, sizeof host, "%.*s", (int)(colon - listen), listen);
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || port < 0 || port > 65535) {
        fprintf(stderr, "kiln-serve: bad port in --listen '%s'\n", listen);
        return 2;
    }
    o.host = host;
    o.port = (int)port;
    o.token = getenv(token_env);
    if (o.token == NULL || o.token[0] == '\0') {
        fprintf(stderr, "kiln-serve: the environment variable %s (--token-env) is not set; "
                        "kiln-serve refuses to run without a push token\n",
                token_env);
        return 2;
    }

    /* Block the stop signals in every thread; main waits for them. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    sv_store_t *store = NULL;
    sv_http_t *http = NULL;
    int rc = sv_store_open(state_dir, &store);
    if (rc == 0 && split != NULL)
        rc = sv_store_set_split(store, split);
    if (rc == 0)
        rc = sv_http_start(store, &o, &http);
    if (rc < 0) {
        fprintf(stderr, "kiln-serve: %s\n", kiln_errmsg());
        sv_store_close(store);
        return 1;
    }
    int bound = sv_http_port(http);
    if (port_file != NULL) {
        char tmp[1024];
        snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
        FILE *f = fopen(tmp, "w");
        if (f == NULL || fprintf(f, "%d\n", bound) < 0 || fclose(f) != 0 ||
            rename(tmp, port_file) != 0) {
            fprintf(stderr, "kiln-serve: cannot write --port-file %s\n", port_file);
            sv_http_stop(http);
            sv_store_close(store);
            return 1;
        }
    }
    KILN_INFO("kiln-serve listening on %s:%d, state in %s", host, bound, state_dir);
    int sig = 0;
    sigwait(&stop, &sig);
    KILN_INFO("signal %d: stopping", sig);
    sv_http_stop(http);
    sv_store_close(store);
    return 0;
}
