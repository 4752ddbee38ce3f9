/*
 * scheduler/sched_queue.c - what kilnd decides: the cron fires that are due and what the catch-up
 * policy makes of the ones missed while kilnd was down, and which queued runs
 * launch now: highest priority first, FIFO within a priority, within the
 * global limit on ranks in use (a run larger than the limit runs alone), and
 * within each job's concurrency policy (forbid | allow | replace).
 */
#include "sched_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A fire this late is still "on time"; older ones count as missed. */
#define SCHED_STARTING_DEADLINE_S 60
/* At most this many missed fires of one job are recorded after downtime. */
#define SCHED_CATCHUP_MAX 100

static sched_active_t *active_of_job(sched_t *s, int64_t job_id)
{
    for (size_t i = 0; i < s->nact; i++)
        if (s->act[i].job_id == job_id)
            return &s->act[i];
    return NULL;
}

int sched_ranks_in_use(const sched_t *s)
{
    int used = 0;
    for (size_t i = 0; i < s->nact; i++)
        if (!s->act[i].followed) /* Slurm places its runs' ranks, not this host */
            used += s->act[i].ranks;
    return used;
}

/* ---- cron ------------------------------------------------------------------------------ */

/* Queues a run for scheduled time t, or counts it on the job as skipped (why
 * != NULL): a skipped fire is not a run. A time already served (KILN_EEXIST:
 * a run for it exists, maybe made by another kilnd) is left alone. */
static void fire(sched_t *s, sched_job_t *j, int64_t t, state_trigger_t trig, const char *why)
{
    int64_t id = 0;
    char iso[KILN_ISO_LEN];
    kiln_time_iso(t, iso, sizeof iso);
    if (why != NULL) {
        if (state_job_skip(s->st, j->row.id, kiln_now_s(), why) < 0)
            KILN_WARN("job %s: cannot count the skipped fire of %s: %s", j->row.name, iso,
                      kiln_errmsg());
        KILN_INFO("job %s: %s skipped: %s", j->row.name, iso, why);
        return;
    }
    int rc = state_run_create(s->st, j->row.id, trig, t, 1, 0, &id);
    if (rc == KILN_EEXIST)
        return;
    if (rc < 0) {
        KILN_WARN("job %s: cannot queue the run for %s: %s", j->row.name, iso, kiln_errmsg());
        return;
    }
    KILN_INFO("job %s: run %lld queued for %s (%s)", j->row.name, (long long)id, iso,
              state_trigger_name(trig));
    s->dirty = true;
}

static void cron_job(sched_t *s, sched_job_t *j, int64_t now, int64_t *next_ms)
{
    int64_t base = j->row.last_scheduled_at > 0 ? j->row.last_scheduled_at : j->row.created_at;
    const job_cron_t *c = &j->cron;
    /* Long downtime under @every: skip ahead to the fires that can be kept. */
    if (c->every_s > 0 && now - base > (SCHED_CATCHUP_MAX + 2) * c->every_s)
        base = now - (SCHED_CATCHUP_MAX + 1) * c->every_s;
    int64_t fires[SCHED_CATCHUP_MAX + 1];
    int nf = 0, dropped = 0;
    int64_t t = 0, after = base;
    for (int guard = 0; guard < 10000000; guard++) {
        if (job_cron_next(c, after, &t) < 0) {
            t = 0;
            break;
        }
        if (t > now)
            break;
        if (nf == SCHED_CATCHUP_MAX + 1) {
            memmove(fires, fires + 1, sizeof fires[0] * SCHED_CATCHUP_MAX);
            nf--;
            dropped++;
        }
        fires[nf++] = t;
        after = t;
    }
    if (t > 0 && (*next_ms == 0 || t * 1000 < *next_ms))
        *next_ms = t * 1000;
    if (nf == 0)
        return;
    if (dropped > 0)
        KILN_WARN("job %s: %d missed fire times are older than the newest %d and are not "
                  "recorded",
                  j->row.name, dropped, SCHED_CATCHUP_MAX);
    int64_t newest = fires[nf - 1];
    bool on_time = now - newest <= SCHED_STARTING_DEADLINE_S;
    job_catchup_t policy = j->spec.catchup;
    sched_active_t *busy = active_of_job(s, j->row.id);
    bool forbid = busy != NULL && j->spec.concurrency == JOB_CONC_FORBID;
    char why[160];
    for (int i = 0; i < nf; i++) {
        bool last = i == nf - 1;
        bool run = false;
        state_trigger_t trig = last && on_time ? STATE_TRIGGER_CRON : STATE_TRIGGER_CATCHUP;
        if (last)
            run = on_time || policy != JOB_CATCHUP_NONE;
        else
            run = policy == JOB_CATCHUP_ALL;
        if (!run) {
            snprintf(why, sizeof why, "missed while kilnd was not running or the job was "
                                      "paused (catchup: %s)",
                     job_catchup_name(policy));
            fire(s, j, fires[i], trig, why);
        } else if (forbid) {
            snprintf(why, sizeof why, "run %lld was still running (concurrency: forbid)",
                     (long long)busy->run_id);
            fire(s, j, fires[i], trig, why);
        } else {
            fire(s, j, fires[i], trig, NULL);
        }
    }
    if (state_job_set_last_scheduled(s->st, j->row.id, newest) < 0)
        KILN_WARN("job %s: %s", j->row.name, kiln_errmsg());
    j->row.last_scheduled_at = newest;
}

int sched_cron_tick(sched_t *s, int64_t now, int64_t *next_ms)
{
    for (size_t i = 0; i < s->njobs; i++) {
        sched_job_t *j = &s->jobs[i];
        if (j->has_cron && !j->row.paused)
            cron_job(s, j, now, next_ms);
    }
    return 0;
}

/* ---- the queue --------------------------------------------------------------------------- */

typedef struct {
    state_run_t *run;
    int priority;
} queued_t;

static int by_priority(const void *a, const void *b)
{
    const queued_t *x = a, *y = b;
    if (x->priority != y->priority)
        return x->priority > y->priority ? -1 : 1;
    return x->run->id < y->run->id ? -1 : x->run->id > y->run->id;
}

int sched_dispatch(sched_t *s, int64_t now_ms, int64_t *next_ms)
{
    state_run_t *rs = NULL;
    size_t n = 0;
    int rc;
    KILN_CHECK(state_run_list_in_state(s->st, STATE_RUN_QUEUED, &rs, &n));
    queued_t *q = kiln_calloc(n + 1, sizeof *q);
    if (q == NULL) {
        state_runs_free(rs, n);
        return KILN_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        sched_job_t *j = sched_job_find(s, rs[i].job_id);
        q[i].run = &rs[i];
        q[i].priority = j != NULL ? j->row.priority : 0;
    }
    qsort(q, n, sizeof *q, by_priority);
    int used = sched_ranks_in_use(s);
    int64_t now_s = now_ms / 1000;
    for (size_t i = 0; i < n && !s->stopping; i++) {
        state_run_t *r = q[i].run;
        sched_job_t *j = sched_job_find(s, r->job_id);
        if (j == NULL)
            continue;
        if (!j->spec_ok) {
            state_run_transition(s->st, r->id, STATE_RUN_QUEUED, STATE_RUN_FAILED, -1,
                                 "the job's stored spec does not parse; resubmit it");
            continue;
        }
        if (j->row.paused)
            continue;
        if (r->not_before > now_s) {
            if (*next_ms == 0 || r->not_before * 1000 < *next_ms)
                *next_ms = r->not_before * 1000;
            continue;
        }
        sched_active_t *busy = active_of_job(s, j->row.id);
        if (busy != NULL && j->spec.concurrency != JOB_CONC_ALLOW) {
            if (j->spec.concurrency == JOB_CONC_REPLACE)
                for (size_t k = 0; k < s->nact; k++)
                    if (s->act[k].job_id == j->row.id)
                        sched_stop(s, &s->act[k], STOP_REPLACED, now_ms);
            continue; /* it launches once the running one ended */
        }
        int need = j->spec.resources.launcher == JOB_LAUNCH_SLURM ? 0 : j->spec.resources.ranks;
        if (need > 0 && used > 0 && used + need > s->o.max_ranks)
            break; /* strict priority order: nothing smaller jumps the queue */
        rc = sched_launch(s, r, j);
        if (rc < 0)
            KILN_WARN("run %lld: %s", (long long)r->id, kiln_errmsg());
        used = sched_ranks_in_use(s);
    }
    free(q);
    state_runs_free(rs, n);
    return 0;
}
