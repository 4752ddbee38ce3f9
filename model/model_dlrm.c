/*
 * model/model_dlrm.c - DLRM (Naumov et al. 2019) on Kiln's pooled inputs,
 * and the BLAS-backed dense layer the models share.
 *
 *   bot (n, d)   = bottom MLP of X (n, F), ReLU after every layer
 *   vectors      = [bot, E[i,0], ..., E[i,S-1]]           (S + 1 of width d)
 *   R (n, d + P) = [bot | <v_a, v_b> for a < b]            P = S (S + 1) / 2
 *   logit (n)    = top MLP of R, ReLU between layers, none after the last
 *
 * The last bottom layer writes straight into R's first d columns, so the top
 * input is built without a copy. The interaction runs a row at a time on
 * each OpenMP thread's own tiles (m->wgT, model_dlrm_scratch floats):
 *
 *   vt (d, NP)   the row's N = S + 1 vectors as columns, NP = N rounded up
 *                to 16, the padding zero
 *   g  (NP, NP)  the forward's dots G[a][b] = <v_a, v_b> before they are
 *                packed into R; the backward's pair gradients made square
 *                (g[t][u] = g[u][t], zero diagonal)
 *
 * Both directions sum along one axis with 16 lanes side by side on the
 * other (the forward over j for 16 b's, the backward over u for 16 of the
 * vector's columns), and four sums at a time, so no sum crosses the lanes:
 * every vector width computes the same bits (KERN_CLONES), and a sum is
 * never waiting on the one before it. docs/models.md has the measurements.
 */
#define MODEL_IMPL
#include "model.h"

#include <omp.h>
#include <string.h>

#include "kern_ops.h"

/* ---- the dense layer ------------------------------------------------------------ */
void model_dense_linear_fwd(model_t *m, int n, const model_layer_t *L, const float *A, int lda,
                         float *Y, int ldy)
{
    const int in = L->in, out = L->out, relu = L->relu;
    const float *W = m->params + L->w_off, *b = m->params + L->b_off;
    /* Y (n, out) = A (n, in) W^T (in, out), in fixed row blocks (model_blas.c),
     * each block's bias and ReLU right after its GEMM */
    if (!m->bf) {
        const model_epi_t ep = {.bias = b, .relu = relu};
        model_gemm_rows_epi(m, n, out, in, A, lda, 1, W, in, Y, ldy, &ep);
        return;
    }
    /* bf16: A rounded once, kept for the weight gradient (model_bf16.c) */
    model_bf16_round_rows(m, n, in, A, lda, L->bf_in);
    model_bf16_fwd(m, n, L, Y, ldy);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        float *yi = Y + (size_t)i * (size_t)ldy;
        if (relu) {
#pragma omp simd
            for (int j = 0; j < out; j++) {
                float v = yi[j] + b[j];
                yi[j] = v > 0.0f ? v : 0.0f;
            }
        } else {
#pragma omp simd
            for (int j = 0; j < out; j++)
                yi[j] += b[j];
        }
    }
}

/* dA *= (act > 0): the ReLU's gradient, act (n, w; lda), dA (n, w; ldd). */
static void relu_mask(int n, int w, const float *act, int lda, float *dA, int ldd)
{
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float *a = act + (size_t)i * (size_t)lda;
        float *g = dA + (size_t)i * (size_t)ldd;
#pragma omp simd
        for (int j = 0; j < w; j++)
            g[j] = a[j] > 0.0f ? g[j] : 0.0f;
    }
}

/* model_dense_linear_bwd; with relu_in (A is a ReLU's output) dA is also
 * multiplied by (A > 0), the ReLU's gradient, block by block. */
static void linear_bwd(model_t *m, int n, const model_layer_t *L, const float *A, int lda,
                       const float *dY, int ldy, float *dA, int ldda, int relu_in)
{
    const int in = L->in, out = L->out;
    if (m->bf) {
        /* db (out) += the column sums of dY */
        model_grad_colsum(m, n, out, dY, ldy, m->grads + L->b_off);
        /* dY rounded once, for both products */
        uint16_t *dYb = model_bf16_dy(m);
        model_bf16_round_rows(m, n, out, dY, ldy, dYb);
        model_grad_gemm_bf16(m, n, L, dYb, dY, ldy, A, lda);
        if (dA) {
            model_bf16_bwd_input(m, n, L, dYb, dA, ldda);
            if (relu_in)
                relu_mask(n, in, A, lda, dA, ldda);
        }
        return;
    }
    /* The whole 256-row blocks in one region (model_dense_bwd_blocks), the
     * rows after them (all of them where it does nothing) below. */
    const float *W = m->params + L->w_off;
    double *G = m->grads + L->w_off, *gb = m->grads + L->b_off;
    const model_epi_t epb = {.mask = A, .ldm = lda};
    const int done = model_dense_bwd_blocks(m, n, out, in, dY, ldy, A, lda, W, G, gb, dA, ldda,
                                            relu_in ? &epb : NULL);
    if (done == n)
        return;
    n -= done;
    dY += (size_t)done * (size_t)ldy;
    A += (size_t)done * (size_t)lda;
    if (dA)
        dA += (size_t)done * (size_t)ldda;
    /* db (out) += the column sums of dY */
    model_grad_colsum(m, n, out, dY, ldy, gb);
    /* dW (out, in) += dY^T (out, n) A (n, in), in float64 (model_blas.c) */
    model_grad_gemm(m, n, out, in, dY, ldy, A, lda, G);
    /* dA (n, in) = dY (n, out) W (out, in), in fixed row blocks */
    if (dA) {
        const model_epi_t ep = {.mask = A, .ldm = lda};
        model_gemm_rows_epi(m, n, in, out, dY, ldy, 0, W, in, dA, ldda, relu_in ? &ep : NULL);
    }
}

void model_dense_linear_bwd(model_t *m, int n, const model_layer_t *L, const float *A, int lda,
                         const float *dY, int ldy, float *dA, int ldda)
{
    linear_bwd(m, n, L, A, lda, dY, ldy, dA, ldda, 0);
}

/* Vector v of a row: v_0 = bot, v_s+1 = the row's slot s. */
static inline const float *vec_of(const float *bot, const float *e, int d, int v)
{
    return v == 0 ? bot : e + (size_t)(v - 1) * (size_t)d;
}

/* 16 floats, loaded and stored at any float's alignment; GCC and clang
 * split it into the widths a clone's ISA has. */
typedef float v16_t __attribute__((vector_size(64), aligned(4)));
enum { LANES = 16 };

static inline int round16(int x)
{
    return (x + LANES - 1) / LANES * LANES;
}

/* 4 floats at any float's alignment, and a 4 x 4 transpose in shuffles:
 * the interaction's tiles are rows turned into columns, and element by
 * element copies of them were 40% of the forward interaction and 25% of
 * the backward. */
typedef float v4_t __attribute__((vector_size(16), aligned(4)));
#if defined(__clang__)
#define SHUF4(a, b, i, j, k, l) __builtin_shufflevector(a, b, i, j, k, l)
#else
typedef int v4i_t __attribute__((vector_size(16)));
#define SHUF4(a, b, i, j, k, l) __builtin_shuffle(a, b, (v4i_t){i, j, k, l})
#endif

/* out[q][k] (leading dimension ld) = r_k[q], for q, k < 4. */
static inline void transpose4(const float *r0, const float *r1, const float *r2, const float *r3,
                              float *out, size_t ld)
{
    const v4_t a = *(const v4_t *)r0, b = *(const v4_t *)r1;
    const v4_t c = *(const v4_t *)r2, e = *(const v4_t *)r3;
    const v4_t t0 = SHUF4(a, b, 0, 4, 1, 5), t1 = SHUF4(a, b, 2, 6, 3, 7);
    const v4_t t2 = SHUF4(c, e, 0, 4, 1, 5), t3 = SHUF4(c, e, 2, 6, 3, 7);
    *(v4_t *)out = SHUF4(t0, t2, 0, 1, 4, 5);
    *(v4_t *)(out + ld) = SHUF4(t0, t2, 2, 3, 6, 7);
    *(v4_t *)(out + 2 * ld) = SHUF4(t1, t3, 0, 1, 4, 5);
    *(v4_t *)(out + 3 * ld) = SHUF4(t1, t3, 2, 3, 6, 7);
}

size_t model_dlrm_scratch(int S, int d)
{
    const size_t np = (size_t)round16(S + 1);
    /* the forward's vt; the backward's g, then its dt ((S + 1, d)) */
    const size_t vt = (size_t)d * np + LANES, g = np * np + (size_t)(S + 1) * (size_t)d;
    return vt > g ? vt : g;
}

static inline void axpy(float c, const float *x, float *y, int d)
{
#pragma omp simd
    for (int j = 0; j < d; j++)
        y[j] += c * x[j];
}

/* ---- forward -------------------------------------------------------------------- */
/* One row's dots, written straight into R: the pairs (a, b > a) of row a
 * sit side by side, so a task (a, m) sums dots[p_a + 16 m ..] over j
 * ascending with b = a + 1 + 16 m .. in the lanes, reading 16 columns of vt
 * from there (lanes past the row read the padding, the next column or the
 * slack, and are thrown away). Tasks run four at a time and are stored in
 * the order of their place in dots: a task's thrown-away lanes land on a
 * later task's place, and that task's store comes after. The last tasks,
 * whose 16 lanes would run past dots, go through a copy. */
KERN_CLONES static void interaction_fwd(int S, int d, const float *bot, const float *e,
                                        float *dots, float *vt)
{
    const int N = S + 1, np = round16(N), P = S * (S + 1) / 2;
    /* vt's columns 4 at a time, the vectors past N read as zeros */
    static const float zero4[4];
    const int n4 = (N + 3) & ~3, d4 = d & ~3;
    for (int b = 0; b < n4; b += 4) {
        const float *r[4];
        for (int q = 0; q < 4; q++)
            r[q] = b + q < N ? vec_of(bot, e, d, b + q) : NULL;
        for (int j = 0; j < d4; j += 4)
            transpose4(r[0] ? r[0] + j : zero4, r[1] ? r[1] + j : zero4,
                       r[2] ? r[2] + j : zero4, r[3] ? r[3] + j : zero4,
                       vt + (size_t)j * np + b, (size_t)np);
        for (int j = d4; j < d; j++)
            for (int q = 0; q < 4; q++)
                vt[(size_t)j * np + b + q] = r[q] ? r[q][j] : 0.0f;
    }
    for (int j = 0; j < d; j++)
        for (int b = n4; b < np; b++)
            vt[(size_t)j * np + b] = 0.0f;
    for (int b = 0; b < LANES; b++)
        vt[(size_t)d * np + b] = 0.0f;

    int a = 0, m = 0, p = 0; /* the next task, and where row a's dots start */
    while (a < N - 1) {
        const float *va[4], *w[4];
        int at[4], nt = 0;
        for (; nt < 4 && a < N - 1; nt++) {
            va[nt] = vec_of(bot, e, d, a);
            w[nt] = vt + a + 1 + m * LANES;
            at[nt] = p + m * LANES;
            if (++m * LANES >= N - 1 - a) {
                p += N - 1 - a;
                a++;
                m = 0;
            }
        }
        v16_t c[4] = {{0}};
        if (nt == 4) {
            for (int j = 0; j < d; j++) {
                const size_t o = (size_t)j * np;
                c[0] += va[0][j] * *(const v16_t *)(w[0] + o);
                c[1] += va[1][j] * *(const v16_t *)(w[1] + o);
                c[2] += va[2][j] * *(const v16_t *)(w[2] + o);
                c[3] += va[3][j] * *(const v16_t *)(w[3] + o);
            }
        } else {
            for (int t = 0; t < nt; t++)
                for (int j = 0; j < d; j++)
                    c[t] += va[t][j] * *(const v16_t *)(w[t] + (size_t)j * np);
        }
        for (int t = 0; t < nt; t++) {
            if (at[t] + LANES <= P) {
                *(v16_t *)(dots + at[t]) = c[t];
            } else {
                float tail[LANES];
                *(v16_t *)tail = c[t];
                memcpy(dots + at[t], tail, (size_t)(P - at[t]) * sizeof(float));
            }
        }
    }
}

/* Row block blk (model_gemm_rows_block's rows of an n-row batch) through
 * the whole forward, bottom MLP, interaction and top MLP, on the calling
 * thread: each layer's block is in that core's cache when the next reads
 * it. The same calls as layer by layer, so the same bits. */
static void forward_block(model_t *m, int n, int blk, const float *E, const float *X)
{
    const int S = m->S, d = m->d, nb = m->nbottom, nl = m->nbottom + m->ntop;
    const size_t ldr = (size_t)m->ldr, rowE = (size_t)S * (size_t)d;
    const int r0 = blk * m->row_block, r1 = r0 + m->row_block < n ? r0 + m->row_block : n;
    const float *A = X;
    int lda = m->F;
    for (int l = 0; l < nl; l++) {
        const model_layer_t *L = &m->layers[l];
        if (l == nb) {
            /* R[i, d + p] = <v_a, v_b> for the p-th pair a < b, v_0 = bot,
             * v_s+1 = E[i,s] */
            float *R = m->R, *tile = m->wgT[omp_get_thread_num()];
            for (int i = r0; i < r1; i++)
                interaction_fwd(S, d, R + (size_t)i * ldr, E + (size_t)i * rowE,
                                R + (size_t)i * ldr + d, tile);
            A = R;
            lda = m->ldr;
        }
        const int ldy = l == nb - 1 ? m->ldr : L->out;
        const model_epi_t ep = {.bias = m->params + L->b_off, .relu = L->relu};
        model_gemm_rows_block(m, n, blk, L->out, L->in, A, lda, 1, m->params + L->w_off, L->in,
                              m->act[l], ldy, &ep);
        A = m->act[l];
        lda = ldy;
    }
}

void model_dlrm_forward(model_t *m, int n, const float *E, const float *X)
{
    const int S = m->S, d = m->d, nb = m->nbottom, nl = m->nbottom + m->ntop;
    const size_t ldr = (size_t)m->ldr, rowE = (size_t)S * (size_t)d;

    if (!m->bf) {
        /* One OpenMP region for the whole forward, a row block at a time
         * (it was 11 regions and their barriers, layer by layer). */
        const int nblk = (n + m->row_block - 1) / m->row_block;
#pragma omp parallel for schedule(static) num_threads(model_buf_threads(m))
        for (int blk = 0; blk < nblk; blk++)
            forward_block(m, n, blk, E, X);
        return;
    }
    const float *A = X;
    int lda = m->F;
    for (int l = 0; l < nb; l++) {
        int ldy = l == nb - 1 ? m->ldr : m->layers[l].out;
        model_dense_linear_fwd(m, n, &m->layers[l], A, lda, m->act[l], ldy);
        A = m->act[l];
        lda = ldy;
    }

    /* R[i, d + p] = <v_a, v_b> for the p-th pair a < b, v_0 = bot, v_s+1 = E[i,s]. */
    float *R = m->R;
#pragma omp parallel for schedule(static) num_threads(model_buf_threads(m))
    for (int i = 0; i < n; i++)
        interaction_fwd(S, d, R + (size_t)i * ldr, E + (size_t)i * rowE, R + (size_t)i * ldr + d,
                        m->wgT[omp_get_thread_num()]);

    A = R;
    lda = m->ldr;
    for (int l = nb; l < nl; l++) {
        model_dense_linear_fwd(m, n, &m->layers[l], A, lda, m->act[l], m->layers[l].out);
        A = m->act[l];
        lda = m->layers[l].out;
    }
}

/* ---- backward ------------------------------------------------------------------- */

/* One row's interaction backward: dr (its row of dR: d bot, then the pair
 * gradients) -> d bot in place and the row's dE, through dt ((S + 1, d)
 * scratch, so de may alias e). The pair gradients are made square first
 * (g, zero diagonal); then d v_t = the sum over u ascending of g[t][u] v_u
 * (the GPU's order too), 16 of the vector's columns in the lanes and four
 * t's at a time. The diagonal's zeros add nothing: a sum that starts at +0
 * is never -0, so adding +-0 leaves every bit of it. */
KERN_CLONES static void interaction_bwd(int S, int d, const float *bot, const float *e, float *dr,
                                        float *dt, float *de, float *g)
{
    const int N = S + 1, np = round16(N);
    const float *gd = dr + d;
    /* The upper triangle row by row from the packed pairs, rows and
     * columns N..n4 zero; then the lower triangle as the transpose of the
     * upper, 4 x 4 blocks off the diagonal, element by element on it. */
    const int n4 = (N + 3) & ~3;
    int p = 0;
    for (int a = 0; a < n4; a++) {
        float *ga = g + (size_t)a * np;
        const int lo = a < N ? a + 1 : 0;
        if (a < N) {
            ga[a] = 0.0f;
#pragma omp simd
            for (int b = a + 1; b < N; b++)
                ga[b] = gd[p + b - a - 1];
            p += N - 1 - a;
        }
        for (int b = lo > N ? lo : N; b < n4; b++)
            ga[b] = 0.0f;
    }
    for (int a0 = 0; a0 < n4; a0 += 4) {
        for (int b0 = a0 + 4; b0 < n4; b0 += 4) {
            const float *u = g + (size_t)a0 * np + b0;
            transpose4(u, u + np, u + 2 * np, u + 3 * np, g + (size_t)b0 * np + a0, (size_t)np);
        }
        for (int r = 1; r < 4; r++)
            for (int c = 0; c < r; c++)
                g[(size_t)(a0 + r) * np + a0 + c] = g[(size_t)(a0 + c) * np + a0 + r];
    }
    int j0 = 0;
    for (; j0 + LANES <= d; j0 += LANES) {
        int t = 0;
        for (; t + 4 <= N; t += 4) {
            const float *g0 = g + (size_t)t * np, *g1 = g0 + np, *g2 = g1 + np, *g3 = g2 + np;
            v16_t c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
            for (int u = 0; u < N; u++) {
                const v16_t vu = *(const v16_t *)(vec_of(bot, e, d, u) + j0);
                c0 += g0[u] * vu;
                c1 += g1[u] * vu;
                c2 += g2[u] * vu;
                c3 += g3[u] * vu;
            }
            *(v16_t *)(dt + (size_t)t * d + j0) = c0;
            *(v16_t *)(dt + (size_t)(t + 1) * d + j0) = c1;
            *(v16_t *)(dt + (size_t)(t + 2) * d + j0) = c2;
            *(v16_t *)(dt + (size_t)(t + 3) * d + j0) = c3;
        }
        for (; t < N; t++) {
            const float *g0 = g + (size_t)t * np;
            v16_t c0 = {0};
            for (int u = 0; u < N; u++)
                c0 += g0[u] * *(const v16_t *)(vec_of(bot, e, d, u) + j0);
            *(v16_t *)(dt + (size_t)t * d + j0) = c0;
        }
    }
    if (j0 < d) /* the columns past the last whole 16, summed in place */
        for (int t = 0; t < N; t++) {
            float *dtt = dt + (size_t)t * d;
            for (int j = j0; j < d; j++)
                dtt[j] = 0.0f;
            for (int u = 0; u < N; u++)
                axpy(g[(size_t)t * np + u], vec_of(bot, e, d, u) + j0, dtt + j0, d - j0);
        }
    /* d bot = (direct part + interaction part) * ReLU'(bot) */
    for (int j = 0; j < d; j++)
        dr[j] = bot[j] > 0.0f ? dr[j] + dt[j] : 0.0f;
    if (S > 0)
        memcpy(de, dt + d, (size_t)S * (size_t)d * sizeof(float));
}

void model_dlrm_backward(model_t *m, int n, const float *E, const float *X, float *dE)
{
    const int S = m->S, d = m->d, nb = m->nbottom, nl = m->nbottom + m->ntop;
    const size_t ldr = (size_t)m->ldr, rowE = (size_t)S * (size_t)d;

    /* Top MLP, last layer first; cur is d loss / d (layer output). */
    const float *cur = m->gz;
    int ldc = 1, cb = 1; /* cur lives in gbuf[cb] (gz at first) */
    for (int l = nl - 1; l >= nb; l--) {
        const model_layer_t *L = &m->layers[l];
        const float *Ap = l == nb ? m->R : m->act[l - 1];
        int lda = l == nb ? m->ldr : m->layers[l - 1].out;
        float *dA = m->gbuf[cb ^ 1];
        linear_bwd(m, n, L, Ap, lda, cur, ldc, dA, L->in, l > nb);
        cur = dA;
        ldc = L->in;
        cb ^= 1;
    }

    /* Interaction: dR (n, d + P) -> d bot (in place, R's first d columns of
     * dR) and dE. A thread's dt tile holds a row's (S + 1, d) gradients
     * before dE is written, so dE may alias E. */
    float *dR = m->gbuf[cb];
    const float *R = m->R;
    const size_t np = (size_t)round16(S + 1);
#pragma omp parallel for schedule(static) num_threads(model_buf_threads(m))
    for (int i = 0; i < n; i++) {
        /* the thread's tiles: g, then dt, which stays in L1 from row to
         * row (a (n, S + 1, d) array for it was 7 MB of fresh lines a
         * step, written and read back once) */
        float *tile = m->wgT[omp_get_thread_num()];
        interaction_bwd(S, d, R + (size_t)i * ldr, E + (size_t)i * rowE, dR + (size_t)i * ldr,
                        tile + np * np, dE + (size_t)i * rowE, tile);
    }

    /* Bottom MLP, last layer first; the top's input gradient dR carries d bot
     * in its first d columns (leading dimension d + P). */
    cur = dR;
    ldc = m->ldr;
    for (int l = nb - 1; l >= 0; l--) {
        const model_layer_t *L = &m->layers[l];
        const float *Ap = l == 0 ? X : m->act[l - 1];
        int lda = l == 0 ? m->F : m->layers[l - 1].out;
        float *dA = l == 0 ? NULL : m->gbuf[cb ^ 1];
        linear_bwd(m, n, L, Ap, lda, cur, ldc, dA, L->in, l > 0);
        cur = dA;
        ldc = L->in;
        cb ^= 1;
    }
}
