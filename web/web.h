/*
 * web/web.h - Kiln's status page, JSON API and Prometheus /metrics, served
 * by kilnd (or any program) from a thread pool of libmicrohttpd.
 *
 * The server reads the SQLite store (one state_t per worker, from a small
 * pool) and the run directories (log tail, progress.jsonl, result.json). GET
 * and HEAD never change anything; the three state changes (cancel a run,
 * retry a run, submit a job) are POSTs that must carry the token
 * ("Authorization: Bearer TOKEN", or a form field `token` for the HTML
 * forms); without a configured token every POST is refused. A request whose
 * Host is not one of the server's names gets 403 (DNS rebinding), and one
 * client address holds at most max_per_client connections, kept by evicting
 * the oldest connection not inside a request (web_guard.h), so slow or idle
 * clients cannot take the page down, even from the address of its readers.
 * Routes, the JSON API and the metrics
 * are described in docs/api.md.
 */
#ifndef KILN_WEB_WEB_H
#define KILN_WEB_WEB_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WEB_DEFAULT_LISTEN "127.0.0.1:8480"

typedef struct web_config {
    const char *db_path;    /* required: the Kiln database */
    const char *listen;     /* "HOST:PORT" or "[V6]:PORT"; port 0 picks one; default
                               WEB_DEFAULT_LISTEN */
    const char *token;      /* NULL: $KILN_WEB_TOKEN, else the first line of token_file */
    const char *token_file; /* NULL: none */
    int threads;            /* worker threads (and database connections); default 4 */
    int max_connections;    /* open connections at once; default 64 */
    int max_per_client;     /* of those from one client address; default 16 */
    const char *allowed_hosts; /* Host names served besides those of the listen
                                  address (comma-separated, "*": any); NULL:
                                  $KILN_WEB_ALLOWED_HOSTS, else none */
    size_t max_body;        /* largest POST body in bytes; default 1 MiB */
    int timeout_s;          /* idle connection timeout; default 10 s */
    int refresh_s;          /* meta refresh of a running run's page; default 5 s */
} web_config_t;

typedef struct web web_t;

/* Fills the defaults above (db_path NULL). */
void web_config_init(web_config_t *cfg);

/* Opens the database (KILN_EDB / KILN_EVERSION as state_open), reads the
 * token, binds the address and starts serving. Returns 0, KILN_EINVAL for a
 * bad listen address, limit or list of allowed hosts, KILN_EIO when the
 * token file cannot be read,
 * or KILN_ENET when the address cannot be bound (message names it). *out is
 * owned by the caller: stop it with web_stop. */
int web_start(const web_config_t *cfg, web_t **out /* OUT */);

/* The port the server listens on (useful after listening on port 0). */
uint16_t web_port(const web_t *w);

/* Stops serving, waits for the requests in flight and frees w. Accepts NULL. */
void web_stop(web_t *w);

#ifdef __cplusplus
}
#endif

#endif /* KILN_WEB_WEB_H */
