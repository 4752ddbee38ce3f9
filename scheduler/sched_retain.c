/*
 * scheduler/sched_retain.c - retention (kilnd --keep-runs DURATION): at start
 * and then every tenth of DURATION (1 s to an hour), a pass of
 * state_retain_pass compacts the runs that ended more than DURATION ago
 * (their events, loss points and logs go; what consumed data, checkpoint
 * chains, endpoints and lineage need stays), then drops what compacted runs
 * kept once nothing needs it: the input records of files gone from disk, the
 * checkpoints nothing needs whose files checkpoint.keep removed, and the runs
 * left with nothing. This file deletes the compacted runs' directories under
 * $KILN_HOME/runs (the logs) and answers whether a file is gone for good.
 * Each step of a pass takes at most RETAIN_BATCH rows in one transaction so
 * the loop is never held long; a full batch brings the next pass at once.
 */
#include "sched_int.h"

#include <errno.h>
#include <ftw.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Passes are a tenth of --keep-runs apart, within these bounds. */
#define RETAIN_EVERY_MIN_MS 1000
#define RETAIN_EVERY_MAX_MS (3600 * 1000)
/* Rows a step takes in one transaction: about 50 ms at 500 runs on a laptop. */
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

/* Whether path is gone for good: it does not exist, but the directory it
 * was in does. A file whose directory is missing too (an unmounted volume, a
 * share that did not come up) may come back, and its records must stay: a
 * consumed file forgotten would be trained again. A relative path (kilnd's
 * directory is not the run's) is never judged. */
static bool gone(const char *path, void *ctx)
{
    (void)ctx;
    struct stat sb;
    if (path[0] != '/' || lstat(path, &sb) == 0 || errno != ENOENT)
        return false;
    char dir[4096];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
        return false;
    return stat(dirname(dir), &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int64_t every_ms(const sched_t *s)
{
    int64_t ms = s->o.keep_runs_ms / 10;
    return ms < RETAIN_EVERY_MIN_MS   ? RETAIN_EVERY_MIN_MS
           : ms > RETAIN_EVERY_MAX_MS ? RETAIN_EVERY_MAX_MS
                                      : ms;
}

int64_t sched_retain(sched_t *s, int64_t now_ms)
{
    if (s->o.keep_runs_ms <= 0)
        return 0;
    if (now_ms < s->next_retain_ms)
        return s->next_retain_ms;
    state_retain_t *r = &s->retain;
    r->before = (now_ms - s->o.keep_runs_ms) / 1000;
    r->limit = RETAIN_BATCH;
    r->gone = gone;
    r->ctx = NULL;
    int rc = state_retain_pass(s->st, r);
    if (rc < 0) {
        KILN_WARN("retention: %s", kiln_errmsg());
        state_retain_fini(r);
        s->next_retain_ms = now_ms + every_ms(s);
        return s->next_retain_ms;
    }
    for (size_t i = 0; i < r->ndirs; i++)
        remove_run_dir(s, r->run_dirs[i]);
    if (r->compacted > 0 || r->removed > 0 || r->checkpoints > 0 || r->inputs > 0)
        KILN_INFO("retention: compacted %lld runs, removed %lld runs, %lld checkpoints nothing "
                  "needs, %lld inputs of files that are gone and %lld job events",
                  (long long)r->compacted, (long long)r->removed, (long long)r->checkpoints,
                  (long long)r->inputs, (long long)r->events);
    bool more = r->more;
    state_retain_fini(r);
    s->next_retain_ms = now_ms + (more ? 1 : every_ms(s));
    return s->next_retain_ms;
}
