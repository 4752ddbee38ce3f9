/*
 * shard/shard_int.h - internal to shard/, never included from outside.
 * What store.c asks of a working copy kept apart from the mirror
 * (SHARD_STORE_TWIN in store.c, SHARD_STORE_CUDA in store_cuda.cu): the table ops
 * of a step, plus the three reads and one write that sync and upload are
 * built from; and the communicator behind shard_comm_t.
 */
#ifndef KILN_SHARD_SHARD_INT_H
#define KILN_SHARD_SHARD_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "kern.h"
#include "shard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Rows taken out of a working copy: n keys, values (n, dim), optimizer
 * state (n, nstate*dim, NULL for sgd) and adam counts (n, NULL unless adam);
 * host arrays owned by the working copy, valid until its next call. */
typedef struct {
    int64_t n;
    const int64_t *keys;
    const float *values;
    const float *opt;
    const uint32_t *steps;
} shard_store_rows_t;

typedef struct shard_store_work shard_store_work_t;

typedef struct {
    void (*destroy)(shard_store_work_t *w);
    int64_t (*rows_bound)(const shard_store_work_t *w, int t);
    int64_t (*size)(const shard_store_work_t *w, int t);
    int (*find)(shard_store_work_t *w, int t, int64_t n, const int64_t *keys, int64_t step,
                bool insert, int32_t *rows);
    int (*read)(shard_store_work_t *w, int t, int64_t n, const int32_t *rows, float *out);
    int (*update)(shard_store_work_t *w, const kern_opt_t *opt, const kern_row_grads_t *ug,
                  int64_t step);
    /* find (every table: its keys at keys[off[t] .. off[t + 1])), read and
     * update on arrays in the working copy's memory, on the caller's stream
     * (shard_store_find_dev and the others, shard.h). */
    int (*find_dev)(shard_store_work_t *w, const int64_t *off, const int64_t *keys, int64_t step,
                    bool insert, int32_t *rows, void *stream);
    int (*read_dev)(shard_store_work_t *w, int t, int64_t n, const int32_t *rows, float *out,
                    void *stream);
    int (*update_dev)(shard_store_work_t *w, const kern_opt_t *opt, const kern_row_grads_t *ug,
                      int64_t step, void *stream);
    /* The keys removed since the last evicted_clear. */
    int (*evicted)(shard_store_work_t *w, int t, const kern_evicted_t **log, int64_t *n);
    void (*evicted_clear)(shard_store_work_t *w, int t);
    /* The live rows changed after step since (stamp > since); the next call
     * will ask for those after step. */
    int (*changed)(shard_store_work_t *w, int t, int64_t since, int64_t step, shard_store_rows_t *out);
    /* Writes rows (keys new to the working copy), stamped with step. */
    int (*insert)(shard_store_work_t *w, int t, const shard_store_rows_t *rows, int64_t step);
    bool parallel;
} shard_store_work_ops_t;

struct shard_store_work {
    const shard_store_work_ops_t *ops;
};

#if KILN_HAVE_CUDA
/* The GPU working copy: one kern_cuda_table_t per table on the current
 * device, a stream, and staging buffers. */
int shard_store_cuda_create(int ntables, const kern_table_config_t *cfgs, int device,
                         shard_store_work_t **out /* OUT */);
#endif

/* ---- comm: the communicator behind shard_comm_t (comm.c, comm_nccl.cu) ---- */

typedef struct shard_comm_nccl shard_comm_nccl_t;

struct shard_comm {
    shard_comm_kind_t kind;
    MPI_Comm comm; /* our duplicate */
    int rank, size;
    int *iarg;    /* MPI: (4, size) int counts and displacements */
    size_t *zarg; /* (4, size) byte counts and displacements (shard_comm_alltoall on NCCL) */
    MPI_Datatype dd_type; /* a (hi, lo) double-double pair, and the op that adds pairs */
    MPI_Op dd_op;
    shard_comm_nccl_t *nccl;
};

#ifdef KILN_HAVE_CUDA
/* comm_nccl.cu (library kiln_shard_cuda): the NCCL backend. c->comm,
 * rank and size are set before shard_comm_nccl_create. comm.c calls the
 * sums and the broadcast only with something to move (count > 0). */
int shard_comm_nccl_create(shard_comm_t *c, shard_comm_nccl_t **out /* OUT */);
void shard_comm_nccl_destroy(shard_comm_nccl_t *n);
int shard_comm_nccl_device(const shard_comm_nccl_t *n);
void *shard_comm_nccl_stream(const shard_comm_nccl_t *n);
int shard_comm_nccl_alltoallv(shard_comm_t *c, const void *sendbuf, const size_t *sendcounts,
                           const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                           const size_t *rdispls);
int shard_comm_nccl_allreduce_sum_f64(shard_comm_t *c, double *buf, size_t count);
int shard_comm_nccl_allreduce_sum_dd(shard_comm_t *c, double *pairs, size_t npairs);
int shard_comm_nccl_bcast(shard_comm_t *c, void *buf, size_t bytes, int root);
int shard_comm_nccl_sync(shard_comm_t *c);
#endif

#ifdef __cplusplus
}
#endif

#endif /* KILN_SHARD_SHARD_INT_H */
