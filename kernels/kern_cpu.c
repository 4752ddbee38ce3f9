/*
 * kernels/kern_cpu.c - the CPU backend of the fused step ops: gather+combine
 * per bag over all tables, the backward reduce of bag gradients to unique
 * rows, and the sparse optimizer update. C11 + OpenMP; the per-element math
 * comes from kern_ops.h, shared with kern_cuda.cu. This file is the
 * readable reference the CUDA backend is checked against.
 *
 * Parallel schedule: forward over blocks of bags, handed out dynamically
 * (each thread owns whole output rows and walks its block table by table,
 * prefetching ahead), backward over unique rows after a serial stable radix
 * sort of the (row, position) pairs (no atomics; each row's sum runs in bag
 * order, so the result does not depend on the thread count), update over
 * unique rows.
 */
#include "kern.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kern_ops.h"

/* Checks what every op needs of a table's batch. */
static int check_bags(int ntables, const kern_bags_t *bags, int64_t nbags,
                      int64_t out_stride)
{
    if (ntables < 0 || nbags < 0 || (ntables > 0 && !bags))
        return kiln_errf(KILN_EINVAL, "gather: bad table count %d or bag count %lld", ntables,
                         (long long)nbags);
    for (int t = 0; t < ntables; t++) {
        const kern_bags_t *g = &bags[t];
        if (!g->offsets || g->dim < 1 || g->out_col < 0 || g->out_col + g->dim > out_stride)
            return kiln_errf(KILN_EINVAL,
                             "gather: table %d has no offsets, dim %d, or columns "
                             "[%lld, %lld) outside the output stride %lld",
                             t, g->dim, (long long)g->out_col,
                             (long long)(g->out_col + g->dim), (long long)out_stride);
        if (g->offsets[0] != 0)
            return kiln_errf(KILN_EINVAL, "gather: table %d offsets must start at 0", t);
        /* A table whose bags are all empty (a column empty in every row of
         * the batch) reads no rows: it needs no slab, and gives zeros. */
        if (g->offsets[nbags] > 0 && (!g->values || !g->rows))
            return kiln_errf(KILN_EINVAL, "gather: table %d has %lld positions but no slab "
                             "or row ids", t, (long long)g->offsets[nbags]);
    }
    return 0;
}

/* ---- forward ------------------------------------------------------------------ */

/* Bags per block: a thread takes a block of bags and walks it table by
 * table, so a table's descriptor is read once per block, its row ids are
 * read in order and the rows of the next few positions are prefetched.
 * Long runs through one table are faster (measured with bench/lookup_bench:
 * 256 bags ahead of 16-64), but a block is never more than a quarter of
 * a thread's share, so that small batches still spread over the team. */
#define GATHER_BLOCK_MAX 256
#define GATHER_BLOCK_MIN 16
/* Positions ahead of the one being combined whose rows are prefetched. */
#define GATHER_AHEAD 8

/* out[0..dim) = the combined rows rows[s..e) of values; returns 1 when a row
 * id is outside [0, cap), 0 otherwise. A one-row bag is a copy (its mean is
 * itself); otherwise the rows are summed in order from zero, then scaled
 * (mean), so every path gives the same bits. Always inlined, so that a call
 * with a constant dim (the models' default widths) compiles to fixed-width
 * code: the copy becomes a few moves instead of a libc memmove call (8.6%
 * of an fm run at width 17 when it was one). */
__attribute__((always_inline)) static inline int
combine_bag(const float *restrict values, int64_t cap, int dim, int combine,
            const int32_t *restrict rows, int64_t s, int64_t e, float *restrict o)
{
    if (e == s + 1 && rows[s] >= 0 && rows[s] < cap) {
        memcpy(o, values + (size_t)rows[s] * (size_t)dim, sizeof(float) * (size_t)dim);
        return 0;
    }
    int bad = 0;
    for (int j = 0; j < dim; j++)
        o[j] = 0.0f;
    for (int64_t p = s; p < e; p++) {
        const int32_t r = rows[p];
        if (r < 0 || r >= cap) {
            bad = 1;
            continue;
        }
        const float *restrict v = values + (size_t)r * (size_t)dim;
#pragma omp simd
        for (int j = 0; j < dim; j++)
            o[j] += v[j];
    }
    if (combine == KERN_COMBINE_MEAN && e > s) {
        const float sc = kern_combine_scale(combine, e - s);
#pragma omp simd
        for (int j = 0; j < dim; j++)
            o[j] *= sc;
    }
    return bad;
}

int kern_cpu_gather_combine(int ntables, const kern_bags_t *bags, int64_t nbags,
                            int64_t out_stride, float *out /* OUT (nbags, out_stride) */)
{
    KILN_CHECK(check_bags(ntables, bags, nbags, out_stride));
    int bad = 0;
    int64_t block = nbags / (4 * (int64_t)omp_get_max_threads());
    if (block > GATHER_BLOCK_MAX)
        block = GATHER_BLOCK_MAX;
    if (block < GATHER_BLOCK_MIN)
        block = GATHER_BLOCK_MIN;
    const int64_t nblocks = (nbags + block - 1) / block;

    /* Blocks are handed out as threads come for them: after a loop over
     * tables a thread may come late (woken from sleep), and the others
     * take its share instead of waiting for it. Each block writes its own
     * rows, so the output does not depend on who took it. */
#pragma omp parallel for schedule(dynamic, 1) reduction(| : bad)
    for (int64_t blk = 0; blk < nblocks; blk++) {
        const int64_t b0 = blk * block;
        const int64_t b1 = b0 + block < nbags ? b0 + block : nbags;
        for (int t = 0; t < ntables; t++) {
            const kern_bags_t *g = &bags[t];
            const float *restrict values = g->values;
            const int32_t *restrict rows = g->rows;
            const int64_t *restrict offsets = g->offsets;
            const int64_t cap = g->capacity;
            const int dim = g->dim, combine = g->combine;
            float *restrict o = out + b0 * out_stride + g->out_col; /* (dim) per bag */
            /* The positions of this block; prefetch the first few rows. */
            const int64_t p0 = offsets[b0], p1 = offsets[b1];
            for (int64_t p = p0; p < p1 && p < p0 + GATHER_AHEAD; p++)
                if ((uint32_t)rows[p] < (uint64_t)cap)
                    __builtin_prefetch(values + (size_t)rows[p] * (size_t)dim);
            for (int64_t b = b0; b < b1; b++, o += out_stride) {
                const int64_t s = offsets[b], e = offsets[b + 1];
                /* Start the rows GATHER_AHEAD positions past this bag. */
                for (int64_t p = s + GATHER_AHEAD; p < e + GATHER_AHEAD && p < p1; p++)
                    if ((uint32_t)rows[p] < (uint64_t)cap)
                        __builtin_prefetch(values + (size_t)rows[p] * (size_t)dim);
                if (e < s) {
                    for (int j = 0; j < dim; j++)
                        o[j] = 0.0f;
                    bad = 1;
                    continue;
                }
                /* The default widths as constants: lr's 1, dlrm's 16, fm's 16 + 1. */
                switch (dim) {
                case 1:
                    bad |= combine_bag(values, cap, 1, combine, rows, s, e, o);
                    break;
                case 16:
                    bad |= combine_bag(values, cap, 16, combine, rows, s, e, o);
                    break;
                case 17:
                    bad |= combine_bag(values, cap, 17, combine, rows, s, e, o);
                    break;
                default:
                    bad |= combine_bag(values, cap, dim, combine, rows, s, e, o);
                }
            }
        }
    }
    if (bad)
        return kiln_errf(KILN_EINVAL, "gather: a bag has decreasing offsets or a row id "
                         "outside its table's slab");
    return 0;
}

/* ---- backward ------------------------------------------------------------------- */

/* Stable LSD radix sort of positions idx[n] by rows[idx], 8 bits a pass,
 * only as many passes as the largest row needs. tmp is scratch (n). */
static int64_t *radix_sort_positions(const int32_t *rows, int64_t n, int32_t maxrow,
                                     int64_t *idx, int64_t *tmp)
{
    int64_t count[256];
    for (int shift = 0; shift < 32 && (maxrow >> shift) > 0; shift += 8) {
        memset(count, 0, sizeof count);
        for (int64_t i = 0; i < n; i++)
            count[((uint32_t)rows[idx[i]] >> shift) & 0xff]++;
        int64_t sum = 0;
        for (int d = 0; d < 256; d++) {
            int64_t c = count[d];
            count[d] = sum;
            sum += c;
        }
        for (int64_t i = 0; i < n; i++)
            tmp[count[((uint32_t)rows[idx[i]] >> shift) & 0xff]++] = idx[i];
        int64_t *sw = idx;
        idx = tmp;
        tmp = sw;
    }
    return idx;
}

static int reduce_table(const kern_bags_t *g, int64_t nbags, int64_t out_stride,
                        const float *grad_out, kern_row_grads_t *gr)
{
    int rc = 0;
    const int64_t nnz = g->offsets[nbags];
    const int dim = g->dim;
    int64_t *bag_of = NULL, *idx = NULL, *tmp = NULL, *seg = NULL;
    gr->n = 0;
    if (nnz == 0)
        return 0;
    bag_of = kiln_malloc(sizeof(int64_t) * (size_t)nnz);
    idx = kiln_malloc(sizeof(int64_t) * (size_t)nnz);
    tmp = kiln_malloc(sizeof(int64_t) * (size_t)nnz);
    seg = kiln_malloc(sizeof(int64_t) * (size_t)(nnz + 1));
    if (!bag_of || !idx || !tmp || !seg) {
        rc = KILN_ENOMEM;
        goto out;
    }

    int bad = 0;
    int32_t maxrow = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) reduction(max : maxrow)
    for (int64_t b = 0; b < nbags; b++) {
        if (g->offsets[b + 1] < g->offsets[b])
            bad = 1;
        for (int64_t p = g->offsets[b]; p < g->offsets[b + 1]; p++) {
            bag_of[p] = b;
            idx[p] = p;
            if (g->rows[p] < 0 || g->rows[p] >= g->capacity)
                bad = 1;
            else if (g->rows[p] > maxrow)
                maxrow = g->rows[p];
        }
    }
    if (bad) {
        rc = kiln_errf(KILN_EINVAL, "backward: a bag has decreasing offsets or a row id "
                       "outside its table's slab");
        goto out;
    }

    int64_t *sorted = radix_sort_positions(g->rows, nnz, maxrow, idx, tmp);
    int64_t nu = 0;
    for (int64_t i = 0; i < nnz; i++)
        if (i == 0 || g->rows[sorted[i]] != g->rows[sorted[i - 1]])
            seg[nu++] = i;
    seg[nu] = nnz;

#pragma omp parallel for schedule(static)
    for (int64_t u = 0; u < nu; u++) {
        float *restrict acc = gr->grads + (size_t)u * (size_t)dim; /* (dim) */
        for (int j = 0; j < dim; j++)
            acc[j] = 0.0f;
        gr->rows[u] = g->rows[sorted[seg[u]]];
        for (int64_t i = seg[u]; i < seg[u + 1]; i++) {
            const int64_t b = bag_of[sorted[i]];
            const float sc = kern_combine_scale(g->combine, g->offsets[b + 1] - g->offsets[b]);
            const float *restrict go = grad_out + b * out_stride + g->out_col;
#pragma omp simd
            for (int j = 0; j < dim; j++)
                acc[j] += go[j] * sc;
        }
    }
    gr->n = nu;
out:
    KILN_FREE_ALL(bag_of, idx, tmp, seg);
    return rc;
}

int kern_cpu_backward_reduce(int ntables, const kern_bags_t *bags, int64_t nbags,
                             int64_t out_stride, const float *grad_out,
                             kern_row_grads_t *grads /* OUT (ntables) */)
{
    KILN_CHECK(check_bags(ntables, bags, nbags, out_stride));
    for (int t = 0; t < ntables; t++) {
        if (bags[t].offsets[nbags] > 0 && (!grads[t].rows || !grads[t].grads))
            return kiln_errf(KILN_EINVAL, "backward: table %d has no output arrays", t);
        KILN_CHECK(reduce_table(&bags[t], nbags, out_stride, grad_out, &grads[t]));
    }
    return 0;
}

/* ---- sparse optimizer update ------------------------------------------------------ */

/* Checks that table t's update rows lie in its slab and that the slab
 * carries the optimizer's state. Returns 0 or KILN_EINVAL. */
static int check_update(const kern_opt_t *opt, const kern_slab_t *s, const kern_row_grads_t *g,
                        int t)
{
    KILN_CHECK(kern_slab_check_opt(s, opt->kind, t, "update"));
    for (int64_t i = 0; i < g->n; i++)
        if (g->rows[i] < 0 || g->rows[i] >= s->capacity)
            return kiln_errf(KILN_EINVAL, "update: table %d row %d is outside its slab", t,
                             g->rows[i]);
    return 0;
}

/* The optimizer step of update rows [i0, i1) of g on slab s. */
static inline void update_rows(const kern_opt_t *opt, const kern_slab_t *s,
                               const kern_row_grads_t *g, int64_t i0, int64_t i1, int64_t step)
{
    const float lr = opt->lr, eps = opt->eps, b1 = opt->beta1, b2 = opt->beta2;
    const size_t dim = (size_t)s->dim;
    for (int64_t i = i0; i < i1; i++) {
        const size_t r = (size_t)g->rows[i];
        float *restrict w = s->values + r * dim;               /* (dim) */
        const float *restrict gi = g->grads + (size_t)i * dim; /* (dim) */
        if (opt->kind == KERN_OPT_SGD) {
#pragma omp simd
            for (size_t j = 0; j < dim; j++)
                kern_sgd_elem(&w[j], gi[j], lr);
        } else if (opt->kind == KERN_OPT_ADAGRAD) {
            float *restrict acc = s->opt_state + r * dim;
#pragma omp simd
            for (size_t j = 0; j < dim; j++)
                kern_adagrad_elem(&w[j], &acc[j], gi[j], lr, eps);
        } else {
            float *restrict m = s->opt_state + r * 2 * dim;
            float *restrict v = m + dim;
            const uint32_t tt = ++s->opt_steps[r];
            const float bc1 = kern_adam_bias(b1, tt), bc2 = kern_adam_bias(b2, tt);
#pragma omp simd
            for (size_t j = 0; j < dim; j++)
                kern_adam_elem(&w[j], &m[j], &v[j], gi[j], lr, b1, b2, eps, bc1, bc2);
        }
        s->stamps[r] = step;
    }
}

int kern_cpu_sparse_update(const kern_opt_t *opt, int ntables, const kern_slab_t *slabs,
                           const kern_row_grads_t *grads, int64_t step)
{
    for (int t = 0; t < ntables; t++)
        KILN_CHECK(check_update(opt, &slabs[t], &grads[t], t));
    /* One parallel region for all tables; a table's rows are unique and
     * tables are independent, so threads go on to the next table without
     * waiting (nowait). */
#pragma omp parallel
    for (int t = 0; t < ntables; t++) {
#pragma omp for schedule(static) nowait
        for (int64_t i = 0; i < grads[t].n; i++)
            update_rows(opt, &slabs[t], &grads[t], i, i + 1, step);
    }
    return 0;
}

int kern_cpu_sparse_update_table(const kern_opt_t *opt, int t, const kern_slab_t *slab,
                                 const kern_row_grads_t *grads, int64_t step)
{
    KILN_CHECK(check_update(opt, slab, grads, t));
    update_rows(opt, slab, grads, 0, grads->n, step);
    return 0;
}
