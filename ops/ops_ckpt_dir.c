/*
 * ops/ops_ckpt_dir.c - which job owns a checkpoint directory. Two jobs that
 * name the same checkpoint.dir would resume from each other's model
 * (init_from: latest) and prune each other's checkpoints (checkpoint.keep),
 * so a submit that would make a second owner is refused (ops_submit calls
 * ops_checkpoint_dir_check). It reads the stored jobs (their spec text and
 * spec_dir) and compares canonical paths: absolute, symlinks resolved as far
 * as the path exists, "." and ".." folded.
 */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln.h"
#include "ops.h"

/* Appends component c (not "" or ".") to the path in buf, folding "..". */
static void push_component(char *buf, size_t cap, const char *c, size_t len)
{
    if (len == 0 || (len == 1 && c[0] == '.'))
        return;
    size_t n = strlen(buf);
    if (len == 2 && c[0] == '.' && c[1] == '.') {
        char *slash = strrchr(buf, '/');
        if (slash != NULL)
            *(slash == buf ? slash + 1 : slash) = '\0';
        return;
    }
    snprintf(buf + n, cap - n, "%s%.*s", n > 0 && buf[n - 1] == '/' ? "" : "/", (int)len, c);
}

/* path (absolute) in canonical form, malloc'd: the longest prefix that
 * exists through realpath, the rest folded by hand (it names directories
 * that do not exist yet: a new job's checkpoint.dir). A dangling symlink
 * on the way (a link to a checkpoint directory not made yet) is followed
 * by hand, at most 40 times. */
static char *canonical(const char *path)
{
    char cur[PATH_MAX], head[PATH_MAX], real[PATH_MAX], out[PATH_MAX * 2];
    snprintf(cur, sizeof cur, "%s", path);
    for (int hops = 0;; hops++) {
        size_t cut = strlen(cur);
        bool link = false;
        struct stat lst;
        snprintf(head, sizeof head, "%s", cur);
        /* Shorten head one component at a time until it exists. */
        while (realpath(head, real) == NULL) {
            if (hops < 40 && lstat(head, &lst) == 0 && S_ISLNK(lst.st_mode)) {
                link = true;
                break;
            }
            char *slash = strrchr(head, '/');
            if (slash == NULL || slash == head) {
                snprintf(real, sizeof real, "/");
                cut = slash == head ? 1 : 0;
                break;
            }
            *slash = '\0';
            cut = (size_t)(slash - head) + 1;
        }
        if (link) {
            /* cur = the link's target (against the link's directory) + the rest. */
            char target[PATH_MAX], next[PATH_MAX * 3];
            ssize_t n = readlink(head, target, sizeof target - 1);
            if (n > 0) {
                target[n] = '\0';
                char *slash = strrchr(head, '/');
                *slash = '\0';
                int k = snprintf(next, sizeof next, "%s%s%s%s%s", target[0] == '/' ? "" : head,
                                 target[0] == '/' ? "" : "/", target, cut < strlen(cur) ? "/" : "",
                                 cut < strlen(cur) ? cur + cut : "");
                if (k > 0 && (size_t)k < sizeof cur) {
                    memcpy(cur, next, (size_t)k + 1);
                    continue;
                }
            }
            snprintf(real, sizeof real, "/");
            cut = 1;
        }
        snprintf(out, sizeof out, "%s", real);
        for (const char *c = cur + (cut < strlen(cur) ? cut : strlen(cur)); *c != '\0';) {
            const char *e = strchr(c, '/');
            size_t len = e ? (size_t)(e - c) : strlen(c);
            push_component(out, sizeof out, c, len);
            c += len + (e ? 1 : 0);
        }
        return kiln_strdup(out);
    }
}

/* The canonical checkpoint directory of spec resolved against spec_dir, or
 * NULL when it has none that other jobs could share (relative, and no
 * spec_dir: then it resolves against $KILN_HOME/jobs/NAME, the job's own). */
static char *owned_dir(const job_spec_t *spec, const char *spec_dir)
{
    const char *d = spec->checkpoint.dir;
    if (d == NULL || (d[0] != '/' && spec_dir == NULL))
        return NULL;
    char *abs = d[0] == '/' ? kiln_strdup(d) : kiln_asprintf("%s/%s", spec_dir, d);
    char *c = abs != NULL ? canonical(abs) : NULL;
    free(abs);
    return c;
}

int ops_checkpoint_dir_check(state_t *st, const job_spec_t *spec, const char *spec_dir)
{
    char *mine = owned_dir(spec, spec_dir);
    if (mine == NULL)
        return 0;
    state_job_t *jobs = NULL;
    size_t n = 0;
    int rc = state_job_list(st, &jobs, &n);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (strcmp(jobs[i].name, spec->name) == 0) /* a resubmit keeps its directory */
            continue;
        job_spec_t other;
        if (job_spec_parse(jobs[i].spec_yaml, strlen(jobs[i].spec_yaml), jobs[i].name, &other,
                           NULL) < 0)
            continue; /* a spec that no longer parses cannot run: it owns nothing */
        char *theirs = owned_dir(&other, jobs[i].spec_dir);
        if (theirs != NULL && strcmp(theirs, mine) == 0)
            rc = kiln_errf(KILN_ECONFLICT,
                           "checkpoint.dir %s is already the checkpoint directory of job %s; two "
                           "jobs in one directory would resume from each other's model and prune "
                           "each other's checkpoints: give job %s its own checkpoint.dir",
                           mine, jobs[i].name, spec->name);
        free(theirs);
        job_spec_fini(&other);
    }
    if (rc == 0)
        kiln_errclear(); /* what a stored spec that no longer parses left */
    state_jobs_free(jobs, n);
    free(mine);
    return rc;
}
