/*
 * web/web_guard.h - the connection guard of Kiln's two HTTP servers, kilnd's
 * status page (web.c) and kiln-serve (serving/serve_http.c), both on
 * libmicrohttpd. A limit per client address protects the other addresses
 * only: on a loopback deployment every client (the browser, kilnd's pusher)
 * shares 127.0.0.1, so one process holding that address's connections open
 * without finishing a request locked them all out. The guard keeps the
 * limits by making room instead of refusing: when a new connection would
 * pass the limit of its address or of the server, the oldest connection
 * that is not inside a request (still sending its headers, or idle between
 * keep-alive requests) is shut down, taken from the address that holds the
 * most. A client that sends its request at once is inside it before any
 * later connection can evict it; a flood of partial requests evicts itself.
 * The guard is its own small library (kiln_web_guard) so that kiln-serve
 * can use it without kilnd's page.
 */
#ifndef KILN_WEB_GUARD_H
#define KILN_WEB_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <microhttpd.h>

typedef struct web_guard web_guard_t;

/* The headroom MHD's own MHD_OPTION_CONNECTION_LIMIT needs above the
 * guard's max_conns: an evicted connection counts until MHD has closed it,
 * and a new one must be accepted (and notified) for the guard to act. */
#define WEB_GUARD_SLACK 32

/* A guard of at most max_conns connections, at most per_client of one
 * address (1 <= per_client <= max_conns). The server passes
 * MHD_OPTION_CONNECTION_LIMIT max_conns + WEB_GUARD_SLACK, no
 * MHD_OPTION_PER_IP_CONNECTION_LIMIT, and MHD_OPTION_NOTIFY_CONNECTION
 * web_guard_notify with the guard. Returns 0 or KILN_ENOMEM. */
int web_guard_create(int max_conns, int per_client, web_guard_t **out /* OUT */);
/* Accepts NULL. After MHD_stop_daemon. */
void web_guard_destroy(web_guard_t *g);

/* MHD_OPTION_NOTIFY_CONNECTION's callback; cls is the guard. */
void web_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                      enum MHD_ConnectionNotificationCode toe);
/* From the access handler's first call for a request: c is inside a
 * request (its headers arrived) and cannot be evicted. */
void web_guard_request(web_guard_t *g, struct MHD_Connection *c);
/* The access handler's first call for a request, the same in both servers:
 * allocates the request's state (size bytes, zeroed) into *con_cls, marks c
 * inside a request (web_guard_request), and sets *host_ok to whether its
 * Host header names this server (kiln_host_allowed of bind and allowed) and
 * *host (unless NULL) to the header. Returns the state, or NULL when out
 * of memory (answer MHD_NO). The completion callback frees it. */
void *web_guard_begin(web_guard_t *g, struct MHD_Connection *c, size_t size, void **con_cls,
                      const char *bind, const char *allowed, const char **host /* OUT */,
                      bool *host_ok /* OUT */);
/* From MHD_OPTION_NOTIFY_COMPLETED's callback: c's request is over; c is
 * idle (evictable) from now. */
void web_guard_done(web_guard_t *g, struct MHD_Connection *c);
/* Connections shut down to make room since the guard was made. */
int64_t web_guard_evicted(web_guard_t *g);

#endif /* KILN_WEB_GUARD_H */
