/*
 * model/model_blas.c - the models' BLAS calls, arranged so that a row's
 * numbers do not depend on how a global batch is split over ranks and
 * threads. That is what lets 1 rank and N ranks on the same global batches
 * train the same weights (model.h, docs/models.md "Rank-count invariance").
 *
 * Two kinds of product, two remedies:
 *
 * - Per-row products (a layer's output, its input gradient): OpenBLAS's
 *   float32 GEMM rounds a row differently depending on where the row sits in
 *   the call and how many rows the call has (measured: 80 rows in one call vs
 *   the same rows inside a 720-row call differ in the last bit for about a
 *   third of the outputs). model_gemm_rows therefore always calls BLAS with
 *   exactly MODEL_ROW_BLOCK rows, blocks starting at the batch's row 0, the last
 *   one zero-padded in a scratch block. A row's result is then a function of
 *   its data and of its index mod MODEL_ROW_BLOCK; with the block-cyclic reader
 *   (rank r starts at row r * batch_size of each global batch) that index is
 *   the same for every rank count as long as batch_size is a multiple of
 *   the block. The block is 16 rows (MODEL_ROW_BLOCK), or 256 (MODEL_GRAD_BLOCK)
 *   when max_batch is a multiple of 256: 16-row calls repack the weights
 *   for every call (10% of the bench dlrm's profile), 256-row calls do not.
 *
 * - Sums over rows (every weight gradient): float64 (model_grad_gemm,
 *   model_grad_colsum), so the order of the terms stops mattering once the sum is
 *   rounded to float32 (a float64 sum's rounding error is about 2^-29 of a
 *   float32 ulp of its largest term). Three ways, by size:
 *     a model whose max_batch (the per-rank train.batch_size) is a multiple
 *       of MODEL_GRAD_BLOCK = 256 computes each whole 256-row block of a
 *       gradient with one float32 SGEMM, always of the same shape, and adds
 *       it to G in float64; the rows after the last whole block go the
 *       float64 way below. With every rank's batch a multiple of 256, rank r
 *       starts at global row r * batch_size, so the blocks are the same rows
 *       on every rank count and so are their float32 products. This costs
 *       what one big SGEMM costs (the DGEMM below made the dlrm step 30%
 *       slower);
 *     every other product is summed in float64 outright: a plain loop when
 *       small, else both operands converted once and one DGEMM per OpenMP
 *       thread over a block of G's rows.
 *   Which way a product goes depends on the model and the product's shape,
 *   never on n. The two ways agree to float32 rounding of a 256-row sum, not
 *   bitwise, so runs compared across rank counts are bitwise equal when
 *   every rank's batch_size is a multiple of 256 in all of them, or a
 *   multiple of 16 but not of 256 in all of them.
 *
 * OpenBLAS is single-threaded here (model_create); the blocks are spread
 * over the OpenMP team, which changes no result.
 */
#define MODEL_IMPL
#include "model.h"

#include <cblas.h>
#include <omp.h>
#include <string.h>

#include "kern_ops.h"

/* The epilogue on rows [r0, r0 + rows) of C (ldc), nn columns; element by
 * element, so the same bits at every vector width (KERN_CLONES). */
KERN_CLONES static void epilogue(const model_epi_t *ep, size_t r0, int rows, int nn, float *C, int ldc)
{
    for (size_t i = r0; i < r0 + (size_t)rows; i++) {
        float *c = C + i * (size_t)ldc;
        if (ep->mask) {
            const float *a = ep->mask + i * (size_t)ep->ldm;
#pragma omp simd
            for (int j = 0; j < nn; j++)
                c[j] = a[j] > 0.0f ? c[j] : 0.0f;
        } else if (ep->relu) {
#pragma omp simd
            for (int j = 0; j < nn; j++) {
                const float v = c[j] + ep->bias[j];
                c[j] = v > 0.0f ? v : 0.0f;
            }
        } else {
#pragma omp simd
            for (int j = 0; j < nn; j++)
                c[j] += ep->bias[j];
        }
    }
}

void model_gemm_rows_block(model_t *m, int n, int blk, int nn, int k, const float *A, int lda,
                           int transb, const float *B, int ldb, float *C, int ldc,
                           const model_epi_t *ep)
{
    const int RB = m->row_block;
    const CBLAS_TRANSPOSE tb = transb ? CblasTrans : CblasNoTrans;
    const size_t r0 = (size_t)blk * RB;
    if ((int)r0 + RB <= n) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, tb, RB, nn, k, 1.0f, A + r0 * (size_t)lda, lda, B,
                    ldb, 0.0f, C + r0 * (size_t)ldc, ldc);
        if (ep)
            epilogue(ep, r0, RB, nn, C, ldc);
        return;
    }
    /* The short last block, padded to RB rows (one block, one user). */
    const int rows = n - (int)r0;
    float *a = m->tailA, *c = m->tailC;
    memset(a, 0, sizeof(float) * (size_t)RB * (size_t)k);
    for (int i = 0; i < rows; i++)
        memcpy(a + (size_t)i * (size_t)k, A + (r0 + (size_t)i) * (size_t)lda,
               sizeof(float) * (size_t)k);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, tb, RB, nn, k, 1.0f, a, k, B, ldb, 0.0f, c, nn);
    for (int i = 0; i < rows; i++)
        memcpy(C + (r0 + (size_t)i) * (size_t)ldc, c + (size_t)i * (size_t)nn,
               sizeof(float) * (size_t)nn);
    if (ep)
        epilogue(ep, r0, rows, nn, C, ldc);
}

void model_gemm_rows_epi(model_t *m, int n, int nn, int k, const float *A, int lda, int transb,
                         const float *B, int ldb, float *C, int ldc, const model_epi_t *ep)
{
    if (n <= 0 || nn <= 0)
        return;
    const int nblk = (n + m->row_block - 1) / m->row_block;
    /* A block's epilogue runs on the thread that computed it, while the
     * block is in that core's cache, and in the same region: no pass of
     * its own over C and no barrier between. */
#pragma omp parallel for schedule(static) if ((int64_t)n * nn * k >= 262144 && !omp_in_parallel())
    for (int blk = 0; blk < nblk; blk++)
        model_gemm_rows_block(m, n, blk, nn, k, A, lda, transb, B, ldb, C, ldc, ep);
}

void model_gemm_rows(model_t *m, int n, int nn, int k, const float *A, int lda, int transb,
                     const float *B, int ldb, float *C, int ldc)
{
    model_gemm_rows_epi(m, n, nn, k, A, lda, transb, B, ldb, C, ldc, NULL);
}

/* dst (n, cols) float64, dense = src (n, cols; ld) float32 */
static void widen(int n, int cols, const float *src, int ld, double *dst)
{
#pragma omp parallel for schedule(static) if (n * cols > 65536)
    for (int i = 0; i < n; i++) {
        const float *s = src + (size_t)i * (size_t)ld;
        double *d = dst + (size_t)i * (size_t)cols;
#pragma omp simd
        for (int j = 0; j < cols; j++)
            d[j] = (double)s[j];
    }
}

/* G (rows, cols) += A^T B over n rows, in float64: a plain loop when small,
 * else DGEMM on float64 copies, one call per thread over a block of G's rows
 * (each element still summed over all n rows). */
static void grad_f64(model_t *m, int n, int rows, int cols, const float *A, int lda,
                     const float *B, int ldb, double *G, double *L)
{
    if (n <= 0)
        return;
    if ((int64_t)n * rows * cols < 262144 || rows == 1) {
        /* A product of two floats is exact in float64, and the double-double
         * sum of exact terms is order-independent: this path is exact. A
         * single output row (dlrm's logit layer, 1 x 128) always goes this
         * way: its sum costs less than the float64 copies for a DGEMM
         * (1.5% of the dlrm model step, and three OpenMP regions). */
        for (int i = 0; i < n; i++) {
            const float *a = A + (size_t)i * (size_t)lda, *b = B + (size_t)i * (size_t)ldb;
            for (int r = 0; r < rows; r++) {
                const double ar = (double)a[r];
                double *g = G + (size_t)r * (size_t)cols, *l = L + (size_t)r * (size_t)cols;
#pragma omp simd
                for (int c = 0; c < cols; c++)
                    kern_dd_add(&g[c], &l[c], ar * (double)b[c]);
            }
        }
        return;
    }
    /* DGEMM rounds inside: order-dependent in the last float64 bit (the
     * batch_size-not-a-multiple-of-256 path; docs/models.md). */
    double *a64 = m->wgA, *b64 = m->wgB;
    widen(n, rows, A, lda, a64);
    widen(n, cols, B, ldb, b64);
    /* Each thread's rows are their own DGEMM, so the split does not change
     * a bit; a small product (lr's 13 x 1) is not worth waking the team. */
#pragma omp parallel if ((int64_t)n * rows * cols >= 262144)
    {
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
        const int r0 = (int)((int64_t)rows * id / nt), r1 = (int)((int64_t)rows * (id + 1) / nt);
        if (r1 > r0)
            cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1 - r0, cols, n, 1.0, a64 + r0,
                        rows, b64, cols, 1.0, G + (size_t)r0 * (size_t)cols, cols);
    }
}

/* (G, L) += t, element by element in double-double: the same bits at
 * every vector width (KERN_CLONES), eight at a time with AVX-512. */
KERN_CLONES static void add_block(size_t cnt, const float *t, double *G, double *L)
{
#pragma omp simd
    for (size_t i = 0; i < cnt; i++)
        kern_dd_add(&G[i], &L[i], (double)t[i]);
}

/* (G, L) += (ph, pl) element by element in double-double, then (ph, pl)
 * = 0 (KERN_CLONES: the same bits at every width). */
KERN_CLONES static void add_dd_block(size_t cnt, double *ph, double *pl, double *G, double *L)
{
#pragma omp simd
    for (size_t i = 0; i < cnt; i++) {
        kern_dd_add_dd(&G[i], &L[i], ph[i], pl[i]);
        ph[i] = pl[i] = 0.0;
    }
}

/* Thread id's share of the (G, L) elements (cnt) gets the other threads'
 * sums of their blocks (m->wgP[q]: hi, then lo), which go back to zero.
 * Called by each of the T threads after the blocks' loop and its barrier. */
static void add_thread_sums(const model_t *m, int id, int T, size_t cnt, double *G, double *L)
{
    const size_t e0 = cnt * (size_t)id / (size_t)T, e1 = cnt * (size_t)(id + 1) / (size_t)T;
    for (int q = 1; q < T; q++)
        add_dd_block(e1 - e0, m->wgP[q] + e0, m->wgP[q] + cnt + e0, G + e0, L + e0);
}

/* model_grad_gemm, its blocks in bf16 when bl (a layer with its bf16 matmul)
 * is given: dYb is A rounded to bf16, the layer's bf_in is B rounded. */
static void grad_gemm(model_t *m, int n, int rows, int cols, const float *A, int lda,
                      const float *B, int ldb, double *G, const model_layer_t *bl,
                      const uint16_t *dYb)
{
    if (n <= 0 || rows <= 0 || cols <= 0)
        return;
    /* The path may depend on the model and the product's shape, never on n:
     * n is what differs between rank counts. */
    const size_t cnt = (size_t)rows * (size_t)cols;
    double *L = m->grads_lo + (G - m->grads); /* G's low parts */
    int done = 0;
    if (model_grad_blocked(m, rows, cols)) {
        /* Whole 256-row blocks: one float32 (or bf16) product each, always
         * of the same shape, added into a double-double sum (about 106 bits:
         * the order does not reach the float32 gradient): the first thread's straight into (G, L), each
         * other's into its own m->wgP, added into (G, L) at the end, each
         * thread a share of the elements. No lock: with one, the threads
         * queued for it at every block (2% of the dlrm model step). */
        const int nblk = n / MODEL_GRAD_BLOCK;
#pragma omp parallel num_threads(model_buf_threads(m)) if (nblk > 1 && m->wgP)
        {
            const int id = omp_get_thread_num(), T = omp_get_num_threads();
            float *t = m->wgT[id];
            double *gh = id == 0 ? G : m->wgP[id], *gl = id == 0 ? L : m->wgP[id] + cnt;
#pragma omp for schedule(static)
            for (int blk = 0; blk < nblk; blk++) {
                const size_t r0 = (size_t)blk * MODEL_GRAD_BLOCK;
                if (bl)
                    model_bf16_grad_block(m, bl, dYb, r0, t);
                else
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rows, cols,
                                MODEL_GRAD_BLOCK, 1.0f, A + r0 * (size_t)lda, lda,
                                B + r0 * (size_t)ldb, ldb, 0.0f, t, cols);
                add_block(cnt, t, gh, gl);
            }
            add_thread_sums(m, id, T, cnt, G, L); /* after the loop's barrier */
        }
        done = nblk * MODEL_GRAD_BLOCK;
    }
    /* The rest (all of it without blocks): float64 throughout. */
    grad_f64(m, n - done, rows, cols, A + (size_t)done * (size_t)lda, lda,
             B + (size_t)done * (size_t)ldb, ldb, G, L);
}

void model_grad_gemm(model_t *m, int n, int rows, int cols, const float *A, int lda,
                  const float *B, int ldb, double *G)
{
    grad_gemm(m, n, rows, cols, A, lda, B, ldb, G, NULL, NULL);
}

void model_grad_gemm_bf16(model_t *m, int n, const model_layer_t *L, const uint16_t *dYb,
                       const float *dY, int ldy, const float *A, int lda)
{
    grad_gemm(m, n, L->out, L->in, dY, ldy, A, lda, m->grads + L->w_off, L->mm_wg >= 0 ? L : NULL,
              dYb);
}

/* Columns [c0, c1) (at most 16) of a small colsum: each a double-double sum down the
 * rows, column by column independent (KERN_CLONES: the same bits at every
 * vector width). */
KERN_CLONES static void colsum_block(int n, int c0, int c1, const float *A, int lda, double *g,
                                     double *gl)
{
    double hi[16] = {0}, lo[16] = {0};
    for (int i = 0; i < n; i++) {
        const float *a = A + (size_t)i * (size_t)lda + c0;
#pragma omp simd
        for (int c = 0; c < c1 - c0; c++)
            kern_dd_add(&hi[c], &lo[c], (double)a[c]);
    }
    for (int c = c0; c < c1; c++)
        kern_dd_add_dd(&g[c], &gl[c], hi[c - c0], lo[c - c0]);
}

/* (hi, lo) (cols) += the rows of A (n, cols; lda), row after row, each
 * column its own double-double sum (KERN_CLONES: the same bits at every
 * vector width). */
KERN_CLONES static void colsum_add(int n, int cols, const float *A, int lda, double *hi,
                                   double *lo)
{
    for (int i = 0; i < n; i++) {
        const float *a = A + (size_t)i * (size_t)lda;
#pragma omp simd
        for (int c = 0; c < cols; c++)
            kern_dd_add(&hi[c], &lo[c], (double)a[c]);
    }
}

/* hi, lo (cols) = the double-double sums down the n rows of A (lda), row
 * after row, every column its own sum (KERN_CLONES: the same bits at every
 * vector width). */
KERN_CLONES static void colsum_rows(int n, int cols, const float *A, int lda, double *hi,
                                    double *lo)
{
    for (int c = 0; c < cols; c++)
        hi[c] = lo[c] = 0.0;
    colsum_add(n, cols, A, lda, hi, lo);
}

void model_grad_colsum(model_t *m, int n, int cols, const float *A, int lda, double *g)
{
    /* Each column a double-double sum of its float terms (about 106 bits),
     * so neither the order nor the grouping reaches the float32 gradient. */
    double *gl = m->grads_lo + (g - m->grads);
    if ((int64_t)n * cols <= 65536 || 4 * (size_t)cols > m->wgT_cap) {
        /* Small, or columns too many for a thread's buffer: columns in
         * blocks of 16 over the threads. */
        const int nblk = (cols + 15) / 16;
#pragma omp parallel for schedule(static) if ((int64_t)n * cols > 65536)
        for (int blk = 0; blk < nblk; blk++)
            colsum_block(n, blk * 16, blk * 16 + 16 < cols ? blk * 16 + 16 : cols, A, lda, g, gl);
        return;
    }
    /* Each thread sums a run of whole rows into its own buffer (hi, lo),
     * reading A row after row as it lies in memory (a block of 16 columns
     * down the rows waits on L3 at every row: 3% of the bench dlrm's
     * profile); the partial sums are then added in thread order. */
    int nt = 1;
#pragma omp parallel num_threads(model_buf_threads(m))
    {
        const int id = omp_get_thread_num(), T = omp_get_num_threads();
        const int r0 = (int)((int64_t)n * id / T), r1 = (int)((int64_t)n * (id + 1) / T);
        double *hi = (double *)(void *)m->wgT[id];
        colsum_rows(r1 - r0, cols, A + (size_t)r0 * (size_t)lda, lda, hi, hi + cols);
        if (id == 0)
            nt = T;
    }
    for (int t = 0; t < nt; t++) {
        const double *hi = (const double *)(const void *)m->wgT[t], *lo = hi + cols;
        for (int c = 0; c < cols; c++)
            kern_dd_add_dd(&g[c], &gl[c], hi[c], lo[c]);
    }
}

int model_dense_bwd_blocks(model_t *m, int n, int out, int in, const float *dY, int ldy,
                           const float *A, int lda, const float *W, double *G, double *gb,
                           float *dA, int ldda, const model_epi_t *ep)
{
    const int nblk = n / MODEL_GRAD_BLOCK;
    if (nblk < 2 || !m->wgP || m->bf || !model_grad_blocked(m, out, in))
        return 0;
    const size_t cnt = (size_t)out * (size_t)in;
    double *L = m->grads_lo + (G - m->grads), *gbl = m->grads_lo + (gb - m->grads);
    int nt = 1;
#pragma omp parallel num_threads(model_buf_threads(m))
    {
        const int id = omp_get_thread_num(), T = omp_get_num_threads();
        float *t = m->wgT[id];
        double *gh = id == 0 ? G : m->wgP[id], *gl = id == 0 ? L : m->wgP[id] + cnt;
        double *bh = m->wgP[id] + 2 * m->wgT_cap, *bl = bh + out;
        for (int c = 0; c < out; c++)
            bh[c] = bl[c] = 0.0;
#pragma omp for schedule(static)
        for (int blk = 0; blk < nblk; blk++) {
            const size_t r0 = (size_t)blk * MODEL_GRAD_BLOCK;
            const float *dy = dY + r0 * (size_t)ldy;
            colsum_add(MODEL_GRAD_BLOCK, out, dy, ldy, bh, bl);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, MODEL_GRAD_BLOCK, 1.0f, dy,
                        ldy, A + r0 * (size_t)lda, lda, 0.0f, t, in);
            add_block(cnt, t, gh, gl);
            if (dA)
                model_gemm_rows_block(m, n, blk, in, out, dY, ldy, 0, W, in, dA, ldda, ep);
        }
        add_thread_sums(m, id, T, cnt, G, L); /* after the loop's barrier */
        if (id == 0)
            nt = T;
    }
    for (int q = 0; q < nt; q++) {
        const double *bh = m->wgP[q] + 2 * m->wgT_cap, *bl = bh + out;
        for (int c = 0; c < out; c++)
            kern_dd_add_dd(&gb[c], &gbl[c], bh[c], bl[c]);
    }
    return nblk * MODEL_GRAD_BLOCK;
}

/* ---- the GEMMs a model makes, for model_kernels_check -------------------------------- */

enum { MAX_SHAPES = 8 * MODEL_MAX_LAYERS + 8 };

typedef struct {
    model_gemm_shape_t s[MAX_SHAPES];
    int n;
    const model_t *m;
} shapes_t;

static void add(shapes_t *sh, const char *what, int m, int n, int k, bool ta, bool tb, bool dbl)
{
    if (sh->n < MAX_SHAPES)
        sh->s[sh->n++] = (model_gemm_shape_t){what, m, n, k, ta, tb, dbl};
}

/* model_gemm_rows's call: (row_block, nn) = (row_block, k) op(B). */
static void add_rows(shapes_t *sh, const char *what, int nn, int k, bool transb)
{
    add(sh, what, sh->m->row_block, nn, k, false, transb, false);
}

/* model_grad_gemm's calls for G (rows, cols): the 256-row float32 block where
 * it takes that path, and the float64 DGEMM of the rest. */
static void add_grad(shapes_t *sh, const char *what, int rows, int cols)
{
    if (model_grad_blocked(sh->m, rows, cols))
        add(sh, what, rows, cols, MODEL_GRAD_BLOCK, true, false, false);
    const int n = sh->m->max_batch < MODEL_GRAD_BLOCK ? sh->m->max_batch : MODEL_GRAD_BLOCK;
    add(sh, what, rows, cols, n, true, false, true);
}

int model_selfcheck(const model_t *m)
{
    static const char *const names[2][3] = {{"bottom forward", "bottom input gradient",
                                              "bottom weight gradient"},
                                             {"top forward", "top input gradient",
                                              "top weight gradient"}};
    shapes_t sh = {.m = m};
    if (m->type == MODEL_DLRM) {
        for (int l = 0; l < m->nbottom + m->ntop; l++) {
            const model_layer_t *L = &m->layers[l];
            const char *const *nm = names[l >= m->nbottom];
            add_rows(&sh, nm[0], L->out, L->in, true);
            add_rows(&sh, nm[1], L->in, L->out, false);
            add_grad(&sh, nm[2], L->out, L->in);
        }
    } else if (m->F > 0) { /* lr, fm: w . x, and fm's Vx x */
        add_rows(&sh, "dense linear term", 1, m->F, false);
        add_grad(&sh, "dense linear gradient", m->F, 1);
        if (m->fm_dense && m->k > 0) {
            add_rows(&sh, "dense factors", m->k, m->F, true);
            add_grad(&sh, "dense factor gradient", m->k, m->F);
        }
    }
    return model_kernels_check(sh.s, sh.n);
}
