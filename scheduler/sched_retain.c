/*
 * scheduler/sched_retain.c - retention of runs (kilnd --keep-runs DAYS): once
 * an hour, and at start, kilnd removes the runs that ended more than DAYS ago
 * and that nothing needs any more (state_runs_prune says which: never a run
 * whose checkpoint chains, is served or is traced by lineage, nor one whose
 * inputs mark data as consumed), their events, and their directories under
 * $KILN_HOME/runs, where their logs live. A pass removes at most
 * RETAIN_BATCH runs so that the loop is never held long; a full batch makes
 * the next pass come at once.
 */
#include "sched_int.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* How often a pass runs when the last one found nothing more to remove. */
#define RETAIN_EVERY_MS (3600 * 1000)
/* Runs removed in one transaction: about 50 ms at 1000 runs on a laptop. */
#define RETAIN_BATCH 500

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    if (remove(path) < 0)
        KILN_WARN("retention: cannot remove %s: %s", path, strerror(errno));
    return 0;
}

/* Removes dir and what is in it when it lies under home's runs/ (a run
 * directory elsewhere is not kilnd's to delete). */
static void remove_run_dir(const sched_t *s, const char *dir)
{
    char runs[4096];
    int len = snprintf(runs, sizeof runs, "%s/runs/", s->home);
    if (len <= 0 || (size_t)len >= sizeof runs || strncmp(dir, runs, (size_t)len) != 0 ||
        strstr(dir, "/..") != NULL)
        return;
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

int64_t sched_retain(sched_t *s, int64_t now_ms)
{
    if (s->o.keep_runs_days <= 0)
        return 0;
    if (now_ms < s->next_retain_ms)
        return s->next_retain_ms;
    int64_t before = now_ms / 1000 - (int64_t)s->o.keep_runs_days * 86400;
    state_prune_t p;
    int rc = state_runs_prune(s->st, before, RETAIN_BATCH, &p);
    if (rc < 0) {
        KILN_WARN("retention: %s", kiln_errmsg());
        s->next_retain_ms = now_ms + RETAIN_EVERY_MS;
        return s->next_retain_ms;
    }
    for (size_t i = 0; i < p.ndirs; i++)
        remove_run_dir(s, p.run_dirs[i]);
    if (p.runs > 0 || p.events > 0)
        KILN_INFO("retention: removed %lld runs and %lld job events older than %d days",
                  (long long)p.runs, (long long)p.events, s->o.keep_runs_days);
    bool more = p.runs == RETAIN_BATCH || p.events == RETAIN_BATCH;
    state_prune_fini(&p);
    s->next_retain_ms = now_ms + (more ? 1 : RETAIN_EVERY_MS);
    return s->next_retain_ms;
}
