/*
 * kernels/kern_tier.c - kern_int.h: the disk tier of an embedding table, a
 * hash table of row records in one file.
 *
 * Layout. The file is npages pages of page_bytes bytes; page p holds
 * nrec[p] records packed from its start (what follows is junk). A key's
 * home page is its hash modulo nhome; when the home page is full the record
 * goes to the next page with room, and every full page passed on the way
 * is flagged `spilled`, so a lookup walks from the home page while pages are
 * spilled and stops at the first that is not. Pages past nhome are spare
 * (npages - nhome of them) so a walk never wraps around. Deletion moves a
 * page's last record into the hole and leaves the flags: a flag only costs
 * a read. Page counts, flags and stamp ranges live in RAM, so a lookup
 * whose walk meets only empty pages reads nothing.
 *
 * Sizes: a page holds at least 8 records (4 KiB, or more for wide rows),
 * and the file has room for rows / LOAD records at home, LOAD = 0.75, so
 * walks stay short. The file is sparse: pages never written take no disk.
 *
 * I/O. A call sorts its keys by home page and goes through them with a
 * window of up to WINDOW pages in RAM: a page is read once per call when it
 * is first needed (not at all when it is empty), changed in the window and
 * written back when the window needs its buffer or at the end of the call.
 * Only the bytes of a page's live records move.
 */
#include "kern_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kern_ops.h"

#define LOAD 0.75
#define PAGE_MIN 4096
#define MIN_PER_PAGE 8
#define WINDOW 64

typedef struct {
    int64_t page; /* -1: free */
    int dirty;
    uint8_t *buf;
} win_t;

struct kern_tier {
    char *path, *table;
    int fd;
    size_t rec;       /* bytes per record */
    size_t page;      /* bytes per page */
    int per_page;     /* records a page holds */
    int nfloat;
    int64_t nhome, npages;
    int64_t size;     /* records held */
    uint16_t *nrec;   /* (npages) */
    uint8_t *spilled; /* (npages) a record whose walk passed this page lies further on */
    int64_t *lo, *hi; /* (npages) smallest and largest stamp on the page (when nrec > 0) */
    win_t win[WINDOW];
    uint8_t *bufs;    /* WINDOW pages */
    int64_t reads, writes;
};

static inline kern_rec_t *rec_at(const kern_tier_t *c, uint8_t *buf, int i)
{
    return (kern_rec_t *)(buf + (size_t)i * c->rec);
}

static int64_t home_of(const kern_tier_t *c, int64_t key)
{
    return (int64_t)kern_hash_index(kern_mix64(kern_key_hash(key) ^ 0x74696572ULL),
                                    (uint64_t)c->nhome);
}

/* ---- life cycle --------------------------------------------------------------- */

int kern_tier_open(const char *path, const char *table, int64_t rows, int nfloat,
                   kern_tier_t **out /* OUT */)
{
    *out = NULL;
    kern_tier_t *c = kiln_calloc(1, sizeof *c);
    if (!c)
        return KILN_ENOMEM;
    c->fd = -1;
    c->nfloat = nfloat;
    c->rec = (sizeof(kern_rec_t) + sizeof(float) * (size_t)nfloat + 7) & ~(size_t)7;
    c->page = PAGE_MIN;
    while (c->page / c->rec < MIN_PER_PAGE)
        c->page += PAGE_MIN;
    c->per_page = (int)(c->page / c->rec);
    if (c->per_page > 65535)
        c->per_page = 65535;
    c->nhome = (int64_t)((double)(rows > 0 ? rows : 1) / (LOAD * c->per_page)) + 1;
    c->npages = c->nhome + (c->nhome / 64 > 64 ? c->nhome / 64 : 64);
    int rc = 0;
    c->path = kiln_strdup(path);
    c->table = kiln_strdup(table ? table : "?");
    c->nrec = kiln_calloc((size_t)c->npages, sizeof *c->nrec);
    c->spilled = kiln_calloc((size_t)c->npages, 1);
    c->lo = kiln_malloc((size_t)c->npages * sizeof *c->lo);
    c->hi = kiln_malloc((size_t)c->npages * sizeof *c->hi);
    c->bufs = kiln_malloc(c->page * WINDOW);
    if (!c->path || !c->table || !c->nrec || !c->spilled || !c->lo || !c->hi || !c->bufs) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int w = 0; w < WINDOW; w++)
        c->win[w] = (win_t){.page = -1, .buf = c->bufs + (size_t)w * c->page};
    c->fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (c->fd < 0) {
        rc = kiln_errf(KILN_EIO, "table '%s': cannot create its disk tier %s: %s; check "
                       "model.embedding.spill_dir",
                       c->table, path, strerror(errno));
        goto out;
    }
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
    if (c->fd >= 0) {
        close(c->fd);
        unlink(c->path);
    }
    KILN_FREE_ALL(c->path, c->table, c->nrec, c->spilled, c->lo, c->hi, c->bufs);
    free(c);
}

size_t kern_tier_rec_bytes(const kern_tier_t *c) { return c->rec; }
int64_t kern_tier_size(const kern_tier_t *c) { return c->size; }

void kern_tier_stats(const kern_tier_t *c, kern_tier_stats_t *st /* OUT */)
{
    *st = (kern_tier_stats_t){.pages_read = c->reads,
                              .pages_written = c->writes,
                              .page_bytes = (int64_t)c->page,
                              .npages = c->npages};
}

/* ---- the window -------------------------------------------------------------------- */

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

/* Writes window entry w back when dirty, with page p's stamp range. */
static int win_write(kern_tier_t *c, win_t *w)
{
    if (!w->dirty)
        return 0;
    int64_t p = w->page;
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int i = 0; i < c->nrec[p]; i++) {
        int64_t s = rec_at(c, w->buf, i)->stamp;
        lo = s < lo ? s : lo;
        hi = s > hi ? s : hi;
    }
    c->lo[p] = lo;
    c->hi[p] = hi;
    size_t bytes = (size_t)c->nrec[p] * c->rec;
    if (bytes > 0) {
        ssize_t got = pwrite(c->fd, w->buf, bytes, (off_t)p * (off_t)c->page);
        if (got != (ssize_t)bytes)
            return io_error(c, "writing", got < 0 ? errno : 0);
        c->writes++;
    }
    w->dirty = 0;
    return 0;
}

/* Writes every dirty page back and empties the window. */
static int win_flush(kern_tier_t *c)
{
    int rc = 0;
    for (int i = 0; i < WINDOW; i++) {
        if (c->win[i].page < 0)
            continue;
        int r = win_write(c, &c->win[i]);
        rc = rc < 0 ? rc : r;
        c->win[i].page = -1;
    }
    return rc;
}

/* Page p in the window (read in when it holds records); *buf is its buffer. */
static int win_get(kern_tier_t *c, int64_t p, win_t **out /* OUT */)
{
    win_t *free_w = NULL, *low = NULL;
    for (int i = 0; i < WINDOW; i++) {
        win_t *w = &c->win[i];
        if (w->page == p) {
            *out = w;
            return 0;
        }
        if (w->page < 0) {
            free_w = free_w ? free_w : w;
        } else if (!low || w->page < low->page) {
            low = w;
        }
    }
    win_t *w = free_w;
    if (!w) {
        /* Calls go through pages in ascending order: the lowest is done. */
        KILN_CHECK(win_write(c, low));
        w = low;
    }
    w->page = p;
    w->dirty = 0;
    size_t bytes = (size_t)c->nrec[p] * c->rec;
    if (bytes > 0) {
        ssize_t got = pread(c->fd, w->buf, bytes, (off_t)p * (off_t)c->page);
        if (got != (ssize_t)bytes) {
            w->page = -1;
            return io_error(c, "reading", got < 0 ? errno : 0);
        }
        c->reads++;
    }
    *out = w;
    return 0;
}

/* Finds key on its walk: *page and *idx of its record (0), or 1 when the
 * tier does not hold it, with *page the last page of the walk. */
static int walk_find(kern_tier_t *c, int64_t key, win_t **wout, int *idx)
{
    for (int64_t p = home_of(c, key); p < c->npages; p++) {
        if (c->nrec[p] > 0) {
            win_t *w;
            KILN_CHECK(win_get(c, p, &w));
            for (int i = 0; i < c->nrec[p]; i++) {
                if (rec_at(c, w->buf, i)->key == key) {
                    *wout = w;
                    *idx = i;
                    return 0;
                }
            }
        }
        if (!c->spilled[p])
            break;
    }
    return 1;
}

static void remove_at(kern_tier_t *c, win_t *w, int i)
{
    int64_t p = w->page;
    int last = c->nrec[p] - 1;
    if (i != last)
        memcpy(rec_at(c, w->buf, i), rec_at(c, w->buf, last), c->rec);
    c->nrec[p]--;
    c->size--;
    w->dirty = 1;
}

/* Key order for a call: indices sorted by home page. */
typedef struct {
    int64_t home;
    int64_t i;
} ord_t;

static int cmp_ord(const void *a, const void *b)
{
    const ord_t *x = a, *y = b;
    if (x->home != y->home)
        return x->home < y->home ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

static ord_t *order(const kern_tier_t *c, int64_t n, const int64_t *keys, size_t stride)
{
    ord_t *o = kiln_malloc(sizeof *o * (size_t)(n > 0 ? n : 1));
    if (!o)
        return NULL;
    for (int64_t i = 0; i < n; i++) {
        int64_t key = *(const int64_t *)((const uint8_t *)keys + (size_t)i * stride);
        o[i] = (ord_t){home_of(c, key), i};
    }
    qsort(o, (size_t)n, sizeof *o, cmp_ord);
    return o;
}

/* ---- calls ---------------------------------------------------------------------------- */

/* take (out != NULL), has (found only) or delete (gone) over keys[n]. */
static int lookup(kern_tier_t *c, int64_t n, const int64_t *keys, void *out, uint8_t *found,
                  int remove, kern_tier_gone_fn gone, void *ctx, int64_t *nhit)
{
    *nhit = 0;
    if (n == 0 || c->size == 0) {
        if (found)
            memset(found, 0, (size_t)n);
        return 0;
    }
    ord_t *o = order(c, n, keys, sizeof(int64_t));
    if (!o)
        return KILN_ENOMEM;
    int rc = 0;
    for (int64_t k = 0; k < n && rc == 0; k++) {
        int64_t i = o[k].i;
        win_t *w;
        int idx;
        rc = walk_find(c, keys[i], &w, &idx);
        if (rc < 0)
            break;
        if (found)
            found[i] = rc == 0;
        if (rc == 1) {
            rc = 0;
            continue;
        }
        (*nhit)++;
        kern_rec_t *r = rec_at(c, w->buf, idx);
        if (out)
            memcpy((uint8_t *)out + (size_t)i * c->rec, r, c->rec);
        if (gone)
            rc = gone(ctx, r->key, r->stamp);
        if (remove && rc == 0)
            remove_at(c, w, idx);
    }
    int frc = win_flush(c);
    free(o);
    return rc < 0 ? rc : frc;
}

int kern_tier_take(kern_tier_t *c, int64_t n, const int64_t *keys, void *out /* OUT (n) */,
                   uint8_t *found /* OUT (n) */)
{
    int64_t hit;
    return lookup(c, n, keys, out, found, 1, NULL, NULL, &hit);
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
    if (n == 0)
        return 0;
    ord_t *o = order(c, n, (const int64_t *)recs, c->rec);
    if (!o)
        return KILN_ENOMEM;
    int rc = 0;
    for (int64_t k = 0; k < n && rc == 0; k++) {
        const kern_rec_t *r = (const kern_rec_t *)((const uint8_t *)recs + (size_t)o[k].i * c->rec);
        win_t *w;
        int idx;
        rc = walk_find(c, r->key, &w, &idx);
        if (rc == 0) {
            memcpy(rec_at(c, w->buf, idx), r, c->rec);
            w->dirty = 1;
            continue;
        }
        if (rc < 0)
            break;
        rc = 0;
        /* Not held: the first page of the walk with room, flagging every
         * full page passed. */
        int64_t p = home_of(c, r->key);
        while (p < c->npages && c->nrec[p] >= c->per_page)
            c->spilled[p++] = 1;
        if (p == c->npages) {
            rc = kiln_errf(KILN_ENOSPC, "table '%s': its disk tier %s has no page left for "
                           "key %lld (%lld records in %lld pages); raise "
                           "model.embedding.capacity, which sizes the tier",
                           c->table, c->path, (long long)r->key, (long long)c->size,
                           (long long)c->npages);
            break;
        }
        rc = win_get(c, p, &w);
        if (rc < 0)
            break;
        memcpy(rec_at(c, w->buf, c->nrec[p]), r, c->rec);
        c->nrec[p]++;
        c->size++;
        w->dirty = 1;
    }
    int frc = win_flush(c);
    free(o);
    return rc < 0 ? rc : frc;
}

/* ---- whole-tier passes ------------------------------------------------------------------ */

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
 * down, so a moved last record is never one still to be removed. */
static int cmp_cand_page(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->page != y->page)
        return x->page < y->page ? -1 : 1;
    return y->idx - x->idx;
}

int kern_tier_evict(kern_tier_t *c, int64_t need, uint64_t seed,
                    uint32_t (*prio)(const void *pctx, const kern_rec_t *r), const void *pctx,
                    kern_tier_gone_fn gone, void *ctx, int64_t *nevicted /* OUT */)
{
    *nevicted = 0;
    if (need <= 0 || c->size == 0)
        return 0;
    if (need > c->size)
        need = c->size;
    /* Sample pages until they hold 4 x need records (every page when the
     * tier is that small). */
    int64_t want = 4 * need, got = 0, cap = want + c->per_page, nc = 0;
    cand_t *cand = kiln_malloc(sizeof *cand * (size_t)cap);
    if (!cand)
        return KILN_ENOMEM;
    int rc = 0;
    /* Consecutive pages from a seeded start: keys land on pages by hash, so
     * a run of pages is as good a sample as scattered ones, and cheaper. */
    int64_t start = want >= c->size ? 0
                    : (int64_t)(kern_mix64(seed ^ 0x65766963ULL) % (uint64_t)c->npages);
    for (int64_t j = 0; j < c->npages && got < want; j++) {
        int64_t pg = (start + j) % c->npages;
        if (c->nrec[pg] == 0)
            continue;
        win_t *w;
        KILN_CHECK_GOTO(win_get(c, pg, &w), rc, out);
        for (int i = 0; i < c->nrec[pg] && nc < cap; i++)
            cand[nc++] = (cand_t){prio(pctx, rec_at(c, w->buf, i)), pg, i};
        got += c->nrec[pg];
        w->page = -1; /* read only: the buffer may go */
    }
    KILN_CHECK_GOTO(win_flush(c), rc, out);
    qsort(cand, (size_t)nc, sizeof *cand, cmp_cand);
    if (nc > need)
        nc = need;
    qsort(cand, (size_t)nc, sizeof *cand, cmp_cand_page);
    for (int64_t j = 0; j < nc; j++) {
        win_t *w;
        KILN_CHECK_GOTO(win_get(c, cand[j].page, &w), rc, out);
        kern_rec_t *r = rec_at(c, w->buf, cand[j].idx);
        KILN_CHECK_GOTO(gone(ctx, r->key, r->stamp), rc, out);
        remove_at(c, w, cand[j].idx);
        (*nevicted)++;
    }
out:;
    int frc = win_flush(c);
    free(cand);
    return rc < 0 ? rc : frc;
}

int kern_tier_expire(kern_tier_t *c, int64_t before, kern_tier_gone_fn gone, void *ctx,
                     int64_t *nexpired /* OUT */)
{
    int rc = 0;
    *nexpired = 0;
    for (int64_t p = 0; p < c->npages && rc == 0; p++) {
        if (c->nrec[p] == 0 || c->lo[p] >= before)
            continue;
        win_t *w;
        KILN_CHECK_GOTO(win_get(c, p, &w), rc, out);
        for (int i = c->nrec[p] - 1; i >= 0; i--) {
            kern_rec_t *r = rec_at(c, w->buf, i);
            if (r->stamp >= before)
                continue;
            KILN_CHECK_GOTO(gone(ctx, r->key, r->stamp), rc, out);
            remove_at(c, w, i);
            (*nexpired)++;
        }
    }
out:;
    int frc = win_flush(c);
    return rc < 0 ? rc : frc;
}

int kern_tier_count(kern_tier_t *c, int64_t since, int64_t *n /* OUT */)
{
    *n = 0;
    for (int64_t p = 0; p < c->npages; p++) {
        if (c->nrec[p] == 0 || c->hi[p] <= since)
            continue;
        if (c->lo[p] > since) {
            *n += c->nrec[p];
            continue;
        }
        win_t *w;
        int rc = win_get(c, p, &w);
        if (rc < 0) {
            win_flush(c);
            return rc;
        }
        for (int i = 0; i < c->nrec[p]; i++)
            *n += rec_at(c, w->buf, i)->stamp > since;
    }
    return win_flush(c);
}

int kern_tier_each(kern_tier_t *c, int64_t since, kern_tier_chunk_fn fn, void *ctx)
{
    int rc = 0;
    for (int64_t p = 0; p < c->npages && rc == 0; p++) {
        if (c->nrec[p] == 0 || c->hi[p] <= since)
            continue;
        win_t *w;
        KILN_CHECK_GOTO(win_get(c, p, &w), rc, out);
        /* Pack the page's matching records to its front copy, in order. */
        int m = 0;
        for (int i = 0; i < c->nrec[p]; i++) {
            kern_rec_t *r = rec_at(c, w->buf, i);
            if (r->stamp <= since)
                continue;
            if (m != i)
                memmove(rec_at(c, w->buf, m), r, c->rec);
            m++;
        }
        rc = fn(ctx, m, w->buf);
        w->page = -1; /* the buffer no longer holds the page */
    }
out:
    win_flush(c);
    return rc;
}
