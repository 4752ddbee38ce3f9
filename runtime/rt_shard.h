/*
 * runtime/rt_shard.h - model-parallel embedding tables across MPI ranks.
 *
 * Key k of table t lives on rank rt_shard_owner(k, nranks). A training step
 * asks for the rows of the unique keys its batch uses, table by table:
 *
 *   rt_shard_lookup()  ONE all-to-all carries the keys of all tables to their
 *                      owners, which find-or-insert them; ONE all-to-all
 *                      carries the rows back.
 *   rt_shard_update()  ONE all-to-all carries the gradients of those rows to
 *                      the owners, which sum duplicates (in source-rank
 *                      order, so the result is deterministic) and apply the
 *                      fused sparse optimizer update to all tables at once.
 *
 * (Each all-to-all is preceded by a tiny MPI_Alltoall of per-table counts.)
 * The caller dedupes keys per table first (rt_dedupe_*), so the exchange
 * moves each key once per step and rank.
 */
#ifndef KILN_RUNTIME_RT_SHARD_H
#define KILN_RUNTIME_RT_SHARD_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "kern.h"
#include "rt_store.h"

/* ---- per-table dedupe ------------------------------------------------------
 * A reusable hash set: unique keys of a batch, in first-seen order, and for
 * every input key the index of its unique key. */
typedef struct rt_dedupe rt_dedupe_t;

int rt_dedupe_create(rt_dedupe_t **out /* OUT */);
void rt_dedupe_destroy(rt_dedupe_t *d);
/* keys (n) -> uniq (*nuniq, owned by d, valid until the next call) and
 * inverse (n): keys[i] == uniq[inverse[i]]. Returns 0 or KILN_ENOMEM. */
int rt_dedupe_run(rt_dedupe_t *d, const int64_t *keys, int64_t n, int32_t *inverse /* OUT (n) */,
                  const int64_t **uniq /* OUT */, int64_t *nuniq /* OUT */);

/* The rank that owns key among nranks. */
static inline int rt_shard_owner(int64_t key, int nranks)
{
    uint64_t x = (uint64_t)key;
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ULL;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dULL;
    x ^= x >> 33;
    return (int)((x >> 16) % (uint64_t)nranks);
}

/* ---- capacity ------------------------------------------------------------------
 * A table's capacity (the spec's model.embedding.capacity or its own) is
 * job-wide: rank r keeps at most its share, floor(C / nranks), plus one for
 * the first C % nranks ranks, so the shares add up to C exactly and the job
 * never holds more than C rows of the table. On more than one rank a table
 * also allocates room for rt_shard_capacity_room(share) rows beyond its
 * share, which only a checkpoint load may use (keys hash unevenly over a
 * new rank count); training evicts (or, with eviction: none, refuses) down
 * to the share (kern_table_config_t.limit). */
static inline int64_t rt_shard_capacity_share(int64_t capacity, int rank, int nranks)
{
    return capacity / nranks + (rank < capacity % nranks ? 1 : 0);
}

static inline int64_t rt_shard_capacity_room(int64_t share, int nranks)
{
    return nranks > 1 ? share / 20 + 64 : 0;
}

/* The least job-wide capacity under which rank `rank` of nranks can load
 * `rows` rows (its share plus room >= rows). */
static inline int64_t rt_shard_capacity_for(int64_t rows, int rank, int nranks)
{
    int64_t lo = 1, hi = rows * nranks > 0 ? rows * nranks : 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int64_t sh = rt_shard_capacity_share(mid, rank, nranks);
        if (sh + rt_shard_capacity_room(sh, nranks) >= rows)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

typedef struct rt_shard rt_shard_t;

/* store: this rank's shard of each table (borrowed; it outlives s), whose
 * rows are dims[t] floats. */
int rt_shard_create(MPI_Comm comm, int ntables, rt_store_t *store, const int *dims,
                    rt_shard_t **out /* OUT */);
void rt_shard_destroy(rt_shard_t *s);

/* keys[t] (nkeys[t]) are the unique keys table t needs on this rank. On
 * return values[t] is (nkeys[t], dim_t), row i the row of keys[t][i],
 * owned by s and valid until the next lookup. insert: training (missing keys
 * are created with their seeded init and count as used at step); !insert:
 * evaluation (missing keys read as zeros, nothing changes).
 * Collective: every rank calls it, with nkeys[t] == 0 where it has nothing.
 * Returns 0, KILN_EFULL (an owner's table is full; message names it and the
 * rank), KILN_EMPI or KILN_ENOMEM; the code is agreed across ranks. */
int rt_shard_lookup(rt_shard_t *s, const int64_t *const *keys, const int64_t *nkeys, int64_t step,
                    bool insert, float *const **values /* OUT */);

/* grads[t] is (nkeys[t], dim_t, 2): double-double sums (hi, lo; rt_dd.h),
 * aligned with the keys of the last lookup. Sends them to the owners, which
 * add the pairs for one row from several ranks, round once to float32,
 * apply opt to their rows and stamp them with step (the rounded sum does not
 * depend on how the batch was split over ranks; rt_model.h). Collective.
 * Returns 0, KILN_EMPI or KILN_ENOMEM. */
int rt_shard_update(rt_shard_t *s, const double *const *grads, const kern_opt_t *opt,
                    int64_t step);

/* MPI's view of double-double pairs stored interleaved (hi, lo): a datatype
 * of two MPI_DOUBLEs and a commutative op that adds pairs (rt_dd_add_dd).
 * Create once after MPI_Init. Returns 0 or KILN_EMPI. */
int rt_dd_mpi_init(MPI_Datatype *type /* OUT */, MPI_Op *op /* OUT */);
void rt_dd_mpi_fini(MPI_Datatype *type, MPI_Op *op);

/* Bytes moved by this rank in the last lookup + update (for progress). */
int64_t rt_shard_bytes_last_step(const rt_shard_t *s);

#endif /* KILN_RUNTIME_RT_SHARD_H */
