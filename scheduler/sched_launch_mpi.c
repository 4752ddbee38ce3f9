/*
 * scheduler/sched_launch_mpi.c - the mpirun launchers: `local` (every rank on
 * this host; --oversubscribe, so a small host can run more ranks than it has
 * cores) and `hostfile` (mpirun --hostfile FILE spreads the ranks over the
 * hosts listed). Both build
 *   mpirun -np N [--allow-run-as-root] ... kiln-train --spec S --run-dir D
 *          [--inputs F] [--resume CKPT] --db DB --run-id R
 * A `slurm` launcher (srun inside an allocation) would be one more table entry
 * with its own build_argv; this build has none and says so.
 */
#include "sched_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void sched_argv_free(char **argv)
{
    for (size_t i = 0; argv != NULL && argv[i] != NULL; i++)
        free(argv[i]);
    free(argv);
}

typedef struct {
    char **v;
    size_t n, cap;
    bool oom;
} argv_t;

static void push(argv_t *a, const char *s)
{
    if (a->oom)
        return;
    if (a->n + 2 > a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 32;
        char **nv = kiln_reallocarray(a->v, cap, sizeof *nv);
        if (nv == NULL) {
            a->oom = true;
            return;
        }
        a->v = nv;
        a->cap = cap;
    }
    a->v[a->n] = kiln_strdup(s);
    if (a->v[a->n] == NULL) {
        a->oom = true;
        return;
    }
    a->v[++a->n] = NULL;
}

static int finish(argv_t *a, char ***out)
{
    if (a->oom) {
        sched_argv_free(a->v);
        return KILN_ENOMEM;
    }
    *out = a->v;
    return 0;
}

static void mpirun_head(argv_t *a, const sched_launch_ctx_t *c)
{
    char np[16];
    snprintf(np, sizeof np, "%d", c->spec->resources.ranks);
    push(a, c->mpirun);
    push(a, "-np");
    push(a, np);
    if (geteuid() == 0)
        push(a, "--allow-run-as-root");
    /* Ranks set their own thread counts; do not pin them to one core each. */
    push(a, "--bind-to");
    push(a, "none");
    /* A rank waiting in a collective yields the core instead of spinning.
     * Open MPI turns this on by itself only when ONE job oversubscribes a
     * host; two 2-rank jobs on a 2-core host each spun against the other's
     * ranks and ran 25x slower (a 1 s job took over 60 s). */
    push(a, "--mca");
    push(a, "mpi_yield_when_idle");
    push(a, "1");
}

static void trainer_tail(argv_t *a, const sched_launch_ctx_t *c)
{
    char id[32];
    push(a, c->trainer);
    push(a, "--spec");
    push(a, c->spec_path);
    push(a, "--run-dir");
    push(a, c->run_dir);
    if (c->inputs_path != NULL) {
        push(a, "--inputs");
        push(a, c->inputs_path);
    }
    if (c->resume_path != NULL) {
        push(a, "--resume");
        push(a, c->resume_path);
    }
    /* Rank 0 records checkpoints, online exports, inputs and the checkpoint
     * the run started from in the database. No --quiet: the progress lines go
     * to the run's log, which `kiln logs --follow` shows as the run trains. */
    snprintf(id, sizeof id, "%lld", (long long)c->run_id);
    push(a, "--db");
    push(a, c->db_path);
    push(a, "--run-id");
    push(a, id);
}

static int local_argv(const sched_launch_ctx_t *c, char ***out)
{
    argv_t a = {0};
    mpirun_head(&a, c);
    push(&a, "--oversubscribe");
    trainer_tail(&a, c);
    return finish(&a, out);
}

static int hostfile_argv(const sched_launch_ctx_t *c, char ***out)
{
    if (c->hostfile == NULL)
        return kiln_errf(KILN_EINVAL, "launcher hostfile needs resources.hostfile");
    argv_t a = {0};
    mpirun_head(&a, c);
    push(&a, "--hostfile");
    push(&a, c->hostfile);
    trainer_tail(&a, c);
    return finish(&a, out);
}

static const sched_launcher_t launchers[] = {
    {"local", local_argv},
    {"hostfile", hostfile_argv},
};

const sched_launcher_t *sched_launcher_for(job_launcher_t which)
{
    const char *name = job_launcher_name(which);
    for (size_t i = 0; i < sizeof launchers / sizeof launchers[0]; i++)
        if (strcmp(launchers[i].name, name) == 0)
            return &launchers[i];
    kiln_errf(KILN_EINVAL, "launcher %s is not available in this build (local and hostfile are)",
              name);
    return NULL;
}
