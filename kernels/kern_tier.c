/*
 * kernels/kern_tier.c - kern_tier.h: the disk tier of an embedding table, a
 * hash table of row records in one file.
 *
 * Layout. The file is npages pages of page_bytes bytes; page p holds
 * nrec[p] records packed from its start (what follows is junk). A key's
 * home page is its hash modulo nhome; when the home page is full the record
 * goes to the next page with room, and every full page passed on the way
 * is flagged `spilled`, so a lookup walks from the home page while pages are
 * spilled and stops at the first that is not. Pages past nhome are spare
 * (npages - nhome of them) so a walk never wraps around. A record taken
 * out of a page leaves a dead slot, marked in RAM only (a bit per slot), so
 * taking a row writes nothing; a later put to the page fills the slot, and
 * a whole-tier pass that changes the page packs it. Removal leaves the
 * flags: a flag only costs a read. Page slot counts, dead bits, flags and
 * stamp ranges live in RAM, so a lookup whose walk meets only empty pages
 * reads nothing.
 *
 * Sizes: a page holds at least 8 records (4 KiB, or more for wide rows),
 * and the file has room for rows / LOAD records at home, LOAD = 0.75, so
 * walks stay short. The file is sparse: pages never written take no disk.
 *
 * I/O in batches. No call moves a page at a time: it sorts its keys by
 * home page, plans the pages the next keys' walks need (up to BATCH pages
 * that hold records), reads them all in one submission, works on the
 * copies and writes back what changed in one more. Only bytes that matter
 * move: a read takes a page's used slots; taking a record out writes
 * nothing; kern_tier_put (keys the tier does not hold) writes records into
 * dead slots or after a page's last slot without reading the page. A
 * page's stamp range is thus a bound, widened by puts and made exact when
 * a whole-tier pass rewrites the page.
 *
 * A batch's reads are one io_uring_enter when Kiln is built with liburing
 * and the kernel gives the process a ring (AUTO), or one pread per page,
 * or copies from a read-only mapping of the file (MMAP, when asked: the
 * page cache's pages are mapped once and then read without a call into the
 * kernel, but they count in the process's RSS; the file is sized to its
 * pages at open, sparse) (kern_tier_io_t picks; bench/tier_bench measures
 * each); writes are one pwrite per page
 * whatever reads use (see io_run), so a full disk is an error (ENOSPC), not
 * a signal as a write into a mapping would be. kern_tier_prefetch asks the
 * kernel to bring the pages of a coming call's keys into its page cache
 * (fadvise WILLNEED over runs of nearby pages, through the ring without
 * waiting), so that call's reads need not wait for the disk.
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

#define LOAD 0.75
#define PAGE_MIN 4096
#define MIN_PER_PAGE 8
/* Pages a call holds at once (1 MiB of 4 KiB pages): enough that a step's
 * misses take a few submissions, small beside the table's memory. */
#define BATCH 256
/* Transfers in flight on the ring: a batch's reads in one submission. */
#define QDEPTH BATCH
/* user_data of a prefetch's fadvise on the ring (a batch's are indices). */
#define PREFETCH_TAG UINT64_MAX
/* A prefetch joins pages this close into one fadvise: keys hash to pages
 * uniformly, so a batch's pages lie a few apart, and reading the pages
 * between costs the disk less than a call per page costs the CPU. */
#define PREFETCH_GAP 8
/* Prefetch runs only while a lookup's reads take longer than this on
 * average (ns a transfer): reads the page cache answers take 1-3 us, and
 * there the fadvise finds nothing to do and costs 2-6 ms of CPU a step
 * (docs/benchmarks.md); reads from the device take 50 us and more. */
#define PREFETCH_MIN_NS 20000

/* The bytes of each of the writer thread's two queues: a put's writes up
 * to this go to the writer (copied); bigger ones (a resume's chunks) are
 * written before the put returns. A step of 1e6 keys at 10% writes 1.2
 * MB. */
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
    size_t page;      /* bytes per page */
    int per_page;     /* records a page holds */
    int nfloat;
    int64_t nhome, npages;
    int64_t size;     /* records held */
    uint16_t *nrec;   /* (npages) slots in use: records and dead slots */
    uint64_t *dead;   /* (npages, dw) a bit per slot: dead (its record was taken) */
    int dw;           /* 64-bit words of dead bits per page */
    uint8_t *spilled; /* (npages) a record whose walk passed this page lies further on */
    uint8_t *fp;      /* (npages, per_page) a byte of each used slot's key hash */
    int64_t *lo, *hi; /* (npages) bounds of the stamps on the page (when nrec > 0) */
    /* The batch: nb pages, ascending, in buffers of `page` bytes. */
    uint8_t *bufs;    /* (BATCH, page) */
    int64_t *bpage;   /* (BATCH) the page buffer b holds */
    int *bmark;       /* (BATCH) put: the first slot it appended to the page */
    uint64_t *want;   /* (BATCH, dw) lookup: the slots whose fingerprint a key matches */
    int nb;
    iop_t *ops;       /* (2 BATCH) */
    int nops;
    int64_t reads, writes, read_bytes, written_bytes, submits, prefetched;
    double read_ns;   /* a lookup's read, ns, moving average (0: none yet) */
    bool prefetch_always;
    kern_tier_io_t io; /* URING, PREAD or MMAP, as opened */
    uint8_t *map;      /* the file mapped read-only (MMAP), NULL otherwise */
    size_t map_bytes;
#ifdef KILN_HAVE_URING
    struct io_uring ring;
    int64_t pf_inflight; /* prefetch fadvises not yet reaped */
#endif
    /* Write-behind: a put hands its writes (copied into a queue) to a
     * thread of the tier's own and returns; every call that reads waits
     * for them first (wb_wait), so reads never see a page before its
     * write. The writer writes wbq[!wb_fill] while wb_busy; callers fill
     * wbq[wb_fill]. */
    pthread_t wb_thread;
    int wb_started, wb_quit;
    pthread_mutex_t wb_mu;
    pthread_cond_t wb_cv;
    wbq_t wbq[2];
    int wb_fill;
    int wb_busy;   /* the writer holds a queue */
    int wb_cold;   /* the tier's reads are slow (kern_tier_slow): the writer reads ahead */
    int wb_rc;     /* the first failure, till a call reports it */
    char wb_msg[512];
};

static inline kern_rec_t *rec_at(const kern_tier_t *c, uint8_t *buf, int i)
{
    return (kern_rec_t *)(buf + (size_t)i * c->rec);
}

static inline uint8_t *buf_at(const kern_tier_t *c, int b)
{
    return c->bufs + (size_t)b * c->page;
}

/* Page p's dead bits. */
static inline uint64_t *dead_of(const kern_tier_t *c, int64_t p)
{
    return c->dead + (size_t)p * (size_t)c->dw;
}

static inline int is_dead(const kern_tier_t *c, int64_t p, int i)
{
    return (int)(dead_of(c, p)[i >> 6] >> (i & 63)) & 1;
}

/* Live records on page p. */
static int live_of(const kern_tier_t *c, int64_t p)
{
    int n = c->nrec[p];
    for (int w = 0; w < c->dw; w++)
        n -= __builtin_popcountll(dead_of(c, p)[w]);
    return n;
}

/* The lowest dead slot of page p, or -1. */
static int first_dead(const kern_tier_t *c, int64_t p)
{
    for (int w = 0; w < c->dw; w++)
        if (dead_of(c, p)[w])
            return w * 64 + __builtin_ctzll(dead_of(c, p)[w]);
    return -1;
}

/* Whether page p holds records (a walk reads it). */
static inline int holds(const kern_tier_t *c, int64_t p)
{
    return c->nrec[p] > 0 && live_of(c, p) > 0;
}

/* Whether a put must pass page p: no free slot and no dead one. */
static inline int page_full(const kern_tier_t *c, int64_t p)
{
    return c->nrec[p] >= c->per_page && first_dead(c, p) < 0;
}

/* Page p's fingerprints, a byte a slot. */
static inline uint8_t *fp_of(const kern_tier_t *c, int64_t p)
{
    return c->fp + (size_t)p * (size_t)c->per_page;
}

/* key's home page (the hash's top half) and fingerprint (its low byte). */
static inline int64_t home_of(const kern_tier_t *c, int64_t key, uint8_t *fp /* OUT */)
{
    uint64_t h = kern_mix64(kern_key_hash(key) ^ 0x74696572ULL);
    *fp = (uint8_t)h;
    return (int64_t)kern_hash_index(h, (uint64_t)c->nhome);
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
            if (op->write)
                io_uring_prep_write(sqe, c->fd, op->buf, (unsigned)op->len, (uint64_t)op->off);
            else
                io_uring_prep_read(sqe, c->fd, op->buf, (unsigned)op->len, (uint64_t)op->off);
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
 * Two queues: the caller appends (copies) writes to the filling one while
 * the writer thread writes the other; when the writer finishes its queue
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
        int rc = 0, cold = c->wb_cold;
        pthread_mutex_unlock(&c->wb_mu);
        /* A record smaller than a page, written where the page is not in
         * the page cache, makes the kernel read the page first, in the
         * write and one at a time. With the file cold, ask for all the
         * queue's pages at once first, so those reads run together. */
        for (int i = 0; cold && i < q->n; i++)
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

/* Writes the n transfers of ops behind the caller's back (the writer
 * thread, started on first use) when they fit WB_MAX, else now. The
 * writes overlap the caller's work that follows (the rest of the put, the
 * step's update, its next batch) on a core the step leaves free. */
static int wb_write(kern_tier_t *c, const iop_t *ops, int n)
{
    size_t bytes = 0;
    for (int i = 0; i < n; i++)
        bytes += ops[i].len;
    if (n == 0)
        return 0;
    if (bytes > WB_MAX) {
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
    c->wb_cold = kern_tier_slow(c);
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

/* Sizes the file to its pages (sparse: holes take no disk) and maps it for
 * reading. Returns 0 or the errno. */
static int map_file(kern_tier_t *c)
{
    size_t bytes = (size_t)c->npages * c->page;
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
    c->io = KERN_TIER_IO_PREAD;
    pthread_mutex_init(&c->wb_mu, NULL);
    pthread_cond_init(&c->wb_cv, NULL);
    c->nfloat = nfloat;
    c->rec = (sizeof(kern_rec_t) + sizeof(float) * (size_t)nfloat + 7) & ~(size_t)7;
    c->page = PAGE_MIN;
    while (c->page / c->rec < MIN_PER_PAGE)
        c->page += PAGE_MIN;
    c->per_page = (int)(c->page / c->rec);
    if (c->per_page > 65535)
        c->per_page = 65535;
    c->dw = (c->per_page + 63) / 64;
    c->nhome = (int64_t)((double)(rows > 0 ? rows : 1) / (LOAD * c->per_page)) + 1;
    c->npages = c->nhome + (c->nhome / 64 > 64 ? c->nhome / 64 : 64);
    int rc = 0;
    c->path = kiln_strdup(path);
    c->table = kiln_strdup(table ? table : "?");
    c->nrec = kiln_calloc((size_t)c->npages, sizeof *c->nrec);
    c->spilled = kiln_calloc((size_t)c->npages, 1);
    c->fp = kiln_malloc((size_t)c->npages * (size_t)c->per_page);
    c->want = kiln_malloc(sizeof *c->want * BATCH * (size_t)c->dw);
    c->dead = kiln_calloc((size_t)c->npages * (size_t)c->dw, sizeof *c->dead);
    c->lo = kiln_malloc((size_t)c->npages * sizeof *c->lo);
    c->hi = kiln_malloc((size_t)c->npages * sizeof *c->hi);
    c->bufs = kiln_malloc(c->page * BATCH);
    c->bpage = kiln_malloc(sizeof *c->bpage * BATCH);
    c->bmark = kiln_malloc(sizeof *c->bmark * BATCH);
    c->ops = kiln_malloc(sizeof *c->ops * 2 * BATCH);
    if (!c->path || !c->table || !c->nrec || !c->spilled || !c->fp || !c->want || !c->dead ||
        !c->lo || !c->hi || !c->bufs ||
        !c->bpage || !c->bmark || !c->ops) {
        rc = KILN_ENOMEM;
        goto out;
    }
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
        if (r == 0)
            c->io = KERN_TIER_IO_URING;
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
    KILN_FREE_ALL(c->path, c->table, c->nrec, c->spilled, c->fp, c->want, c->dead, c->lo, c->hi,
                  c->bufs, c->bpage, c->bmark, c->ops, c->wbq[0].ops, c->wbq[0].buf,
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
                              .page_bytes = (int64_t)c->page,
                              .npages = c->npages,
                              .io = c->io};
}

/* ---- keys in home order --------------------------------------------------------------- */

typedef struct {
    int64_t home;
    int64_t i;
    uint32_t fp; /* the key's fingerprint */
} ord_t;

/* Indices of the n keys (every stride bytes from keys) in home page order,
 * keys of one page in index order: an LSD radix sort over the bits a home
 * needs, 11 at a time (a step's misses sort in two or three passes instead
 * of a comparison sort's ~15 rounds). */
static ord_t *order(const kern_tier_t *c, int64_t n, const int64_t *keys, size_t stride)
{
    size_t bytes = sizeof(ord_t) * (size_t)(n > 0 ? n : 1);
    ord_t *o = kiln_malloc(bytes), *tmp = kiln_malloc(bytes);
    int64_t *cnt = kiln_malloc(sizeof *cnt * 2048);
    if (!o || !tmp || !cnt) {
        KILN_FREE_ALL(o, tmp, cnt);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t key = *(const int64_t *)((const uint8_t *)keys + (size_t)i * stride);
        uint8_t fp;
        int64_t home = home_of(c, key, &fp);
        o[i] = (ord_t){.home = home, .i = i, .fp = fp};
    }
    int bits = 1;
    while (((int64_t)1 << bits) < c->nhome)
        bits++;
    for (int shift = 0; shift < bits; shift += 11) {
        memset(cnt, 0, sizeof *cnt * 2048);
        for (int64_t i = 0; i < n; i++)
            cnt[(o[i].home >> shift) & 2047]++;
        for (int64_t d = 0, at = 0; d < 2048; d++) {
            int64_t k = cnt[d];
            cnt[d] = at;
            at += k;
        }
        for (int64_t i = 0; i < n; i++)
            tmp[cnt[(o[i].home >> shift) & 2047]++] = o[i];
        ord_t *sw = o;
        o = tmp;
        tmp = sw;
    }
    free(tmp);
    free(cnt);
    return o;
}

/* Adds the pages of key's walk that hold records and the batch lacks.
 * Keys come in home order, so the walk's pages the batch lacks all lie past
 * its last page. Returns 1 (nothing added) when they do not fit. */
static int plan_walk(kern_tier_t *c, int64_t home)
{
    int64_t last = c->nb > 0 ? c->bpage[c->nb - 1] : -1;
    int add = 0;
    for (int64_t p = home; p < c->npages; p++) {
        add += holds(c, p) && p > last;
        if (!c->spilled[p])
            break;
    }
    if (add > BATCH - c->nb)
        return 1;
    for (int64_t p = home; add > 0; p++) {
        if (holds(c, p) && p > last) {
            c->bpage[c->nb++] = p;
            add--;
        }
    }
    return 0;
}

/* The batch's buffer index of page p, -1 when absent (pages ascend). */
static int batch_find(const kern_tier_t *c, int64_t p)
{
    int lo = 0, hi = c->nb - 1;
    while (lo <= hi) {
        int m = lo + (hi - lo) / 2;
        if (c->bpage[m] == p)
            return m;
        if (c->bpage[m] < p)
            lo = m + 1;
        else
            hi = m - 1;
    }
    return -1;
}

/* Reads the batch's pages (their used slots) in one submission. */
static int batch_read(kern_tier_t *c)
{
    for (int b = 0; b < c->nb; b++)
        c->ops[b] = (iop_t){.off = c->bpage[b] * (int64_t)c->page,
                            .len = (size_t)c->nrec[c->bpage[b]] * c->rec,
                            .buf = buf_at(c, b)};
    return io_run(c, c->ops, c->nb);
}

/* Bit i set where f[i] == fp, for i < n <= 64. Eight slots at a time: a
 * byte of w ^ fp is zero exactly where they match (the test below has no
 * false alarms, unlike the one that finds a tab in data_tsv.c), and a
 * multiply gathers the eight bytes' high bits. A page of lr rows holds 128
 * records, so a byte at a time was most of a miss's CPU in the tier. */
static inline uint64_t fp_bits(const uint8_t *f, int n, uint8_t fp)
{
    uint64_t m = 0;
    int i = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const uint64_t lo7 = 0x7f7f7f7f7f7f7f7full, highs = 0x8080808080808080ull;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, f + i, 8);
        w ^= 0x0101010101010101ull * fp;
        const uint64_t z = ~(((w & lo7) + lo7) | w) & highs; /* high bit of each zero byte */
        m |= (((z >> 7) * 0x0102040810204080ull) >> 56) << i;
    }
#endif
    for (; i < n; i++)
        m |= (uint64_t)(f[i] == fp) << i;
    return m;
}

/* The used slots of page p in its 64-slot word w. */
static inline uint64_t used_bits(const kern_tier_t *c, int64_t p, int w)
{
    const int n = c->nrec[p] - w * 64;
    return n >= 64 ? ~(uint64_t)0 : n > 0 ? ((uint64_t)1 << n) - 1 : 0;
}

/* Marks, in the batch's want bits, the live slots on the walk from home
 * whose fingerprint is fp. */
static void want_walk(kern_tier_t *c, int64_t home, uint8_t fp)
{
    for (int64_t p = home; p < c->npages; p++) {
        if (holds(c, p)) {
            int b = batch_find(c, p);
            const uint8_t *f = fp_of(c, p);
            const uint64_t *dead = dead_of(c, p);
            uint64_t *want = c->want + (size_t)b * (size_t)c->dw;
            for (int w = 0; w * 64 < c->nrec[p]; w++) {
                const int n = c->nrec[p] - w * 64;
                want[w] |= fp_bits(f + w * 64, n < 64 ? n : 64, fp) & ~dead[w];
            }
        }
        if (!c->spilled[p])
            break;
    }
}

/* Reads of a lookup's batch: of each page only the slots from its first
 * wanted one to its last (a key's record, not the page: a page holds ~26
 * records of dim 16 with adagrad), none of a page no key's fingerprint
 * matches. The rest of the page's buffer is junk. */
static int batch_read_wanted(kern_tier_t *c)
{
    int no = 0;
    for (int b = 0; b < c->nb; b++) {
        int64_t p = c->bpage[b];
        const uint64_t *want = c->want + (size_t)b * (size_t)c->dw;
        int first = -1, last = -1;
        for (int w = 0; w < c->dw; w++) {
            if (!want[w])
                continue;
            first = first < 0 ? w * 64 + __builtin_ctzll(want[w]) : first;
            last = w * 64 + 63 - __builtin_clzll(want[w]);
        }
        if (first < 0)
            continue;
        c->ops[no++] = (iop_t){.off = p * (int64_t)c->page + first * (int64_t)c->rec,
                               .len = (size_t)(last - first + 1) * c->rec,
                               .buf = buf_at(c, b) + (size_t)first * c->rec};
    }
    return io_run(c, c->ops, no);
}

/* Finds key on its walk through the batch's wanted slots: 0 with *b and
 * *idx, or 1. */
static int batch_walk(const kern_tier_t *c, int64_t key, int64_t home, int *bout, int *idx)
{
    for (int64_t p = home; p < c->npages; p++) {
        if (holds(c, p)) {
            int b = batch_find(c, p);
            uint8_t *buf = buf_at(c, b);
            const uint64_t *want = c->want + (size_t)b * (size_t)c->dw, *dead = dead_of(c, p);
            for (int w = 0; w * 64 < c->nrec[p]; w++) {
                /* the wanted live slots, lowest first */
                for (uint64_t m = want[w] & ~dead[w] & used_bits(c, p, w); m; m &= m - 1) {
                    const int i = w * 64 + __builtin_ctzll(m);
                    if (rec_at(c, buf, i)->key == key) {
                        *bout = b;
                        *idx = i;
                        return 0;
                    }
                }
            }
        }
        if (!c->spilled[p])
            break;
    }
    return 1;
}

/* Takes record i of page p out: its slot goes dead, in RAM only (dead
 * slots at the page's end are given back to it). */
static void slot_kill(kern_tier_t *c, int64_t p, int i)
{
    dead_of(c, p)[i >> 6] |= (uint64_t)1 << (i & 63);
    c->size--;
    while (c->nrec[p] > 0 && is_dead(c, p, c->nrec[p] - 1)) {
        int j = c->nrec[p] - 1;
        dead_of(c, p)[j >> 6] &= ~((uint64_t)1 << (j & 63));
        c->nrec[p]--;
    }
}

/* ---- calls ---------------------------------------------------------------------------- */

/* take (out != NULL), has (found only) or delete (gone) over keys[n]:
 * reads, writes nothing. */
static int lookup(kern_tier_t *c, int64_t n, const int64_t *keys, void *out, uint8_t *found,
                  int remove, kern_tier_gone_fn gone, void *ctx, int64_t *nhit)
{
    *nhit = 0;
    if (found)
        memset(found, 0, (size_t)n);
    KILN_CHECK(wb_wait(c));
    if (n == 0 || c->size == 0)
        return 0;
    ord_t *o = order(c, n, keys, sizeof(int64_t));
    if (!o)
        return KILN_ENOMEM;
    int rc = 0;
    for (int64_t k = 0; k < n && rc == 0;) {
        int64_t end = k;
        c->nb = 0;
        while (end < n && plan_walk(c, o[end].home) == 0)
            end++;
        if (end == k) {
            rc = kiln_errf(KILN_EINTERNAL, "table '%s': a walk in its disk tier %s passes more "
                           "than %d full pages", c->table, c->path, BATCH);
            break;
        }
        memset(c->want, 0, sizeof *c->want * (size_t)c->nb * (size_t)c->dw);
        for (int64_t j = k; j < end; j++)
            want_walk(c, o[j].home, (uint8_t)o[j].fp);
        int64_t r0 = c->reads, t0 = kiln_mono_ns();
        rc = batch_read_wanted(c);
        if (c->reads > r0) {
            double per = (double)(kiln_mono_ns() - t0) / (double)(c->reads - r0);
            c->read_ns = c->read_ns > 0 ? 0.9 * c->read_ns + 0.1 * per : per;
        }
        for (; k < end && rc == 0; k++) {
            int64_t i = o[k].i;
            int b, idx;
            if (batch_walk(c, keys[i], o[k].home, &b, &idx) != 0)
                continue;
            if (found)
                found[i] = 1;
            (*nhit)++;
            kern_rec_t *r = rec_at(c, buf_at(c, b), idx);
            if (out)
                memcpy((uint8_t *)out + (size_t)i * c->rec, r, c->rec);
            if (gone)
                rc = gone(ctx, r->key, r->stamp);
            if (remove && rc == 0)
                slot_kill(c, c->bpage[b], idx);
        }
        c->nb = 0;
    }
    free(o);
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

/* Sends the put's writes: records into dead slots (c->ops[0..nops), from
 * the caller's records) and each batch page's appended slots. */
static int put_flush(kern_tier_t *c)
{
    for (int b = 0; b < c->nb; b++) {
        int64_t p = c->bpage[b];
        c->ops[c->nops++] = (iop_t){.off = p * (int64_t)c->page + c->bmark[b] * (int64_t)c->rec,
                                    .len = (size_t)(c->nrec[p] - c->bmark[b]) * c->rec,
                                    .buf = buf_at(c, b),
                                    .write = 1};
    }
    int n = c->nops;
    c->nb = c->nops = 0;
    return wb_write(c, c->ops, n);
}

int kern_tier_put(kern_tier_t *c, int64_t n, const void *recs)
{
    /* No wait for earlier writes: the writer keeps their order, and a
     * slot a put fills was freed by a take, which waited for them. */
    if (n == 0)
        return 0;
    ord_t *o = order(c, n, (const int64_t *)recs, c->rec);
    if (!o)
        return KILN_ENOMEM;
    int rc = 0;
    c->nb = c->nops = 0;
    /* Keys in home order land on pages in ascending order: a key passes
     * only pages that were full for the keys before it. */
    for (int64_t k = 0; k < n && rc == 0; k++) {
        uint8_t *r = (uint8_t *)recs + (size_t)o[k].i * c->rec; /* only written from */
        kern_rec_t h;
        memcpy(&h, r, sizeof h);
        int64_t p = o[k].home;
        while (p < c->npages && page_full(c, p))
            c->spilled[p++] = 1;
        if (p == c->npages) {
            rc = kiln_errf(KILN_ENOSPC, "table '%s': its disk tier %s has no page left for "
                           "key %lld (%lld records in %lld pages); raise "
                           "model.embedding.capacity, which sizes the tier",
                           c->table, c->path, (long long)h.key, (long long)c->size,
                           (long long)c->npages);
            break;
        }
        if (c->nb == BATCH || c->nops == BATCH)
            rc = put_flush(c);
        int empty = live_of(c, p) == 0, slot = first_dead(c, p);
        if (slot >= 0) {
            /* Into the dead slot: the record goes straight from recs. */
            dead_of(c, p)[slot >> 6] &= ~((uint64_t)1 << (slot & 63));
            fp_of(c, p)[slot] = (uint8_t)o[k].fp;
            c->ops[c->nops++] = (iop_t){.off = p * (int64_t)c->page + slot * (int64_t)c->rec,
                                        .len = c->rec, .buf = r, .write = 1};
        } else {
            if (c->nb == 0 || c->bpage[c->nb - 1] != p) {
                c->bpage[c->nb] = p;
                c->bmark[c->nb++] = c->nrec[p];
            }
            int b = c->nb - 1;
            memcpy(buf_at(c, b) + (size_t)(c->nrec[p] - c->bmark[b]) * c->rec, r, c->rec);
            fp_of(c, p)[c->nrec[p]] = (uint8_t)o[k].fp;
            c->nrec[p]++;
        }
        if (empty || h.stamp < c->lo[p])
            c->lo[p] = h.stamp;
        if (empty || h.stamp > c->hi[p])
            c->hi[p] = h.stamp;
        c->size++;
    }
    int wrc = put_flush(c);
    free(o);
    return rc < 0 ? rc : wrc;
}

/* Asks the kernel to read pages first..last (their records) ahead. */
static void prefetch_run(kern_tier_t *c, int64_t first, int64_t last)
{
    off_t off = (off_t)(first * (int64_t)c->page);
    off_t len = (off_t)((last - first) * (int64_t)c->page + (int64_t)c->nrec[last] * (int64_t)c->rec);
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
        io_uring_prep_fadvise(sqe, c->fd, (uint64_t)off, len, POSIX_FADV_WILLNEED);
        sqe->user_data = PREFETCH_TAG;
        c->pf_inflight++;
        c->prefetched += last - first + 1;
        return;
    }
#endif
    c->prefetched += last - first + 1;
    (void)posix_fadvise(c->fd, off, len, POSIX_FADV_WILLNEED);
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
    ord_t *o = order(c, n, keys, sizeof(int64_t));
    if (!o)
        return KILN_ENOMEM;
    /* Runs of pages holding records at most PREFETCH_GAP apart, one
     * fadvise each. */
    int64_t first = -1, last = -1;
    for (int64_t k = 0; k < n; k++) {
        for (int64_t p = o[k].home; p < c->npages; p++) {
            if (holds(c, p) && p > last) {
                if (first >= 0 && p > last + PREFETCH_GAP) {
                    prefetch_run(c, first, last);
                    first = -1;
                }
                first = first < 0 ? p : first;
                last = p;
            }
            if (!c->spilled[p])
                break;
        }
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
    free(o);
    return 0;
}

/* ---- whole-tier passes ------------------------------------------------------------------
 * A pass picks pages (those holding records that it needs) BATCH at a time,
 * reads them in one submission and hands each to a page function, which
 * skips dead slots and may take records out (slot_kill); the pages it
 * changed go back packed (no dead slots) and whole in one submission, their
 * stamp ranges exact again. */

/* Works on page p's records in buf; returns 1 when it changed them, 0 when
 * not, or a negative KILN_E* code. */
typedef int (*page_fn)(kern_tier_t *c, void *ctx, int64_t p, uint8_t *buf);

/* Runs fn over the batch's pages (c->bpage[0..nb), any order). */
static int batch_visit(kern_tier_t *c, page_fn fn, void *ctx)
{
    int rc = batch_read(c), no = 0;
    for (int b = 0; b < c->nb && rc == 0; b++) {
        int64_t p = c->bpage[b];
        int r = fn(c, ctx, p, buf_at(c, b));
        if (r < 0)
            rc = r;
        if (r <= 0)
            continue;
        int m = 0;
        int64_t lo = INT64_MAX, hi = INT64_MIN;
        for (int i = 0; i < c->nrec[p]; i++) {
            if (is_dead(c, p, i))
                continue;
            kern_rec_t *rec = rec_at(c, buf_at(c, b), i);
            lo = rec->stamp < lo ? rec->stamp : lo;
            hi = rec->stamp > hi ? rec->stamp : hi;
            if (m != i) {
                memcpy(rec_at(c, buf_at(c, b), m), rec, c->rec);
                fp_of(c, p)[m] = fp_of(c, p)[i];
            }
            m++;
        }
        memset(dead_of(c, p), 0, sizeof(uint64_t) * (size_t)c->dw);
        c->nrec[p] = (uint16_t)m;
        c->lo[p] = lo;
        c->hi[p] = hi;
        if (m == 0)
            continue;
        c->ops[no++] = (iop_t){.off = p * (int64_t)c->page,
                               .len = (size_t)c->nrec[p] * c->rec,
                               .buf = buf_at(c, b),
                               .write = 1};
    }
    c->nb = 0;
    int wrc = io_run(c, c->ops, no); /* what fn changed goes back, whatever failed */
    return rc < 0 ? rc : wrc;
}

/* Adds page p to the batch, visiting the batch first when it is full. */
static int batch_add(kern_tier_t *c, int64_t p, page_fn fn, void *ctx)
{
    if (c->nb == BATCH)
        KILN_CHECK(batch_visit(c, fn, ctx));
    c->bpage[c->nb++] = p;
    return 0;
}

typedef struct {
    uint32_t prio;
    int64_t page;
    int idx;
} cand_t;

static int cmp_cand(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->prio != y->prio)
        return x->prio < y->prio ? -1 : 1;
    if (x->page != y->page)
        return x->page < y->page ? -1 : 1;
    return x->idx - y->idx;
}

/* Removal order: by page ascending, within a page from the last record
 * down, so a slot that slot_kill gives back is never one still to go. */
static int cmp_cand_page(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->page != y->page)
        return x->page < y->page ? -1 : 1;
    return y->idx - x->idx;
}

/* Who is told of the records an evict or an expire takes out, and how many it took. */
typedef struct {
    kern_tier_gone_fn fn;
    void *ctx;
    int64_t removed;
} gone_t;

/* Tells the owner that record r (slot i of page p) goes, then takes it out. */
static int rec_gone(kern_tier_t *c, gone_t *g, int64_t p, int i, const kern_rec_t *r)
{
    KILN_CHECK(g->fn(g->ctx, r->key, r->stamp));
    slot_kill(c, p, i);
    g->removed++;
    return 0;
}

typedef struct {
    cand_t *cand;
    int64_t nc, cap, at;
    uint32_t (*prio)(const void *pctx, const kern_rec_t *r);
    const void *pctx;
    gone_t gone;
} evict_t;

static int evict_sample(kern_tier_t *c, void *ctx, int64_t p, uint8_t *buf)
{
    evict_t *e = ctx;
    for (int i = 0; i < c->nrec[p] && e->nc < e->cap; i++)
        if (!is_dead(c, p, i))
            e->cand[e->nc++] = (cand_t){e->prio(e->pctx, rec_at(c, buf, i)), p, i};
    return 0;
}

static int evict_remove(kern_tier_t *c, void *ctx, int64_t p, uint8_t *buf)
{
    evict_t *e = ctx;
    int changed = 0;
    for (; e->at < e->nc && e->cand[e->at].page == p; e->at++) {
        int i = e->cand[e->at].idx;
        KILN_CHECK(rec_gone(c, &e->gone, p, i, rec_at(c, buf, i)));
        changed = 1;
    }
    return changed;
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
    /* Sample pages until they hold 4 x need records (every page when the
     * tier is that small). */
    int64_t want = 4 * need, got = 0;
    evict_t e = {.cap = want + c->per_page, .prio = prio, .pctx = pctx, .gone = {gone, ctx, 0}};
    e.cand = kiln_malloc(sizeof *e.cand * (size_t)e.cap);
    if (!e.cand)
        return KILN_ENOMEM;
    int rc = 0;
    /* Consecutive pages from a seeded start: keys land on pages by hash, so
     * a run of pages is as good a sample as scattered ones, and cheaper. */
    int64_t start = want >= c->size ? 0
                    : (int64_t)(kern_mix64(seed ^ 0x65766963ULL) % (uint64_t)c->npages);
    c->nb = 0;
    for (int64_t j = 0; j < c->npages && got < want && rc == 0; j++) {
        int64_t pg = (start + j) % c->npages;
        if (!holds(c, pg))
            continue;
        rc = batch_add(c, pg, evict_sample, &e);
        got += live_of(c, pg);
    }
    if (rc == 0)
        rc = batch_visit(c, evict_sample, &e);
    if (rc < 0)
        goto out;
    qsort(e.cand, (size_t)e.nc, sizeof *e.cand, cmp_cand);
    if (e.nc > need)
        e.nc = need;
    qsort(e.cand, (size_t)e.nc, sizeof *e.cand, cmp_cand_page);
    for (int64_t j = 0; j < e.nc && rc == 0; j++)
        if (j == 0 || e.cand[j].page != e.cand[j - 1].page)
            rc = batch_add(c, e.cand[j].page, evict_remove, &e);
    if (rc == 0)
        rc = batch_visit(c, evict_remove, &e);
out:
    c->nb = 0;
    *nevicted = e.gone.removed;
    free(e.cand);
    return rc;
}

typedef struct {
    int64_t before;
    gone_t gone;
} expire_t;

static int expire_page(kern_tier_t *c, void *ctx, int64_t p, uint8_t *buf)
{
    expire_t *x = ctx;
    int changed = 0;
    for (int i = c->nrec[p] - 1; i >= 0; i--) {
        kern_rec_t *r = rec_at(c, buf, i);
        if (i >= c->nrec[p] || is_dead(c, p, i) || r->stamp >= x->before)
            continue;
        KILN_CHECK(rec_gone(c, &x->gone, p, i, r));
        changed = 1;
    }
    return changed;
}

int kern_tier_expire(kern_tier_t *c, int64_t before, kern_tier_gone_fn gone, void *ctx,
                     int64_t *nexpired /* OUT */)
{
    expire_t x = {.before = before, .gone = {gone, ctx, 0}};
    int rc = wb_wait(c);
    c->nb = 0;
    for (int64_t p = 0; p < c->npages && rc == 0; p++)
        if (holds(c, p) && c->lo[p] < before)
            rc = batch_add(c, p, expire_page, &x);
    if (rc == 0)
        rc = batch_visit(c, expire_page, &x);
    c->nb = 0;
    *nexpired = x.gone.removed;
    return rc;
}

typedef struct {
    int64_t since, n;
    kern_tier_chunk_fn fn;
    void *ctx;
} since_t;

static int count_page(kern_tier_t *c, void *ctx, int64_t p, uint8_t *buf)
{
    since_t *s = ctx;
    for (int i = 0; i < c->nrec[p]; i++)
        s->n += !is_dead(c, p, i) && rec_at(c, buf, i)->stamp > s->since;
    return 0;
}

int kern_tier_count(kern_tier_t *c, int64_t since, int64_t *n /* OUT */)
{
    since_t s = {.since = since};
    int rc = wb_wait(c);
    c->nb = 0;
    for (int64_t p = 0; p < c->npages && rc == 0; p++) {
        if (!holds(c, p) || c->hi[p] <= since)
            continue;
        if (c->lo[p] > since)
            s.n += live_of(c, p); /* every record of the page is newer */
        else
            rc = batch_add(c, p, count_page, &s);
    }
    if (rc == 0)
        rc = batch_visit(c, count_page, &s);
    c->nb = 0;
    *n = s.n;
    return rc;
}

int kern_tier_scan(kern_tier_t *c, int64_t *page, int64_t cap, void *out /* OUT (cap) */,
                   int64_t *n /* OUT */)
{
    *n = 0;
    KILN_CHECK(wb_wait(c));
    /* One batch: the next pages holding records, as many as fit cap. */
    int64_t p = *page, fit = 0;
    c->nb = 0;
    for (; p < c->npages && c->nb < BATCH; p++) {
        if (!holds(c, p))
            continue;
        if (fit + live_of(c, p) > cap)
            break;
        fit += live_of(c, p);
        c->bpage[c->nb++] = p;
    }
    if (c->nb == 0 && p < c->npages)
        return kiln_errf(KILN_EINVAL, "table '%s': kern_tier_scan needs room for a page's "
                         "records (%d), not %lld", c->table, c->per_page, (long long)cap);
    int rc = batch_read(c);
    int64_t got = 0;
    for (int b = 0; b < c->nb && rc == 0; b++)
        for (int i = 0; i < c->nrec[c->bpage[b]]; i++)
            if (!is_dead(c, c->bpage[b], i))
                memcpy((uint8_t *)out + (size_t)got++ * c->rec, rec_at(c, buf_at(c, b), i),
                       c->rec);
    c->nb = 0;
    *page = p;
    *n = got;
    return rc;
}

/* Packs the page's records newer than since to the front of its copy (the
 * file keeps its order) and hands them on. */
static int each_page(kern_tier_t *c, void *ctx, int64_t p, uint8_t *buf)
{
    since_t *s = ctx;
    int m = 0;
    for (int i = 0; i < c->nrec[p]; i++) {
        kern_rec_t *r = rec_at(c, buf, i);
        if (is_dead(c, p, i) || r->stamp <= s->since)
            continue;
        if (m != i)
            memmove(rec_at(c, buf, m), r, c->rec);
        m++;
    }
    int rc = m > 0 ? s->fn(s->ctx, m, buf) : 0;
    return rc < 0 ? rc : 0;
}

int kern_tier_each(kern_tier_t *c, int64_t since, kern_tier_chunk_fn fn, void *ctx)
{
    since_t s = {.since = since, .fn = fn, .ctx = ctx};
    int rc = wb_wait(c);
    c->nb = 0;
    for (int64_t p = 0; p < c->npages && rc == 0; p++)
        if (holds(c, p) && c->hi[p] > since)
            rc = batch_add(c, p, each_page, &s);
    if (rc == 0)
        rc = batch_visit(c, each_page, &s);
    c->nb = 0;
    return rc;
}
