/*
 * trainer/train_dev_cuda.cuh - what the device step's two CUDA files share:
 * the logistic loss's device functions (as model/model.c's), a block's
 * fixed-order sum and the cuBLAS call check. Internal to trainer/.
 */
#ifndef KILN_TRAINER_TRAIN_DEV_CUDA_CUH
#define KILN_TRAINER_TRAIN_DEV_CUDA_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>

#include "train_dev.h"

#include "kiln_cuda.h"

/* model_sigmoid, without overflow for either sign of z. */
__device__ inline float dev_sigmoid(float z)
{
    if (z >= 0.0f)
        return 1.0f / (1.0f + expf(-z));
    const float e = expf(z);
    return e / (1.0f + e);
}

/* model_logloss: max(z, 0) - z y + log1p(exp(-|z|)). */
__device__ inline double dev_logloss(double z, double y)
{
    return fmax(z, 0.0) - z * y + log1p(exp(-fabs(z)));
}

/* The sum of every thread's acc over a block of DEV_SUM_THREADS threads,
 * added in a fixed order (a tree in shared memory), so a launch gives the
 * same bits on every run; the result is valid in thread 0. */
#define DEV_SUM_THREADS 256
__device__ inline double dev_block_sum(double acc)
{
    __shared__ double part[DEV_SUM_THREADS];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    return part[0];
}

/* Returns KILN_ECUDA from the enclosing function when a cuBLAS call fails. */
#define CUBLAS_CHECK(call)                                                                         \
    KILN_CUDA_STATUS_CHECK(cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublasGetStatusString, call,    \
                           #call)

/* The exchange's kernels (train_dev_xchg.cu), train_dev.h's permute,
 * dedupe, accum and combine on stream st; x is their scratch, made on the
 * first call that needs it. */
typedef struct dev_xchg dev_xchg_t;
int dev_xchg_permute(cudaStream_t st, void *dst, const void *src, int nseg, const dev_seg_t *segs);
int dev_xchg_dedupe(dev_xchg_t **x, cudaStream_t st, int ntables, const int64_t *koff,
                    const int64_t *keys, int nranks, int64_t *uniq, int32_t *inv, int64_t *cnt);
int dev_xchg_accum(cudaStream_t st, int64_t n, const int32_t *rows, const float *sums, int dim,
                   double *tg);
int dev_xchg_combine(dev_xchg_t **x, cudaStream_t st, int ntables, const int64_t *off,
                     const int32_t *rows, const double *grads, int dim, kern_row_grads_t *out);
void dev_xchg_destroy(dev_xchg_t *x);

#endif /* KILN_TRAINER_TRAIN_DEV_CUDA_CUH */
