/*
 * shard/shard.h - the distributed embedding table: kiln-train's embedding
 * rows sharded over MPI ranks, and everything the exchange stands on.
 *
 *   dedupe, shard   unique keys per table; the all-to-all exchange that
 *                   carries keys to their owners, rows back and gradients
 *                   to the owners (shard.c)
 *   store           where this rank's rows live: host tables, the twin, or
 *                   the GPU (store.c, store_cuda.cu)
 *   comm            the step's collectives behind one interface, on MPI
 *                   (comm.c) or NCCL (comm_nccl.cu)
 *   device          which backend a rank runs on (device.c)
 *   mpi helpers     MPI errors as KILN_EMPI, agreement across ranks
 *
 * Sections below keep each part's own contract. Headers a .cu includes are
 * C11 inside extern "C" guards, so this one is too.
 */
#ifndef KILN_SHARD_SHARD_H
#define KILN_SHARD_SHARD_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "jobs.h"
#include "kern.h"
#include "kern_ops.h" /* KERN_HD: shard_owner runs on the device too */
#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==== device: which backend a kiln-train rank runs on.
 *
 * The job spec's `device:` is auto, cpu or cuda (jobs/jobs.h). shard_device_pick
 * turns it into the backend this rank uses, from two facts the caller
 * passes in: whether this kiln-train was built with CUDA and how many GPUs
 * the rank can see (shard_device_visible_gpus). It is pure logic, so the table
 * of cases is tested on machines without a GPU; it also writes the log line
 * the trainer prints, e.g.
 *   device auto: no CUDA device visible; using the CPU backend
 */

typedef enum { SHARD_DEVICE_CPU = 0, SHARD_DEVICE_CUDA = 1 } shard_device_t;

/* Returns "cpu" or "cuda" (or "?"). */
const char *shard_device_name(shard_device_t d);

/* Picks the backend for want:
 *   auto -> cuda when built_cuda and visible_gpus > 0, else cpu
 *   cpu  -> cpu
 *   cuda -> cuda when built_cuda and visible_gpus > 0, else KILN_EINVAL
 * Writes one log line into why (cap bytes, NUL-terminated; why may be NULL
 * when cap is 0): on success the choice and its reason ("device auto: no
 * CUDA device visible; using the CPU backend"), on failure the same message
 * kiln_errmsg() then returns, which says what to do. Returns 0 or
 * KILN_EINVAL (cuda impossible, an unknown want, visible_gpus < 0, out NULL). */
int shard_device_pick(job_device_t want, bool built_cuda, int visible_gpus, shard_device_t *out /* OUT */,
                   char *why /* OUT (cap) */, size_t cap);

/* True when this build has the CUDA backend (KILN_HAVE_CUDA). */
bool shard_device_built_cuda(void);

/* The number of CUDA devices this process can see (kern_cuda_device_count,
 * which honours CUDA_VISIBLE_DEVICES); 0 without a driver, without a GPU or
 * in a build without CUDA. */
int shard_device_visible_gpus(void);

/* ==== store: where this rank's shard of every embedding table
 * lives, as the owner side of the exchange (shard.h) sees it.
 *
 * Three kinds:
 *   SHARD_STORE_HOST  the rows live in the host tables given to create
 *                  (kern_table_t, the CPU backend). Sync and upload do
 *                  nothing.
 *   SHARD_STORE_CUDA  the rows live in GPU hash tables (kern_cuda_table_t) on
 *                  the current device; lookups, inserts, evictions and the
 *                  fused sparse update run as CUDA kernels. The host tables
 *                  are a mirror for checkpoints: shard_store_sync copies what
 *                  changed on the GPU since the last sync into them (evicted
 *                  keys deleted, changed rows written with values, optimizer
 *                  state and adam counts), in O(changed rows) transfers, and
 *                  shard_store_upload copies them to the GPU after a load.
 *   SHARD_STORE_TWIN  SHARD_STORE_CUDA's protocol with the working copy in a
 *                  second set of host tables: the CPU stand-in for the GPU
 *                  that lets the CPU tests run the mirror logic (sync,
 *                  upload, the ordering of deletions and rows) that the CUDA
 *                  store shares. Training results equal SHARD_STORE_HOST's.
 *
 * Calls are collective over nothing: each rank's store is its own. Errors
 * are KILN_E* codes with a message (KILN_EFULL names the table and rank
 * state, KILN_ECUDA the CUDA call and what to check).
 */

typedef enum { SHARD_STORE_HOST = 0, SHARD_STORE_TWIN = 1, SHARD_STORE_CUDA = 2 } shard_store_kind_t;

typedef struct shard_store shard_store_t;

/* mirror: the host tables (borrowed, they outlive the store). TWIN and
 * CUDA make their working tables from cfgs (CUDA on GPU `device`, which it
 * makes current); the mirror needs room for every row they can hold (a GPU
 * table's capacity is rounded up to whole buckets; docs/gpu.md). Returns 0,
 * KILN_EINVAL (SHARD_STORE_CUDA in a build without CUDA), KILN_ENOMEM or
 * KILN_ECUDA. */
int shard_store_create(shard_store_kind_t kind, int ntables, kern_table_t *const *mirror,
                    const kern_table_config_t *cfgs, int device, shard_store_t **out /* OUT */);
void shard_store_destroy(shard_store_t *s);
const char *shard_store_kind_name(shard_store_kind_t kind);

/* Whether different tables may be used from several threads at once. */
bool shard_store_parallel(const shard_store_t *s);
/* Row ids of table t are below this. */
int64_t shard_store_rows_bound(const shard_store_t *s, int t);
/* Live keys of table t. */
int64_t shard_store_size(const shard_store_t *s, int t);

/* kern_table_find_or_insert (insert) or kern_table_find (!insert) on table
 * t's working copy: keys (n) -> rows (n), host arrays. */
int shard_store_find(shard_store_t *s, int t, int64_t n, const int64_t *keys, int64_t step, bool insert,
                  int32_t *rows /* OUT (n) */);
/* After a lookup without insert has read its rows: lets the next one at the
 * same step move them (kern_table_unpin; a host table with a disk tier). */
void shard_store_unpin(shard_store_t *s, int64_t step);
/* out (n, dim) = the values of rows (n); row -1 reads as zeros. */
int shard_store_read(shard_store_t *s, int t, int64_t n, const int32_t *rows, float *out /* OUT */);
/* The fused sparse update of every table: ug[t] holds unique rows and their
 * float32 gradients (host arrays); the rows are stamped with step and put
 * on the change list. */
int shard_store_update(shard_store_t *s, const kern_opt_t *opt, const kern_row_grads_t *ug,
                    int64_t step);
/* Whether the tables live in host memory alone (no working copy elsewhere). */
bool shard_store_on_host(const shard_store_t *s);
/* shard_store_update of table t alone, on the calling thread, for a store
 * on the host (shard_store_on_host): callers run tables side by side. */
int shard_store_update_table(shard_store_t *s, const kern_opt_t *opt, int t,
                             const kern_row_grads_t *ug, int64_t step);

/* The same three calls on arrays in the working copy's own memory: device
 * memory of the store's GPU for SHARD_STORE_CUDA, host memory for HOST and
 * TWIN (the device step's stand-in). For CUDA they run on `stream` (a
 * cudaStream_t, the caller's) after what it queued there, and after the
 * store's own calls on its stream; the store's later calls run after them.
 * find takes every table at once, table t's keys at keys[off[t] .. off[t +
 * 1]) (off: a host array of ntables + 1), their rows to the same places of
 * rows; it synchronizes the stream once for all tables (it returns
 * KILN_EFULL; the host stores stop at the first table that fails, the GPU
 * store gives every table its call and returns the first failure); read
 * and update are enqueued (update reads ug[t].n on the host). The device
 * step's exchange (trainer/train_dev.c) uses these; the host exchange uses
 * those above. */
int shard_store_find_dev(shard_store_t *s, const int64_t *off, const int64_t *keys, int64_t step,
                         bool insert, int32_t *rows /* OUT (off[ntables]) */, void *stream);
int shard_store_read_dev(shard_store_t *s, int t, int64_t n, const int32_t *rows,
                      float *out /* OUT (n, dim) */, void *stream);
int shard_store_update_dev(shard_store_t *s, const kern_opt_t *opt, const kern_row_grads_t *ug,
                        int64_t step, void *stream);

/* Brings the mirror up to date with the working copy at step: first the
 * keys evicted since the last sync are deleted from it (and so land in its
 * removal log), then the rows changed since then are written. Call before
 * reading the mirror (a checkpoint). */
int shard_store_sync(shard_store_t *s, int64_t step);
/* Copies every row of the mirror into the working copy (after a load into
 * the mirror, into an empty working copy). */
int shard_store_upload(shard_store_t *s, int64_t step);

/* ==== comm: the collectives of a training step behind one small
 * interface, so that kiln-train runs the same step on MPI (CPU build, host
 * buffers) or on NCCL (CUDA build, device buffers). The exchange (shard_*)
 * and the trainer's dense allreduce make every collective of a step here:
 *
 *   shard_comm_alltoall()          bytes, the same count to every rank (the
 *                               exchange's per-table counts)
 *   shard_comm_alltoallv()         bytes, per-rank counts and displacements
 *                               (the key, row and gradient exchanges)
 *   shard_comm_allreduce_sum_dd()  in place, double-double pairs (the dense
 *                               gradients; kern_ops.h's kern_dd_add_dd)
 *   shard_comm_agree()             the worst status over the ranks
 *   shard_comm_allreduce_sum_f64() in place, float64
 *   shard_comm_bcast()             bytes from one rank
 *
 * Backends, one per file (comm.c, comm_nccl.cu):
 *
 *   SHARD_COMM_MPI   buffers are HOST memory. Every call is blocking: when it
 *                 returns, the result is in place.
 *   SHARD_COMM_NCCL  buffers are DEVICE memory of the GPU the communicator is
 *                 bound to (shard_comm_info's device). Calls are enqueued on the
 *                 communicator's own stream (shard_comm_stream) and return
 *                 before the data has moved: call shard_comm_sync() before the
 *                 host reads a result, or make another stream wait on
 *                 shard_comm_stream(). The all-to-all-v is one group of
 *                 ncclSend/ncclRecv; the allreduce is ncclAllReduce with
 *                 ncclDouble. Only in a build with CUDA (KILN_HAVE_CUDA).
 *
 * Counts and displacements are always HOST arrays of nranks entries, in
 * bytes. Every call is collective over the communicator given to
 * shard_comm_create: all ranks call it, in the same order, with matching counts.
 * Errors come back as KILN_EMPI (MPI) or KILN_ECUDA (CUDA, NCCL), with a
 * message that says what failed and what to try.
 */

typedef enum { SHARD_COMM_MPI = 0, SHARD_COMM_NCCL = 1 } shard_comm_kind_t;

typedef struct shard_comm shard_comm_t;

/* Returns "mpi" or "nccl" (or "?"). */
const char *shard_comm_kind_name(shard_comm_kind_t kind);

/* Creates a communicator of the given kind over the ranks of comm
 * (duplicated, so its messages never mix with the caller's; the duplicate
 * returns MPI errors instead of aborting). Collective over comm.
 *
 * SHARD_COMM_NCCL also binds the calling thread to GPU (local rank on this host)
 * with cudaSetDevice, so each rank of a host gets its own GPU, makes the
 * ncclUniqueId on rank 0 and shares it with MPI_Bcast, creates the NCCL
 * communicator and one non-blocking stream. Every rank agrees on the outcome
 * (a failure on one rank makes every rank return an error, none hangs).
 *
 * Returns 0, KILN_EINVAL (unknown kind; NCCL in a build without CUDA; more
 * ranks on a host than GPUs), KILN_ENODEV (NCCL and no GPU visible),
 * KILN_EMPI, KILN_ECUDA or KILN_ENOMEM. Free with shard_comm_destroy. */
int shard_comm_create(shard_comm_kind_t kind, MPI_Comm comm, shard_comm_t **out /* OUT */);

/* Waits for outstanding work, frees the NCCL communicator and stream and
 * the duplicated MPI communicator. Collective (every rank destroys its
 * communicator); accepts NULL. */
void shard_comm_destroy(shard_comm_t *c);

/* Who this rank is in a communicator, and over what it talks. */
typedef struct {
    shard_comm_kind_t kind;
    int rank, size; /* this rank, of size ranks */
    int device;     /* the CUDA device ordinal this rank is bound to (NCCL), or -1 (MPI) */
} shard_comm_info_t;

/* Returns c's kind, rank, size and device. */
shard_comm_info_t shard_comm_info(const shard_comm_t *c);
/* The cudaStream_t the NCCL calls run on, or NULL (MPI). */
void *shard_comm_stream(const shard_comm_t *c);

/* All-to-all-v of bytes. This rank sends sendcounts[r] bytes starting at
 * sendbuf + sdispls[r] to rank r, and receives recvcounts[r] bytes from rank
 * r at recvbuf + rdispls[r]; counts may be 0 (then the buffers may be NULL
 * when all of a side's counts are 0). sendcounts[r] on this rank must equal
 * recvcounts[this rank] on rank r. Send and receive regions must not overlap.
 * Returns 0, KILN_EINVAL (NULL arrays), KILN_ERANGE (MPI: a count or
 * displacement above INT_MAX bytes), KILN_EMPI or KILN_ECUDA. */
int shard_comm_alltoallv(shard_comm_t *c, const void *sendbuf, const size_t *sendcounts /* (nranks) */,
                      const size_t *sdispls /* (nranks) */, void *recvbuf,
                      const size_t *recvcounts /* (nranks) */,
                      const size_t *rdispls /* (nranks) */);

/* buf (count doubles) becomes the element-wise sum of every rank's buf.
 * Returns 0, KILN_EINVAL, KILN_EMPI or KILN_ECUDA. */
int shard_comm_allreduce_sum_f64(shard_comm_t *c, double *buf /* IN/OUT (count) */, size_t count);

/* All-to-all of bytes: this rank sends bytes bytes at sendbuf + r * bytes to
 * rank r and receives rank r's at recvbuf + r * bytes (nranks * bytes each).
 * Returns 0, KILN_EINVAL, KILN_ERANGE, KILN_EMPI or KILN_ECUDA. */
int shard_comm_alltoall(shard_comm_t *c, const void *sendbuf, void *recvbuf /* OUT */, size_t bytes);

/* pairs (npairs, 2: hi, lo) becomes the element-wise double-double sum of
 * every rank's pairs. MPI: a pair datatype and an op that adds pairs, made
 * by shard_comm_create (the order of the ranks is MPI's). NCCL: an all-gather
 * of the pairs and a kernel that adds them in rank order (comm_nccl.cu), on
 * the communicator's stream. Returns 0, KILN_EINVAL, KILN_EMPI or
 * KILN_ECUDA. */
int shard_comm_allreduce_sum_dd(shard_comm_t *c, double *pairs /* IN/OUT (npairs, 2) */, size_t npairs);

/* shard_mpi_agree over the communicator: every rank returns the worst rc; a
 * rank that was fine gets "<step> failed on another rank". Collective (host
 * side on either backend). */
int shard_comm_agree(shard_comm_t *c, int rc, const char *step);

/* Copies bytes bytes of root's buf into every rank's buf. Returns 0,
 * KILN_EINVAL (root out of range), KILN_EMPI or KILN_ECUDA. */
int shard_comm_bcast(shard_comm_t *c, void *buf /* IN on root, OUT elsewhere */, size_t bytes, int root);

/* Waits until the calls made so far have finished on this rank (NCCL: the
 * stream is drained and the communicator's asynchronous error is checked;
 * MPI: returns 0 at once). Returns 0 or KILN_ECUDA. */
int shard_comm_sync(shard_comm_t *c);

/* ==== shard: model-parallel embedding tables across MPI ranks.
 *
 * Key k of table t lives on rank shard_owner(k, nranks). A training step
 * asks for the rows of the unique keys its batch uses, table by table:
 *
 *   shard_lookup()  ONE all-to-all carries the keys of all tables to their
 *                      owners, which find-or-insert them; ONE all-to-all
 *                      carries the rows back.
 *   shard_update()  ONE all-to-all carries the gradients of those rows to
 *                      the owners, which sum duplicates (in source-rank
 *                      order, so the result is deterministic) and apply the
 *                      fused sparse optimizer update to all tables at once.
 *
 * (Each all-to-all is preceded by a tiny all-to-all of per-table counts.)
 * Every collective goes through shard_comm (below).
 * The caller dedupes keys per table first (shard_dedupe_*), so the exchange
 * moves each key once per step and rank.
 */

/* ---- per-table dedupe ------------------------------------------------------
 * A reusable hash set: unique keys of a batch, in first-seen order, and for
 * every input key the index of its unique key. */
typedef struct shard_dedupe shard_dedupe_t;

int shard_dedupe_create(shard_dedupe_t **out /* OUT */);
void shard_dedupe_destroy(shard_dedupe_t *d);
/* keys (n) -> uniq (*nuniq, owned by d, valid until the next call) and
 * inverse (n): keys[i] == uniq[inverse[i]]. Returns 0 or KILN_ENOMEM. */
int shard_dedupe_run(shard_dedupe_t *d, const int64_t *keys, int64_t n, int32_t *inverse /* OUT (n) */,
                  const int64_t **uniq /* OUT */, int64_t *nuniq /* OUT */);

/* The rank that owns key among nranks (on the host, and on the device for
 * the device step's dedupe, trainer/train_dev_cuda.cu). */
KERN_HD static inline int shard_owner(int64_t key, int nranks)
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
 * also allocates room for shard_capacity_room(share) rows beyond its
 * share, which only a checkpoint load may use (keys hash unevenly over a
 * new rank count); training evicts (or, with eviction: none, refuses) down
 * to the share (kern_table_config_t.limit). */
static inline int64_t shard_capacity_share(int64_t capacity, int rank, int nranks)
{
    return capacity / nranks + (rank < capacity % nranks ? 1 : 0);
}

static inline int64_t shard_capacity_room(int64_t share, int nranks)
{
    return nranks > 1 ? share / 20 + 64 : 0;
}

/* The least job-wide capacity under which rank `rank` of nranks can load
 * `rows` rows (its share plus room >= rows). */
static inline int64_t shard_capacity_for(int64_t rows, int rank, int nranks)
{
    int64_t lo = 1, hi = rows * nranks > 0 ? rows * nranks : 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int64_t sh = shard_capacity_share(mid, rank, nranks);
        if (sh + shard_capacity_room(sh, nranks) >= rows)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

typedef struct shard shard_t;

/* comm: the collectives of the exchange (borrowed; it outlives s; an
 * SHARD_COMM_MPI communicator: the exchange's buffers are host memory). store:
 * this rank's shard of each table (borrowed; it outlives s), whose rows are
 * dims[t] floats. */
int shard_create(shard_comm_t *comm, int ntables, shard_store_t *store, const int *dims,
                    shard_t **out /* OUT */);
void shard_destroy(shard_t *s);

/* keys[t] (nkeys[t]) are the unique keys table t needs on this rank. On
 * return values[t] is (nkeys[t], dim_t), row i the row of keys[t][i],
 * owned by s and valid until the next lookup. insert: training (missing keys
 * are created with their seeded init and count as used at step); !insert:
 * evaluation (missing keys read as zeros, nothing changes).
 * Collective: every rank calls it, with nkeys[t] == 0 where it has nothing.
 * Returns 0, KILN_EFULL (an owner's table is full; message names it and the
 * rank), KILN_EMPI or KILN_ENOMEM; the code is agreed across ranks. */
int shard_lookup(shard_t *s, const int64_t *const *keys, const int64_t *nkeys, int64_t step,
                    bool insert, float *const **values /* OUT */);

/* Gives table t's unique keys for shard_lookup_fill: *keys (*n), valid
 * until the lookup returns. Called once for each table, on any thread of
 * the team, tables side by side. Returns 0 or a code with its message. */
typedef int (*shard_keys_fn)(void *ctx, int t, const int64_t **keys /* OUT */,
                             int64_t *n /* OUT */);

/* shard_lookup of the keys keys_of gives, table by table. One rank with its
 * tables on the host: the thread that gets a table's keys finds them and
 * reads their rows right after, all tables in one parallel loop. Else every
 * table's keys are got, then shard_lookup. Returns what shard_lookup
 * returns, or the first failing table's code. */
int shard_lookup_fill(shard_t *s, shard_keys_fn keys_of, void *ctx, int64_t step, bool insert,
                      float *const **values /* OUT */);

/* grads[t] is (nkeys[t], dim_t, 2): double-double sums (hi, lo; kern_ops.h),
 * aligned with the keys of the last lookup. Sends them to the owners, which
 * add the pairs for one row from several ranks, round once to float32,
 * apply opt to their rows and stamp them with step (the rounded sum does not
 * depend on how the batch was split over ranks; model.h). Collective.
 * Returns 0, KILN_EMPI or KILN_ENOMEM. */
int shard_update(shard_t *s, const double *const *grads, const kern_opt_t *opt,
                    int64_t step);

/* Writes table t's double-double gradient sums, (nkeys[t], dim_t, 2) as
 * shard_update takes them, into g. Called once for each table with keys,
 * on any thread of the team, tables side by side. */
typedef void (*shard_fill_fn)(void *ctx, int t, double *g /* OUT */);

/* shard_update with the sums made by fill, table by table. One rank with
 * its tables on the host, and at least a table a thread: the thread that
 * fills a table's sums rounds them and updates the table right after,
 * while they are in its cache. Else every table's sums are filled, then
 * shard_update. The same bits either
 * way. Collective. Returns what shard_update returns. */
int shard_update_fill(shard_t *s, shard_fill_fn fill, void *ctx, const kern_opt_t *opt,
                      int64_t step);

/* Bytes moved by this rank in the last lookup + update (for progress). */
int64_t shard_bytes_last_step(const shard_t *s);

/* ==== mpi: the MPI error handling the trainer's modules share (shard.c,
 * comm.c, comm_nccl.cu, trainer/; ckpt/ does not depend on shard/, and
 * ckpt_mpi.c's own agreement also names the rank that failed): a failed MPI call becomes KILN_EMPI with MPI's
 * own message and a hint, shard_mpi_agree makes every rank take the same
 * branch after a step that may have failed on some of them, and
 * shard_mpi_local_rank says where a rank stands on its host. Header-only, so
 * that kiln_shard_cuda needs nothing from the libraries that link it.
 */

/* Returns KILN_EMPI with "<what> failed: <MPI's message>" and what to check. */
static inline int shard_mpi_fail(int err, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", err);
    return kiln_errf(KILN_EMPI,
                     "%s failed: %s (a rank may have died or the network failed; the "
                     "mpirun output names the rank and host)",
                     what, msg);
}

/* Returns from the enclosing function when call fails. */
#define SHARD_MPI_CHECK(call, what)                                                           \
    do {                                                                                   \
        int shard_mpi_rc_ = (call);                                                           \
        if (shard_mpi_rc_ != MPI_SUCCESS)                                                     \
            return shard_mpi_fail(shard_mpi_rc_, what);                                          \
    } while (0)

/* Returns the smallest (worst) rc over the ranks of comm, so that every rank
 * takes the same branch; a rank that was fine gets "<step> failed on another
 * rank". KILN_EMPI when the agreement itself fails. Collective. */
static inline int shard_mpi_agree(MPI_Comm comm, int rc, const char *step)
{
    int worst = rc;
    int mrc = MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MIN, comm);
    if (mrc != MPI_SUCCESS)
        return shard_mpi_fail(mrc, "MPI_Allreduce of the ranks' status");
    if (worst < 0 && rc == 0)
        return kiln_errf(worst, "%s failed on another rank (%s); see its log", step,
                         kiln_errname(worst));
    return worst;
}

/* This rank's index among the ranks of comm on its host, and how many
 * there are. Collective over comm. 0 or KILN_EMPI. */
static inline int shard_mpi_local_rank(MPI_Comm comm, int *lrank, int *lsize)
{
    MPI_Comm local;
    int rank = 0;
    SHARD_MPI_CHECK(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
    SHARD_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local),
                 "MPI_Comm_split_type (ranks per host)");
    int mrc = MPI_Comm_rank(local, lrank);
    if (mrc == MPI_SUCCESS)
        mrc = MPI_Comm_size(local, lsize);
    int frc = MPI_Comm_free(&local);
    if (mrc != MPI_SUCCESS)
        return shard_mpi_fail(mrc, "MPI_Comm_rank / MPI_Comm_size on a host's ranks");
    SHARD_MPI_CHECK(frc, "MPI_Comm_free");
    return 0;
}

#ifdef __cplusplus
}
#endif

#endif /* KILN_SHARD_SHARD_H */
