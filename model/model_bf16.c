/*
 * model/model_bf16.c - dlrm's MLP GEMMs in bf16 (model.dense_precision:
 * bf16): both operands rounded to bfloat16 (round to nearest even), the
 * products summed in float32 and written as float32, by oneDNN's matmul,
 * which runs AMX tiles or AVX512_BF16 dot products where the CPU has them.
 * Only the multiplications change: the parameters, the gradients (float64
 * sums, model_blas.c), the optimizer state and the checkpoints stay as
 * they are in fp32, so a checkpoint does not know which precision wrote it.
 *
 * What is rounded, and when (nothing is allocated after model_bf16_create):
 *   the parameters   once after each optimizer step (model_step), or at
 *                    the next forward after a load or a write through
 *                    model_params: bf->w (nparams), same offsets;
 *   a layer's input  once per forward, into the layer's bf_in (rows, in),
 *                    which the backward's weight gradient reads again;
 *   a layer's output gradient  once per backward, into bf->dy (rows, out),
 *                    read by the input gradient and the weight gradient.
 *
 * The blocks are model_blas.c's, for the same reason (a row's result must
 * not depend on how a batch is split over ranks): per-row products in calls
 * of exactly row_block rows, the short last block zero-padded (the rounded
 * copies have rows = max_batch rounded up to row_block, the padding zero);
 * weight gradients as 256-row blocks added into float64, the rows after the
 * last whole block (and every row where model_blas.c uses no blocks) in
 * float64 from the float32 operands. Each block is one matmul on one
 * OpenMP thread: oneDNN sees it is inside a parallel region and stays on
 * that thread, as OpenBLAS does with one thread. A call from outside a
 * parallel region is made with the thread count set to 1, and the
 * primitives are made so too: oneDNN would otherwise split a product over
 * threads (the sum over K too, for small outputs) and round it differently
 * from the same product on one thread.
 *
 * One primitive per shape, made by model_bf16_create, with the scratchpad
 * owned here (one buffer per thread) so that executing allocates nothing;
 * memory objects are per primitive and thread, their data handles set per
 * call.
 */
#define MODEL_IMPL
#include "model.h"

#include <dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per layer: forward, forward into a dense block, input gradient, weight
 * gradient. */
enum { MM_MAX = 4 * 2 * MODEL_MAX_LAYERS };

typedef struct {
    dnnl_primitive_t p;
    dnnl_memory_desc_t md[4]; /* src, weights, dst, scratchpad */
    size_t pad_bytes;
    int ldc;                  /* the dst's leading dimension */
    dnnl_memory_t *mem;       /* (nt, 4): each thread's src, weights, dst, scratchpad */
} mm_t;

struct model_bf16 {
    dnnl_engine_t eng;
    dnnl_stream_t *strm; /* (nt) */
    int nt;              /* threads: m->wgT_n */
    mm_t mm[MM_MAX];
    int nmm;
    uint16_t *w;     /* (nparams) the parameters, rounded */
    uint16_t *dy;    /* (rows, maxw) an output gradient, rounded */
    float **out;     /* (nt) each thread's (row_block, maxw) output block */
    void **scratch;  /* (nt) scratchpads of pad_bytes (the largest) */
    size_t pad_bytes;
    char impl[64];   /* oneDNN's implementation of the first matmul: "brg:avx512_core_bf16" */
};

static inline uint16_t bf16_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    /* NaN stays NaN (the carry would make a small-payload NaN infinite). */
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static size_t padded_rows(const model_t *m)
{
    const size_t RB = (size_t)m->row_block;
    return ((size_t)m->max_batch + RB - 1) / RB * RB;
}

/* ---- the primitives ------------------------------------------------------------- */

/* A matmul C (M, N; ldc) float32 = A (M, K) B (K, N), A and B bf16 with the
 * strides given. Returns its index in bf->mm, or KILN_EINVAL when oneDNN
 * cannot make it. */
static int mm_make(model_bf16_t *bf, int M, int N, int K, dnnl_dim_t as0, dnnl_dim_t as1,
                   dnnl_dim_t bs0, dnnl_dim_t bs1, int ldc)
{
    if (bf->nmm >= MM_MAX)
        return kiln_errf(KILN_EINVAL, "bf16: more than %d matmul shapes", MM_MAX);
    mm_t *x = &bf->mm[bf->nmm];
    const dnnl_dims_t ad = {M, K}, bd = {K, N}, cd = {M, N};
    const dnnl_dims_t ast = {as0, as1}, bst = {bs0, bs1}, cst = {ldc, 1};
    dnnl_matmul_desc_t d;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st = dnnl_memory_desc_init_by_strides(&x->md[0], 2, ad, dnnl_bf16, ast);
    if (st == dnnl_success)
        st = dnnl_memory_desc_init_by_strides(&x->md[1], 2, bd, dnnl_bf16, bst);
    if (st == dnnl_success)
        st = dnnl_memory_desc_init_by_strides(&x->md[2], 2, cd, dnnl_f32, cst);
    if (st == dnnl_success)
        st = dnnl_matmul_desc_init(&d, &x->md[0], &x->md[1], NULL, &x->md[2]);
    if (st == dnnl_success)
        st = dnnl_primitive_attr_create(&attr);
    if (st == dnnl_success)
        st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (st == dnnl_success)
        st = dnnl_primitive_desc_create(&pd, &d, attr, bf->eng, NULL);
    if (st == dnnl_success) {
        x->md[3] = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        x->pad_bytes = dnnl_memory_desc_get_size(&x->md[3]);
        const char *impl = NULL;
        if (bf->impl[0] == '\0' &&
            dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
            impl != NULL)
            snprintf(bf->impl, sizeof bf->impl, "%s", impl);
        st = dnnl_primitive_create(&x->p, pd);
    }
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success)
        return kiln_errf(KILN_EINVAL,
                         "bf16: oneDNN cannot make a bf16 matmul of %d x %d x %d (status %d); "
                         "use model.dense_precision: fp32",
                         M, N, K, (int)st);
    x->ldc = ldc;
    if (x->pad_bytes > bf->pad_bytes)
        bf->pad_bytes = x->pad_bytes;
    return bf->nmm++;
}

/* Each thread's memory objects of every primitive, over its scratchpad. */
static int mm_bind(model_bf16_t *bf)
{
    for (int t = 0; t < bf->nt; t++)
        if (!(bf->scratch[t] = kiln_malloc(bf->pad_bytes ? bf->pad_bytes : 1)))
            return KILN_ENOMEM;
    for (int i = 0; i < bf->nmm; i++) {
        mm_t *x = &bf->mm[i];
        if (!(x->mem = kiln_calloc((size_t)bf->nt * 4, sizeof *x->mem)))
            return KILN_ENOMEM;
        for (int t = 0; t < bf->nt; t++)
            for (int a = 0; a < 4; a++) {
                void *h = a == 3 ? bf->scratch[t] : DNNL_MEMORY_NONE;
                if (a == 3 && x->pad_bytes == 0)
                    continue;
                if (dnnl_memory_create(&x->mem[t * 4 + a], &x->md[a], bf->eng, h) != dnnl_success)
                    return kiln_errf(KILN_ENOMEM, "bf16: oneDNN cannot make a memory object");
            }
    }
    return 0;
}

/* C = A B with primitive i on this thread. */
static void mm_run(model_bf16_t *bf, int i, const void *A, const void *B, float *C)
{
    const int t = omp_get_thread_num();
    mm_t *x = &bf->mm[i];
    dnnl_memory_t *mem = x->mem + (size_t)t * 4;
    dnnl_memory_set_data_handle(mem[0], (void *)A);
    dnnl_memory_set_data_handle(mem[1], (void *)B);
    dnnl_memory_set_data_handle(mem[2], C);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, mem[0]},
                               {DNNL_ARG_WEIGHTS, mem[1]},
                               {DNNL_ARG_DST, mem[2]},
                               {DNNL_ARG_SCRATCHPAD, mem[3]}};
    const int team = omp_in_parallel() ? 0 : omp_get_max_threads();
    if (team > 1)
        omp_set_num_threads(1);
    dnnl_primitive_execute(x->p, bf->strm[t], x->pad_bytes ? 4 : 3, args);
    dnnl_stream_wait(bf->strm[t]);
    if (team > 1)
        omp_set_num_threads(team);
}

static int create(model_t *m);

int model_bf16_create(model_t *m)
{
    /* The primitives are made for one thread (the file's opening). */
    const int team = omp_get_max_threads();
    omp_set_num_threads(1);
    const int rc = create(m);
    omp_set_num_threads(team);
    return rc;
}

static int create(model_t *m)
{
    model_bf16_t *bf = kiln_calloc(1, sizeof *bf);
    if (!bf)
        return KILN_ENOMEM;
    m->bf = bf;
    bf->nt = m->wgT_n;
    const int RB = m->row_block, nl = m->nbottom + m->ntop;
    const size_t rows = padded_rows(m);
    if (dnnl_engine_create(&bf->eng, dnnl_cpu, 0) != dnnl_success)
        return kiln_errf(KILN_EINVAL, "bf16: oneDNN has no CPU engine");
    if (!(bf->strm = kiln_calloc((size_t)bf->nt, sizeof *bf->strm)) ||
        !(bf->scratch = kiln_calloc((size_t)bf->nt, sizeof *bf->scratch)) ||
        !(bf->out = kiln_calloc((size_t)bf->nt, sizeof *bf->out)))
        return KILN_ENOMEM;
    for (int t = 0; t < bf->nt; t++)
        if (!(bf->out[t] = kiln_calloc((size_t)RB * (size_t)m->maxw, sizeof(float))))
            return KILN_ENOMEM;
    for (int t = 0; t < bf->nt; t++)
        if (dnnl_stream_create(&bf->strm[t], bf->eng, dnnl_stream_default_flags) != dnnl_success)
            return kiln_errf(KILN_EINVAL, "bf16: oneDNN cannot make a CPU stream");
    for (int l = 0; l < nl; l++) {
        model_layer_t *L = &m->layers[l];
        const int in = L->in, out = L->out;
        /* Y (RB, out) = A (RB, in) W^T: W (out, in) read as (in, out). Into a
         * dense block always: with the leading dimension of R (the last
         * bottom layer's output) oneDNN 2.6 gives up its brgemm kernel for a
         * far slower one (gemm:jit, 0.2 ms for a 256 x 16 x 64 block), and
         * a copy of 16 columns costs nothing beside it. */
        int rc;
        KILN_CHECK(rc = mm_make(bf, RB, out, in, in, 1, 1, in, out));
        L->mm_fwd = rc;
        /* dA (RB, in) = dY (RB, out) W (out, in); the first layer has no dA */
        L->mm_bwd = -1;
        if (l > 0) {
            KILN_CHECK(rc = mm_make(bf, RB, in, out, out, 1, in, 1, in));
            L->mm_bwd = rc;
        }
        /* dW block (out, in) = dY^T (out, 256) A (256, in) */
        L->mm_wg = -1;
        if (model_grad_blocked(m, out, in)) {
            KILN_CHECK(rc = mm_make(bf, out, in, MODEL_GRAD_BLOCK, 1, out, in, 1, in));
            L->mm_wg = rc;
        }
        if (!(L->bf_in = kiln_calloc(rows * (size_t)in, sizeof(uint16_t))))
            return KILN_ENOMEM;
    }
    if (!(bf->w = kiln_calloc(m->nparams ? m->nparams : 1, sizeof(uint16_t))) ||
        !(bf->dy = kiln_calloc(rows * (size_t)m->maxw, sizeof(uint16_t))))
        return KILN_ENOMEM;
    KILN_CHECK(mm_bind(bf));
    m->bf_stale = 1;
    return 0;
}

void model_bf16_destroy(model_t *m)
{
    model_bf16_t *bf = m->bf;
    for (int l = 0; l < m->nbottom + m->ntop; l++) {
        free(m->layers[l].bf_in);
        m->layers[l].bf_in = NULL;
    }
    if (!bf)
        return;
    for (int i = 0; i < bf->nmm; i++) {
        for (int k = 0; bf->mm[i].mem && k < bf->nt * 4; k++)
            dnnl_memory_destroy(bf->mm[i].mem[k]);
        free(bf->mm[i].mem);
        dnnl_primitive_destroy(bf->mm[i].p);
    }
    for (int t = 0; t < bf->nt; t++) {
        if (bf->strm)
            dnnl_stream_destroy(bf->strm[t]);
        if (bf->scratch)
            free(bf->scratch[t]);
        if (bf->out)
            free(bf->out[t]);
    }
    dnnl_engine_destroy(bf->eng);
    KILN_FREE_ALL(bf->strm, bf->scratch, bf->out, bf->w, bf->dy);
    free(bf);
    m->bf = NULL;
}

void model_bf16_describe(const model_t *m, char *buf, size_t cap)
{
    if (!m->bf) {
        snprintf(buf, cap, "%s", "");
        return;
    }
    const dnnl_version_t *v = dnnl_version();
    snprintf(buf, cap, "oneDNN %d.%d %s", v->major, v->minor, m->bf->impl);
}

/* ---- rounding ------------------------------------------------------------------- */

void model_bf16_round_rows(const model_t *m, int n, int cols, const float *src, int ld,
                        uint16_t *dst)
{
    const size_t RB = (size_t)m->row_block, c = (size_t)cols;
    const size_t rows = ((size_t)n + RB - 1) / RB * RB;
#pragma omp parallel for schedule(static) if ((int64_t)n * cols >= 65536 && !omp_in_parallel())
    for (int i = 0; i < n; i++) {
        const float *s = src + (size_t)i * (size_t)ld;
        uint16_t *d = dst + (size_t)i * c;
#pragma omp simd
        for (int j = 0; j < cols; j++)
            d[j] = bf16_round(s[j]);
    }
    memset(dst + (size_t)n * c, 0, (rows - (size_t)n) * c * sizeof(uint16_t));
}

void model_bf16_sync_weights(model_t *m)
{
    const long P = (long)m->nparams;
    uint16_t *w = m->bf->w;
    const float *p = m->params;
#pragma omp parallel for simd schedule(static) if (P >= 65536 && !omp_in_parallel())
    for (long i = 0; i < P; i++)
        w[i] = bf16_round(p[i]);
    m->bf_stale = 0;
}

uint16_t *model_bf16_dy(model_t *m)
{
    return m->bf->dy;
}

/* ---- the products --------------------------------------------------------------- */

/* C (n, nn; ldc) = rows of A times B by primitive mm (a dense (RB, nn)
 * output), in row_block blocks: A (rows, k) bf16, zero past n. A block
 * goes straight into C when C is dense and the block whole, else into the
 * thread's own block and its rows are copied. */
static void rows_run(model_t *m, int n, int mm, int nn, int k, const uint16_t *A,
                     const uint16_t *B, float *C, int ldc)
{
    model_bf16_t *bf = m->bf;
    const int RB = m->row_block;
    const int direct = ldc == nn ? n / RB : 0, nblk = (n + RB - 1) / RB;
#pragma omp parallel for schedule(static) num_threads(bf->nt) if (nblk > 1 && !omp_in_parallel())
    for (int blk = 0; blk < nblk; blk++) {
        const size_t r0 = (size_t)blk * (size_t)RB;
        const uint16_t *a = A + r0 * (size_t)k;
        if (blk < direct) {
            mm_run(bf, mm, a, B, C + r0 * (size_t)ldc);
            continue;
        }
        float *c = bf->out[omp_get_thread_num()];
        const int rows = n - (int)r0 < RB ? n - (int)r0 : RB;
        mm_run(bf, mm, a, B, c);
        for (int i = 0; i < rows; i++)
            memcpy(C + (r0 + (size_t)i) * (size_t)ldc, c + (size_t)i * (size_t)nn,
                   sizeof(float) * (size_t)nn);
    }
}

void model_bf16_fwd(model_t *m, int n, const model_layer_t *L, float *Y, int ldy)
{
    rows_run(m, n, L->mm_fwd, L->out, L->in, L->bf_in, m->bf->w + L->w_off, Y, ldy);
}

void model_bf16_bwd_input(model_t *m, int n, const model_layer_t *L, const uint16_t *dYb,
                       float *dA, int ldda)
{
    rows_run(m, n, L->mm_bwd, L->in, L->out, dYb, m->bf->w + L->w_off, dA, ldda);
}

void model_bf16_grad_block(model_t *m, const model_layer_t *L, const uint16_t *dYb, size_t r0,
                        float *t)
{
    mm_run(m->bf, L->mm_wg, dYb + r0 * (size_t)L->out, L->bf_in + r0 * (size_t)L->in, t);
}
