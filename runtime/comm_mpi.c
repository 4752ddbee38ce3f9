/*
 * runtime/comm_mpi.c - rt_comm's front door and its MPI backend.
 *
 * rt_comm_create duplicates the caller's communicator, and every rt_comm_*
 * call dispatches on the kind: RT_COMM_MPI runs here on host buffers,
 * RT_COMM_NCCL goes to comm_nccl.cu (compiled only with KILN_HAVE_CUDA; a
 * build without CUDA refuses the kind with a message that says how to get
 * it). The MPI backend is a thin layer over MPI_Alltoallv, MPI_Allreduce
 * and MPI_Bcast on MPI_BYTE / MPI_DOUBLE; MPI's counts are int, so sizes
 * are checked before the call, and the allreduce and broadcast run in
 * chunks when a buffer holds more than INT_MAX elements.
 */
#define RT_COMM_IMPL
#include "rt_comm.h"
#include "rt_mpi.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Elements per MPI call for the chunked allreduce / broadcast. */
#define CHUNK ((size_t)1 << 30)

const char *rt_comm_kind_name(rt_comm_kind_t kind)
{
    switch (kind) {
    case RT_COMM_MPI:
        return "mpi";
    case RT_COMM_NCCL:
        return "nccl";
    }
    return "?";
}

int rt_comm_create(rt_comm_kind_t kind, MPI_Comm comm, rt_comm_t **out)
{
    if (out == NULL)
        return kiln_errf(KILN_EINVAL, "rt_comm_create: out is NULL");
    *out = NULL;
    if (kind != RT_COMM_MPI && kind != RT_COMM_NCCL)
        return kiln_errf(KILN_EINVAL, "rt_comm_create: unknown comm kind %d", (int)kind);
#ifndef KILN_HAVE_CUDA
    if (kind == RT_COMM_NCCL)
        return kiln_errf(KILN_EINVAL,
                         "comm: nccl needs a kiln-train built with CUDA; rebuild with "
                         "-DKILN_CUDA=ON on a host with nvcc and NCCL, or set device: cpu");
#endif
    int rc = 0;
    rt_comm_t *c = kiln_calloc(1, sizeof *c);
    if (c == NULL)
        return KILN_ENOMEM;
    c->kind = kind;
    c->comm = MPI_COMM_NULL;
    int mrc = MPI_Comm_dup(comm, &c->comm);
    if (mrc != MPI_SUCCESS) {
        c->comm = MPI_COMM_NULL;
        rc = rt_mpi_fail(mrc, "MPI_Comm_dup of the trainer's communicator");
        goto out;
    }
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->size);
    c->iarg = kiln_calloc((size_t)4 * (size_t)c->size, sizeof *c->iarg);
    KILN_CHECK_GOTO(rt_mpi_agree(c->comm, c->iarg ? 0 : KILN_ENOMEM, "rt_comm_create"), rc, out);
#ifdef KILN_HAVE_CUDA
    if (kind == RT_COMM_NCCL)
        KILN_CHECK_GOTO(rt_comm_nccl_create(c, &c->nccl), rc, out);
#endif
    *out = c;
    c = NULL;
out:
    rt_comm_destroy(c);
    return rc;
}

void rt_comm_destroy(rt_comm_t *c)
{
    if (c == NULL)
        return;
#ifdef KILN_HAVE_CUDA
    rt_comm_nccl_destroy(c->nccl);
#endif
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (c->comm != MPI_COMM_NULL && !finalized)
        MPI_Comm_free(&c->comm);
    free(c->iarg);
    free(c);
}

rt_comm_kind_t rt_comm_kind(const rt_comm_t *c)
{
    return c->kind;
}

int rt_comm_rank(const rt_comm_t *c)
{
    return c->rank;
}

int rt_comm_size(const rt_comm_t *c)
{
    return c->size;
}

int rt_comm_device(const rt_comm_t *c)
{
#ifdef KILN_HAVE_CUDA
    if (c->kind == RT_COMM_NCCL)
        return rt_comm_nccl_device(c->nccl);
#endif
    (void)c;
    return -1;
}

void *rt_comm_stream(const rt_comm_t *c)
{
#ifdef KILN_HAVE_CUDA
    if (c->kind == RT_COMM_NCCL)
        return rt_comm_nccl_stream(c->nccl);
#endif
    (void)c;
    return NULL;
}

/* Converts nranks byte counts and displacements to MPI's int, or returns
 * KILN_ERANGE naming the first that does not fit. */
static int to_int(const rt_comm_t *c, const size_t *cnt, const size_t *dsp, int *icnt, int *idsp,
                  const char *side)
{
    for (int r = 0; r < c->size; r++) {
        if (cnt[r] > (size_t)INT_MAX || dsp[r] > (size_t)INT_MAX)
            return kiln_errf(KILN_ERANGE,
                             "comm: %s %zu bytes at offset %zu for rank %d is past MPI's "
                             "INT_MAX-byte limit; use a smaller batch_size or more ranks",
                             side, cnt[r], dsp[r], r);
        icnt[r] = (int)cnt[r];
        idsp[r] = (int)dsp[r];
    }
    return 0;
}

int rt_comm_alltoallv(rt_comm_t *c, const void *sendbuf, const size_t *sendcounts,
                      const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                      const size_t *rdispls)
{
    if (c == NULL || sendcounts == NULL || sdispls == NULL || recvcounts == NULL || rdispls == NULL)
        return kiln_errf(KILN_EINVAL, "rt_comm_alltoallv: NULL communicator or count arrays");
#ifdef KILN_HAVE_CUDA
    if (c->kind == RT_COMM_NCCL)
        return rt_comm_nccl_alltoallv(c, sendbuf, sendcounts, sdispls, recvbuf, recvcounts,
                                      rdispls);
#endif
    const int n = c->size;
    int *sc = c->iarg, *sd = sc + n, *rcn = sd + n, *rd = rcn + n;
    int rc = to_int(c, sendcounts, sdispls, sc, sd, "sending");
    if (rc == 0)
        rc = to_int(c, recvcounts, rdispls, rcn, rd, "receiving");
    /* A rank whose sizes do not fit must not leave the others waiting in
     * MPI_Alltoallv: the ranks agree first (one int, cheap next to the
     * exchange). */
    KILN_CHECK(rt_mpi_agree(c->comm, rc, "a collective"));
    RT_MPI_CHECK(MPI_Alltoallv(sendbuf, sc, sd, MPI_BYTE, recvbuf, rcn, rd, MPI_BYTE, c->comm),
              "MPI_Alltoallv");
    return 0;
}

int rt_comm_allreduce_sum_f64(rt_comm_t *c, double *buf, size_t count)
{
    if (c == NULL || (buf == NULL && count > 0))
        return kiln_errf(KILN_EINVAL, "rt_comm_allreduce_sum_f64: NULL communicator or buffer");
#ifdef KILN_HAVE_CUDA
    if (c->kind == RT_COMM_NCCL)
        return rt_comm_nccl_allreduce_sum_f64(c, buf, count);
#endif
    for (size_t off = 0; off < count; off += CHUNK) {
        const size_t k = count - off < CHUNK ? count - off : CHUNK;
        RT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf + off, (int)k, MPI_DOUBLE, MPI_SUM, c->comm),
                  "MPI_Allreduce of float64 sums");
    }
    return 0;
}

int rt_comm_bcast(rt_comm_t *c, void *buf, size_t bytes, int root)
{
    if (c == NULL || (buf == NULL && bytes > 0))
        return kiln_errf(KILN_EINVAL, "rt_comm_bcast: NULL communicator or buffer");
    if (root < 0 || root >= c->size)
        return kiln_errf(KILN_EINVAL, "rt_comm_bcast: root %d is not a rank (0..%d)", root,
                         c->size - 1);
#ifdef KILN_HAVE_CUDA
    if (c->kind == RT_COMM_NCCL)
        return rt_comm_nccl_bcast(c, buf, bytes, root);
#endif
    for (size_t off = 0; off < bytes; off += CHUNK) {
        const size_t k = bytes - off < CHUNK ? bytes - off : CHUNK;
        RT_MPI_CHECK(MPI_Bcast((char *)buf + off, (int)k, MPI_BYTE, root, c->comm), "MPI_Bcast");
    }
    return 0;
}

int rt_comm_sync(rt_comm_t *c)
{
    if (c == NULL)
        return kiln_errf(KILN_EINVAL, "rt_comm_sync: NULL communicator");
#ifdef KILN_HAVE_CUDA
    if (c->kind == RT_COMM_NCCL)
        return rt_comm_nccl_sync(c);
#endif
    return 0;
}
