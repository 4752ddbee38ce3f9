/*
 * tests/support/badblas.c - a cblas_sgemm that is wrong on purpose, for
 * LD_PRELOAD: it calls the real one and then adds 1 to C's first element.
 * It stands in for an OpenBLAS kernel set that computes wrong products on a
 * CPU (no such library can be had here), so that tests/test_train.c can see
 * kiln-train's kernel check refuse it (model/model_kernels.c).
 */
#include <cblas.h>
#include <dlfcn.h>

typedef void (*sgemm_fn)(const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE,
                         const enum CBLAS_TRANSPOSE, const blasint, const blasint, const blasint,
                         const float, const float *, const blasint, const float *, const blasint,
                         const float, float *, const blasint);

void cblas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta,
                 const enum CBLAS_TRANSPOSE tb, const blasint m, const blasint n, const blasint k,
                 const float alpha, const float *A, const blasint lda, const float *B,
                 const blasint ldb, const float beta, float *C, const blasint ldc)
{
    sgemm_fn real = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
    real(order, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    if (m > 0 && n > 0)
        C[0] += 1.0f;
}
