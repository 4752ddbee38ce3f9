/*
 * scheduler/sched_push.c - kilnd's deliverer of queued pushes and reader of
 * endpoints' stats, in threads of their own: the event loop only queues
 * pushes (in the transaction that ends a run, or when an online export
 * appears) and kicks the dispatcher, so a slow endpoint or a large model
 * never delays a cron fire, a launch or a cancel.
 *
 * The dispatcher claims the pushes that are due (ops.h, state_push_claim:
 * at most one in flight per endpoint; one that a newer push to the same
 * endpoint follows is superseded) and hands each batch to a worker thread
 * (at most SCHED_PUSH_WORKERS at once), which delivers it with ops_deliver
 * on its own database connection. It sleeps until the next push is due, a
 * kick, or a second passes. At start, and every minute, it gives back the
 * pushes claimed by a kilnd or a kiln command that died mid-delivery; their
 * idempotency keys make the second delivery apply nothing twice.
 *
 * The stats thread reads every endpoint's /v1/stats every --stats-every
 * (the endpoints page shows request rate and traffic share).
 */
#include "sched_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops.h"

#define SCHED_PUSH_WORKERS 4
#define SCHED_PUSH_BATCH 64
#define SCHED_PUSH_POLL_MS 1000
#define SCHED_RECLAIM_EVERY_MS 60000
/* A claim lasts this long before another deliverer may take the push; a
 * kilnd that dies is noticed sooner, by its pid. */
#define SCHED_PUSH_LEASE_MS (3600 * 1000)
#define SCHED_STATS_TIMEOUT_MS 2000

struct sched_pusher {
    char *db_path, *claimer;
    int64_t stats_every_ms;
    pthread_t dispatcher, stats;
    bool have_dispatcher, have_stats;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop, kicked;
    int busy; /* workers delivering */
};

typedef struct batch {
    sched_pusher_t *p;
    state_push_t *ps;
    size_t n;
} batch_t;

/* Sleeps on the pusher's condition until at_ms (wall clock), a kick or stop. */
static void wait_until(sched_pusher_t *p, int64_t at_ms)
{
    struct timespec ts = {at_ms / 1000, (long)(at_ms % 1000) * 1000000L};
    while (!p->stop && !p->kicked) {
        int rc = pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        if (rc == ETIMEDOUT)
            break;
    }
}

/* Test hook (tests/test_loop.c): KILN_TEST_PUSH_DELAY_MS holds a claimed
 * batch that long before it is delivered, so that a test can kill kilnd -9
 * between a run's success and its push. */
static void test_delay(void)
{
    const char *ms = getenv("KILN_TEST_PUSH_DELAY_MS");
    if (ms != NULL && atoll(ms) > 0) {
        struct timespec ts = {atoll(ms) / 1000, (atoll(ms) % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static void *worker(void *arg)
{
    batch_t *b = arg;
    sched_pusher_t *p = b->p;
    state_t *st = NULL;
    test_delay();
    if (state_open(p->db_path, &st) < 0 || ops_deliver(st, p->claimer, b->ps, b->n) < 0)
        KILN_WARN("pushes: %s; they go out again once their claim is given back",
                  kiln_errmsg());
    state_close(st);
    state_pushes_free(b->ps, b->n);
    free(b);
    pthread_mutex_lock(&p->mu);
    p->busy--;
    p->kicked = true; /* a slot is free: look again */
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Claims what is due and starts a worker on it. True when it claimed any. */
static bool dispatch(sched_pusher_t *p, state_t *st)
{
    state_push_t *ps = NULL;
    size_t n = 0;
    if (state_push_claim(st, p->claimer, kiln_now_ms(), SCHED_PUSH_LEASE_MS, SCHED_PUSH_BATCH, &ps,
                         &n) < 0) {
        KILN_WARN("pushes: cannot claim the pushes due: %s", kiln_errmsg());
        return false;
    }
    if (n == 0)
        return false;
    batch_t *b = kiln_calloc(1, sizeof *b);
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (b != NULL) {
        *b = (batch_t){p, ps, n};
        pthread_mutex_lock(&p->mu);
        p->busy++;
        pthread_mutex_unlock(&p->mu);
        if (pthread_create(&t, &attr, worker, b) != 0) {
            KILN_WARN("pushes: cannot start a worker; %zu push%s wait for their claim to run out",
                      n, n == 1 ? "" : "es");
            pthread_mutex_lock(&p->mu);
            p->busy--;
            pthread_mutex_unlock(&p->mu);
            state_pushes_free(ps, n);
            free(b);
        }
    } else {
        state_pushes_free(ps, n);
    }
    pthread_attr_destroy(&attr);
    return true;
}

static void *dispatcher(void *arg)
{
    sched_pusher_t *p = arg;
    state_t *st = NULL;
    if (state_open(p->db_path, &st) < 0) {
        KILN_ERROR("pushes: cannot open %s: %s; no push is delivered until kilnd restarts",
                   p->db_path, kiln_errmsg());
        return NULL;
    }
    int64_t next_reclaim = 0;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        p->kicked = false;
        int busy = p->busy;
        pthread_mutex_unlock(&p->mu);
        int64_t now = kiln_now_ms();
        if (now >= next_reclaim) {
            int back = 0;
            if (state_push_reclaim(st, ops_claimer_dead, NULL, &back) < 0)
                KILN_WARN("pushes: %s", kiln_errmsg());
            else if (back > 0)
                KILN_INFO("pushes: %d push%s of a deliverer that is gone queued again", back,
                          back == 1 ? "" : "es");
            next_reclaim = now + SCHED_RECLAIM_EVERY_MS;
        }
        bool more = busy < SCHED_PUSH_WORKERS && dispatch(p, st);
        int64_t due = 0, wake = kiln_now_ms() + SCHED_PUSH_POLL_MS;
        if (state_push_next_due(st, &due) == 0 && due > 0 && due < wake)
            wake = due;
        pthread_mutex_lock(&p->mu);
        if (!more)
            wait_until(p, wake);
    }
    pthread_mutex_unlock(&p->mu);
    state_close(st);
    return NULL;
}

static void *stats_loop(void *arg)
{
    sched_pusher_t *p = arg;
    state_t *st = NULL;
    if (state_open(p->db_path, &st) < 0) {
        KILN_WARN("endpoint stats: cannot open %s: %s", p->db_path, kiln_errmsg());
        return NULL;
    }
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        pthread_mutex_unlock(&p->mu);
        if (ops_poll_stats(st, SCHED_STATS_TIMEOUT_MS) < 0)
            KILN_WARN("endpoint stats: %s", kiln_errmsg());
        pthread_mutex_lock(&p->mu);
        struct timespec ts;
        int64_t at = kiln_now_ms() + p->stats_every_ms;
        ts.tv_sec = at / 1000;
        ts.tv_nsec = (long)(at % 1000) * 1000000L;
        while (!p->stop && pthread_cond_timedwait(&p->cv, &p->mu, &ts) != ETIMEDOUT) {
        }
    }
    pthread_mutex_unlock(&p->mu);
    state_close(st);
    return NULL;
}

int sched_pusher_start(const char *db_path, int64_t stats_every_ms, sched_pusher_t **out)
{
    sched_pusher_t *p = kiln_calloc(1, sizeof *p);
    if (p == NULL)
        return KILN_ENOMEM;
    p->db_path = kiln_strdup(db_path);
    p->claimer = ops_claimer("kilnd");
    p->stats_every_ms = stats_every_ms;
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_REALTIME);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (p->db_path == NULL || p->claimer == NULL) {
        sched_pusher_stop(p);
        return KILN_ENOMEM;
    }
    p->have_dispatcher = pthread_create(&p->dispatcher, NULL, dispatcher, p) == 0;
    if (stats_every_ms > 0)
        p->have_stats = pthread_create(&p->stats, NULL, stats_loop, p) == 0;
    if (!p->have_dispatcher) {
        sched_pusher_stop(p);
        return kiln_errf(KILN_EIO, "cannot start the push thread");
    }
    *out = p;
    return 0;
}

/* Sets *flag (kicked or stop) under the lock and wakes the dispatcher. */
static void raise_flag(sched_pusher_t *p, bool *flag)
{
    pthread_mutex_lock(&p->mu);
    *flag = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void sched_pusher_kick(sched_t *s)
{
    sched_pusher_t *p = s->pusher;
    if (p == NULL)
        return;
    raise_flag(p, &p->kicked);
}

void sched_pusher_stop(sched_pusher_t *p)
{
    if (p == NULL)
        return;
    raise_flag(p, &p->stop);
    if (p->have_dispatcher)
        pthread_join(p->dispatcher, NULL);
    if (p->have_stats)
        pthread_join(p->stats, NULL);
    /* Workers finish the push in hand (a few seconds at most, bounded by
     * push.timeout): waiting keeps their records; a kilnd stopped harder
     * leaves claims that the next one gives back. */
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < 50 && p->busy > 0; i++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    }
    int left = p->busy;
    pthread_mutex_unlock(&p->mu);
    if (left > 0) {
        KILN_WARN("pushes: %d delivery worker%s still busy at exit; their pushes go out again "
                  "at the next start",
                  left, left == 1 ? "" : "s");
        return; /* they still use p */
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->db_path);
    free(p->claimer);
    free(p);
}
