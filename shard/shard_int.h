/*
 * shard/shard_int.h - internal to shard/, never included from outside.
 * What store.c asks of a working copy kept apart from the mirror
 * (RT_STORE_TWIN in store.c, RT_STORE_CUDA in store_cuda.cu): the table ops
 * of a step, plus the three reads and one write that sync and upload are
 * built from; and the communicator behind rt_comm_t.
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
} rt_store_rows_t;

typedef struct rt_store_work rt_store_work_t;

typedef struct {
    void (*destroy)(rt_store_work_t *w);
    int64_t (*rows_bound)(const rt_store_work_t *w, int t);
    int64_t (*size)(const rt_store_work_t *w, int t);
    int (*find)(rt_store_work_t *w, int t, int64_t n, const int64_t *keys, int64_t step,
                bool insert, int32_t *rows);
    int (*read)(rt_store_work_t *w, int t, int64_t n, const int32_t *rows, float *out);
    int (*update)(rt_store_work_t *w, const kern_opt_t *opt, const kern_row_grads_t *ug,
                  int64_t step);
    /* find, read and update on arrays in the working copy's memory, on the
     * caller's stream (rt_store_find_dev and the others, shard.h). */
    int (*find_dev)(rt_store_work_t *w, int t, int64_t n, const int64_t *keys, int64_t step,
                    bool insert, int32_t *rows, void *stream);
    int (*read_dev)(rt_store_work_t *w, int t, int64_t n, const int32_t *rows, float *out,
                    void *stream);
    int (*update_dev)(rt_store_work_t *w, const kern_opt_t *opt, const kern_row_grads_t *ug,
                      int64_t step, void *stream);
    /* The keys removed since the last evicted_clear. */
    int (*evicted)(rt_store_work_t *w, int t, const kern_evicted_t **log, int64_t *n);
    void (*evicted_clear)(rt_store_work_t *w, int t);
    /* The live rows changed after step since (stamp > since); the next call
     * will ask for those after step. */
    int (*changed)(rt_store_work_t *w, int t, int64_t since, int64_t step, rt_store_rows_t *out);
    /* Writes rows (keys new to the working copy), stamped with step. */
    int (*insert)(rt_store_work_t *w, int t, const rt_store_rows_t *rows, int64_t step);
    bool parallel;
} rt_store_work_ops_t;

struct rt_store_work {
    const rt_store_work_ops_t *ops;
};

#if KILN_HAVE_CUDA
/* The GPU working copy: one kern_cuda_table_t per table on the current
 * device, a stream, and staging buffers. */
int rt_store_cuda_create(int ntables, const kern_table_config_t *cfgs, int device,
                         rt_store_work_t **out /* OUT */);
#endif

/* ---- comm: the communicator behind rt_comm_t (comm.c, comm_nccl.cu) ---- */

typedef struct rt_comm_nccl rt_comm_nccl_t;

struct rt_comm {
    rt_comm_kind_t kind;
    MPI_Comm comm; /* our duplicate */
    int rank, size;
    int *iarg;    /* MPI: (4, size) int counts and displacements */
    size_t *zarg; /* (4, size) byte counts and displacements (rt_comm_alltoall on NCCL) */
    MPI_Datatype dd_type; /* a (hi, lo) double-double pair, and the op that adds pairs */
    MPI_Op dd_op;
    rt_comm_nccl_t *nccl;
};

#ifdef KILN_HAVE_CUDA
/* comm_nccl.cu (library kiln_shard_cuda): the NCCL backend. c->comm,
 * rank and size are set before rt_comm_nccl_create. */
int rt_comm_nccl_create(rt_comm_t *c, rt_comm_nccl_t **out /* OUT */);
void rt_comm_nccl_destroy(rt_comm_nccl_t *n);
int rt_comm_nccl_device(const rt_comm_nccl_t *n);
void *rt_comm_nccl_stream(const rt_comm_nccl_t *n);
int rt_comm_nccl_alltoallv(rt_comm_t *c, const void *sendbuf, const size_t *sendcounts,
                           const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                           const size_t *rdispls);
int rt_comm_nccl_allreduce_sum_f64(rt_comm_t *c, double *buf, size_t count);
int rt_comm_nccl_allreduce_sum_dd(rt_comm_t *c, double *pairs, size_t npairs);
int rt_comm_nccl_bcast(rt_comm_t *c, void *buf, size_t bytes, int root);
int rt_comm_nccl_sync(rt_comm_t *c);
#endif

#ifdef __cplusplus
}
#endif

#endif /* KILN_SHARD_SHARD_INT_H */
