/*
 * scheduler/sched_launch_mpi.c - the mpirun launchers: `local` (every rank on
 * this host; --oversubscribe, so a small host can run more ranks than it has
 * cores) and `hostfile` (mpirun --hostfile FILE spreads the ranks over the
 * hosts listed). Both build
 *   mpirun -np N [--allow-run-as-root] ... kiln-train --spec S --run-dir D
 *          [--inputs F] [--resume CKPT] --db DB --run-id R
 * The table that picks a launcher is sched_launch.c; the Slurm one is
 * sched_launch_slurm.c; the argv helpers all of them use, sched_argv.c.
 */
#include "sched_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

static void mca(sched_argv_t *a, const char *name, const char *value)
{
    sched_argv_push(a, "--mca");
    sched_argv_push(a, name);
    sched_argv_push(a, value);
}

static void mpirun_head(sched_argv_t *a, const sched_launch_ctx_t *c)
{
    sched_argv_push(a, c->mpirun);
    sched_argv_push(a, "-np");
    sched_argv_pushf(a, "%d", c->spec->resources.ranks);
    if (geteuid() == 0)
        sched_argv_push(a, "--allow-run-as-root");
    /* Ranks set their own thread counts; do not pin them to one core each. */
    sched_argv_push(a, "--bind-to");
    sched_argv_push(a, "none");
    /* A rank waiting in a collective yields the core instead of spinning.
     * Open MPI turns this on by itself only when ONE job oversubscribes a
     * host; two 2-rank jobs on a 2-core host each spun against the other's
     * ranks and ran 25x slower (a 1 s job took over 60 s). */
    mca(a, "mpi_yield_when_idle", "1");
    /* resources.mpi: the ranks' traffic (btl) and mpirun's own with its
     * daemons on other hosts (oob) only over these interfaces or subnets;
     * transport tcp leaves out shared memory (vader) between ranks on one host. */
    if (c->spec->resources.mpi.interfaces != NULL) {
        mca(a, "btl_tcp_if_include", c->spec->resources.mpi.interfaces);
        mca(a, "oob_tcp_if_include", c->spec->resources.mpi.interfaces);
    }
    if (c->spec->resources.mpi.transport == JOB_MPI_TCP)
        mca(a, "btl", "tcp,self");
}

int sched_mpi_local_argv(const sched_launch_ctx_t *c, char ***out)
{
    sched_argv_t a = {0};
    mpirun_head(&a, c);
    sched_argv_push(&a, "--oversubscribe");
    sched_argv_trainer(&a, c);
    return sched_argv_finish(&a, out);
}

int sched_mpi_hostfile_argv(const sched_launch_ctx_t *c, char ***out)
{
    if (c->hostfile == NULL)
        return kiln_errf(KILN_EINVAL, "launcher hostfile needs resources.hostfile");
    sched_argv_t a = {0};
    mpirun_head(&a, c);
    sched_argv_push(&a, "--hostfile");
    sched_argv_push(&a, c->hostfile);
    /* mpirun gives ranks on other hosts only the variables it is told to
     * (sbatch passes the whole environment): the run's own, and kilnd's
     * KILN_*, OMP_* and OPENBLAS_* (OpenBLAS picks its kernels by
     * OPENBLAS_CORETYPE: ranks with other kernels train other bits). */
    const char *env[] = {"KILN_RUN_ID", "KILN_ATTEMPT", c->spec_dir ? "KILN_SPEC_DIR" : NULL};
    for (size_t i = 0; i < sizeof env / sizeof env[0]; i++) {
        if (env[i] == NULL)
            continue;
        sched_argv_push(&a, "-x");
        sched_argv_push(&a, env[i]);
    }
    static const char *const prefixes[] = {"KILN_", "OMP_", "OPENBLAS_"};
    for (char **e = environ; *e != NULL; e++) {
        size_t len = strcspn(*e, "=");
        char name[256];
        bool forward = false;
        for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
            forward = forward || strncmp(*e, prefixes[i], strlen(prefixes[i])) == 0;
        if (!forward || len >= sizeof name || (*e)[len] != '=')
            continue;
        snprintf(name, sizeof name, "%.*s", (int)len, *e);
        bool dup = false;
        for (size_t i = 0; i < sizeof env / sizeof env[0]; i++)
            dup = dup || (env[i] != NULL && strcmp(env[i], name) == 0);
        if (dup)
            continue;
        sched_argv_push(&a, "-x");
        sched_argv_push(&a, name);
    }
    sched_argv_trainer(&a, c);
    return sched_argv_finish(&a, out);
}
