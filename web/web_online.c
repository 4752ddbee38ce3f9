/*
 * web/web_online.c - the endpoints' online A/B figures as kilnd's /metrics
 * shows them: read from each kiln-serve (ops_online_read, GET
 * /v1/models/M/online) by a thread of their own and kept, so that a scrape
 * never waits on a kiln-serve.
 *
 * A scrape hands the endpoints it lists to web_online_get. When the kept
 * reading is older than WEB_ONLINE_TTL_MS (or has none of them) the reader
 * thread is asked for a new one, and the scrape waits at most
 * WEB_ONLINE_WAIT_MS for it: a healthy kiln-serve on the same network
 * answers in a few milliseconds, so its figures are fresh; one that hangs
 * costs the reader its read's timeout (OPS_ONLINE_TIMEOUT_MS), and the
 * scrapes meanwhile answer with what was kept, each series with its age
 * (kiln_endpoint_online_age_seconds). The reader reads one (URL, model) at
 * a time and keeps each answer as it comes, so one hanging kiln-serve does
 * not hold back the others' figures.
 *
 * The thread starts with the first scrape and stops in web_stop.
 */
#include "web_int.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One endpoint's kept figures. */
typedef struct kept {
    char *url, *model, *label;
    ops_online_t fig;
    int64_t at_ms; /* when read; 0: never */
} kept_t;

struct web_online {
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    pthread_t th;
    bool started, stop;
    bool want;         /* a reading is asked for and not begun */
    bool busy;         /* the reader is reading */
    int64_t asked_ms;  /* when the last reading was asked for */
    uint64_t readings; /* finished readings, for a scrape waiting on one */
    kept_t *k;         /* every endpoint asked about, kept */
    size_t nk, capk;
};

int web_online_create(web_online_t **out)
{
    web_online_t *o = kiln_calloc(1, sizeof *o);
    if (o == NULL)
        return KILN_ENOMEM;
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->wake, NULL);
    pthread_cond_init(&o->done, NULL);
    *out = o;
    return 0;
}

void web_online_destroy(web_online_t *o)
{
    if (o == NULL)
        return;
    pthread_mutex_lock(&o->mu);
    o->stop = true;
    pthread_cond_broadcast(&o->wake);
    pthread_mutex_unlock(&o->mu);
    if (o->started)
        pthread_join(o->th, NULL);
    for (size_t i = 0; i < o->nk; i++)
        KILN_FREE_ALL(o->k[i].url, o->k[i].model, o->k[i].label);
    free(o->k);
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->wake);
    pthread_cond_destroy(&o->done);
    free(o);
}

/* Under mu: the kept entry of (url, model, label), added when new; NULL
 * when out of memory. */
static kept_t *kept_find(web_online_t *o, const char *url, const char *model, const char *label)
{
    for (size_t i = 0; i < o->nk; i++)
        if (strcmp(o->k[i].url, url) == 0 && strcmp(o->k[i].model, model) == 0 &&
            strcmp(o->k[i].label, label) == 0)
            return &o->k[i];
    if (kiln_grow((void **)&o->k, &o->capk, o->nk + 1, sizeof *o->k, 8) < 0)
        return NULL;
    kept_t *k = &o->k[o->nk];
    *k =
        (kept_t){.url = kiln_strdup(url), .model = kiln_strdup(model), .label = kiln_strdup(label)};
    if (k->url == NULL || k->model == NULL || k->label == NULL) {
        KILN_FREE_ALL(k->url, k->model, k->label);
        return NULL;
    }
    snprintf(k->fig.error, sizeof k->fig.error, "not read yet");
    k->fig.diff = k->fig.lo = k->fig.hi = NAN;
    o->nk++;
    return k;
}

/* The reader: one reading per request, one (URL, model) after another,
 * each answer kept as it comes. */
static void *reader_main(void *arg)
{
    web_online_t *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->want && !o->stop)
            pthread_cond_wait(&o->wake, &o->mu);
        if (o->stop)
            break;
        o->want = false;
        o->busy = true;
        for (size_t i = 0; i < o->nk && !o->stop; i++) {
            if (o->k[i].at_ms >= o->asked_ms)
                continue; /* read in this reading already, with an earlier entry */
            /* The endpoints of this (URL, model), read in one request. */
            size_t n = 0;
            state_endpoint_info_t *es = kiln_calloc(o->nk, sizeof *es);
            size_t *which = kiln_calloc(o->nk, sizeof *which);
            for (size_t j = i; es != NULL && which != NULL && j < o->nk; j++)
                if (strcmp(o->k[j].url, o->k[i].url) == 0 &&
                    strcmp(o->k[j].model, o->k[i].model) == 0) {
                    /* borrowed: a kept entry's strings live as long as o */
                    es[n] = (state_endpoint_info_t){
                        .url = o->k[j].url, .model = o->k[j].model, .label = o->k[j].label};
                    which[n++] = j;
                }
            pthread_mutex_unlock(&o->mu);
            ops_online_t *on = ops_online_read(es, n, OPS_ONLINE_TIMEOUT_MS);
            pthread_mutex_lock(&o->mu);
            int64_t now = kiln_now_ms();
            for (size_t m = 0; m < n; m++) {
                o->k[which[m]].fig = *ops_online_at(on, m);
                o->k[which[m]].at_ms = now;
            }
            KILN_FREE_ALL(on, es, which);
            if (n == 0) { /* out of memory: this entry waits for the next reading */
                o->k[i].at_ms = now;
                snprintf(o->k[i].fig.error, sizeof o->k[i].fig.error, "out of memory");
            }
            pthread_cond_broadcast(&o->done);
        }
        o->busy = false;
        o->readings++;
        pthread_cond_broadcast(&o->done);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

ops_online_t *web_online_get(web_online_t *o, const state_endpoint_info_t *es, size_t n,
                             int64_t *age_ms /* OUT */)
{
    ops_online_t *out = kiln_calloc(n + 1, sizeof *out);
    if (out == NULL)
        return NULL;
    int64_t now = kiln_now_ms();
    pthread_mutex_lock(&o->mu);
    /* Ask for a reading when one of es was never read or the newest is old. */
    bool stale = false;
    for (size_t i = 0; i < n; i++) {
        kept_t *k = kept_find(o, es[i].url, es[i].model, es[i].label);
        stale |= k != NULL && now - k->at_ms > WEB_ONLINE_TTL_MS;
    }
    if (stale && !o->want && !o->busy) {
        if (!o->started && pthread_create(&o->th, NULL, reader_main, o) == 0)
            o->started = true;
        o->want = o->started;
        o->asked_ms = now;
        pthread_cond_signal(&o->wake);
    }
    /* Wait a little for it: a healthy kiln-serve answers in that time. */
    uint64_t readings = o->readings;
    int64_t until = now + WEB_ONLINE_WAIT_MS; /* on CLOCK_REALTIME, as the wait's clock */
    struct timespec ts = {.tv_sec = (time_t)(until / 1000),
                          .tv_nsec = (long)(until % 1000) * 1000000L};
    while ((o->want || o->busy) && o->readings == readings &&
           pthread_cond_timedwait(&o->done, &o->mu, &ts) == 0)
        ;
    int64_t later = kiln_now_ms();
    for (size_t i = 0; i < n; i++) {
        kept_t *k = kept_find(o, es[i].url, es[i].model, es[i].label);
        if (k == NULL) {
            snprintf(out[i].error, sizeof out[i].error, "out of memory");
            age_ms[i] = -1;
            continue;
        }
        out[i] = k->fig;
        age_ms[i] = k->at_ms > 0 ? later - k->at_ms : -1;
    }
    pthread_mutex_unlock(&o->mu);
    return out;
}
