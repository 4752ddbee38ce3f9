/*
 * kernels/kern_tier.h - the disk tier of a table (kern_tier.c), which
 * kern_table.c keeps the rows in that do not fit the RAM it was given, and
 * kiln-serve's tables (serving/serve_table.c) the rows past --table-memory.
 *
 * The tier is a log in one file: segments of fixed-size records, a put's
 * records appended to the open segment (one write per 64 KiB), and an
 * index in RAM from key to record (8 bytes an entry). A record is the whole
 * row: key, change stamp, use (lru: step of last use, lfu: use count),
 * adam's update count, then the values and the optimizer state. Nothing of
 * a row stays in RAM but its index entry; per segment the tier keeps its
 * slot count, which slots are dead (their record was taken out) and the
 * smallest and largest stamp, so an incremental dump reads only segments
 * with changed rows and an expiry only segments with old ones. Segments
 * whose records are mostly dead are compacted by the puts
 * (docs/models.md has the RAM this takes).
 *
 * Tiers are exclusive: a key's row lives in the RAM slab or here, never in
 * both (kern_table.c takes rows out when it brings them in). Every call
 * does its I/O itself: a lookup's reads in one submission (copies from a
 * mapping of the file, io_uring, or preads), writes by pwrite (the call's
 * own while the page cache holds the file, else from a writer thread of
 * the tier's own); each table has its own tier,
 * so tables run in parallel but one tier is not thread-safe.
 */
#ifndef KILN_KERNELS_KERN_TIER_H
#define KILN_KERNELS_KERN_TIER_H

#include <stdint.h>

#include "kern.h"

/* The fixed head of a record; dim values and nstate*dim optimizer state
 * floats follow it. */
typedef struct {
    int64_t key;
    int64_t stamp;      /* step of the row's last change */
    uint32_t use;       /* lru: low 32 bits of the step of last use; lfu: use count */
    uint32_t opt_steps; /* adam's update count */
} kern_rec_t;

typedef struct kern_tier kern_tier_t;

/* Reports a record a call removed for good (evicted, expired): key, stamp. */
typedef int (*kern_tier_gone_fn)(void *ctx, int64_t key, int64_t stamp);
/* Receives records in chunks: n records of rec_bytes each at recs. */
typedef int (*kern_tier_chunk_fn)(void *ctx, int64_t n, const void *recs);

/* Creates the tier file at path (truncated; removed again by close) for
 * about `rows` records of nfloat floats (its segments hold up to three
 * times that; compaction keeps about twice in use), its I/O as io says (AUTO: io_uring when built in and
 * the kernel gives a ring, else pread; MMAP: reads from a mapping).
 * Returns 0, KILN_EIO (the message names the path; or io_uring or a
 * mapping asked for and refused),
 * KILN_EINVAL (io_uring asked for, not built in) or KILN_ENOMEM. */
int kern_tier_open(const char *path, const char *table, int64_t rows, int nfloat,
                   kern_tier_io_t io, kern_tier_t **out /* OUT */);
void kern_tier_close(kern_tier_t *c);

/* Bytes of one record (kern_rec_t, the floats, padding to 8). */
size_t kern_tier_rec_bytes(const kern_tier_t *c);
int64_t kern_tier_size(const kern_tier_t *c);

/* Takes the records of keys[n] (distinct) out of the tier: found[i] = 1 and
 * record i of out (n records) filled for those it holds, found[i] = 0 for
 * the others. Returns 0, KILN_EIO or KILN_ENOSPC. */
int kern_tier_take(kern_tier_t *c, int64_t n, const int64_t *keys, void *out /* OUT (n) */,
                   uint8_t *found /* OUT (n) */);
/* Counts which of keys[n] the tier holds (found[i]), reading their records. */
int kern_tier_has(kern_tier_t *c, int64_t n, const int64_t *keys, uint8_t *found /* OUT (n) */);
/* kern_tier_take without taking: the records stay in the tier. */
int kern_tier_get(kern_tier_t *c, int64_t n, const int64_t *keys, void *out /* OUT (n) */,
                  uint8_t *found /* OUT (n) */);
/* Adds n records (distinct keys, none of which the tier holds: a row lives
 * in one tier), appended to the log; then compacts the sparsest segments
 * while dead slots outnumber live records. Returns 0, KILN_EIO or
 * KILN_ENOSPC (the disk, or the file's segments, ran out: the message says
 * which and what to do). */
int kern_tier_put(kern_tier_t *c, int64_t n, const void *recs);
/* Whether the tier's reads are slow (the last lookups' reads took 20 us
 * or more each on average: the device, not the page cache, answers them). */
bool kern_tier_slow(const kern_tier_t *c);
/* Makes kern_tier_prefetch run whatever kern_tier_slow says. */
void kern_tier_prefetch_always(kern_tier_t *c, bool always);
/* Asks the kernel to bring the pages of keys[n]'s records into
 * its page cache, without waiting (a later take finds them there), while
 * the tier's reads are slow (kern_tier_slow; else it does nothing: the
 * page cache holds the file). Reads nothing itself; returns 0 or
 * KILN_ENOMEM. */
int kern_tier_prefetch(kern_tier_t *c, int64_t n, const int64_t *keys);
/* Removes keys[n] that the tier holds, reporting each to gone. */
int kern_tier_delete(kern_tier_t *c, int64_t n, const int64_t *keys, kern_tier_gone_fn gone,
                     void *ctx, int64_t *ndeleted /* OUT */);
/* Removes `need` records of lowest priority (prio(use) ascending) found in
 * a seeded sample of segments holding at least 4 x need records, reporting
 * each to gone. */
int kern_tier_evict(kern_tier_t *c, int64_t need, uint64_t seed,
                    uint32_t (*prio)(const void *pctx, const kern_rec_t *r), const void *pctx,
                    kern_tier_gone_fn gone, void *ctx, int64_t *nevicted /* OUT */);
/* Removes every record with stamp < before, reporting each to gone. */
int kern_tier_expire(kern_tier_t *c, int64_t before, kern_tier_gone_fn gone, void *ctx,
                     int64_t *nexpired /* OUT */);
/* Counts the records with stamp > since (since < 0: all of them), reading
 * only segments whose largest stamp is above since. */
int kern_tier_count(kern_tier_t *c, int64_t since, int64_t *n /* OUT */);
/* Hands the records with stamp > since to fn in file order, a segment's
 * worth at a time. */
int kern_tier_each(kern_tier_t *c, int64_t since, kern_tier_chunk_fn fn, void *ctx);
/* Copies up to cap live records from the cursor *page on into out,
 * advancing *page (a slot number: 0 starts); *n 0 at the end. A cursor over
 * the tier for callers that pull. Returns 0, KILN_EIO or KILN_EINVAL (cap
 * below 1). */
int kern_tier_scan(kern_tier_t *c, int64_t *page, int64_t cap, void *out /* OUT (cap) */,
                   int64_t *n /* OUT */);

/* The bits of key's hash the index keeps (28): keys sharing them are told
 * apart by the record's key (tests pick such pairs with it). */
uint64_t kern_tier_tag(int64_t key);

typedef struct {
    int64_t reads, writes;              /* transfers since open */
    int64_t read_bytes, written_bytes;
    int64_t submits;                    /* io_uring_enter, pread/pwrite or fadvise calls
                                           (a read from the mapping is none) */
    int64_t prefetched;                 /* pages prefetch asked the kernel for */
    int64_t page_bytes;                 /* a segment's bytes */
    int64_t npages;                     /* segments in the file */
    kern_tier_io_t io;                  /* what reads use: MMAP, URING or PREAD */
} kern_tier_stats_t;
void kern_tier_stats(const kern_tier_t *c, kern_tier_stats_t *st /* OUT */);

#endif /* KILN_KERNELS_KERN_TIER_H */
