/*
 * kernels/kern_tier.c - kern_tier.h: the disk tier of an embedding table, a
 * log of row records in one file and an index of it in RAM.
 *
 * Layout. The file is a run of segments of seg bytes (64 KiB, or 64
 * records where a record is wider than 1 KiB); a segment holds per_seg
 * records packed from its start. A put appends: its records are copied into
 * the open segment's buffer in RAM, and a put ends by handing what it
 * appended to the file as one write (a full segment goes at once). So a
 * step's demotions, which land on random pages of a hashed layout (a
 * pwrite of 1.5-1.9 us each; docs/benchmarks.md, "the kernel's floor under
 * the tier"), cost a copy each and a write per put or per 64 KiB (400
 * records of dim 16 with adagrad).
 *
 * The index. A key's place is no longer a function of its hash, so RAM
 * keeps an open-addressing table (linear probing, load at most 3/4,
 * doubled when fuller) of 8-byte entries: the top 28 bits of the key's hash
 * (which also pick its home bucket, so the table can double without the
 * keys) and the record's slot number + 1 (36 bits: seg * per_seg + slot).
 * Two keys may share the 28 bits, so a lookup checks the key of the record
 * it reads and walks on when it is another's. Removal shifts the entries
 * after it back (no tombstones).
 *
 * Dead slots. A record taken out (into RAM, evicted, expired, deleted)
 * leaves a dead slot, marked in RAM (a bit a slot): taking a row writes
 * nothing. A segment whose records are all dead is free and is appended to
 * again. When the dead slots outnumber the live records by more than two
 * segments, a put ends by compacting the sparsest segments: their live
 * records are read and appended again (one read of the segment), the
 * segment freed. The file thus stays within about twice the live records
 * plus a few segments.
 *
 * Per segment RAM keeps its slots in use, its live records, its dead bits
 * and the smallest and largest stamp of its records, so an incremental dump
 * reads only segments with changed rows and an expiry only those with old
 * ones. Peak RSS past the table's rows: the index (10.7 bytes a record
 * held on disk at 3/4 load, up to 21 just after it doubles), 32 bytes a
 * segment and a bit a slot, the open segment (64 KiB) and, once the tier
 * has been slow, the writer's two queues (2 x 2 MiB) (docs/models.md).
 *
 * Reads are one transfer a record (a run of records with consecutive slots
 * is one), in one submission a call: copies from a read-only mapping of
 * the file (MMAP, when asked: the page cache's pages are mapped once and
 * then read without a call into the kernel, but they count in the
 * process's RSS; the file is sized to its most segments at open, sparse),
 * io_uring when Kiln is built with liburing and the kernel gives the
 * process a ring (AUTO), or one pread each (kern_tier_io_t picks;
 * bench/tier_bench measures each). Writes are pwrite, so a full disk is
 * an error (ENOSPC), not a signal as a write into a mapping would be: the
 * put's own while the page cache holds the file, else handed to a writer
 * thread of the tier's own (write-behind; every call that reads waits for
 * them first). kern_tier_prefetch asks the kernel to bring the pages of
 * a coming call's records into its page cache (fadvise WILLNEED over runs
 * of nearby pages, through the ring without waiting), so that call's reads
 * need not wait for the disk.
 */
#include "kern_tier.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef KILN_HAVE_URING
#include <liburing.h>
#endif

#include "kern_ops.h"

#define SEG_MIN (64 << 10)
#define MIN_PER_SEG 64
/* The index: at most this full, then doubled. */
#define IX_LOAD 0.75
/* Entry bits: the hash's top TAG_BITS, then the slot number + 1. */
#define TAG_BITS 28
#define ADDR_BITS 36
#define ADDR_MASK ((UINT64_C(1) << ADDR_BITS) - 1)
/* Segments a put may compact before it returns. */
#define GC_PER_PUT 4
/* Transfers in flight on the ring: a batch's reads in one submission. */
#define QDEPTH 256
/* user_data of a prefetch's fadvise on the ring (a batch's are indices). */
#define PREFETCH_TAG UINT64_MAX
/* A prefetch joins records this close (bytes) into one fadvise: reading
 * the pages between costs the disk less than a call each costs the CPU. */
#define PREFETCH_GAP (32 << 10)
/* Prefetch runs only while a lookup's reads take longer than this on
 * average (ns a transfer): reads the page cache answers take 1-3 us, and
 * there the fadvise finds nothing to do and costs 2-6 ms of CPU a step
 * (docs/benchmarks.md); reads from the device take 50 us and more. */
#define PREFETCH_MIN_NS 20000
/* A lookup reads records of a segment this close (bytes) in one transfer. */
#define READ_GAP (2 << 10)
/* An index entry is a cache miss (the index of a big tier is megabytes):
 * loops over a call's keys or records ask for the entry AHEAD items on. */
#define AHEAD 8

/* The bytes of each of the writer thread's two queues: a slow tier's put
 * hands writes up to this to the writer (copied); bigger ones are written
 * before the put returns. A segment is 64 KiB. */
#define WB_MAX (2 << 20)

/* One transfer: len bytes at file offset off from or to buf. */
typedef struct {
    int64_t off;
    size_t len;
    uint8_t *buf;
    int write;
} iop_t;

/* A queue of writes handed to the writer thread: n transfers (room for
 * WB_MAX / record bytes + 1) whose bytes were copied into buf (WB_MAX),
 * used of them. */
typedef struct {
    iop_t *ops;
    int64_t n;
    uint8_t *buf;
    size_t used;
} wbq_t;

struct kern_tier {
    char *path, *table;
    int fd;
    size_t rec;       /* bytes per record */
    size_t seg;       /* bytes per segment */
    int per_seg;      /* records a segment holds */
    int dw;           /* 64-bit words of dead bits per segment */
    int64_t size;     /* records held */
    int64_t slots;    /* slots in use in all segments: records and dead slots */
    int64_t nseg;     /* segments the file has (free ones included) */
    int64_t maxseg;   /* the most it may have */
    int32_t *used;    /* (maxseg) slots appended */
    int32_t *live;    /* (maxseg) records */
    uint64_t *dead;   /* (maxseg, dw) a bit per slot: dead (its record was taken) */
    int64_t *lo, *hi; /* (maxseg) bounds of the stamps in the segment (when live > 0) */
    int64_t *free_seg; /* a stack of segments with no slot in use */
    int64_t nfree;
    /* The open segment: appended to in obuf; its slots below flushed are
     * in the file too. -1: none yet. */
    int64_t open;
    uint8_t *obuf;
    int flushed;
    /* The index: 2^ixbits entries, ixn of them in use. */
    uint64_t *ix;
    int ixbits;
    int64_t ixn;
    /* A call's reads: records, transfers, and what they are for. */
    uint8_t *rbuf;     /* a segment's records (seg bytes): compactions and passes */
    uint8_t *sbuf;     /* the spans a lookup read (read_wanted) */
    int64_t sbuf_cap;
    iop_t *ops;
    int64_t ops_cap;
    int64_t reads, writes, read_bytes, written_bytes, submits, prefetched;
    double read_ns;   /* a lookup's read, ns, moving average (0: none yet) */
    bool prefetch_always;
    kern_tier_io_t io; /* URING, PREAD or MMAP, as opened */
    uint8_t *map;      /* the file mapped read-only (MMAP), NULL otherwise */
    size_t map_bytes;
#ifdef KILN_HAVE_URING
    struct io_uring ring;
    bool ring_fixed;     /* the file is registered with the ring (index 0) */
    int64_t pf_inflight; /* prefetch fadvises not yet reaped */
#endif
    /* Write-behind: a put hands its writes (copied into a queue) to a
     * thread of the tier's own and returns; every call that reads waits
     * for them first (wb_wait), so reads never see a segment before its
     * write. The writer writes wbq[!wb_fill] while wb_busy; callers fill
     * wbq[wb_fill]. */
    pthread_t wb_thread;
    int wb_started, wb_quit;
    pthread_mutex_t wb_mu;
    pthread_cond_t wb_cv;
    wbq_t wbq[2];
    int wb_fill;
    int wb_busy;   /* the writer holds a queue */
    int wb_rc;     /* the first failure, till a call reports it */
    char wb_msg[512];
};

static inline kern_rec_t *rec_at(const kern_tier_t *c, uint8_t *buf, int64_t i)
{
    return (kern_rec_t *)(buf + (size_t)i * c->rec);
}

static inline int64_t seg_off(const kern_tier_t *c, int64_t s) { return s * (int64_t)c->seg; }

static inline uint64_t *dead_of(const kern_tier_t *c, int64_t s)
{
    return c->dead + (size_t)s * (size_t)c->dw;
}

static inline int is_dead(const kern_tier_t *c, int64_t s, int i)
{
    return (int)(dead_of(c, s)[i >> 6] >> (i & 63)) & 1;
}

/* ---- the index -------------------------------------------------------------------------- */

static inline uint64_t tag_of(int64_t key)
{
    return kern_mix64(kern_key_hash(key) ^ 0x74696572ULL) >> (64 - TAG_BITS);
}

uint64_t kern_tier_tag(int64_t key) { return tag_of(key); }

static inline uint64_t ix_mask(const kern_tier_t *c) { return ((uint64_t)1 << c->ixbits) - 1; }

static inline uint64_t ix_home(const kern_tier_t *c, uint64_t tag)
{
    return tag >> (TAG_BITS - c->ixbits);
}

/* Where key's index walk starts, for __builtin_prefetch (called in the
 * loop itself: GCC takes a function holding only a prefetch for pure and
 * drops the call). */
static inline const uint64_t *ix_start(const kern_tier_t *c, int64_t key)
{
    return c->ix + ix_home(c, tag_of(key));
}

static inline uint64_t ix_entry(uint64_t tag, int64_t addr)
{
    return tag << ADDR_BITS | (uint64_t)(addr + 1);
}

static inline int64_t entry_addr(uint64_t e) { return (int64_t)(e & ADDR_MASK) - 1; }

/* The position of the first entry at or after pos (on tag's walk) whose
 * tag is tag, or -1 where the walk ends. */
static int64_t ix_next(const kern_tier_t *c, uint64_t tag, uint64_t pos)
{
    const uint64_t m = ix_mask(c);
    for (;; pos = (pos + 1) & m) {
        const uint64_t e = c->ix[pos];
        if (e == 0)
            return -1;
        if (e >> ADDR_BITS == tag)
            return (int64_t)pos;
    }
}

static void ix_put_entry(kern_tier_t *c, uint64_t e)
{
    const uint64_t m = ix_mask(c);
    uint64_t pos = ix_home(c, e >> ADDR_BITS);
    while (c->ix[pos] != 0)
        pos = (pos + 1) & m;
    c->ix[pos] = e;
}

/* Doubles the index (its entries' tags give their new homes). */
static int ix_grow(kern_tier_t *c)
{
    if (c->ixbits >= TAG_BITS)
        return kiln_errf(KILN_ENOSPC, "table '%s': its disk tier %s indexes at most %lld "
                         "records on one rank; run on more ranks",
                         c->table, c->path, (long long)((1LL << TAG_BITS) * 3 / 4));
    uint64_t *old = c->ix;
    const uint64_t n = (uint64_t)1 << c->ixbits;
    uint64_t *nx = kiln_calloc(n * 2, sizeof *nx);
    if (!nx)
        return KILN_ENOMEM;
    c->ix = nx;
    c->ixbits++;
    for (uint64_t i = 0; i < n; i++)
        if (old[i] != 0)
            ix_put_entry(c, old[i]);
    free(old);
    return 0;
}

static int ix_add(kern_tier_t *c, uint64_t tag, int64_t addr)
{
    if ((double)(c->ixn + 1) > IX_LOAD * (double)((int64_t)1 << c->ixbits))
        KILN_CHECK(ix_grow(c));
    ix_put_entry(c, ix_entry(tag, addr));
    c->ixn++;
    return 0;
}

/* The position of the entry for the record at addr (whose key has tag). */
static int64_t ix_find(const kern_tier_t *c, uint64_t tag, int64_t addr)
{
    const uint64_t m = ix_mask(c), want = ix_entry(tag, addr);
    for (uint64_t pos = ix_home(c, tag);; pos = (pos + 1) & m) {
        if (c->ix[pos] == want)
            return (int64_t)pos;
        if (c->ix[pos] == 0)
            return -1;
    }
}

/* Removes the entry at pos, shifting the walk after it back. */
static void ix_remove(kern_tier_t *c, uint64_t pos)
{
    const uint64_t m = ix_mask(c);
    uint64_t hole = pos;
    for (uint64_t j = (pos + 1) & m; c->ix[j] != 0; j = (j + 1) & m) {
        const uint64_t h = ix_home(c, c->ix[j] >> ADDR_BITS);
        /* the entry at j may fill the hole when its home is not in (hole, j] */
        if (((j - h) & m) >= ((j - hole) & m)) {
            c->ix[hole] = c->ix[j];
            hole = j;
        }
    }
    c->ix[hole] = 0;
    c->ixn--;
}

/* ---- slots ------------------------------------------------------------------------------- */

/* Segment s holds no live record: its slots go back, it is appended to
 * again. */
static void seg_free(kern_tier_t *c, int64_t s)
{
    c->slots -= c->used[s];
    c->used[s] = 0;
    memset(dead_of(c, s), 0, sizeof(uint64_t) * (size_t)c->dw);
    c->free_seg[c->nfree++] = s;
}

/* Takes the record at addr (key's) out: its slot goes dead, its entry goes;
 * a segment left with no record is free again. */
static void slot_kill(kern_tier_t *c, int64_t key, int64_t addr)
{
    const int64_t s = addr / c->per_seg;
    const int i = (int)(addr % c->per_seg);
    int64_t pos = ix_find(c, tag_of(key), addr);
    if (pos >= 0)
        ix_remove(c, (uint64_t)pos);
    dead_of(c, s)[i >> 6] |= (uint64_t)1 << (i & 63);
    c->live[s]--;
    c->size--;
    if (c->live[s] == 0 && s != c->open)
        seg_free(c, s);
}

static int io_error(const kern_tier_t *c, const char *what, int err)
{
    if (err == ENOSPC || err == EDQUOT)
        return kiln_errf(KILN_ENOSPC, "table '%s': the disk under its tier %s is full (%s); "
                         "free space there, point model.embedding.spill_dir at a bigger disk "
                         "or raise model.embedding.memory",
                         c->table, c->path, strerror(err));
    return kiln_errf(KILN_EIO, "table '%s': %s its disk tier %s failed: %s", c->table, what,
                     c->path, err ? strerror(err) : "short transfer");
}

/* ---- submissions ---------------------------------------------------------------------- */

/* Finishes op from byte `from` with pread/pwrite. Returns 0, KILN_ENOSPC or
 * KILN_EIO. */
static int io_sync(kern_tier_t *c, const iop_t *op, size_t from)
{
    for (size_t done = from; done < op->len;) {
        ssize_t got = op->write ? pwrite(c->fd, op->buf + done, op->len - done,
                                         (off_t)(op->off + (int64_t)done))
                                : pread(c->fd, op->buf + done, op->len - done,
                                        (off_t)(op->off + (int64_t)done));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return io_error(c, op->write ? "writing" : "reading", got < 0 ? errno : 0);
        done += (size_t)got;
    }
    return 0;
}

#ifdef KILN_HAVE_URING
/* Hands the completions the ring holds to the transfers of ops (prefetch
 * ones just leave); *done counts those of ops. */
static int ring_reap(kern_tier_t *c, const iop_t *ops, int *done, int rc)
{
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&c->ring, head, cqe)
    {
        seen++;
        if (cqe->user_data == PREFETCH_TAG) {
            c->pf_inflight--;
            continue;
        }
        const iop_t *op = &ops[cqe->user_data];
        (*done)++;
        if (rc < 0)
            continue;
        if (cqe->res < 0)
            rc = io_error(c, op->write ? "writing" : "reading", -cqe->res);
        else if ((size_t)cqe->res < op->len)
            rc = io_sync(c, op, (size_t)cqe->res); /* the rest, or why not */
    }
    io_uring_cq_advance(&c->ring, seen);
    return rc;
}

/* The n transfers of ops on the ring, QDEPTH at a time. After a failed
 * one no more are queued, but those in flight are waited for (their
 * buffers are the batch's). */
static int ring_run(kern_tier_t *c, const iop_t *ops, int n)
{
    int sent = 0, done = 0, rc = 0;
    while (rc == 0 ? done < n : done < sent) {
        struct io_uring_sqe *sqe;
        while (rc == 0 && sent < n && (sqe = io_uring_get_sqe(&c->ring)) != NULL) {
            const iop_t *op = &ops[sent];
            /* the file is the ring's registered file 0 where it took one:
             * no look-up of the descriptor per transfer */
            const int fd = c->ring_fixed ? 0 : c->fd;
            if (op->write)
                io_uring_prep_write(sqe, fd, op->buf, (unsigned)op->len, (uint64_t)op->off);
            else
                io_uring_prep_read(sqe, fd, op->buf, (unsigned)op->len, (uint64_t)op->off);
            if (c->ring_fixed)
                sqe->flags |= IOSQE_FIXED_FILE;
            sqe->user_data = (uint64_t)sent++;
        }
        /* One enter: send what is queued and wait for all in flight. */
        int s = io_uring_submit_and_wait(&c->ring, (unsigned)(sent - done));
        c->submits++;
        if (s < 0 && s != -EINTR && s != -EAGAIN && s != -EBUSY)
            return rc < 0 ? rc : io_error(c, "submitting transfers to", -s);
        rc = ring_reap(c, ops, &done, rc);
    }
    return rc;
}
#endif

/* Does the n transfers of ops: one submission (a ring) or a call each.
 * Returns 0, KILN_ENOSPC or KILN_EIO (the message names the file). */
static int io_run(kern_tier_t *c, const iop_t *ops, int n)
{
    for (int i = 0; i < n; i++) {
        if (ops[i].write) {
            c->writes++;
            c->written_bytes += (int64_t)ops[i].len;
        } else {
            c->reads++;
            c->read_bytes += (int64_t)ops[i].len;
        }
    }
    if (n == 0)
        return 0;
    /* Reads from the mapping: a copy each, no call into the kernel once a
     * page is mapped (a pread of a record cost ~1 us, the copy 0.15 us),
     * the lines of the transfer 4 ahead asked for meanwhile. */
    if (c->map && !ops[0].write) {
        for (int i = 0; i < n; i++) {
            const uint8_t *src = c->map + ops[i].off;
            if (i + 4 < n)
                for (size_t b = 0; b < ops[i + 4].len; b += 64)
                    __builtin_prefetch(c->map + ops[i + 4].off + (int64_t)b);
            memcpy(ops[i].buf, src, ops[i].len);
        }
        return 0;
    }
#ifdef KILN_HAVE_URING
    /* Reads go on the ring, writes by pwrite: the kernel runs a buffered
     * write on an ext4 file from a ring in a worker thread (io-wq), which
     * cost more than the pwrite itself (docs/benchmarks.md). */
    if (c->io == KERN_TIER_IO_URING && !ops[0].write)
        return ring_run(c, ops, n);
#endif
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++, c->submits++)
        rc = io_sync(c, &ops[i], 0);
    return rc;
}

/* ---- write-behind -------------------------------------------------------------
 * For a tier whose reads go to the device (wb_write says when). Two
 * queues: the caller appends (copies) writes to the filling one while the
 * writer thread writes the other; when the writer finishes its queue
 * it takes the filling one if that holds writes, else goes idle. A put of
 * many pages thus hands its batches over without waiting for the writes of
 * the batch before (it used to, which left most of a step's writes on the
 * step's own path), and waits only when a queue's WB_MAX bytes are full. */

static void *wb_main(void *arg)
{
    kern_tier_t *c = arg;
    pthread_mutex_lock(&c->wb_mu);
    for (;;) {
        while (!c->wb_busy && !c->wb_quit)
            pthread_cond_wait(&c->wb_cv, &c->wb_mu);
        if (!c->wb_busy)
            break;
        wbq_t *q = &c->wbq[!c->wb_fill];
        int rc = 0;
        pthread_mutex_unlock(&c->wb_mu);
        /* A record smaller than a page, written where the page is not in
         * the page cache, makes the kernel read the page first, in the
         * write and one at a time. The writer has writes only while the
         * file is cold (wb_write): it asks for all the queue's pages at
         * once first, so those reads run together. */
        for (int i = 0; i < q->n; i++)
            (void)posix_fadvise(c->fd, (off_t)q->ops[i].off, (off_t)q->ops[i].len,
                                POSIX_FADV_WILLNEED);
        for (int i = 0; i < q->n && rc == 0; i++)
            rc = io_sync(c, &q->ops[i], 0);
        pthread_mutex_lock(&c->wb_mu);
        if (rc < 0 && c->wb_rc == 0) {
            c->wb_rc = rc;
            snprintf(c->wb_msg, sizeof c->wb_msg, "%s", kiln_errmsg());
        }
        q->n = 0;
        q->used = 0;
        if (c->wbq[c->wb_fill].n > 0)
            c->wb_fill = !c->wb_fill; /* the filled queue is the writer's now */
        else
            c->wb_busy = 0;
        pthread_cond_broadcast(&c->wb_cv);
    }
    pthread_mutex_unlock(&c->wb_mu);
    return NULL;
}

/* Takes the failure the writer met, if any (with wb_mu held). */
static int wb_failed(kern_tier_t *c)
{
    int rc = c->wb_rc;
    c->wb_rc = 0;
    return rc < 0 ? kiln_errf(rc, "%s", c->wb_msg) : 0;
}

/* Waits for every write handed over; returns 0 or their failure
 * (KILN_ENOSPC, KILN_EIO, with the message the write gave). */
static int wb_wait(kern_tier_t *c)
{
    if (!c->wb_started)
        return 0;
    pthread_mutex_lock(&c->wb_mu);
    while (c->wb_busy)
        pthread_cond_wait(&c->wb_cv, &c->wb_mu);
    int rc = wb_failed(c);
    pthread_mutex_unlock(&c->wb_mu);
    return rc;
}

/* Stops the writer thread, if wb_write started one, once the writes handed
 * over are done (what they failed with no longer matters: the file goes). */
static void wb_stop(kern_tier_t *c)
{
    if (!c->wb_started)
        return;
    (void)wb_wait(c);
    pthread_mutex_lock(&c->wb_mu);
    c->wb_quit = 1;
    pthread_cond_signal(&c->wb_cv);
    pthread_mutex_unlock(&c->wb_mu);
    pthread_join(c->wb_thread, NULL);
}

/* Writes the n transfers of ops: now, in the caller, while the page
 * cache answers the tier (a put's write is a copy into it, a few us);
 * behind the caller's back (the writer thread, started on first use)
 * while the tier is slow (kern_tier_slow: the file is out of the page
 * cache, so a write that covers part of a page first reads the page from
 * the device, and the writer asks for its queue's pages together) and the
 * writes fit WB_MAX. Handing a write over costs a wake-up of the writer,
 * its context switches and the queue's lock: on a tiered lr run that all
 * in the page cache, 24 k context switches against 2.5 k, and 6-7 % of
 * the step's time (docs/benchmarks.md, "Session 21"). */
static int wb_write(kern_tier_t *c, const iop_t *ops, int n)
{
    size_t bytes = 0;
    for (int i = 0; i < n; i++)
        bytes += ops[i].len;
    if (n == 0)
        return 0;
    if (bytes > WB_MAX || !kern_tier_slow(c)) {
        KILN_CHECK(wb_wait(c));
        return io_run(c, ops, n);
    }
    if (!c->wb_started) {
        /* A transfer moves a record or more: a queue holds at most this many. */
        size_t cap = WB_MAX / c->rec + 1;
        for (int k = 0; k < 2; k++) {
            if (!c->wbq[k].buf)
                c->wbq[k].buf = kiln_malloc(WB_MAX);
            if (!c->wbq[k].ops)
                c->wbq[k].ops = kiln_malloc(sizeof *c->wbq[k].ops * cap);
        }
        if (!c->wbq[0].buf || !c->wbq[1].buf || !c->wbq[0].ops || !c->wbq[1].ops ||
            pthread_create(&c->wb_thread, NULL, wb_main, c) != 0)
            return io_run(c, ops, n); /* no thread: write as before */
        c->wb_started = 1;
    }
    pthread_mutex_lock(&c->wb_mu);
    int rc = wb_failed(c);
    wbq_t *q = &c->wbq[c->wb_fill];
    /* A full queue waits for the writer to take it (or, idle, hands it over). */
    while (rc == 0 && q->used + bytes > WB_MAX) {
        if (!c->wb_busy) {
            c->wb_fill = !c->wb_fill;
            c->wb_busy = 1;
            pthread_cond_broadcast(&c->wb_cv);
        } else {
            pthread_cond_wait(&c->wb_cv, &c->wb_mu);
        }
        rc = wb_failed(c);
        q = &c->wbq[c->wb_fill];
    }
    if (rc < 0) {
        pthread_mutex_unlock(&c->wb_mu);
        return rc;
    }
    for (int i = 0; i < n; i++) {
        iop_t *op = &q->ops[q->n++];
        *op = ops[i];
        op->buf = q->buf + q->used;
        memcpy(op->buf, ops[i].buf, ops[i].len);
        q->used += ops[i].len;
        c->writes++;
        c->written_bytes += (int64_t)ops[i].len;
        c->submits++;
    }
    if (!c->wb_busy) {
        c->wb_fill = !c->wb_fill;
        c->wb_busy = 1;
        pthread_cond_broadcast(&c->wb_cv);
    }
    pthread_mutex_unlock(&c->wb_mu);
    return 0;
}


/* ---- life cycle --------------------------------------------------------------- */

/* Sizes the file to its most segments (sparse: holes take no disk) and
 * maps it for reading. Returns 0 or the errno. */
static int map_file(kern_tier_t *c)
{
    size_t bytes = (size_t)c->maxseg * c->seg;
    if (ftruncate(c->fd, (off_t)bytes) != 0)
        return errno;
    void *m = mmap(NULL, bytes, PROT_READ, MAP_SHARED, c->fd, 0);
    if (m == MAP_FAILED)
        return errno;
    (void)madvise(m, bytes, MADV_RANDOM); /* a record's read needs its page only */
    c->map = m;
    c->map_bytes = bytes;
    return 0;
}

int kern_tier_open(const char *path, const char *table, int64_t rows, int nfloat,
                   kern_tier_io_t io, kern_tier_t **out /* OUT */)
{
    *out = NULL;
    kern_tier_t *c = kiln_calloc(1, sizeof *c);
    if (!c)
        return KILN_ENOMEM;
    c->fd = -1;
    c->open = -1;
    c->io = KERN_TIER_IO_PREAD;
    pthread_mutex_init(&c->wb_mu, NULL);
    pthread_cond_init(&c->wb_cv, NULL);
    c->rec = (sizeof(kern_rec_t) + sizeof(float) * (size_t)nfloat + 7) & ~(size_t)7;
    c->seg = SEG_MIN;
    if (c->seg / c->rec < MIN_PER_SEG)
        c->seg = (c->rec * MIN_PER_SEG + 4095) & ~(size_t)4095;
    c->per_seg = (int)(c->seg / c->rec);
    c->dw = (c->per_seg + 63) / 64;
    if (rows < 1)
        rows = 1;
    /* Live records stay within `rows`; the dead slots compaction allows
     * are as many again and two segments, and a put appends before it
     * compacts: room for one more `rows` of them and 16 segments. The file
     * is sparse, so room never used takes no disk. */
    c->maxseg = 3 * (rows / c->per_seg + 1) + 16;
    /* The index starts small and doubles as records come: a table whose
     * tier never fills pays only for what it holds. */
    c->ixbits = 10;
    int rc = 0;
    c->path = kiln_strdup(path);
    c->table = kiln_strdup(table ? table : "?");
    c->used = kiln_calloc((size_t)c->maxseg, sizeof *c->used);
    c->live = kiln_calloc((size_t)c->maxseg, sizeof *c->live);
    c->dead = kiln_calloc((size_t)c->maxseg * (size_t)c->dw, sizeof *c->dead);
    c->lo = kiln_malloc((size_t)c->maxseg * sizeof *c->lo);
    c->hi = kiln_malloc((size_t)c->maxseg * sizeof *c->hi);
    c->free_seg = kiln_malloc((size_t)c->maxseg * sizeof *c->free_seg);
    c->obuf = kiln_malloc(c->seg);
    c->rbuf = kiln_malloc(c->seg);
    c->ix = kiln_calloc((size_t)1 << c->ixbits, sizeof *c->ix);
    if (!c->path || !c->table || !c->used || !c->live || !c->dead || !c->lo || !c->hi ||
        !c->free_seg || !c->obuf || !c->rbuf || !c->ix) {
        rc = KILN_ENOMEM;
        goto out;
    }
    if ((int64_t)c->maxseg * c->per_seg >= (int64_t)ADDR_MASK) {
        rc = kiln_errf(KILN_EINVAL, "table '%s': %lld rows are more than one rank's disk tier "
                       "holds; run on more ranks", c->table, (long long)rows);
        goto out;
    }
    /* No access times: a lookup's reads each checked whether the file's
     * atime was due (0.6 % of a tiered lr run). Only a file's owner may
     * ask; a file left by another user is opened without. */
    c->fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOATIME, 0600);
    if (c->fd < 0 && errno == EPERM)
        c->fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (c->fd < 0) {
        rc = kiln_errf(KILN_EIO, "table '%s': cannot create its disk tier %s: %s; check "
                       "model.embedding.spill_dir",
                       c->table, path, strerror(errno));
        goto out;
    }
    /* A mapping only when asked: its pages count in RSS, and with the file
     * out of the page cache it reads slower than the ring
     * (docs/benchmarks.md). */
    if (io == KERN_TIER_IO_MMAP) {
        int err = map_file(c);
        if (err != 0) {
            rc = kiln_errf(KILN_EIO, "table '%s': cannot map its disk tier %s: %s; check "
                           "model.embedding.spill_dir", c->table, path, strerror(err));
            goto out;
        }
        c->io = KERN_TIER_IO_MMAP;
    }
#ifdef KILN_HAVE_URING
    /* A kernel or sandbox without io_uring leaves the pread path (auto). */
    if (io == KERN_TIER_IO_AUTO || io == KERN_TIER_IO_URING) {
        int r = io_uring_queue_init(QDEPTH, &c->ring, 0);
        if (r == 0) {
            c->io = KERN_TIER_IO_URING;
            c->ring_fixed = io_uring_register_files(&c->ring, &c->fd, 1) == 0;
        }
        else if (io == KERN_TIER_IO_URING) {
            rc = kiln_errf(KILN_EIO, "table '%s': io_uring is not available here (%s)",
                           c->table, strerror(-r));
            goto out;
        }
    }
#else
    if (io == KERN_TIER_IO_URING) {
        rc = kiln_errf(KILN_EINVAL, "table '%s': this build of Kiln has no io_uring (liburing "
                       "was missing when it was built)", c->table);
        goto out;
    }
#endif
    *out = c;
    c = NULL;
out:
    kern_tier_close(c);
    return rc;
}

void kern_tier_close(kern_tier_t *c)
{
    if (!c)
        return;
    wb_stop(c);
    pthread_mutex_destroy(&c->wb_mu);
    pthread_cond_destroy(&c->wb_cv);
#ifdef KILN_HAVE_URING
    if (c->io == KERN_TIER_IO_URING) {
        /* Prefetches still running read into the kernel's cache only. */
        while (c->pf_inflight > 0) {
            struct io_uring_cqe *cqe;
            if (io_uring_wait_cqe(&c->ring, &cqe) < 0)
                break;
            io_uring_cqe_seen(&c->ring, cqe);
            c->pf_inflight--;
        }
        io_uring_queue_exit(&c->ring);
    }
#endif
    if (c->map)
        munmap(c->map, c->map_bytes);
    if (c->fd >= 0) {
        close(c->fd);
        unlink(c->path);
    }
    KILN_FREE_ALL(c->path, c->table, c->used, c->live, c->dead, c->lo, c->hi, c->free_seg,
                  c->obuf, c->ix, c->rbuf, c->sbuf, c->ops, c->wbq[0].ops, c->wbq[0].buf,
                  c->wbq[1].ops, c->wbq[1].buf);
    free(c);
}

size_t kern_tier_rec_bytes(const kern_tier_t *c) { return c->rec; }
int64_t kern_tier_size(const kern_tier_t *c) { return c->size; }

void kern_tier_stats(const kern_tier_t *c, kern_tier_stats_t *st /* OUT */)
{
    *st = (kern_tier_stats_t){.reads = c->reads,
                              .writes = c->writes,
                              .read_bytes = c->read_bytes,
                              .written_bytes = c->written_bytes,
                              .submits = c->submits,
                              .prefetched = c->prefetched,
                              .page_bytes = (int64_t)c->seg,
                              .npages = c->nseg,
                              .io = c->io};
}

/* ---- appending -------------------------------------------------------------------------- */

/* Writes the open segment's slots not yet in the file (wb_write: now, or
 * by the writer for a slow tier). */
static int open_flush(kern_tier_t *c)
{
    if (c->open < 0 || c->flushed == c->used[c->open])
        return 0;
    iop_t op = {.off = seg_off(c, c->open) + (int64_t)c->flushed * (int64_t)c->rec,
                .len = (size_t)(c->used[c->open] - c->flushed) * c->rec,
                .buf = c->obuf + (size_t)c->flushed * c->rec,
                .write = 1};
    c->flushed = c->used[c->open];
    return wb_write(c, &op, 1);
}

/* Writes what the open segment holds and closes it (freed if nothing in it
 * lives). */
static int open_seal(kern_tier_t *c)
{
    if (c->open < 0)
        return 0;
    KILN_CHECK(open_flush(c));
    int64_t s = c->open;
    c->open = -1;
    if (c->live[s] == 0)
        seg_free(c, s);
    return 0;
}

/* Makes sure the open segment has a free slot: a free segment, or the
 * file's next. */
static int open_room(kern_tier_t *c)
{
    if (c->open >= 0 && c->used[c->open] < c->per_seg)
        return 0;
    KILN_CHECK(open_seal(c));
    int64_t s;
    if (c->nfree > 0) {
        s = c->free_seg[--c->nfree];
    } else if (c->nseg < c->maxseg) {
        s = c->nseg++;
    } else {
        return kiln_errf(KILN_ENOSPC, "table '%s': its disk tier %s is full (%lld records, "
                         "%lld segments of %zu bytes); raise model.embedding.capacity, "
                         "which sizes the tier",
                         c->table, c->path, (long long)c->size, (long long)c->maxseg, c->seg);
    }
    c->open = s;
    c->flushed = 0;
    return 0;
}

/* The slot number the open segment's next record gets. */
static inline int64_t open_next(const kern_tier_t *c)
{
    return c->open * c->per_seg + c->used[c->open];
}

/* Copies record r into the open segment's next slot (open_room made room)
 * and counts it there. */
static void slot_append(kern_tier_t *c, const uint8_t *r)
{
    kern_rec_t h;
    memcpy(&h, r, sizeof h);
    const int64_t s = c->open;
    memcpy(c->obuf + (size_t)c->used[s] * c->rec, r, c->rec);
    if (c->live[s] == 0 || h.stamp < c->lo[s])
        c->lo[s] = h.stamp;
    if (c->live[s] == 0 || h.stamp > c->hi[s])
        c->hi[s] = h.stamp;
    c->used[s]++;
    c->live[s]++;
    c->slots++;
}

/* Appends record r (its key not in the tier) to the open segment. */
static int append(kern_tier_t *c, const uint8_t *r)
{
    KILN_CHECK(open_room(c));
    kern_rec_t h;
    memcpy(&h, r, sizeof h);
    KILN_CHECK(ix_add(c, tag_of(h.key), open_next(c)));
    slot_append(c, r);
    c->size++;
    return 0;
}

/* Reads segment s's slots into buf: from the open segment's buffer or the
 * file. */
static int seg_read(kern_tier_t *c, int64_t s, uint8_t *buf)
{
    if (s == c->open) {
        memcpy(buf, c->obuf, (size_t)c->used[s] * c->rec);
        return 0;
    }
    iop_t op = {.off = seg_off(c, s), .len = (size_t)c->used[s] * c->rec, .buf = buf};
    return io_run(c, &op, 1);
}

/* Compacts closed segment s: its live records appended again (their index
 * entries pointed at the new slots), the segment freed. */
static int seg_compact(kern_tier_t *c, int64_t s)
{
    KILN_CHECK(seg_read(c, s, c->rbuf));
    for (int i = 0; i < c->used[s]; i++) {
        if (is_dead(c, s, i))
            continue;
        const kern_rec_t *r = rec_at(c, c->rbuf, i);
        const uint64_t tag = tag_of(r->key);
        const int64_t pos = ix_find(c, tag, s * c->per_seg + i);
        if (pos < 0)
            return kiln_errf(KILN_EINTERNAL, "table '%s': its disk tier %s lost the index "
                             "entry of key %lld", c->table, c->path, (long long)r->key);
        KILN_CHECK(open_room(c));
        c->ix[pos] = ix_entry(tag, open_next(c));
        slot_append(c, (const uint8_t *)r);
    }
    c->live[s] = 0; /* every live record moved */
    seg_free(c, s);
    return 0;
}

/* While dead slots outnumber live records by more than two segments, the
 * sparsest closed segments (at most half live) are compacted, GC_PER_PUT
 * at most. Counts decide, not time, so a run's file is the same each time. */
static int collect(kern_tier_t *c)
{
    for (int k = 0; k < GC_PER_PUT; k++) {
        if (c->slots - c->size <= c->size + 2 * (int64_t)c->per_seg)
            return 0;
        int64_t best = -1;
        for (int64_t s = 0; s < c->nseg; s++)
            if (s != c->open && c->used[s] > 0 &&
                (best < 0 || c->live[s] < c->live[best]))
                best = s;
        if (best < 0 || 2 * (int64_t)c->live[best] > c->used[best])
            return 0;
        KILN_CHECK(wb_wait(c)); /* its last writes may be queued */
        KILN_CHECK(seg_compact(c, best));
    }
    return 0;
}

/* ---- calls ---------------------------------------------------------------------------- */

/* A key's lookup: its tag, the index position of its candidate. */
typedef struct {
    uint64_t tag;
    int64_t pos;
    int64_t addr;
    int64_t i;             /* its index in the call's keys */
    const kern_rec_t *rec; /* the record read (read_wanted), in sbuf */
} want_t;

/* Sorts w[0..n) by addr: an LSD radix sort, a byte a pass over the bytes
 * the tier's slot numbers take (two or three; a comparison sort of a
 * step's misses was 4 % of a tiered lr run). Returns 0 or KILN_ENOMEM. */
static int sort_wants(const kern_tier_t *c, want_t *w, int64_t n)
{
    if (n < 2)
        return 0;
    want_t *tmp = kiln_malloc(sizeof *tmp * (size_t)n);
    if (!tmp)
        return KILN_ENOMEM;
    want_t *src = w, *dst = tmp;
    const int64_t top = c->nseg * c->per_seg;
    for (int shift = 0; shift == 0 || (top >> shift) > 0; shift += 8) {
        int64_t cnt[256] = {0};
        for (int64_t j = 0; j < n; j++)
            cnt[(src[j].addr >> shift) & 255]++;
        for (int64_t d = 0, at = 0; d < 256; d++) {
            const int64_t k = cnt[d];
            cnt[d] = at;
            at += k;
        }
        for (int64_t j = 0; j < n; j++)
            dst[cnt[(src[j].addr >> shift) & 255]++] = src[j];
        want_t *sw = src;
        src = dst;
        dst = sw;
    }
    if (src != w)
        memcpy(w, src, sizeof *w * (size_t)n);
    free(tmp);
    return 0;
}

/* Reads the candidates w[0..n) (sorted by addr) in one submission (every
 * put ends with its records written or handed to the writer, and a lookup
 * waits for the writer first), w[j].rec pointing at each record read. Records of a
 * segment at most READ_GAP bytes apart are one transfer: a transfer costs
 * the kernel about what copying a few KiB does, and a segment holds rows
 * demoted together (2 KiB measured best of 0, 2, 4, 8 and 32 KiB:
 * docs/benchmarks.md). */
static int read_wanted(kern_tier_t *c, want_t *w, int64_t n)
{
    KILN_CHECK(kiln_grow_to((void **)&c->ops, &c->ops_cap, n > 0 ? n : 1, sizeof *c->ops, 256));
    /* the spans first: where each starts and ends, in file order */
    int64_t no = 0, sbytes = 0;
    for (int64_t j = 0; j < n; j++) {
        const int64_t s = w[j].addr / c->per_seg;
        const int64_t off = seg_off(c, s) + (w[j].addr % c->per_seg) * (int64_t)c->rec;
        iop_t *last = no > 0 ? &c->ops[no - 1] : NULL;
        if (last && last->off / (int64_t)c->seg == s &&
            off - (last->off + (int64_t)last->len) <= READ_GAP) {
            sbytes += off + (int64_t)c->rec - (last->off + (int64_t)last->len);
            last->len = (size_t)(off + (int64_t)c->rec - last->off);
            continue;
        }
        c->ops[no++] = (iop_t){.off = off, .len = c->rec};
        sbytes += (int64_t)c->rec;
    }
    KILN_CHECK(kiln_grow_to((void **)&c->sbuf, &c->sbuf_cap, sbytes > 0 ? sbytes : 1, 1,
                            (int64_t)c->seg));
    for (int64_t k = 0, at = 0; k < no; k++) {
        c->ops[k].buf = c->sbuf + at;
        at += (int64_t)c->ops[k].len;
    }
    int64_t r0 = c->reads, t0 = kiln_mono_ns();
    int rc = io_run(c, c->ops, (int)no);
    if (c->reads > r0) {
        double per = (double)(kiln_mono_ns() - t0) / (double)(c->reads - r0);
        c->read_ns = c->read_ns > 0 ? 0.9 * c->read_ns + 0.1 * per : per;
    }
    /* each record in its span */
    for (int64_t j = 0, k = 0; j < n && rc == 0; j++) {
        const int64_t off = seg_off(c, w[j].addr / c->per_seg) +
                            (w[j].addr % c->per_seg) * (int64_t)c->rec;
        while (off >= c->ops[k].off + (int64_t)c->ops[k].len)
            k++;
        w[j].rec = (const kern_rec_t *)(c->ops[k].buf + (off - c->ops[k].off));
    }
    return rc;
}

/* take (out, remove), get (out), has (found only) or delete (remove, gone)
 * over keys[n] (distinct): reads, writes nothing. */
static int lookup(kern_tier_t *c, int64_t n, const int64_t *keys, void *out, uint8_t *found,
                  int remove, kern_tier_gone_fn gone, void *ctx, int64_t *nhit)
{
    *nhit = 0;
    if (found)
        memset(found, 0, (size_t)n);
    KILN_CHECK(wb_wait(c));
    if (n == 0 || c->size == 0)
        return 0;
    want_t *w = kiln_malloc(sizeof *w * (size_t)n);
    int64_t *hit = kiln_malloc(sizeof *hit * (size_t)n); /* addr of key i's record, or -1 */
    if (!w || !hit) {
        KILN_FREE_ALL(w, hit);
        return KILN_ENOMEM;
    }
    int64_t nw = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i + AHEAD < n)
            __builtin_prefetch(ix_start(c, keys[i + AHEAD]));
        hit[i] = -1;
        const uint64_t tag = tag_of(keys[i]);
        const int64_t pos = ix_next(c, tag, ix_home(c, tag));
        if (pos >= 0)
            w[nw++] = (want_t){tag, pos, entry_addr(c->ix[pos]), i, NULL};
    }
    int rc = 0;
    /* Rounds: a candidate whose record holds another key (the same 28
     * bits of hash) walks on to the next entry with its tag. */
    while (nw > 0 && rc == 0) {
        rc = sort_wants(c, w, nw);
        if (rc == 0)
            rc = read_wanted(c, w, nw);
        int64_t next = 0;
        for (int64_t j = 0; j < nw && rc == 0; j++) {
            const kern_rec_t *r = w[j].rec;
            const int64_t i = w[j].i;
            if (r->key == keys[i]) {
                hit[i] = w[j].addr;
                if (out)
                    memcpy((uint8_t *)out + (size_t)i * c->rec, r, c->rec);
                if (gone)
                    rc = gone(ctx, r->key, r->stamp);
                continue;
            }
            const int64_t pos = ix_next(c, w[j].tag, ((uint64_t)w[j].pos + 1) & ix_mask(c));
            if (pos >= 0)
                w[next++] = (want_t){w[j].tag, pos, entry_addr(c->ix[pos]), i, NULL};
        }
        nw = next;
    }
    /* Removals last: a removal moves other entries. */
    for (int64_t i = 0; i < n; i++) {
        if (remove && i + AHEAD < n && hit[i + AHEAD] >= 0)
            __builtin_prefetch(ix_start(c, keys[i + AHEAD]));
        if (hit[i] < 0)
            continue;
        (*nhit)++;
        if (found)
            found[i] = 1;
        if (remove && rc == 0)
            slot_kill(c, keys[i], hit[i]);
    }
    KILN_FREE_ALL(w, hit);
    return rc;
}

int kern_tier_take(kern_tier_t *c, int64_t n, const int64_t *keys, void *out /* OUT (n) */,
                   uint8_t *found /* OUT (n) */)
{
    int64_t hit;
    return lookup(c, n, keys, out, found, 1, NULL, NULL, &hit);
}

int kern_tier_get(kern_tier_t *c, int64_t n, const int64_t *keys, void *out /* OUT (n) */,
                  uint8_t *found /* OUT (n) */)
{
    int64_t hit;
    return lookup(c, n, keys, out, found, 0, NULL, NULL, &hit);
}

int kern_tier_has(kern_tier_t *c, int64_t n, const int64_t *keys, uint8_t *found /* OUT (n) */)
{
    int64_t hit;
    return lookup(c, n, keys, NULL, found, 0, NULL, NULL, &hit);
}

int kern_tier_delete(kern_tier_t *c, int64_t n, const int64_t *keys, kern_tier_gone_fn gone,
                     void *ctx, int64_t *ndeleted /* OUT */)
{
    return lookup(c, n, keys, NULL, NULL, 1, gone, ctx, ndeleted);
}

int kern_tier_put(kern_tier_t *c, int64_t n, const void *recs)
{
    /* No wait for earlier writes: the writer keeps their order, and a
     * segment a put reuses was freed by a call that waited for them. */
    int rc = 0;
    for (int64_t k = 0; k < n && rc == 0; k++) {
        if (k + AHEAD < n) {
            int64_t key; /* a record's first field; records need not be aligned */
            memcpy(&key, (const uint8_t *)recs + (size_t)(k + AHEAD) * c->rec, sizeof key);
            __builtin_prefetch(ix_start(c, key));
        }
        rc = append(c, (const uint8_t *)recs + (size_t)k * c->rec);
        if (rc == 0 && c->used[c->open] == c->per_seg)
            rc = open_flush(c); /* a full segment is written now */
    }
    if (rc == 0)
        rc = collect(c);
    /* and the rest of the put and of the compactions: every record is in
     * the file (behind the call), none only in RAM */
    if (rc == 0)
        rc = open_flush(c);
    return rc;
}

/* Asks the kernel to read bytes [off, end) of the file ahead. */
static void prefetch_run(kern_tier_t *c, int64_t off, int64_t end)
{
#ifdef KILN_HAVE_URING
    if (c->io == KERN_TIER_IO_URING) {
        /* At most QDEPTH fadvises in flight: the completion queue (2
         * QDEPTH) must keep room for a batch's reads beside them. Past it
         * the kernel queues completions in memory of its own, and where it
         * cannot get that memory (a cgroup at its limit: the very case of
         * a cold file) it drops them and the next submission fails with
         * EBADR. A prefetch is advice: the lookup reads the pages anyway. */
        if (c->pf_inflight >= QDEPTH) {
            io_uring_submit(&c->ring);
            c->submits++;
            int done = 0;
            ring_reap(c, NULL, &done, 0);
            if (c->pf_inflight >= QDEPTH)
                return;
        }
        struct io_uring_sqe *sqe = io_uring_get_sqe(&c->ring);
        if (!sqe)
            return;
        io_uring_prep_fadvise(sqe, c->fd, (uint64_t)off, (off_t)(end - off),
                              POSIX_FADV_WILLNEED);
        sqe->user_data = PREFETCH_TAG;
        c->pf_inflight++;
        c->prefetched += (end - off + 4095) / 4096;
        return;
    }
#endif
    c->prefetched += (end - off + 4095) / 4096;
    (void)posix_fadvise(c->fd, (off_t)off, (off_t)(end - off), POSIX_FADV_WILLNEED);
    c->submits++;
}

bool kern_tier_slow(const kern_tier_t *c)
{
    return c->prefetch_always || c->read_ns >= PREFETCH_MIN_NS;
}

void kern_tier_prefetch_always(kern_tier_t *c, bool always) { c->prefetch_always = always; }

int kern_tier_prefetch(kern_tier_t *c, int64_t n, const int64_t *keys)
{
    if (n == 0 || c->size == 0 || !kern_tier_slow(c))
        return 0;
    want_t *w = kiln_malloc(sizeof *w * (size_t)n);
    if (!w)
        return KILN_ENOMEM;
    int64_t nw = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint64_t tag = tag_of(keys[i]);
        const int64_t pos = ix_next(c, tag, ix_home(c, tag));
        if (pos >= 0)
            w[nw++] = (want_t){tag, pos, entry_addr(c->ix[pos]), i, NULL};
    }
    if (sort_wants(c, w, nw) < 0) {
        free(w);
        return KILN_ENOMEM;
    }
    /* Runs of records at most PREFETCH_GAP apart, one fadvise each. */
    int64_t first = -1, last = -1;
    for (int64_t j = 0; j < nw; j++) {
        const int64_t off = seg_off(c, w[j].addr / c->per_seg) +
                            (w[j].addr % c->per_seg) * (int64_t)c->rec;
        if (first >= 0 && off > last + PREFETCH_GAP) {
            prefetch_run(c, first, last);
            first = -1;
        }
        first = first < 0 ? off : first;
        last = off + (int64_t)c->rec;
    }
    if (first >= 0)
        prefetch_run(c, first, last);
#ifdef KILN_HAVE_URING
    if (c->io == KERN_TIER_IO_URING) {
        io_uring_submit(&c->ring); /* no wait: the step goes on while the kernel reads */
        c->submits++;
        int done = 0;
        ring_reap(c, NULL, &done, 0);
    }
#endif
    free(w);
    return 0;
}

/* ---- whole-tier passes ------------------------------------------------------------------
 * A pass reads the segments holding records it needs, one at a time, into
 * rbuf and works on their live slots; records it takes out go dead
 * (slot_kill), and a segment left with some gets exact stamp bounds. */

/* Makes the stamp bounds of segment s (read into buf) exact. */
static void seg_bounds(kern_tier_t *c, int64_t s, uint8_t *buf)
{
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int i = 0; i < c->used[s]; i++) {
        if (is_dead(c, s, i))
            continue;
        const int64_t st = rec_at(c, buf, i)->stamp;
        lo = st < lo ? st : lo;
        hi = st > hi ? st : hi;
    }
    c->lo[s] = lo;
    c->hi[s] = hi;
}

typedef struct {
    uint32_t prio;
    int64_t addr;
    int64_t key;
    int64_t stamp;
} cand_t;

static int cmp_cand(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->prio != y->prio)
        return x->prio < y->prio ? -1 : 1;
    return (x->addr > y->addr) - (x->addr < y->addr);
}

int kern_tier_evict(kern_tier_t *c, int64_t need, uint64_t seed,
                    uint32_t (*prio)(const void *pctx, const kern_rec_t *r), const void *pctx,
                    kern_tier_gone_fn gone, void *ctx, int64_t *nevicted /* OUT */)
{
    *nevicted = 0;
    KILN_CHECK(wb_wait(c));
    if (need <= 0 || c->size == 0)
        return 0;
    if (need > c->size)
        need = c->size;
    /* Sample segments until they hold 4 x need records (every segment when
     * the tier is that small), consecutive ones from a seeded start. */
    int64_t want = 4 * need, nc = 0;
    cand_t *cand = kiln_malloc(sizeof *cand * (size_t)(want + c->per_seg));
    if (!cand)
        return KILN_ENOMEM;
    int rc = 0;
    int64_t start = want >= c->size ? 0
                    : (int64_t)(kern_mix64(seed ^ 0x65766963ULL) % (uint64_t)c->nseg);
    for (int64_t j = 0; j < c->nseg && nc < want && rc == 0; j++) {
        int64_t s = (start + j) % c->nseg;
        if (c->live[s] == 0)
            continue;
        rc = seg_read(c, s, c->rbuf);
        for (int i = 0; i < c->used[s] && rc == 0; i++) {
            if (is_dead(c, s, i))
                continue;
            const kern_rec_t *r = rec_at(c, c->rbuf, i);
            cand[nc++] = (cand_t){prio(pctx, r), s * c->per_seg + i, r->key, r->stamp};
        }
    }
    if (rc == 0) {
        qsort(cand, (size_t)nc, sizeof *cand, cmp_cand);
        if (nc > need)
            nc = need;
        for (int64_t j = 0; j < nc && rc == 0; j++) {
            rc = gone(ctx, cand[j].key, cand[j].stamp);
            if (rc == 0) {
                slot_kill(c, cand[j].key, cand[j].addr);
                (*nevicted)++;
            }
        }
    }
    free(cand);
    return rc;
}

int kern_tier_expire(kern_tier_t *c, int64_t before, kern_tier_gone_fn gone, void *ctx,
                     int64_t *nexpired /* OUT */)
{
    *nexpired = 0;
    int rc = wb_wait(c);
    for (int64_t s = 0; s < c->nseg && rc == 0; s++) {
        if (c->live[s] == 0 || c->lo[s] >= before)
            continue;
        rc = seg_read(c, s, c->rbuf);
        for (int i = 0; i < c->used[s] && rc == 0; i++) {
            const kern_rec_t *r = rec_at(c, c->rbuf, i);
            if (is_dead(c, s, i) || r->stamp >= before)
                continue;
            rc = gone(ctx, r->key, r->stamp);
            if (rc == 0) {
                slot_kill(c, r->key, s * c->per_seg + i);
                (*nexpired)++;
            }
        }
        if (c->live[s] > 0)
            seg_bounds(c, s, c->rbuf);
    }
    return rc;
}

int kern_tier_count(kern_tier_t *c, int64_t since, int64_t *n /* OUT */)
{
    *n = 0;
    int rc = wb_wait(c);
    for (int64_t s = 0; s < c->nseg && rc == 0; s++) {
        if (c->live[s] == 0 || c->hi[s] <= since)
            continue;
        if (c->lo[s] > since) {
            *n += c->live[s]; /* every record of the segment is newer */
            continue;
        }
        rc = seg_read(c, s, c->rbuf);
        for (int i = 0; i < c->used[s] && rc == 0; i++)
            *n += !is_dead(c, s, i) && rec_at(c, c->rbuf, i)->stamp > since;
    }
    return rc;
}

int kern_tier_scan(kern_tier_t *c, int64_t *page, int64_t cap, void *out /* OUT (cap) */,
                   int64_t *n /* OUT */)
{
    /* *page is a slot number: the scan goes on from there, partway
     * through a segment where cap ran out. */
    *n = 0;
    KILN_CHECK(wb_wait(c));
    if (cap < 1)
        return kiln_errf(KILN_EINVAL, "table '%s': kern_tier_scan needs room for a record",
                         c->table);
    int64_t at = *page, got = 0;
    int rc = 0;
    while (got < cap && at < c->nseg * c->per_seg && rc == 0) {
        const int64_t s = at / c->per_seg;
        int i = (int)(at % c->per_seg);
        if (c->live[s] == 0 || i >= c->used[s]) {
            at = (s + 1) * c->per_seg;
            continue;
        }
        rc = seg_read(c, s, c->rbuf);
        for (; i < c->used[s] && got < cap && rc == 0; i++)
            if (!is_dead(c, s, i))
                memcpy((uint8_t *)out + (size_t)got++ * c->rec, rec_at(c, c->rbuf, i), c->rec);
        at = i < c->used[s] ? s * c->per_seg + i : (s + 1) * c->per_seg;
    }
    *page = at;
    *n = got;
    return rc;
}

int kern_tier_each(kern_tier_t *c, int64_t since, kern_tier_chunk_fn fn, void *ctx)
{
    int rc = wb_wait(c);
    for (int64_t s = 0; s < c->nseg && rc == 0; s++) {
        if (c->live[s] == 0 || c->hi[s] <= since)
            continue;
        rc = seg_read(c, s, c->rbuf);
        int m = 0;
        for (int i = 0; i < c->used[s] && rc == 0; i++) {
            kern_rec_t *r = rec_at(c, c->rbuf, i);
            if (is_dead(c, s, i) || r->stamp <= since)
                continue;
            if (m != i)
                memmove(rec_at(c, c->rbuf, m), r, c->rec);
            m++;
        }
        if (rc == 0 && m > 0)
            rc = fn(ctx, m, c->rbuf);
        rc = rc < 0 ? rc : 0;
    }
    return rc;
}
