/*
 * scheduler/sched_argv.c - building a launcher's argv: a growing list of
 * copied strings that stops (and reports KILN_ENOMEM once, at finish) after an
 * allocation fails, and the `kiln-train ...` tail every launcher ends with.
 * It calls nothing else of the scheduler.
 */
#include "sched_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sched_argv_free(char **argv)
{
    for (size_t i = 0; argv != NULL && argv[i] != NULL; i++)
        free(argv[i]);
    free(argv);
}

/* Appends s, which the list then owns (NULL: an allocation failed). */
static void adopt(sched_argv_t *a, char *s)
{
    /* room for this one and the NULL that ends the list */
    if (a->oom || s == NULL ||
        kiln_grow((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v, 32) < 0) {
        a->oom = true;
        free(s);
        return;
    }
    a->v[a->n] = s;
    a->v[++a->n] = NULL;
}

void sched_argv_push(sched_argv_t *a, const char *s)
{
    if (!a->oom)
        adopt(a, kiln_strdup(s));
}

void sched_argv_pushf(sched_argv_t *a, const char *fmt, ...)
{
    if (a->oom)
        return;
    va_list ap;
    va_start(ap, fmt);
    char *s = kiln_vasprintf(fmt, ap);
    va_end(ap);
    adopt(a, s);
}

int sched_argv_finish(sched_argv_t *a, char ***out)
{
    if (a->oom) {
        sched_argv_free(a->v);
        return KILN_ENOMEM;
    }
    *out = a->v;
    return 0;
}

void sched_argv_trainer(sched_argv_t *a, const sched_launch_ctx_t *c)
{
    sched_argv_push(a, c->trainer);
    sched_argv_push(a, "--spec");
    sched_argv_push(a, c->spec_path);
    sched_argv_push(a, "--run-dir");
    sched_argv_push(a, c->run_dir);
    if (c->inputs_path != NULL) {
        sched_argv_push(a, "--inputs");
        sched_argv_push(a, c->inputs_path);
    }
    if (c->resume_path != NULL) {
        sched_argv_push(a, "--resume");
        sched_argv_push(a, c->resume_path);
    }
    /* Rank 0 records checkpoints, online exports, inputs and the checkpoint
     * the run started from in the database. No --quiet: the progress lines go
     * to the run's log, which `kiln logs --follow` shows as the run trains. */
    sched_argv_push(a, "--db");
    sched_argv_push(a, c->db_path);
    sched_argv_push(a, "--run-id");
    sched_argv_pushf(a, "%lld", (long long)c->run_id);
}
