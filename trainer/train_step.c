/*
 * trainer/train_step.c - one training step: keys per table, dedupe, the lookup
 * exchange, forward and backward, the gradients of the unique keys as
 * double-double sums, the update exchange and the dense gradients summed
 * over the ranks through shard_comm.
 */
#include "train_int.h"

/* ---- one step ------------------------------------------------------------------------ */

/* Where each slot's keys go in its table's list: tn (keys per table),
 * slot_koff (slot s's first key in its table's list) and boff (the bag
 * offsets rebased to 0). */
void train_batch_layout(trainer_t *tr, const data_batch_t *b)
{
    const int n = b->n;
    for (int t = 0; t < tr->T; t++)
        tr->tn[t] = 0;
    for (int s = 0; s < tr->S; s++) {
        const int64_t *off = b->offsets + (int64_t)s * (n + 1);
        int t = tr->slot_table[s];
        tr->slot_koff[s] = tr->tn[t];
        tr->tn[t] += off[n] - off[0];
        int64_t *bo = tr->boff + (int64_t)s * (tr->max_batch + 1);
        for (int i = 0; i <= n; i++)
            bo[i] = off[i] - off[0];
    }
}

/* Dedupes table t's keys of the batch (tkeys[t], tn[t]): nuniq[t] and the
 * inverse index tinv[t], and the unique keys for the lookup. A
 * shard_keys_fn: each table has its own hash set, so tables dedupe side by
 * side. */
static int dedupe_table(void *ctx, int t, const int64_t **uniq, int64_t *nuniq)
{
    trainer_t *tr = ctx;
    int rc = shard_dedupe_run(tr->dedupe[t], tr->tkeys[t], tr->tn[t], tr->tinv[t], uniq, nuniq);
    tr->nuniq[t] = rc == 0 ? *nuniq : 0;
    if (rc < 0)
        return kiln_errf(rc, "out of memory deduplicating the batch's keys of table %d", t);
    return 0;
}

/* Collects each table's keys from its slots, dedupes them, and looks the
 * unique keys up on their owners. Fills the per-slot bag descriptors (host
 * arrays). */
int train_lookup_keys(trainer_t *tr, const data_batch_t *b, int64_t step, bool insert)
{
    const int n = b->n, S = tr->S, T = tr->T;
    train_batch_layout(tr, b);
    for (int t = 0; t < T; t++) {
        int64_t cap = tr->tkeys_cap[t];
        KILN_CHECK(kiln_grow_to((void **)&tr->tkeys[t], &tr->tkeys_cap[t], tr->tn[t],
                                sizeof(int64_t), 1024));
        if (tr->tkeys_cap[t] != cap) {
            int32_t *inv = kiln_reallocarray(tr->tinv[t], (size_t)tr->tkeys_cap[t], sizeof *inv);
            if (inv == NULL)
                return KILN_ENOMEM;
            tr->tinv[t] = inv;
        }
    }
    for (int s = 0; s < S; s++) {
        const int64_t *off = b->offsets + (int64_t)s * (n + 1);
        int64_t cnt = off[n] - off[0];
        if (cnt > 0) /* an empty column: the table may have no key buffer yet */
            memcpy(tr->tkeys[tr->slot_table[s]] + tr->slot_koff[s], b->keys + off[0],
                   (size_t)cnt * sizeof(int64_t));
    }
    float *const *values;
    KILN_CHECK(shard_lookup_fill(tr->shard, dedupe_table, tr, step, insert, &values));
    tr->tvalues = values;
    for (int s = 0; s < S; s++) {
        int t = tr->slot_table[s];
        tr->bags[s] = (kern_bags_t){
            .values = values[t],
            .capacity = tr->nuniq[t],
            .dim = tr->d,
            .combine = tr->combine[s],
            .offsets = tr->boff + (int64_t)s * (tr->max_batch + 1),
            .rows = tr->tinv[t] + tr->slot_koff[s],
            .out_col = (int64_t)s * tr->d,
        };
    }
    return 0;
}

/* train_lookup_keys, then the pooled vectors E on the CPU. */
int train_lookup_batch(trainer_t *tr, const data_batch_t *b, int64_t step, bool insert)
{
    KILN_CHECK(train_lookup_keys(tr, b, step, insert));
    if (b->n == 0) /* this rank has no rows in this step; it only served lookups */
        return 0;
    return kern_cpu_gather_combine(tr->S, tr->bags, b->n, (int64_t)tr->S * tr->d, tr->E);
}

/* The CPU step's sum over the ranks: on tr->comm. */
static int sum_dd_comm(trainer_t *tr, double *pairs, size_t npairs)
{
    return shard_comm_allreduce_sum_dd(tr->comm, pairs, npairs);
}

/* x with its bits ANDed with mask: x or +0.0, without a branch. */
static inline double and_bits(double x, uint64_t mask)
{
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    b &= mask;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* Adds slot bg's bag gradients (go: row i's d floats at go + i * ldE) into
 * its table's unique-key gradients g (nuniq, d, 2), double-double, in bag
 * order. Element-wise, so every vector width gives the scalar loop's bits
 * (KERN_CLONES). *next is the table's first unique key not met yet: the
 * dedupe numbers a table's keys in the order its slots' positions are
 * walked here (slot order, then bag order), so the position of a key's
 * first appearance has row == *next, and its sum starts there, written
 * as adding to zero would make it (TwoSum of (0, 0) and x is (0 + x, 0)):
 * g needs no zeroing first (the memset was 1.2% of the dlrm profile). */
/* Rows of dE ahead of the one being added whose slot gradients are
 * prefetched (wide rows only). A slot's gradients are a row of dE apart
 * (S d floats: 1768 bytes for fm), so the hardware's prefetcher, which
 * stays within a 4 KiB page, misses most of them; 16 ahead: fm's sums and
 * update 1.30x faster (8 ahead 1.19x, 32 the same as 16). lr's single
 * floats are 104 bytes apart, which the hardware follows: prefetching them
 * made lr's sums slower (315 -> 343 ms). */
#define GO_AHEAD 16
KERN_CLONES static void add_slot_grads(const kern_bags_t *bg, int n, int d, const float *go,
                                       int64_t ldE, double *g, int32_t *next)
{
    int32_t nx = *next;
    for (int64_t i = 0; i < n; i++, go += ldE) {
        const int64_t p0 = bg->offsets[i], p1 = bg->offsets[i + 1];
        const float sc = /* as kern_ops.h's kern_combine_scale */
            bg->combine == KERN_COMBINE_MEAN && p1 > p0 ? 1.0f / (float)(p1 - p0) : 1.0f;
        if (d == 1) {
            /* lr's width: a first position adds to (0, 0) instead of the
             * stale pair, chosen by a mask, not a branch: 4 positions in
             * 10 are first ones, in no order a predictor learns (lr's
             * gradient sums 1.4x faster). Wide rows keep the branch: their
             * stale pairs are cold, and a load of them would wait on
             * memory where the branch only stores. */
            for (int64_t p = p0; p < p1; p++) {
                const int32_t r = bg->rows[p];
                double *acc = g + 2 * (int64_t)r;
                const uint64_t keep = (uint64_t)(r == nx) - 1; /* 0 at a first */
                nx += r == nx;
                double hi = and_bits(acc[0], keep), lo = and_bits(acc[1], keep);
                kern_dd_add(&hi, &lo, (double)(go[0] * sc));
                acc[0] = hi;
                acc[1] = lo;
            }
            continue;
        }
        if (i + GO_AHEAD < n)
            for (int j = 0; j < d; j += 16)
                __builtin_prefetch(go + GO_AHEAD * ldE + j);
        for (int64_t p = p0; p < p1; p++) {
            const int32_t r = bg->rows[p];
            double *acc = g + 2 * (int64_t)r * d;
            if (r == nx) {
                nx++;
#pragma omp simd
                for (int j = 0; j < d; j++) {
                    acc[2 * j] = 0.0 + (double)(go[j] * sc);
                    acc[2 * j + 1] = 0.0;
                }
                continue;
            }
#pragma omp simd
            for (int j = 0; j < d; j++)
                kern_dd_add(&acc[2 * j], &acc[2 * j + 1], (double)(go[j] * sc));
        }
    }
    *next = nx;
}

/* The step's batch, for fill_table_grads. */
typedef struct {
    trainer_t *tr;
    int n;
} fill_ctx_t;

/* Bag gradients (the backward's dE, in tr->E) -> the gradients of table
 * t's unique keys, g (nuniq[t], d, 2), scattered by the dedupe's inverse
 * index (bags[s].rows are indices into the table's unique keys, so no sort
 * is needed). A table sums its slots in slot order and each slot in bag
 * order, and shard_update_fill runs tables side by side, so the sums do
 * not depend on the thread count. A shard_fill_fn. */
static void fill_table_grads(void *ctx, int t, double *g)
{
    const fill_ctx_t *c = ctx;
    const trainer_t *tr = c->tr;
    const int d = tr->d;
    const int64_t ldE = (int64_t)tr->S * d;
    int32_t next = 0; /* every unique key's first position sets its sum */
    for (int s = 0; s < tr->S; s++)
        if (tr->slot_table[s] == t)
            add_slot_grads(&tr->bags[s], c->n, d, tr->E + (int64_t)s * d, ldE, g, &next);
}

/* One training step. global_n is the rows of all ranks in this step. */
int train_step(trainer_t *tr, const data_batch_t *b, int64_t step, int64_t global_n,
               double *loss_sum)
{
    const int n = b->n;
    KILN_CHECK(train_lookup_batch(tr, b, step, true));
    KILN_CHECK(model_forward(tr->model, n, tr->E, b->dense, b->labels, NULL, loss_sum));
    /* dE replaces E: the pooled vectors are not needed after forward. */
    KILN_CHECK(model_backward(tr->model, 1.0f / (float)global_n, tr->E));

    fill_ctx_t fc = {tr, n};
    KILN_CHECK(shard_update_fill(tr->shard, fill_table_grads, &fc, &tr->sparse_opt, step));
    return train_dense_update(tr, sum_dd_comm);
}

/* The dense gradients summed over the ranks, then the dense optimizer step. */
int train_dense_update(trainer_t *tr, train_sum_dd_fn sum)
{
    /* Double-double sums over the ranks too; model_step rounds them once. */
    double *g = model_grads(tr->model), *gl = model_grads_lo(tr->model);
    size_t np = model_nparams(tr->model);
    if (tr->nranks > 1) {
        double *pair = tr->dense_pairs; /* (np, 2) */
        for (size_t i = 0; i < np; i++) {
            pair[2 * i] = g[i];
            pair[2 * i + 1] = gl[i];
        }
        KILN_CHECK(sum(tr, pair, np));
        for (size_t i = 0; i < np; i++) {
            g[i] = pair[2 * i];
            gl[i] = pair[2 * i + 1];
        }
    }
    KILN_CHECK(model_step(tr->model));
    model_zero_grad(tr->model);
    return 0;
}
