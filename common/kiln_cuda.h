/*
 * common/kiln_cuda.h - the CUDA error checks every .cu file of Kiln uses:
 * a failed CUDA runtime call (or the cudaGetLastError after a launch)
 * becomes KILN_ECUDA with the call's text, CUDA's message, the place and
 * what to check.
 * Only CUDA translation units include this header.
 */
#ifndef KILN_COMMON_KILN_CUDA_H
#define KILN_COMMON_KILN_CUDA_H

#include <cuda_runtime.h>

#include "kiln.h"

/* What a user can check when a CUDA call fails. */
#define KILN_CUDA_HINT                                                                     \
    "check the GPU with nvidia-smi and that CUDA_VISIBLE_DEVICES lists a GPU for this "    \
    "rank, or set device: cpu"

/* Returns KILN_ECUDA from the enclosing function when call, whose status is
 * of type T, does not return ok; words(status) is the library's message and
 * text the call as written. CUDA_CHECK below, and the CUDA libraries'
 * checks (CUBLAS_CHECK in trainer/train_dev_cuda.cuh), are this for their
 * status type. */
#define KILN_CUDA_STATUS_CHECK(T, ok, words, call, text)                                   \
    do {                                                                                   \
        T cuda_st_ = (call);                                                               \
        if (cuda_st_ != (ok))                                                              \
            return kiln_errf(KILN_ECUDA, "%s: %s (%s); " KILN_CUDA_HINT, text,            \
                             words(cuda_st_), KILN_WHERE);                                 \
    } while (0)

/* Returns KILN_ECUDA from the enclosing function when call fails. */
#define CUDA_CHECK(call)                                                                   \
    KILN_CUDA_STATUS_CHECK(cudaError_t, cudaSuccess, cudaGetErrorString, call, #call)

/* Sets rc to KILN_ECUDA and jumps to label when call fails. */
#define CUDA_CHECK_GOTO(call, rc, label)                                                   \
    do {                                                                                   \
        cudaError_t cuda_err_ = (call);                                                    \
        if (cuda_err_ != cudaSuccess) {                                                    \
            (rc) = kiln_errf(KILN_ECUDA, "%s: %s (%s); " KILN_CUDA_HINT, #call,            \
                             cudaGetErrorString(cuda_err_), KILN_WHERE);                   \
            goto label;                                                                    \
        }                                                                                  \
    } while (0)

#endif /* KILN_COMMON_KILN_CUDA_H */
