/*
 * runtime/rt_mpi.h - the MPI error handling runtime/ shares (shard.c,
 * comm_mpi.c, comm_nccl.cu): a failed MPI call becomes KILN_EMPI with MPI's
 * own message and a hint, rt_mpi_agree makes every rank take the same
 * branch after a step that may have failed on some of them, and
 * rt_mpi_local_rank says where a rank stands on its host. Header-only, so
 * that kiln_runtime_cuda needs nothing from the libraries that link it.
 */
#ifndef KILN_RUNTIME_RT_MPI_H
#define KILN_RUNTIME_RT_MPI_H

#include <mpi.h>
#include <stdio.h>

#include "kiln.h"

/* Returns KILN_EMPI with "<what> failed: <MPI's message>" and what to check. */
static inline int rt_mpi_fail(int err, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", err);
    return kiln_errf(KILN_EMPI,
                     "%s failed: %s (a rank may have died or the network failed; the "
                     "mpirun output names the rank and host)",
                     what, msg);
}

/* Returns from the enclosing function when call fails. */
#define RT_MPI_CHECK(call, what)                                                           \
    do {                                                                                   \
        int rt_mpi_rc_ = (call);                                                           \
        if (rt_mpi_rc_ != MPI_SUCCESS)                                                     \
            return rt_mpi_fail(rt_mpi_rc_, what);                                          \
    } while (0)

/* Returns the smallest (worst) rc over the ranks of comm, so that every rank
 * takes the same branch; a rank that was fine gets "<step> failed on another
 * rank". KILN_EMPI when the agreement itself fails. Collective. */
static inline int rt_mpi_agree(MPI_Comm comm, int rc, const char *step)
{
    int worst = rc;
    int mrc = MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MIN, comm);
    if (mrc != MPI_SUCCESS)
        return rt_mpi_fail(mrc, "MPI_Allreduce of the ranks' status");
    if (worst < 0 && rc == 0)
        return kiln_errf(worst, "%s failed on another rank (%s); see its log", step,
                         kiln_errname(worst));
    return worst;
}

/* This rank's index among the ranks of comm on its host, and how many
 * there are. Collective over comm. 0 or KILN_EMPI. */
static inline int rt_mpi_local_rank(MPI_Comm comm, int *lrank, int *lsize)
{
    MPI_Comm local;
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    int mrc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
    if (mrc != MPI_SUCCESS)
        return rt_mpi_fail(mrc, "MPI_Comm_split_type (ranks per host)");
    MPI_Comm_rank(local, lrank);
    MPI_Comm_size(local, lsize);
    MPI_Comm_free(&local);
    return 0;
}

#endif /* KILN_RUNTIME_RT_MPI_H */
