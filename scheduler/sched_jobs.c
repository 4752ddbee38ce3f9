/*
 * scheduler/sched_jobs.c - the jobs kilnd knows: the job rows of the
 * database with their specs parsed once per version (a job whose stored spec
 * no longer parses is kept, logged and never launched) and their cron
 * schedules in the job's time zone. The queue (sched_queue.c) and the run
 * side (sched_run.c) both look jobs up here.
 */
#include "sched_int.h"

#include <stdlib.h>
#include <string.h>

void sched_job_clear(sched_job_t *j)
{
    if (j->spec_ok)
        job_spec_fini(&j->spec);
    sched_seen_destroy(j->seen);
    state_job_fini(&j->row);
    memset(j, 0, sizeof *j);
}

sched_job_t *sched_job_find(sched_t *s, int64_t job_id)
{
    for (size_t i = 0; i < s->njobs; i++)
        if (s->jobs[i].row.id == job_id)
            return &s->jobs[i];
    return NULL;
}

int sched_jobs_reload(sched_t *s)
{
    state_job_t *rows = NULL;
    size_t n = 0;
    KILN_CHECK(state_job_list(s->st, &rows, &n));
    sched_job_t *jobs = kiln_calloc(n + 1, sizeof *jobs);
    if (jobs == NULL) {
        state_jobs_free(rows, n);
        return KILN_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        sched_job_t *j = &jobs[i], *old = sched_job_find(s, rows[i].id);
        j->row = rows[i];
        memset(&rows[i], 0, sizeof rows[i]);
        if (old != NULL && old->spec_ok && strcmp(old->row.spec_hash, j->row.spec_hash) == 0) {
            j->spec = old->spec; /* same text: keep the parsed spec */
            j->spec_ok = true;
            old->spec_ok = false;
        } else {
            j->spec_ok = job_spec_parse(j->row.spec_yaml, strlen(j->row.spec_yaml), j->row.name,
                                        &j->spec, NULL) == 0;
            if (!j->spec_ok)
                KILN_WARN("job %s: its stored spec does not parse: %s", j->row.name,
                          kiln_errmsg());
        }
        /* What the job saw of its files outlives a reload (a resubmit too:
         * it is keyed by path and checked against each file's stat). */
        if (old != NULL) {
            j->seen = old->seen;
            old->seen = NULL;
        } else {
            j->seen = sched_seen_create(); /* NULL (no memory): remember nothing */
        }
        j->has_cron = false;
        if (j->spec_ok && j->row.schedule != NULL) {
            if (job_cron_parse(j->row.schedule, &j->cron) == 0 &&
                job_cron_set_timezone(&j->cron, j->spec.timezone) == 0)
                j->has_cron = true;
            else
                KILN_WARN("job %s: schedule \"%s\": %s", j->row.name, j->row.schedule,
                          kiln_errmsg());
        }
    }
    for (size_t i = 0; i < s->njobs; i++)
        sched_job_clear(&s->jobs[i]);
    free(s->jobs);
    free(rows);
    s->jobs = jobs;
    s->njobs = n;
    return 0;
}
