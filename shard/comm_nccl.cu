/*
 * shard/comm_nccl.cu - shard_comm's NCCL backend (shard.h): the trainer's
 * collectives on device buffers, enqueued on one non-blocking stream per
 * communicator.
 *
 * Setup: each rank binds to GPU (its rank among the ranks of its host), rank
 * 0 makes the ncclUniqueId and MPI_Bcast shares it, then every rank joins
 * with ncclCommInitRank. The ranks agree on the local setup's outcome before
 * NCCL's own (blocking) bootstrap starts, so a rank without a GPU makes all
 * ranks fail instead of leaving the others waiting.
 *
 * The all-to-all-v is one ncclGroupStart/End around an ncclSend and an
 * ncclRecv per peer with a nonzero count (the rank itself included: NCCL
 * copies that part locally), bytes as ncclInt8. The allreduce is
 * ncclAllReduce(ncclDouble, ncclSum) in place; the broadcast ncclBroadcast
 * in place.
 *
 * The double-double allreduce (the dense gradients) cannot use NCCL's sum,
 * which would add the hi and lo words separately and lose what the pairs
 * carry. It is an ncclAllGather of every rank's pairs into a scratch buffer
 * (ranks x pairs, kept by the communicator and grown when needed) and a
 * kernel that adds them pair by pair in rank order with kern_dd_add_dd: the
 * same sum on every rank and every run. It moves ranks x the bytes of a
 * ring allreduce, which is nothing next to the exchange for the dense
 * models Kiln trains (at most a few hundred thousand parameters).
 */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include "kern_ops.h"
#include "kiln_cuda.h"
#include "shard_int.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct shard_comm_nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    int device;
    double *d_gather;  /* (size, gather_cap, 2) the double-double allreduce's scratch */
    size_t gather_cap; /* pairs per rank it has room for */
};

static int nccl_fail(ncclResult_t r, ncclComm_t comm, const char *what, const char *where)
{
    const char *last = ncclGetLastError(comm);
    return kiln_errf(KILN_ECUDA,
                     "%s failed: %s%s%s (%s); rerun with NCCL_DEBUG=WARN for NCCL's account "
                     "(a peer rank may have died, or the GPUs cannot reach each other)",
                     what, ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "",
                     where);
}

#define NCCL_CHECK(call, comm, what)                                                               \
    do {                                                                                           \
        ncclResult_t nccl_rc_ = (call);                                                            \
        if (nccl_rc_ != ncclSuccess)                                                               \
            return nccl_fail(nccl_rc_, (comm), (what), KILN_WHERE);                                \
    } while (0)

/* Binds this rank to its GPU and makes the stream; local, no collective. */
static int bind_device(shard_comm_t *c, shard_comm_nccl_t *n, int lrank, int lsize)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess) {
        (void)cudaGetLastError();
        ndev = 0;
    }
    if (ndev == 0)
        return kiln_errf(KILN_ENODEV,
                         "comm: nccl on rank %d: no CUDA device visible; check the driver "
                         "(nvidia-smi) and CUDA_VISIBLE_DEVICES, or set device: cpu",
                         c->rank);
    if (lsize > ndev)
        return kiln_errf(KILN_EINVAL,
                         "comm: nccl: %d ranks share this host but only %d GPU(s) are visible, "
                         "and NCCL needs one GPU per rank; start at most %d ranks per host "
                         "(mpirun --map-by ppr:%d:node) or set device: cpu",
                         lsize, ndev, ndev, ndev);
    n->device = lrank;
    CUDA_CHECK(cudaSetDevice(n->device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking));
    return 0;
}

extern "C" int shard_comm_nccl_create(shard_comm_t *c, shard_comm_nccl_t **out)
{
    *out = NULL;
    int rc = 0, lrank = 0, lsize = 1;
    struct {
        int rc;
        ncclUniqueId id;
    } msg;
    KILN_CHECK(shard_mpi_local_rank(c->comm, &lrank, &lsize));
    shard_comm_nccl_t *n = (shard_comm_nccl_t *)kiln_calloc(1, sizeof *n);
    if (n == NULL)
        rc = KILN_ENOMEM;
    else
        rc = bind_device(c, n, lrank, lsize);
    KILN_CHECK_GOTO(shard_mpi_agree(c->comm, rc, "NCCL setup"), rc, out);

    memset(&msg, 0, sizeof msg);
    if (c->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&msg.id);
        if (r != ncclSuccess)
            msg.rc = nccl_fail(r, NULL, "ncclGetUniqueId on rank 0", KILN_WHERE);
    }
    {
        int mrc = MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, 0, c->comm);
        if (mrc != MPI_SUCCESS) {
            rc = shard_mpi_fail(mrc, "MPI_Bcast of the NCCL unique id");
            goto out;
        }
    }
    if (msg.rc < 0) {
        rc = c->rank == 0 ? msg.rc
                          : kiln_errf(KILN_ECUDA, "rank 0 could not make the NCCL unique id; "
                                                  "see its log");
        goto out;
    }
    {
        ncclResult_t r = ncclCommInitRank(&n->comm, c->size, msg.id, c->rank);
        if (r != ncclSuccess) {
            n->comm = NULL;
            rc = nccl_fail(r, NULL, "ncclCommInitRank", KILN_WHERE);
        }
    }
    KILN_CHECK_GOTO(shard_mpi_agree(c->comm, rc, "NCCL setup"), rc, out);
    *out = n;
    n = NULL;
out:
    shard_comm_nccl_destroy(n);
    return rc;
}

extern "C" void shard_comm_nccl_destroy(shard_comm_nccl_t *n)
{
    if (n == NULL)
        return;
    if (n->stream != NULL)
        (void)cudaStreamSynchronize(n->stream);
    if (n->comm != NULL)
        (void)ncclCommDestroy(n->comm);
    if (n->d_gather != NULL)
        (void)cudaFree(n->d_gather);
    if (n->stream != NULL)
        (void)cudaStreamDestroy(n->stream);
    free(n);
}

extern "C" int shard_comm_nccl_device(const shard_comm_nccl_t *n)
{
    return n->device;
}

extern "C" void *shard_comm_nccl_stream(const shard_comm_nccl_t *n)
{
    return (void *)n->stream;
}

extern "C" int shard_comm_nccl_alltoallv(shard_comm_t *c, const void *sendbuf, const size_t *sendcounts,
                                      const size_t *sdispls, void *recvbuf,
                                      const size_t *recvcounts, const size_t *rdispls)
{
    shard_comm_nccl_t *n = c->nccl;
    const char *sb = (const char *)sendbuf;
    char *rb = (char *)recvbuf;
    ncclResult_t first = ncclSuccess;
    NCCL_CHECK(ncclGroupStart(), n->comm, "ncclGroupStart (all-to-all-v)");
    /* Every send and receive is posted even after a failure, and the group
     * is always closed, so NCCL's group state is never left open. */
    for (int r = 0; r < c->size; r++) {
        ncclResult_t e = ncclSuccess;
        if (sendcounts[r] > 0)
            e = ncclSend(sb + sdispls[r], sendcounts[r], ncclInt8, r, n->comm, n->stream);
        if (first == ncclSuccess)
            first = e;
        e = ncclSuccess;
        if (recvcounts[r] > 0)
            e = ncclRecv(rb + rdispls[r], recvcounts[r], ncclInt8, r, n->comm, n->stream);
        if (first == ncclSuccess)
            first = e;
    }
    ncclResult_t end = ncclGroupEnd();
    NCCL_CHECK(first, n->comm, "ncclSend/ncclRecv (all-to-all-v)");
    NCCL_CHECK(end, n->comm, "ncclGroupEnd (all-to-all-v)");
    return 0;
}

extern "C" int shard_comm_nccl_allreduce_sum_f64(shard_comm_t *c, double *buf, size_t count)
{
    shard_comm_nccl_t *n = c->nccl;
    NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclDouble, ncclSum, n->comm, n->stream), n->comm,
               "ncclAllReduce of float64 sums");
    return 0;
}

/* grid-stride over pairs: pairs[i] = the double-double sum of gathered[r][i]
 * over r = 0 .. nranks-1, in that order. gathered is (nranks, npairs, 2). */
static __global__ void dd_sum_ranks_kernel(const double *gathered, size_t npairs, int nranks,
                                           double *pairs)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < npairs; i += stride) {
        double hi = gathered[2 * i], lo = gathered[2 * i + 1];
        for (int r = 1; r < nranks; r++) {
            const double *g = gathered + (size_t)r * 2 * npairs + 2 * i;
            kern_dd_add_dd(&hi, &lo, g[0], g[1]);
        }
        pairs[2 * i] = hi;
        pairs[2 * i + 1] = lo;
    }
}

extern "C" int shard_comm_nccl_allreduce_sum_dd(shard_comm_t *c, double *pairs, size_t npairs)
{
    shard_comm_nccl_t *n = c->nccl;
    if (npairs > n->gather_cap) {
        /* Grows to the new size; the stream's earlier work may still read
         * the old buffer, so wait for it first. */
        CUDA_CHECK(cudaStreamSynchronize(n->stream));
        if (n->d_gather != NULL)
            CUDA_CHECK(cudaFree(n->d_gather));
        n->d_gather = NULL;
        n->gather_cap = 0;
        CUDA_CHECK(
            cudaMalloc((void **)&n->d_gather, sizeof(double) * 2 * npairs * (size_t)c->size));
        n->gather_cap = npairs;
    }
    NCCL_CHECK(ncclAllGather(pairs, n->d_gather, 2 * npairs, ncclDouble, n->comm, n->stream),
               n->comm, "ncclAllGather of double-double sums");
    const unsigned threads = 256;
    const size_t want = (npairs + threads - 1) / threads;
    const unsigned blocks = (unsigned)(want < 4096 ? want : 4096);
    dd_sum_ranks_kernel<<<blocks, threads, 0, n->stream>>>(n->d_gather, npairs, c->size, pairs);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int shard_comm_nccl_bcast(shard_comm_t *c, void *buf, size_t bytes, int root)
{
    shard_comm_nccl_t *n = c->nccl;
    NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclInt8, root, n->comm, n->stream), n->comm,
               "ncclBroadcast");
    return 0;
}

extern "C" int shard_comm_nccl_sync(shard_comm_t *c)
{
    shard_comm_nccl_t *n = c->nccl;
    CUDA_CHECK(cudaStreamSynchronize(n->stream));
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(n->comm, &async), n->comm, "ncclCommGetAsyncError");
    NCCL_CHECK(async, n->comm, "an NCCL collective (asynchronous error)");
    return 0;
}
