/*
 * shard/comm.c - shard_comm's front door and its MPI backend.
 *
 * shard_comm_create duplicates the caller's communicator, and every shard_comm_*
 * call dispatches on the kind: SHARD_COMM_MPI runs here on host buffers,
 * SHARD_COMM_NCCL goes to comm_nccl.cu (compiled only with KILN_HAVE_CUDA; a
 * build without CUDA refuses the kind with a message that says how to get
 * it). The MPI backend is a thin layer over MPI_Alltoall(v), MPI_Allreduce
 * and MPI_Bcast on MPI_BYTE / MPI_DOUBLE / a double-double pair type with
 * its own op; MPI's counts are int, so sizes are checked before the call,
 * and the allreduces and broadcast run in chunks when a buffer holds more
 * than INT_MAX elements.
 */
#include "shard_int.h"
#include "kern_ops.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Elements per MPI call for the chunked allreduce / broadcast. */
#define CHUNK ((size_t)1 << 30)

/* MPI's op on double-double pairs stored interleaved (hi, lo): adds in to
 * inout pair by pair (kern_dd_add_dd), so the sum does not depend on the
 * order MPI combines the ranks in beyond the pair's 106 bits. */
static void dd_sum_op(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    const double *a = in;
    double *b = inout;
    for (int i = 0; i < *len; i++)
        kern_dd_add_dd(&b[2 * i], &b[2 * i + 1], a[2 * i], a[2 * i + 1]);
}

/* The datatype of one pair (two MPI_DOUBLEs) and the op that adds pairs.
 * Returns 0 or KILN_EMPI. */
static int dd_init(shard_comm_t *c)
{
    if (MPI_Type_contiguous(2, MPI_DOUBLE, &c->dd_type) != MPI_SUCCESS) {
        c->dd_type = MPI_DATATYPE_NULL;
        return kiln_errf(KILN_EMPI, "cannot create the MPI type of double-double sums");
    }
    if (MPI_Type_commit(&c->dd_type) != MPI_SUCCESS ||
        MPI_Op_create(dd_sum_op, 1, &c->dd_op) != MPI_SUCCESS)
        return kiln_errf(KILN_EMPI, "cannot create the MPI type and op of double-double sums");
    return 0;
}

const char *shard_comm_kind_name(shard_comm_kind_t kind)
{
    static const char *const names[] = {[SHARD_COMM_MPI] = "mpi", [SHARD_COMM_NCCL] = "nccl"};
    return (unsigned)kind < sizeof names / sizeof names[0] ? names[kind] : "?";
}

int shard_comm_create(shard_comm_kind_t kind, MPI_Comm comm, shard_comm_t **out)
{
    if (out == NULL)
        return kiln_errf(KILN_EINVAL, "shard_comm_create: out is NULL");
    *out = NULL;
    if (kind != SHARD_COMM_MPI && kind != SHARD_COMM_NCCL)
        return kiln_errf(KILN_EINVAL, "shard_comm_create: unknown comm kind %d", (int)kind);
#ifndef KILN_HAVE_CUDA
    if (kind == SHARD_COMM_NCCL)
        return kiln_errf(KILN_EINVAL,
                         "comm: nccl needs a kiln-train built with CUDA; rebuild with "
                         "-DKILN_CUDA=ON on a host with nvcc and NCCL, or set device: cpu");
#endif
    int rc = 0;
    shard_comm_t *c = kiln_calloc(1, sizeof *c);
    if (c == NULL)
        return KILN_ENOMEM;
    c->kind = kind;
    c->comm = MPI_COMM_NULL;
    c->dd_type = MPI_DATATYPE_NULL;
    c->dd_op = MPI_OP_NULL;
    int mrc = MPI_Comm_dup(comm, &c->comm);
    if (mrc != MPI_SUCCESS) {
        c->comm = MPI_COMM_NULL;
        rc = shard_mpi_fail(mrc, "MPI_Comm_dup of the trainer's communicator");
        goto out;
    }
    if ((mrc = MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN)) != MPI_SUCCESS ||
        (mrc = MPI_Comm_rank(c->comm, &c->rank)) != MPI_SUCCESS ||
        (mrc = MPI_Comm_size(c->comm, &c->size)) != MPI_SUCCESS) {
        rc = shard_mpi_fail(mrc, "MPI_Comm_rank / MPI_Comm_size of the duplicate");
        goto out;
    }
    c->iarg = kiln_calloc((size_t)4 * (size_t)c->size, sizeof *c->iarg);
    c->zarg = kiln_calloc((size_t)4 * (size_t)c->size, sizeof *c->zarg);
    rc = c->iarg && c->zarg ? dd_init(c) : KILN_ENOMEM;
    KILN_CHECK_GOTO(shard_mpi_agree(c->comm, rc, "shard_comm_create"), rc, out);
#ifdef KILN_HAVE_CUDA
    if (kind == SHARD_COMM_NCCL)
        KILN_CHECK_GOTO(shard_comm_nccl_create(c, &c->nccl), rc, out);
#endif
    *out = c;
    c = NULL;
out:
    shard_comm_destroy(c);
    return rc;
}

void shard_comm_destroy(shard_comm_t *c)
{
    if (c == NULL)
        return;
#ifdef KILN_HAVE_CUDA
    shard_comm_nccl_destroy(c->nccl);
#endif
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
        if (c->dd_op != MPI_OP_NULL)
            MPI_Op_free(&c->dd_op);
        if (c->dd_type != MPI_DATATYPE_NULL)
            MPI_Type_free(&c->dd_type);
        if (c->comm != MPI_COMM_NULL)
            MPI_Comm_free(&c->comm);
    }
    free(c->iarg);
    free(c->zarg);
    free(c);
}

shard_comm_info_t shard_comm_info(const shard_comm_t *c)
{
    shard_comm_info_t i = {.kind = c->kind, .rank = c->rank, .size = c->size, .device = -1};
#ifdef KILN_HAVE_CUDA
    if (c->kind == SHARD_COMM_NCCL)
        i.device = shard_comm_nccl_device(c->nccl);
#endif
    return i;
}

void *shard_comm_stream(const shard_comm_t *c)
{
#ifdef KILN_HAVE_CUDA
    if (c->kind == SHARD_COMM_NCCL)
        return shard_comm_nccl_stream(c->nccl);
#endif
    (void)c;
    return NULL;
}

/* Converts nranks byte counts and displacements to MPI's int, or returns
 * KILN_ERANGE naming the first that does not fit. */
static int to_int(const shard_comm_t *c, const size_t *cnt, const size_t *dsp, int *icnt, int *idsp,
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

int shard_comm_alltoallv(shard_comm_t *c, const void *sendbuf, const size_t *sendcounts,
                      const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                      const size_t *rdispls)
{
    if (c == NULL || sendcounts == NULL || sdispls == NULL || recvcounts == NULL || rdispls == NULL)
        return kiln_errf(KILN_EINVAL, "shard_comm_alltoallv: NULL communicator or count arrays");
#ifdef KILN_HAVE_CUDA
    if (c->kind == SHARD_COMM_NCCL)
        return shard_comm_nccl_alltoallv(c, sendbuf, sendcounts, sdispls, recvbuf, recvcounts,
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
    KILN_CHECK(shard_mpi_agree(c->comm, rc, "a collective"));
    SHARD_MPI_CHECK(MPI_Alltoallv(sendbuf, sc, sd, MPI_BYTE, recvbuf, rcn, rd, MPI_BYTE, c->comm),
              "MPI_Alltoallv");
    return 0;
}

int shard_comm_alltoall(shard_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes)
{
    if (c == NULL || ((sendbuf == NULL || recvbuf == NULL) && bytes > 0))
        return kiln_errf(KILN_EINVAL, "shard_comm_alltoall: NULL communicator or buffer");
    if (c->kind == SHARD_COMM_NCCL) {
        /* NCCL has no plain all-to-all: the same exchange with equal counts. */
        size_t *cnt = c->zarg, *dsp = cnt + c->size;
        for (int r = 0; r < c->size; r++) {
            cnt[r] = bytes;
            dsp[r] = (size_t)r * bytes;
        }
        return shard_comm_alltoallv(c, sendbuf, cnt, dsp, recvbuf, cnt, dsp);
    }
    if (bytes > (size_t)INT_MAX)
        return kiln_errf(KILN_ERANGE, "comm: %zu bytes per rank is past MPI's INT_MAX-byte limit",
                         bytes);
    SHARD_MPI_CHECK(MPI_Alltoall(sendbuf, (int)bytes, MPI_BYTE, recvbuf, (int)bytes, MPI_BYTE,
                              c->comm),
                 "MPI_Alltoall");
    return 0;
}

/* The two in-place sums over the ranks: count elements of `width` doubles,
 * float64 (dd false) or double-double pairs (dd true). MPI goes in chunks
 * of at most CHUNK elements (its counts are int). */
static int allreduce(shard_comm_t *c, double *buf, size_t count, bool dd)
{
    if (c == NULL || (buf == NULL && count > 0))
        return kiln_errf(KILN_EINVAL, "shard_comm_allreduce_sum_%s: NULL communicator or buffer",
                         dd ? "dd" : "f64");
    if (count == 0)
        return 0; /* nothing to move, on either backend */
#ifdef KILN_HAVE_CUDA
    if (c->kind == SHARD_COMM_NCCL)
        return dd ? shard_comm_nccl_allreduce_sum_dd(c, buf, count)
                  : shard_comm_nccl_allreduce_sum_f64(c, buf, count);
#endif
    const size_t width = dd ? 2 : 1;
    for (size_t off = 0; off < count; off += CHUNK) {
        const size_t k = count - off < CHUNK ? count - off : CHUNK;
        SHARD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf + width * off, (int)k,
                                   dd ? c->dd_type : MPI_DOUBLE, dd ? c->dd_op : MPI_SUM, c->comm),
                     dd ? "MPI_Allreduce of double-double sums" : "MPI_Allreduce of float64 sums");
    }
    return 0;
}

int shard_comm_allreduce_sum_dd(shard_comm_t *c, double *pairs, size_t npairs)
{
    return allreduce(c, pairs, npairs, true);
}

int shard_comm_allreduce_sum_f64(shard_comm_t *c, double *buf, size_t count)
{
    return allreduce(c, buf, count, false);
}

int shard_comm_agree(shard_comm_t *c, int rc, const char *step)
{
    return shard_mpi_agree(c->comm, rc, step);
}

int shard_comm_bcast(shard_comm_t *c, void *buf, size_t bytes, int root)
{
    if (c == NULL || (buf == NULL && bytes > 0))
        return kiln_errf(KILN_EINVAL, "shard_comm_bcast: NULL communicator or buffer");
    if (root < 0 || root >= c->size)
        return kiln_errf(KILN_EINVAL, "shard_comm_bcast: root %d is not a rank (0..%d)", root,
                         c->size - 1);
    if (bytes == 0)
        return 0; /* nothing to move, on either backend */
#ifdef KILN_HAVE_CUDA
    if (c->kind == SHARD_COMM_NCCL)
        return shard_comm_nccl_bcast(c, buf, bytes, root);
#endif
    for (size_t off = 0; off < bytes; off += CHUNK) {
        const size_t k = bytes - off < CHUNK ? bytes - off : CHUNK;
        SHARD_MPI_CHECK(MPI_Bcast((char *)buf + off, (int)k, MPI_BYTE, root, c->comm), "MPI_Bcast");
    }
    return 0;
}

int shard_comm_sync(shard_comm_t *c)
{
    if (c == NULL)
        return kiln_errf(KILN_EINVAL, "shard_comm_sync: NULL communicator");
#ifdef KILN_HAVE_CUDA
    if (c->kind == SHARD_COMM_NCCL)
        return shard_comm_nccl_sync(c);
#endif
    return 0;
}
