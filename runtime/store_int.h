/*
 * runtime/store_int.h - what store.c asks of a working copy kept apart from
 * the mirror (RT_STORE_TWIN in store.c, RT_STORE_CUDA in store_cuda.cu):
 * the table ops of a step, plus the three reads and one write that sync
 * and upload are built from. Internal to runtime/.
 */
#ifndef KILN_RUNTIME_STORE_INT_H
#define KILN_RUNTIME_STORE_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "kern.h"

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

#ifdef __cplusplus
}
#endif

#endif /* KILN_RUNTIME_STORE_INT_H */
