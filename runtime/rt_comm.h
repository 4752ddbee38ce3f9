/*
 * runtime/rt_comm.h - the trainer's three collectives behind one small
 * interface, so that kiln-train runs the same step on MPI (CPU build, host
 * buffers) or on NCCL (CUDA build, device buffers):
 *
 *   rt_comm_alltoallv()         bytes, per-rank counts and displacements
 *                               (the key, row and gradient exchanges)
 *   rt_comm_allreduce_sum_f64() in place, float64 (the dense gradients)
 *   rt_comm_bcast()             bytes from one rank (dense parameters)
 *
 * Backends, one per file (comm_mpi.c, comm_nccl.cu):
 *
 *   RT_COMM_MPI   buffers are HOST memory. Every call is blocking: when it
 *                 returns, the result is in place.
 *   RT_COMM_NCCL  buffers are DEVICE memory of the GPU the communicator is
 *                 bound to (rt_comm_device). Calls are enqueued on the
 *                 communicator's own stream (rt_comm_stream) and return
 *                 before the data has moved: call rt_comm_sync() before the
 *                 host reads a result, or make another stream wait on
 *                 rt_comm_stream(). The all-to-all-v is one group of
 *                 ncclSend/ncclRecv; the allreduce is ncclAllReduce with
 *                 ncclDouble. Only in a build with CUDA (KILN_HAVE_CUDA).
 *
 * Counts and displacements are always HOST arrays of nranks entries, in
 * bytes. Every call is collective over the communicator given to
 * rt_comm_create: all ranks call it, in the same order, with matching counts.
 * Errors come back as KILN_EMPI (MPI) or KILN_ECUDA (CUDA, NCCL), with a
 * message that says what failed and what to try.
 */
#ifndef KILN_RUNTIME_RT_COMM_H
#define KILN_RUNTIME_RT_COMM_H

#include <mpi.h>
#include <stddef.h>

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { RT_COMM_MPI = 0, RT_COMM_NCCL = 1 } rt_comm_kind_t;

typedef struct rt_comm rt_comm_t;

/* Returns "mpi" or "nccl" (or "?"). */
const char *rt_comm_kind_name(rt_comm_kind_t kind);

/* Creates a communicator of the given kind over the ranks of comm
 * (duplicated, so its messages never mix with the caller's; the duplicate
 * returns MPI errors instead of aborting). Collective over comm.
 *
 * RT_COMM_NCCL also binds the calling thread to GPU (local rank on this host)
 * with cudaSetDevice, so each rank of a host gets its own GPU, makes the
 * ncclUniqueId on rank 0 and shares it with MPI_Bcast, creates the NCCL
 * communicator and one non-blocking stream. Every rank agrees on the outcome
 * (a failure on one rank makes every rank return an error, none hangs).
 *
 * Returns 0, KILN_EINVAL (unknown kind; NCCL in a build without CUDA; more
 * ranks on a host than GPUs), KILN_ENODEV (NCCL and no GPU visible),
 * KILN_EMPI, KILN_ECUDA or KILN_ENOMEM. Free with rt_comm_destroy. */
int rt_comm_create(rt_comm_kind_t kind, MPI_Comm comm, rt_comm_t **out /* OUT */);

/* Waits for outstanding work, frees the NCCL communicator and stream and
 * the duplicated MPI communicator. Collective (every rank destroys its
 * communicator); accepts NULL. */
void rt_comm_destroy(rt_comm_t *c);

rt_comm_kind_t rt_comm_kind(const rt_comm_t *c);
int rt_comm_rank(const rt_comm_t *c);
int rt_comm_size(const rt_comm_t *c);
/* The CUDA device ordinal this rank is bound to (NCCL), or -1 (MPI). */
int rt_comm_device(const rt_comm_t *c);
/* The cudaStream_t the NCCL calls run on, or NULL (MPI). */
void *rt_comm_stream(const rt_comm_t *c);

/* All-to-all-v of bytes. This rank sends sendcounts[r] bytes starting at
 * sendbuf + sdispls[r] to rank r, and receives recvcounts[r] bytes from rank
 * r at recvbuf + rdispls[r]; counts may be 0 (then the buffers may be NULL
 * when all of a side's counts are 0). sendcounts[r] on this rank must equal
 * recvcounts[this rank] on rank r. Send and receive regions must not overlap.
 * Returns 0, KILN_EINVAL (NULL arrays), KILN_ERANGE (MPI: a count or
 * displacement above INT_MAX bytes), KILN_EMPI or KILN_ECUDA. */
int rt_comm_alltoallv(rt_comm_t *c, const void *sendbuf, const size_t *sendcounts /* (nranks) */,
                      const size_t *sdispls /* (nranks) */, void *recvbuf,
                      const size_t *recvcounts /* (nranks) */,
                      const size_t *rdispls /* (nranks) */);

/* buf (count doubles) becomes the element-wise sum of every rank's buf.
 * Returns 0, KILN_EINVAL, KILN_EMPI or KILN_ECUDA. */
int rt_comm_allreduce_sum_f64(rt_comm_t *c, double *buf /* IN/OUT (count) */, size_t count);

/* Copies bytes bytes of root's buf into every rank's buf. Returns 0,
 * KILN_EINVAL (root out of range), KILN_EMPI or KILN_ECUDA. */
int rt_comm_bcast(rt_comm_t *c, void *buf /* IN on root, OUT elsewhere */, size_t bytes, int root);

/* Waits until the calls made so far have finished on this rank (NCCL: the
 * stream is drained and the communicator's asynchronous error is checked;
 * MPI: returns 0 at once). Returns 0 or KILN_ECUDA. */
int rt_comm_sync(rt_comm_t *c);

/* ---- implementation (only runtime/comm_*.c and comm_*.cu use what follows) ---- */
#ifdef RT_COMM_IMPL

typedef struct rt_comm_nccl rt_comm_nccl_t;

struct rt_comm {
    rt_comm_kind_t kind;
    MPI_Comm comm; /* our duplicate */
    int rank, size;
    int *iarg; /* MPI: (4, size) int counts and displacements */
    rt_comm_nccl_t *nccl;
};

#ifdef KILN_HAVE_CUDA
/* comm_nccl.cu (library kiln_runtime_cuda): the NCCL backend. c->comm,
 * rank and size are set before rt_comm_nccl_create. */
int rt_comm_nccl_create(rt_comm_t *c, rt_comm_nccl_t **out /* OUT */);
void rt_comm_nccl_destroy(rt_comm_nccl_t *n);
int rt_comm_nccl_device(const rt_comm_nccl_t *n);
void *rt_comm_nccl_stream(const rt_comm_nccl_t *n);
int rt_comm_nccl_alltoallv(rt_comm_t *c, const void *sendbuf, const size_t *sendcounts,
                           const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                           const size_t *rdispls);
int rt_comm_nccl_allreduce_sum_f64(rt_comm_t *c, double *buf, size_t count);
int rt_comm_nccl_bcast(rt_comm_t *c, void *buf, size_t bytes, int root);
int rt_comm_nccl_sync(rt_comm_t *c);
#endif

#endif /* RT_COMM_IMPL */

#ifdef __cplusplus
}
#endif

#endif /* KILN_RUNTIME_RT_COMM_H */
