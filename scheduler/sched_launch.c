/*
 * scheduler/sched_launch.c - the launchers by name: `local` and `hostfile`
 * (mpirun, sched_launch_mpi.c) and `slurm` (sbatch, followed by its job id,
 * sched_launch_slurm.c). sched_run.c asks here for the one a spec names.
 */
#include "sched_int.h"

#include <string.h>

static const sched_launcher_t launchers[] = {
    {"local", sched_mpi_local_argv, NULL},
    {"hostfile", sched_mpi_hostfile_argv, NULL},
    {"slurm", sched_slurm_argv, sched_slurm_follow},
};

const sched_launcher_t *sched_launcher_for(job_launcher_t which)
{
    const char *name = job_launcher_name(which);
    for (size_t i = 0; i < sizeof launchers / sizeof launchers[0]; i++)
        if (strcmp(launchers[i].name, name) == 0)
            return &launchers[i];
    kiln_errf(KILN_EINVAL, "launcher %s is not available in this build", name);
    return NULL;
}
