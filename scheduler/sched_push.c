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
 *
 * The ramp thread drives push.ramp (ops_ramp.c): every second it works out
 * where each ramp stands and, when a step is due or a held or failed push
 * stopped the ramp, sets the label's share on its kiln-serve and records a
 * "ramp" event of the job. It reads each split again every minute, so a
 * kiln-serve that lost its split, or a split changed by hand, is set back to
 * what the ramp says.
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
#define SCHED_RAMP_POLL_MS 1000
#define SCHED_RAMP_RECHECK_MS 60000
#define SCHED_RAMP_RETRY_MS 10000

struct sched_pusher {
    char *db_path, *claimer;
    int64_t stats_every_ms;
    pthread_t dispatcher, stats, ramp;
    bool have_dispatcher, have_stats, have_ramp;
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
    kiln_test_pause("KILN_TEST_PUSH_DELAY_MS");
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

/* The database handle of one of the pusher's threads, or NULL when it does
 * not open (logged as an error: what it does stops until kilnd restarts). */
static state_t *thread_db(const sched_pusher_t *p, const char *what, const char *stopped)
{
    state_t *st = NULL;
    if (state_open(p->db_path, &st) < 0) {
        KILN_ERROR("%s: cannot open %s: %s; %s until kilnd restarts", what, p->db_path,
                   kiln_errmsg(), stopped);
        return NULL;
    }
    return st;
}

static void *dispatcher(void *arg)
{
    sched_pusher_t *p = arg;
    state_t *st = thread_db(p, "pushes", "no push is delivered");
    if (st == NULL)
        return NULL;
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

/* Under p->mu: sleeps ms (kicks do not end it), or until stop. */
static void nap(sched_pusher_t *p, int64_t ms)
{
    struct timespec ts;
    int64_t at = kiln_now_ms() + ms;
    ts.tv_sec = at / 1000;
    ts.tv_nsec = (long)(at % 1000) * 1000000L;
    while (!p->stop && pthread_cond_timedwait(&p->cv, &p->mu, &ts) != ETIMEDOUT) {
    }
}

static void *stats_loop(void *arg)
{
    sched_pusher_t *p = arg;
    state_t *st = thread_db(p, "endpoint stats", "no endpoint's stats are read");
    if (st == NULL)
        return NULL;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        pthread_mutex_unlock(&p->mu);
        if (ops_poll_stats(st, SCHED_STATS_TIMEOUT_MS) < 0)
            KILN_WARN("endpoint stats: %s", kiln_errmsg());
        pthread_mutex_lock(&p->mu);
        nap(p, p->stats_every_ms);
    }
    pthread_mutex_unlock(&p->mu);
    state_close(st);
    return NULL;
}

/* What the ramp thread last made an endpoint's split say. */
typedef struct ramp_seen {
    int64_t endpoint_id;
    int share;
    bool stopped;
    int64_t recheck_ms; /* read the split again then (a retry after a failure, or the
                           minute's check) */
    char error[200];    /* the last failure, logged once */
} ramp_seen_t;

static ramp_seen_t *ramp_seen(ramp_seen_t **seen, size_t *n, int64_t endpoint_id)
{
    for (size_t i = 0; i < *n; i++)
        if ((*seen)[i].endpoint_id == endpoint_id)
            return &(*seen)[i];
    ramp_seen_t *g = realloc(*seen, (*n + 1) * sizeof *g);
    if (g == NULL)
        return NULL;
    *seen = g;
    g[*n] = (ramp_seen_t){.endpoint_id = endpoint_id, .share = -1};
    return &g[(*n)++];
}

/* Makes one ramp's split agree with where it stands, when due. */
static void ramp_one(state_t *st, const ops_ramp_t *r, ramp_seen_t *e)
{
    int64_t now = kiln_now_ms();
    if (e->share == r->share && e->stopped == r->stopped && now < e->recheck_ms)
        return;
    if (e->error[0] != '\0' && now < e->recheck_ms)
        return;
    int was = -1;
    int rc = ops_ramp_apply(r, &was);
    if (rc < 0) {
        if (strncmp(e->error, kiln_errmsg(), sizeof e->error - 1) != 0)
            KILN_WARN("%s; trying again every %d s", kiln_errmsg(), SCHED_RAMP_RETRY_MS / 1000);
        snprintf(e->error, sizeof e->error, "%s", kiln_errmsg());
        e->recheck_ms = now + SCHED_RAMP_RETRY_MS;
        return;
    }
    e->error[0] = '\0';
    e->share = r->share;
    e->stopped = r->stopped;
    e->recheck_ms = now + SCHED_RAMP_RECHECK_MS;
    if (rc == 0)
        return;
    char what[900], msg[2200];
    ops_ramp_describe(r, what, sizeof what);
    snprintf(msg, sizeof msg, "%s/%s on %s: traffic share %d%% -> %d%% (%s)", r->model, r->label,
             r->url, was, r->share, what);
    KILN_INFO("%s", msg);
    if (state_event_add(st, r->job_id, 0, "ramp", msg) < 0)
        KILN_WARN("ramp: cannot record the event: %s", kiln_errmsg());
}

static void *ramp_loop(void *arg)
{
    sched_pusher_t *p = arg;
    state_t *st = thread_db(p, "push.ramp", "no ramp moves");
    if (st == NULL)
        return NULL;
    ramp_seen_t *seen = NULL;
    size_t nseen = 0;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        pthread_mutex_unlock(&p->mu);
        ops_ramp_t *rs = NULL;
        size_t n = 0;
        if (ops_ramp_list(st, kiln_now_s(), &rs, &n) < 0)
            KILN_WARN("push.ramp: %s", kiln_errmsg());
        for (size_t i = 0; i < n; i++) {
            ramp_seen_t *e = ramp_seen(&seen, &nseen, rs[i].endpoint_id);
            if (e != NULL)
                ramp_one(st, &rs[i], e);
        }
        free(rs);
        pthread_mutex_lock(&p->mu);
        nap(p, SCHED_RAMP_POLL_MS);
    }
    pthread_mutex_unlock(&p->mu);
    free(seen);
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
    p->have_ramp = pthread_create(&p->ramp, NULL, ramp_loop, p) == 0;
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
    if (p->have_ramp)
        pthread_join(p->ramp, NULL);
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
