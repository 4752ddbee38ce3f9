/*
 * web/web_guard.c - the connection guard (web_guard.h): a table of the
 * server's open connections, each with its address, whether it is inside a
 * request and since when it is not, under one mutex. MHD's pool threads
 * notify starts and ends; a start over a limit shuts down (shutdown(2), not
 * close: MHD owns the descriptor and closes it when it sees the end) the
 * oldest idle connection of the address that holds the most. MHD notifies
 * a connection's close before it closes the descriptor, and the table entry
 * goes under the mutex the eviction holds, so a descriptor is never shut
 * down after MHD let it go.
 */
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "kiln.h"
#include "web_guard.h"

typedef struct slot {
    bool used, busy, evicted;
    int fd;
    unsigned char addr[17]; /* family byte, then the IPv4 or IPv6 address */
    int64_t idle_since_ms;
} slot_t;

struct web_guard {
    pthread_mutex_t mu;
    int max_conns, per_client, cap;
    slot_t *slots; /* (cap) */
    int64_t evicted;
};

int web_guard_create(int max_conns, int per_client, web_guard_t **out)
{
    *out = NULL;
    web_guard_t *g = kiln_calloc(1, sizeof *g);
    int cap = max_conns + WEB_GUARD_SLACK;
    slot_t *slots = kiln_calloc((size_t)cap, sizeof *slots);
    if (g == NULL || slots == NULL) {
        free(g);
        free(slots);
        return KILN_ENOMEM;
    }
    pthread_mutex_init(&g->mu, NULL);
    g->max_conns = max_conns;
    g->per_client = per_client;
    g->cap = cap;
    g->slots = slots;
    *out = g;
    return 0;
}

void web_guard_destroy(web_guard_t *g)
{
    if (g == NULL)
        return;
    pthread_mutex_destroy(&g->mu);
    free(g->slots);
    free(g);
}

/* The address of c as a key: its family byte, then its bytes (zero-padded). */
static void addr_key(struct MHD_Connection *c, unsigned char key[17])
{
    memset(key, 0, 17);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci != NULL ? ci->client_addr : NULL;
    if (sa == NULL)
        return;
    key[0] = (unsigned char)sa->sa_family;
    if (sa->sa_family == AF_INET)
        memcpy(key + 1, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    else if (sa->sa_family == AF_INET6)
        memcpy(key + 1, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
}

/* Live (not evicted) connections of address key (any address: NULL). */
static int live_of(const web_guard_t *g, const unsigned char *key)
{
    int n = 0;
    for (int i = 0; i < g->cap; i++)
        n += g->slots[i].used && !g->slots[i].evicted &&
             (key == NULL || memcmp(g->slots[i].addr, key, 17) == 0);
    return n;
}

/* Shuts down the oldest idle live connection of address key (NULL: of the
 * address with the most live connections that has an idle one), sparing
 * slot `spare` while another is idle. Returns false when none is idle. */
static bool evict_one(web_guard_t *g, const unsigned char *key, const slot_t *spare)
{
    slot_t *pick = NULL;
    int pick_count = 0;
    for (int pass = 0; pass < 2 && pick == NULL; pass++)
        for (int i = 0; i < g->cap; i++) {
            slot_t *s = &g->slots[i];
            if (!s->used || s->evicted || s->busy || (pass == 0 && s == spare) ||
                (key != NULL && memcmp(s->addr, key, 17) != 0))
                continue;
            int count = key != NULL ? 0 : live_of(g, s->addr);
            if (pick == NULL || count > pick_count ||
                (count == pick_count && s->idle_since_ms < pick->idle_since_ms)) {
                pick = s;
                pick_count = count;
            }
        }
    if (pick == NULL)
        return false;
    shutdown(pick->fd, SHUT_RDWR);
    pick->evicted = true;
    g->evicted++;
    return true;
}

void web_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                      enum MHD_ConnectionNotificationCode toe)
{
    web_guard_t *g = cls;
    pthread_mutex_lock(&g->mu);
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        slot_t *s = *socket_context;
        if (s != NULL)
            s->used = false;
        *socket_context = NULL;
        pthread_mutex_unlock(&g->mu);
        return;
    }
    slot_t *s = NULL;
    for (int i = 0; i < g->cap && s == NULL; i++)
        if (!g->slots[i].used)
            s = &g->slots[i];
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (s == NULL || ci == NULL) { /* over MHD's limit already: MHD refuses it */
        *socket_context = NULL;
        pthread_mutex_unlock(&g->mu);
        return;
    }
    *s = (slot_t){.used = true, .fd = ci->connect_fd, .idle_since_ms = kiln_mono_ns() / 1000000};
    addr_key(c, s->addr);
    *socket_context = s;
    while (live_of(g, s->addr) > g->per_client && evict_one(g, s->addr, s)) {
    }
    while (live_of(g, NULL) > g->max_conns && evict_one(g, NULL, s)) {
    }
    pthread_mutex_unlock(&g->mu);
}

/* The guard's slot of c, or NULL (the caller holds the mutex). */
static slot_t *slot_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci != NULL ? ci->socket_context : NULL;
}

void web_guard_request(web_guard_t *g, struct MHD_Connection *c)
{
    pthread_mutex_lock(&g->mu);
    slot_t *s = slot_of(c);
    if (s != NULL)
        s->busy = true;
    pthread_mutex_unlock(&g->mu);
}

void *web_guard_begin(web_guard_t *g, struct MHD_Connection *c, size_t size, void **con_cls,
                      const char *bind, const char *allowed, const char **host, bool *host_ok)
{
    void *state = kiln_calloc(1, size);
    if (state == NULL)
        return NULL;
    *con_cls = state;
    web_guard_request(g, c);
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    *host_ok = kiln_host_allowed(h, bind, allowed);
    if (host != NULL)
        *host = h;
    return state;
}

void web_guard_done(web_guard_t *g, struct MHD_Connection *c)
{
    pthread_mutex_lock(&g->mu);
    slot_t *s = slot_of(c);
    if (s != NULL) {
        s->busy = false;
        s->idle_since_ms = kiln_mono_ns() / 1000000;
    }
    pthread_mutex_unlock(&g->mu);
}

int64_t web_guard_evicted(web_guard_t *g)
{
    pthread_mutex_lock(&g->mu);
    int64_t n = g->evicted;
    pthread_mutex_unlock(&g->mu);
    return n;
}
