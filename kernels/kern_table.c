/*
 * kernels/kern_table.c - the dynamic embedding table one rank holds for one
 * table: int64 keys mapped to rows of a dense slab.
 *
 * Layout (docs/kernels.md has the numbers): rows live densely in
 * capacity-sized arrays indexed by row id - keys, values (dim floats),
 * optimizer state, adam update counts, stamps, for lru the step of last use
 * and for lfu the use count. The hash index is an open-addressing table of
 * 3-byte slots holding row id + 1 (0 = empty), growing up to capacity / 0.8
 * slots, probed linearly and compared through keys[row]; deletion shifts the
 * probe run back instead of leaving tombstones. Free rows are chained through
 * their keys[] entry, and their stamp is -1.
 *
 * Segments: a 3-byte slot addresses 2^24 - 1 rows, so a table with more rows
 * is split into segments of at most that many: each owns a contiguous range
 * of the slab, its own index, free chain and high-water mark, and evicts
 * within itself. A key's segment is picked by the low 32 bits of its hash
 * (the home slot uses the top 32). A table below 2^24 rows is one segment.
 *
 * A new key's row is a pure function of (table seed, key) (kern_ops.h), so
 * training is reproducible across rank counts and insertion orders.
 *
 * Change tracking: rows whose stamp moved past the base (the stamp of the
 * last dump) are listed once each in chg[] (guarded by a bit per row), so an
 * incremental dump costs O(changed rows). Removed keys go to a log.
 */
#include "kern.h"

#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_tier.h"
#include "kern_ops.h"

#define MAX_LOAD 0.8
/* A tiered table's RAM is always full (a step's misses come in as
 * demotions make room), so its index sits at its most load all the time:
 * at 0.8 a miss probed 13 slots on average (a row key compared at each)
 * and a removal shifted as long a run. Its rows are few, so its slots
 * are cheap: 6 bytes a row at 0.5. */
#define TIER_RAM_LOAD 0.5
#define EVICT_SAMPLE 4096
/* A round takes its rows with their key, values and home slot asked for
 * this many rows ahead. */
#define TAKE_AHEAD 16
#define NO_ROW (-1)
/* lru keeps the low 16 bits of the step of last use. A sweep at least
 * every AGE_SWEEP steps caps every row's age at AGE_CAP, so true ages stay
 * below AGE_CAP + AGE_SWEEP < 65536 and the 16-bit difference is exact. */
#define AGE_CAP 32768u
#define AGE_SWEEP 16384
/* lfu packs a row's use count (15 bits, saturating) and a flag "used at the
 * step in use_step[row / 64]" into one 16-bit word; a group's flags are
 * cleared when the first of its rows is used at a new step. */
#define FREQ_MAX KERN_FREQ_MAX
#define FREQ_USED 0x8000u
/* A slot holds a segment-local row id + 1 in SLOT_BYTES bytes, so a
 * segment has at most SEG_MAX_ROWS rows. */
#define SLOT_BYTES 3
#define SEG_MAX_ROWS (((int64_t)1 << 24) - 1)

/* One segment: rows [base, base + cap) of the slab and the index over them. */
typedef struct {
    int64_t base;
    int64_t cap;
    int64_t lim;       /* rows find_or_insert keeps here: the table's limit, shared
                          out over the segments in proportion to cap */
    int64_t hiwater;   /* rows [base, base + hiwater) have been handed out once */
    int64_t size;      /* live rows */
    int64_t free_head; /* first row (a slab row id) of the free chain, NO_ROW when empty */
    int64_t pending;   /* scratch: new keys an insert brings to this segment */
    uint8_t *slots;    /* (nslots * SLOT_BYTES) local row id + 1, little endian, 0 = empty */
    int64_t nslots;    /* now: grows with the live rows ... */
    int64_t max_slots; /* ... up to cap / the table's max_load */
} seg_t;

struct kern_table {
    char *name;
    int dim;
    int nstate;
    kern_opt_kind_t opt_kind;
    int64_t capacity;
    int64_t limit;        /* rows find_or_insert keeps (<= capacity) */
    char *capacity_note;  /* what the limit is, for the full message; NULL: plain */
    kern_init_t init;
    float init_scale;
    float opt_init; /* a fresh row's optimizer state (adagrad's accumulator; 0 otherwise) */
    uint64_t seed;
    kern_evict_t evict;
    double evict_fraction; /* of a segment's rows, per eviction round */
    double max_load;       /* of the index: MAX_LOAD, or TIER_RAM_LOAD with a disk tier */

    /* The slab, (capacity) rows. */
    int64_t *keys;       /* key of a live row; next free row of a free one */
    float *values;       /* (capacity, dim) */
    float *opt;          /* (capacity, nstate*dim) or NULL */
    uint32_t *opt_steps; /* adam only */
    int64_t *stamps;     /* -1 for a free row */
    uint16_t *used;      /* lru: low 16 bits of the step of last use */
    uint16_t *freq;      /* lfu: uses (FREQ_MAX saturating) | FREQ_USED */
    uint32_t *use_step;  /* lfu: (capacity/64) the step whose uses the group's flags show */
    int64_t last_step;   /* the largest step seen by a use */
    int64_t swept;       /* step of the last age sweep */

    /* The index, in segments of seg_rows rows (the last may be shorter). */
    seg_t *seg;
    int nseg;
    int64_t seg_rows;

    int64_t size; /* live rows, all segments */

    /* Change tracking: a bit per row, and a summary bit per 64-row word. */
    uint64_t *chg;     /* (capacity/64) row changed since base */
    uint64_t *chg_sum; /* (capacity/4096) word w of chg is nonzero */
    int64_t nchg;      /* bits set in chg */
    int64_t base;
    int64_t last_visited;

    /* Removed keys. */
    kern_evicted_t *log;
    int64_t nlog, caplog;

    int64_t evictions, eviction_batches;

    /* The disk tier (NULL without one): capacity and limit above are then
     * the RAM slab's, these the whole table's. */
    kern_tier_t *cold;
    int64_t all_capacity, all_limit;
    uint8_t *dem;          /* records of rows leaving RAM, written to the tier in one call */
    int64_t ndem, capdem;
    int64_t ram_hits, disk_hits, demoted, expired;
    /* The RAM's own policy (a tier only): how often each key was looked up
     * lately, in a count-min sketch of 2 x hk_width 8-bit counters, a
     * key's two in one 64-byte block (heat_slots; halved each time hk_adds
     * passes hk_window), and each RAM row's
     * estimate when last used (heat, halved along). Demotion takes the
     * coolest rows first, the longest unused among equals, so the hottest
     * Zipf keys stay in RAM where lru would push them out for keys seen once. */
    uint8_t *hk, *heat;
    int64_t hk_width, hk_adds, hk_window;
    /* The RAM rows of each segment in lists by heat, the last used first
     * (hl_on): row r is in list heat[r] of its segment once the call that
     * set its heat has moved it (find_ext, load_row; a row joins a list
     * when its slab row is taken, leaves it when freed). The lists are
     * circular through a sentinel each, entries capacity + seg * 256 + heat
     * of hl_next/hl_prev. So a demotion takes its rows from the tails of
     * the coolest lists, where a scan of every RAM row for their priorities
     * cost O(RAM rows) a step (the step's misses are far fewer at 1e7 keys). */
    uint32_t *hl_next, *hl_prev;
    bool hl_on;

    /* Admission: a count-min sketch of SKETCH_DEPTH rows of sk_width. */
    uint16_t *sketch;
    int64_t sk_width, sk_epoch, admit_min, admit_decay, admit_rejected;

    /* Rows fetches have marked used at the current step (kern_table_unpin). */
    int32_t *pins;
    int64_t npins, cappins;
};

#define SKETCH_DEPTH 4

/* ---- big arrays ----------------------------------------------------------------
 * A table's arrays are sized for its capacity up front but filled as keys
 * arrive; calloc maps large ones lazily, so a 1 M-row table costs little
 * until used. (2 MB pages were tried: zeroing a whole huge page on the first
 * touch of each array cost more than the TLB misses it saved; see
 * docs/benchmarks.md.) */

static void *big_alloc(size_t bytes)
{
    return kiln_calloc(bytes ? bytes : 1, 1);
}

static void big_free(void *p, size_t bytes)
{
    (void)bytes;
    free(p);
}

/* ---- index ------------------------------------------------------------------ */

/* Returns slot i's content: local row id + 1, 0 when empty. */
static inline uint32_t slot_get(const seg_t *g, uint64_t i)
{
    const uint8_t *p = g->slots + i * SLOT_BYTES;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16;
}

static inline void slot_set(seg_t *g, uint64_t i, uint32_t v)
{
    uint8_t *p = g->slots + i * SLOT_BYTES;
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
}

/* The slab row slot i of segment g points to (it must not be empty). */
static inline int64_t slot_row(const seg_t *g, uint64_t i)
{
    return g->base + (int64_t)slot_get(g, i) - 1;
}

static inline void slot_put(seg_t *g, uint64_t i, int64_t row)
{
    slot_set(g, i, (uint32_t)(row - g->base + 1));
}

/* The segment of key: the low 32 bits of its hash scaled to [0, nseg). */
static inline seg_t *seg_of_key(const kern_table_t *t, int64_t key)
{
    if (t->nseg == 1)
        return t->seg;
    uint64_t lo = kern_key_hash(key) & 0xffffffffu;
    return t->seg + ((lo * (uint64_t)t->nseg) >> 32);
}

static inline seg_t *seg_of_row(const kern_table_t *t, int64_t r)
{
    return t->nseg == 1 ? t->seg : t->seg + r / t->seg_rows;
}

/* The home slot of key in g: the top 32 bits of its hash scaled to
 * [0, nslots) (nslots < 2^32, and need not be a power of two). */
static inline uint64_t slot_of(const seg_t *g, int64_t key)
{
    return kern_hash_index(kern_key_hash(key), (uint64_t)g->nslots);
}

static inline uint64_t next_slot(const seg_t *g, uint64_t i)
{
    return i + 1 == (uint64_t)g->nslots ? 0 : i + 1;
}

/* Returns the slot of g holding key, or the empty slot where it would go;
 * *found says which. */
static inline uint64_t probe(const kern_table_t *t, const seg_t *g, int64_t key, int *found)
{
    uint64_t i = slot_of(g, key);
    for (;;) {
        uint32_t s = slot_get(g, i);
        if (s == 0) {
            *found = 0;
            return i;
        }
        if (t->keys[g->base + (int64_t)s - 1] == key) {
            *found = 1;
            return i;
        }
        i = next_slot(g, i);
    }
}

/* The address of key's home slot, for a loop to prefetch (GCC drops a call
 * to an inline function that only prefetches, so helpers return addresses). */
static inline const uint8_t *home_slot_at(const kern_table_t *t, int64_t key)
{
    const seg_t *g = seg_of_key(t, key);
    return g->slots + slot_of(g, key) * SLOT_BYTES;
}

/* Empties slot i of g and shifts the rest of its probe run back so that
 * every remaining key stays reachable from its home slot. */
static void index_remove(const kern_table_t *t, seg_t *g, uint64_t i)
{
    uint64_t j = i;
    for (;;) {
        j = next_slot(g, j);
        uint32_t s = slot_get(g, j);
        if (s == 0)
            break;
        uint64_t home = slot_of(g, t->keys[g->base + (int64_t)s - 1]);
        /* The entry at j may move to the hole at i unless its home lies
         * cyclically in (i, j]. */
        int stays = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            slot_set(g, i, s);
            i = j;
        }
    }
    slot_set(g, i, 0);
}

/* Makes g's index big enough for `want` live rows at load <= max_load:
 * doubles it (never past max_slots) and reinserts every live row. The index
 * starts small, so a big table that holds few keys stays cache-sized.
 * Returns 0 or KILN_ENOMEM. */
static int index_reserve(kern_table_t *t, seg_t *g, int64_t want)
{
    if ((double)want <= (double)g->nslots * t->max_load || g->nslots >= g->max_slots)
        return 0;
    int64_t ns = g->nslots;
    while ((double)want > (double)ns * t->max_load && ns < g->max_slots)
        ns *= 2;
    if (ns > g->max_slots)
        ns = g->max_slots;
    uint8_t *slots = big_alloc((size_t)SLOT_BYTES * (size_t)ns);
    if (!slots)
        return kiln_errf(KILN_ENOMEM, "table '%s': out of memory growing its index to %lld "
                         "slots", t->name, (long long)ns);
    big_free(g->slots, (size_t)SLOT_BYTES * (size_t)g->nslots);
    g->slots = slots;
    g->nslots = ns;
    for (int64_t r = g->base; r < g->base + g->hiwater; r++) {
        if (t->stamps[r] < 0)
            continue;
        int found;
        uint64_t i = probe(t, g, t->keys[r], &found);
        slot_put(g, i, r);
    }
    return 0;
}

/* ---- rows --------------------------------------------------------------------- */

static inline int is_live(const kern_table_t *t, int64_t r)
{
    if (r < 0 || r >= t->capacity)
        return 0;
    const seg_t *g = seg_of_row(t, r);
    return r - g->base < g->hiwater && t->stamps[r] >= 0;
}

static inline void mark_one(kern_table_t *t, int64_t r)
{
    uint64_t bit = (uint64_t)1 << (r & 63);
    if (!(t->chg[r >> 6] & bit)) {
        t->chg[r >> 6] |= bit;
        t->chg_sum[r >> 12] |= (uint64_t)1 << ((r >> 6) & 63);
        t->nchg++;
    }
}

/* Counts a use of row r at step (lru: the step; lfu: the count and the
 * used-now flag, clearing the stale flags of r's group first). */
static inline void touch(kern_table_t *t, int64_t r, int64_t step)
{
    if (t->used)
        t->used[r] = (uint16_t)step;
    if (t->freq) {
        const int64_t w = r >> 6;
        if (t->use_step[w] != (uint32_t)step) {
            const int64_t e = (w + 1) * 64 < t->capacity ? (w + 1) * 64 : t->capacity;
            for (int64_t q = w * 64; q < e; q++)
                t->freq[q] &= (uint16_t)~FREQ_USED;
            t->use_step[w] = (uint32_t)step;
        }
        uint16_t f = t->freq[r];
        if ((f & FREQ_MAX) != FREQ_MAX)
            f++;
        t->freq[r] = (uint16_t)(f | FREQ_USED);
    }
}

/* Steps since row r was last used (t->used present, r live, step >= the
 * last use); exact while the sweep keeps ages below 65536. */
static inline uint32_t age_of(const kern_table_t *t, int64_t r, int64_t step)
{
    return (uint16_t)((uint16_t)step - t->used[r]);
}

static inline int used_now(const kern_table_t *t, int64_t r, int64_t step)
{
    if (t->freq)
        return t->use_step[r >> 6] == (uint32_t)step && (t->freq[r] & FREQ_USED);
    return t->used[r] == (uint16_t)step;
}

/* Called before uses at step: caps every live row's age at AGE_CAP when
 * AGE_SWEEP steps have passed since the last sweep (or the step went back,
 * after which every row counts as old). O(capacity) per AGE_SWEEP steps. */
static void age_sweep(kern_table_t *t, int64_t step)
{
    if (!t->used)
        return;
    if (step >= t->last_step && step - t->swept < AGE_SWEEP) {
        t->last_step = step;
        return;
    }
    const int back = step < t->last_step;
    const int64_t gap = back ? 0 : step - t->last_step;
    const uint16_t now = (uint16_t)step;
    for (const seg_t *g = t->seg; g < t->seg + t->nseg; g++) {
        for (int64_t r = g->base; r < g->base + g->hiwater; r++) {
            if (t->stamps[r] < 0)
                continue;
            int64_t age = back ? AGE_CAP : (int64_t)age_of(t, r, t->last_step) + gap;
            if (age > (int64_t)AGE_CAP)
                age = AGE_CAP;
            t->used[r] = (uint16_t)(now - (uint16_t)age);
        }
    }
    t->swept = step;
    t->last_step = step;
}

/* ---- heat lists (a tiered table's RAM: see hl_next) ---- */

/* The sentinel of list h of segment g. */
static inline uint32_t hl_list(const kern_table_t *t, const seg_t *g, unsigned h)
{
    return (uint32_t)(t->capacity + (g - t->seg) * 256 + h);
}

static inline void hl_unlink(kern_table_t *t, int64_t r)
{
    const uint32_t n = t->hl_next[r], p = t->hl_prev[r];
    t->hl_next[p] = n;
    t->hl_prev[n] = p;
}

/* Puts row r at the head (the last used) of list heat[r]. */
static inline void hl_push(kern_table_t *t, int64_t r)
{
    const uint32_t s = hl_list(t, seg_of_row(t, r), t->heat[r]), h = t->hl_next[s];
    t->hl_prev[r] = s;
    t->hl_next[r] = h;
    t->hl_prev[h] = (uint32_t)r;
    t->hl_next[s] = (uint32_t)r;
}

/* Row r (live, in some list) is used now: to the head of list heat[r]. */
static inline void hl_move(kern_table_t *t, int64_t r)
{
    hl_unlink(t, r);
    hl_push(t, r);
}

/* Takes a free row of segment g; NO_ROW when g is full. */
static int64_t alloc_row(kern_table_t *t, seg_t *g)
{
    int64_t r;
    if (g->free_head != NO_ROW) {
        r = g->free_head;
        g->free_head = t->keys[r];
    } else if (g->hiwater < g->cap) {
        r = g->base + g->hiwater++;
    } else {
        return NO_ROW;
    }
    g->size++;
    t->size++;
    if (t->hl_on)
        hl_push(t, r); /* in the list of whatever heat the row holds; its user sets it */
    return r;
}

/* The row of key: the one it has, or (*added set) a free row of its segment
 * now holding it, room for it reserved beforehand (reserve_pending). */
static int64_t find_or_add(kern_table_t *t, int64_t key, int *added)
{
    seg_t *g = seg_of_key(t, key);
    int found;
    uint64_t s = probe(t, g, key, &found);
    *added = !found;
    if (found)
        return slot_row(g, s);
    int64_t r = alloc_row(t, g);
    t->keys[r] = key;
    slot_put(g, s, r);
    return r;
}

static int log_removed(kern_table_t *t, int64_t key, int64_t stamp, int64_t step)
{
    KILN_CHECK(kiln_grow_to((void **)&t->log, &t->caplog, t->nlog + 1, sizeof *t->log, 64));
    t->log[t->nlog++] = (kern_evicted_t){.key = key, .stamp = stamp, .step = step};
    return 0;
}

/* Frees live row r of segment g whose key sits in g's slot i, without a
 * trace (the row moves to the disk tier). */
static void drop_row(kern_table_t *t, seg_t *g, int64_t r, uint64_t i)
{
    if (t->hl_on)
        hl_unlink(t, r);
    index_remove(t, g, i);
    t->stamps[r] = -1;
    t->keys[r] = g->free_head;
    g->free_head = r;
    g->size--;
    t->size--;
}

/* Frees live row r of segment g whose key sits in g's slot i, logging it
 * as removed. */
static int free_row(kern_table_t *t, seg_t *g, int64_t r, uint64_t i, int64_t step)
{
    int rc = log_removed(t, t->keys[r], t->stamps[r], step);
    if (rc < 0)
        return rc;
    drop_row(t, g, r, i);
    return 0;
}

/* Row r's optimizer state as a new row's: adagrad's accumulator starts at
 * opt_init, every other state at 0. */
static void fresh_state(kern_table_t *t, int64_t r)
{
    size_t sdim = (size_t)t->nstate * (size_t)t->dim;
    float *o = t->opt + (size_t)r * sdim;
    if (t->opt_init == 0.0f) {
        memset(o, 0, sizeof(float) * sdim);
        return;
    }
    for (size_t j = 0; j < sdim; j++)
        o[j] = t->opt_init;
}

/* Writes the seeded initial row of key into row r and a fresh state. */
static void init_row(kern_table_t *t, int64_t r, int64_t key)
{
    kern_init_row(t->values + (size_t)r * (size_t)t->dim, t->dim, t->init, t->init_scale,
                  t->seed, key);
    if (t->opt)
        fresh_state(t, r);
    if (t->opt_steps)
        t->opt_steps[r] = 0;
    if (t->freq)
        t->freq[r] = 0;
    if (t->heat)
        t->heat[r] = 0; /* the caller moves it to its list (hl_move) */
}

/* ---- eviction ---------------------------------------------------------------------
 * Eviction works within one segment (the one that lacks room). A round
 * evicts max(need, evict_fraction x the segment's rows) rows of lowest
 * priority (lru: step of last use, lfu: use count), never a row used at the
 * current step. The priority threshold is the k-th smallest (kth_u32) of a sample of
 * EVICT_SAMPLE live rows (all rows when fewer, which makes small tables
 * exact); one scan of the segment then evicts rows below it, a second rows
 * equal to it, in row order, until enough are gone. Cost: O(segment rows)
 * per round, so O(1/fraction) amortised per inserted key. */

/* Lower goes first: lfu the use count, lru the age counted down. */
static inline uint32_t priority(const kern_table_t *t, int64_t r, int64_t step)
{
    if (t->evict == KERN_EVICT_LFU)
        return kern_evict_priority(KERN_EVICT_LFU, 0, t->freq[r] & FREQ_MAX);
    return kern_evict_priority(t->evict, age_of(t, r, step), 0);
}

/* The k-th smallest of a[n] (0-based), reordering a: a radix select, a
 * byte at a time from the top (a count of each byte's values, then only
 * the values in the k-th's bucket kept), over the bytes in which the
 * values differ (a pass of AND and OR finds them: a demotion's priorities
 * share their top byte). Four counts a byte, summed after, so that runs
 * of equal bytes do not wait on one counter. The threshold of a round is
 * a value, the same whichever way it is found; sorting the sample for it
 * (qsort with a comparison call per step) was a sixth of a tiered lr step,
 * and a quickselect's unpredictable branches a third of a demotion round. */
static uint32_t kth_u32(uint32_t *a, int64_t n, int64_t k)
{
    uint32_t all = UINT32_MAX, any = 0;
    for (int64_t j = 0; j < n; j++) {
        all &= a[j];
        any |= a[j];
    }
    for (int shift = 24; shift >= 0 && n > 1; shift -= 8) {
        if ((((all ^ any) >> shift) & 255) == 0)
            continue; /* every value has this byte */
        uint32_t cnt[4][256] = {{0}};
        int64_t j = 0;
        for (; j + 4 <= n; j += 4) {
            cnt[0][(a[j] >> shift) & 255]++;
            cnt[1][(a[j + 1] >> shift) & 255]++;
            cnt[2][(a[j + 2] >> shift) & 255]++;
            cnt[3][(a[j + 3] >> shift) & 255]++;
        }
        for (; j < n; j++)
            cnt[0][(a[j] >> shift) & 255]++;
        unsigned d = 0;
        for (;; d++) {
            const int64_t c = (int64_t)cnt[0][d] + cnt[1][d] + cnt[2][d] + cnt[3][d];
            if (k < c)
                break;
            k -= c;
        }
        int64_t m = 0;
        all = UINT32_MAX;
        any = 0;
        for (j = 0; j < n; j++) {
            if (((a[j] >> shift) & 255) == d) {
                a[m++] = a[j];
                all &= a[j];
                any |= a[j];
            }
        }
        n = m;
    }
    return a[0]; /* the values left are all the k-th */
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Sorts a[n] ascending: an LSD radix sort, a byte a pass (passes where
 * every key has the same byte skipped), tmp[n] its scratch. A step's
 * misses on a tiered table are a few hundred keys; qsort's comparison
 * calls were 3.6 % of a tiered lr run. */
static void sort_i64(int64_t *a, int64_t n, int64_t *tmp)
{
    int64_t *src = a, *dst = tmp;
    for (int shift = 0; shift < 64 && n > 1; shift += 8) {
        int64_t cnt[256] = {0};
        /* the sign bit flipped: signed order as unsigned */
        for (int64_t j = 0; j < n; j++)
            cnt[(((uint64_t)src[j] ^ (1ULL << 63)) >> shift) & 255]++;
        if (cnt[(((uint64_t)src[0] ^ (1ULL << 63)) >> shift) & 255] == n)
            continue;
        for (int64_t d = 0, at = 0; d < 256; d++) {
            const int64_t k = cnt[d];
            cnt[d] = at;
            at += k;
        }
        for (int64_t j = 0; j < n; j++)
            dst[cnt[(((uint64_t)src[j] ^ (1ULL << 63)) >> shift) & 255]++] = src[j];
        int64_t *sw = src;
        src = dst;
        dst = sw;
    }
    if (src != a)
        memcpy(a, src, sizeof *a * (size_t)n);
}

static int demote_row(kern_table_t *t, seg_t *g, int64_t r, uint64_t i, int64_t step);

/* Whether round victims may take row r: live and not used at step (for a
 * demotion: not looked up at step, which the RAM's lru word says). */
static inline int evictable(const kern_table_t *t, int64_t r, int64_t step, int demote)
{
    if (t->stamps[r] < 0)
        return 0;
    return demote ? t->used[r] != (uint16_t)step : !used_now(t, r, step);
}

/* Takes row r of segment g out: to the disk tier (demote) or evicted. */
static int take_row(kern_table_t *t, seg_t *g, int64_t r, int64_t step, int demote)
{
    int found;
    uint64_t i = probe(t, g, t->keys[r], &found);
    return demote ? demote_row(t, g, r, i, step) : free_row(t, g, r, i, step);
}

/* Takes rows go[n] of segment g out in that order (take_row), each row's
 * key, values and home slot asked for ahead (a cache miss each: the rows
 * are scattered); *freed counts them. */
static int take_rows(kern_table_t *t, seg_t *g, const int32_t *go, int64_t n, int64_t step,
                     int demote, int64_t *freed)
{
    for (int64_t j = 0; j < n; j++) {
        if (j + TAKE_AHEAD < n) {
            const int64_t r = go[j + TAKE_AHEAD];
            __builtin_prefetch(&t->keys[r]);
            if (demote) {
                __builtin_prefetch(t->values + r * t->dim);
                if (t->nstate)
                    __builtin_prefetch(t->opt + r * t->nstate * t->dim);
            }
        }
        if (j + TAKE_AHEAD / 2 < n)
            __builtin_prefetch(home_slot_at(t, t->keys[go[j + TAKE_AHEAD / 2]]));
        KILN_CHECK(take_row(t, g, go[j], step, demote));
        (*freed)++;
    }
    return 0;
}

/* A demotion round of a table with heat lists: the `want` coolest rows
 * not used at step, the longest unused first among equal heat: from the
 * tail of list 0 up. Costs the rows it visits, not a scan of the RAM. */
static int demote_coolest(kern_table_t *t, seg_t *g, int64_t want, int64_t step,
                          int64_t *freed /* OUT */)
{
    int32_t *go = kiln_malloc(sizeof *go * (size_t)want);
    if (!go)
        return KILN_ENOMEM;
    int64_t ngo = 0;
    for (unsigned h = 0; h < 256 && ngo < want; h++) {
        const uint32_t s = hl_list(t, g, h);
        for (uint32_t x = t->hl_prev[s]; x != s && ngo < want; x = t->hl_prev[x])
            if (evictable(t, x, step, 1))
                go[ngo++] = (int32_t)x;
    }
    int rc = take_rows(t, g, go, ngo, step, 1, freed);
    t->demoted += *freed;
    free(go);
    return rc;
}

/* A round of eviction (demote 0: rows leave the table, logged) or of
 * demotion to the disk tier (demote 1: the coolest RAM rows, whatever the
 * table's policy; the rows go to t->dem). */
static int evict_round(kern_table_t *t, seg_t *g, int64_t need, int64_t step, int demote,
                       int64_t *freed /* OUT */)
{
    int64_t batch = (int64_t)(t->evict_fraction * (double)g->lim);
    int64_t want = need > batch ? need : batch > 1 ? batch : 1;
    const int64_t lo = g->base, hi = g->base + g->hiwater;
    int rc = 0;
    *freed = 0;
    if (demote)
        return demote_coolest(t, g, want, step, freed); /* a tiered table: heat lists */
    /* An eviction: which rows it drops is part of the trained model, so
     * its sample and threshold stay as they are (exact for small segments). */
    const int exact = g->hiwater <= EVICT_SAMPLE;
    const size_t nsample = (size_t)(exact && g->hiwater > 0 ? g->hiwater : EVICT_SAMPLE);
    uint32_t *sample = kiln_malloc(sizeof(uint32_t) * nsample);
    /* exact: the evictable rows in row order, each with its priority */
    uint64_t *cand = exact ? kiln_malloc(sizeof(uint64_t) * nsample) : NULL;
    if (!sample || (exact && !cand)) {
        KILN_FREE_ALL(sample, cand);
        return KILN_ENOMEM;
    }

    /* Sample evictable rows (all of them when the segment is small). */
    int64_t ns = 0;
    if (exact) {
        for (int64_t r = lo; r < hi; r++) {
            if (!evictable(t, r, step, 0))
                continue;
            sample[ns] = priority(t, r, step);
            cand[ns] = (uint64_t)sample[ns] << 32 | (uint64_t)r;
            ns++;
        }
    } else {
        uint64_t x = kern_mix64(t->seed ^ (uint64_t)step ^ (uint64_t)t->eviction_batches);
        for (int64_t k = 0; k < 4 * EVICT_SAMPLE && ns < EVICT_SAMPLE; k++) {
            x = kern_mix64(x);
            int64_t r = lo + (int64_t)(x % (uint64_t)g->hiwater);
            if (evictable(t, r, step, 0))
                sample[ns++] = priority(t, r, step);
        }
    }
    if (ns == 0)
        goto out;
    int64_t live = exact ? ns : g->size;
    int64_t k = (int64_t)((double)want * (double)ns / (double)live);
    if (k >= ns)
        k = ns - 1;
    uint32_t thr = kth_u32(sample, ns, k);

    /* One scan, in row order, lists the rows to go: those below the
     * threshold; then those equal to it, then (only when the sample misled
     * us and need is not met) any other evictable row, in row order too.
     * The same rows in the same order as a scan per class, for one scan's
     * reads where that took two or three. An exact round scans its list
     * of the rows and priorities (taking a row changes no other's), not
     * the segment again. */
    int32_t *go = kiln_malloc(sizeof *go * (size_t)want);
    int32_t *eq = kiln_malloc(sizeof *eq * (size_t)want);
    int32_t *gt = kiln_malloc(sizeof *gt * (size_t)want);
    int64_t ngo = 0, neq = 0, ngt = 0;
    if (!go || !eq || !gt) {
        rc = KILN_ENOMEM;
        goto lists;
    }
    const int64_t nscan = exact ? ns : hi - lo;
    for (int64_t j = 0; j < nscan && ngo < want; j++) {
        int64_t r;
        uint32_t p;
        if (exact) {
            r = (int64_t)(cand[j] & 0xffffffffu);
            p = (uint32_t)(cand[j] >> 32);
        } else {
            r = lo + j;
            if (!evictable(t, r, step, 0))
                continue;
            p = priority(t, r, step);
        }
        if (p == thr && neq < want)
            eq[neq++] = (int32_t)r;
        else if (p > thr && ngt < want)
            gt[ngt++] = (int32_t)r;
        if (p < thr)
            go[ngo++] = (int32_t)r;
    }
    /* then the rows at the threshold, and past it only where need is not met */
    for (int64_t j = 0; j < neq && ngo < want; j++)
        go[ngo++] = eq[j];
    const int64_t ngt_go = ngo < need ? ngt : 0;
    for (int64_t j = 0; j < ngt_go && ngo < want; j++)
        go[ngo++] = gt[j];
    /* taken in that order */
    rc = take_rows(t, g, go, ngo, step, 0, freed);
lists:
    KILN_FREE_ALL(go, eq, gt);
    if (rc < 0)
        goto out;
    t->evictions += *freed;
    t->eviction_batches++;
out:
    KILN_FREE_ALL(sample, cand);
    return rc;
}

/* The error for new keys that do not fit segment g. */
static int full_error(const kern_table_t *t, const seg_t *g)
{
    char what[300], where[200] = "";
    if (t->capacity_note)
        snprintf(what, sizeof what, "%s", t->capacity_note);
    else
        snprintf(what, sizeof what, "capacity %lld rows", (long long)t->limit);
    if (t->nseg > 1)
        snprintf(where, sizeof where,
                 "; index segment %d of %d, where these keys hash, is full at %lld rows while "
                 "the table holds %lld",
                 (int)(g - t->seg), t->nseg, (long long)g->lim, (long long)t->size);
    if (t->evict == KERN_EVICT_NONE)
        return kiln_errf(KILN_EFULL,
                         "table '%s' is full (%s%s); raise "
                         "model.embedding.capacity or set eviction: lru",
                         t->name, what, where);
    return kiln_errf(KILN_EFULL,
                     "table '%s' is full (%s%s) and every row was used in the "
                     "current step, so none can be evicted; raise model.embedding.capacity "
                     "or use smaller batches",
                     t->name, what, where);
}

/* Sets each segment's `pending` to the number of keys of missing[n] (keys
 * not in the table) that go to it: distinct keys (missing gets sorted) when
 * counting duplicates too would overflow some segment, unless the caller
 * says they are distinct already (a tiered table's misses: then every
 * step would sort them again, its RAM being full). Returns the first
 * segment without room for its new keys under its limit (to_limit) or its
 * capacity, or NULL when all fit. */
static seg_t *count_new(kern_table_t *t, int64_t *missing, int64_t n, int to_limit, int distinct)
{
    for (int pass = 0; pass < 2 - distinct; pass++) {
        for (seg_t *g = t->seg; g < t->seg + t->nseg; g++)
            g->pending = 0;
        if (pass == 1)
            qsort(missing, (size_t)n, sizeof *missing, cmp_i64);
        for (int64_t i = 0; i < n; i++)
            if (pass == 0 || i == 0 || missing[i] != missing[i - 1])
                seg_of_key(t, missing[i])->pending++;
        seg_t *over = NULL;
        for (seg_t *g = t->seg; g < t->seg + t->nseg && !over; g++)
            if (g->pending > (to_limit ? g->lim : g->cap) - g->size)
                over = g;
        if (!over || pass == 1 || distinct)
            return over;
    }
    return NULL;
}

/* Grows the index of every segment that gets new keys. */
static int reserve_pending(kern_table_t *t)
{
    for (seg_t *g = t->seg; g < t->seg + t->nseg; g++)
        if (g->pending > 0)
            KILN_CHECK(index_reserve(t, g, g->size + g->pending));
    return 0;
}

/* ---- the disk tier and admission ----------------------------------------------------
 * A table with a disk tier keeps at most ram_rows rows in its slab; the
 * rest are records in kern_tier.c's file. find_or_insert looks in RAM,
 * then takes the keys it lacks out of the tier, makes room in RAM by
 * demoting the coolest rows (the heat lists, whatever the table's policy)
 * and writes those to the tier in one call. The whole
 * table's limit is kept on disk: when new keys would pass it, lru/lfu evict
 * the lowest-priority records of a sample of pages. Admission counts the
 * keys the table lacks in a count-min sketch and gives a row only to those
 * seen admit_min times. Tables with neither take the plain path above. */

static inline uint8_t *dem_at(const kern_table_t *t, int64_t i)
{
    return t->dem + (size_t)i * kern_tier_rec_bytes(t->cold);
}

/* Copies row r into record rec (use: lru the step of last use, lfu the
 * use count). */
static void row_to_rec(const kern_table_t *t, int64_t r, int64_t step, uint8_t *rec)
{
    const size_t dim = (size_t)t->dim, sdim = (size_t)t->nstate * dim;
    kern_rec_t h = {.key = t->keys[r], .stamp = t->stamps[r]};
    h.use = t->freq ? (uint32_t)(t->freq[r] & FREQ_MAX) : (uint32_t)(step - age_of(t, r, step));
    h.opt_steps = t->opt_steps ? t->opt_steps[r] : 0;
    memcpy(rec, &h, sizeof h);
    float *f = (float *)(rec + sizeof h);
    memcpy(f, t->values + r * (int64_t)dim, sizeof(float) * dim);
    if (sdim)
        memcpy(f + dim, t->opt + r * (int64_t)sdim, sizeof(float) * sdim);
}

/* Fills row r (holding the record's key already) from record rec. */
static void rec_to_row(kern_table_t *t, const uint8_t *rec, int64_t r)
{
    const size_t dim = (size_t)t->dim, sdim = (size_t)t->nstate * dim;
    kern_rec_t h;
    memcpy(&h, rec, sizeof h);
    const float *f = (const float *)(rec + sizeof h);
    memcpy(t->values + r * (int64_t)dim, f, sizeof(float) * dim);
    if (sdim)
        memcpy(t->opt + r * (int64_t)sdim, f + dim, sizeof(float) * sdim);
    if (t->opt_steps)
        t->opt_steps[r] = h.opt_steps;
    if (t->freq)
        t->freq[r] = (uint16_t)(h.use < FREQ_MAX ? h.use : FREQ_MAX);
    t->stamps[r] = h.stamp;
    if (h.stamp > t->base)
        mark_one(t, r);
    t->heat[r] = 0; /* the caller moves it to its list (hl_move) */
}

static int dem_reserve(kern_table_t *t, int64_t more)
{
    return kiln_grow_to((void **)&t->dem, &t->capdem, t->ndem + more,
                        kern_tier_rec_bytes(t->cold), 1024);
}

/* Moves live row r (key in slot i of g) to the batch of rows leaving RAM. */
static int demote_row(kern_table_t *t, seg_t *g, int64_t r, uint64_t i, int64_t step)
{
    KILN_CHECK(dem_reserve(t, 1));
    row_to_rec(t, r, step, dem_at(t, t->ndem++));
    drop_row(t, g, r, i);
    return 0;
}

/* Writes the demoted rows to the tier. */
static int dem_flush(kern_table_t *t)
{
    int rc = kern_tier_put(t->cold, t->ndem, t->dem);
    t->ndem = 0;
    return rc;
}

static int tier_gone(void *ctx, int64_t key, int64_t stamp)
{
    kern_table_t *t = ctx;
    return log_removed(t, key, stamp, t->last_step);
}

static uint32_t tier_prio(const void *ctx, const kern_rec_t *r)
{
    (void)ctx;
    return r->use; /* lru: older steps first; lfu: fewer uses first */
}

/* Halves every counter once per admit_decay steps passed. */
static void sketch_decay(kern_table_t *t, int64_t step)
{
    if (t->admit_decay <= 0 || step < 0)
        return;
    int64_t e = step / t->admit_decay;
    if (e <= t->sk_epoch)
        return;
    int shift = e - t->sk_epoch > 16 ? 16 : (int)(e - t->sk_epoch);
    for (int64_t i = 0; i < SKETCH_DEPTH * t->sk_width; i++)
        t->sketch[i] = (uint16_t)(t->sketch[i] >> shift);
    t->sk_epoch = e;
}

/* Counts m sightings of key; returns its estimated count. */
static uint32_t sketch_add(kern_table_t *t, int64_t key, int64_t m)
{
    uint32_t est = UINT32_MAX;
    uint64_t h = kern_key_hash(key);
    for (int d = 0; d < SKETCH_DEPTH; d++) {
        uint64_t hd = kern_mix64(h + 0x9e3779b97f4a7c15ULL * (uint64_t)(d + 1));
        uint16_t *c = t->sketch + d * t->sk_width + (int64_t)kern_hash_index(hd,
                                                                             (uint64_t)t->sk_width);
        uint32_t v = (uint32_t)*c + (uint32_t)(m < 65535 ? m : 65535);
        *c = (uint16_t)(v < 65535 ? v : 65535);
        est = *c < est ? *c : est;
    }
    return est;
}

/* The heat sketch's two counters of key: two different bytes (from the
 * hash's high bits) of one 64-byte block (its low bits; 2 x hk_width is a
 * power of two >= 128), so counting a key costs one cache miss where two
 * rows of counters cost two. */
static inline void heat_slots(const kern_table_t *t, int64_t key, uint8_t **a, uint8_t **b)
{
    const uint64_t h = kern_mix64(kern_key_hash(key) ^ 0x68656174ULL);
    uint8_t *blk = t->hk + ((h & ((uint64_t)(2 * t->hk_width) / 64 - 1)) << 6);
    const unsigned i = (unsigned)(h >> 32) & 63;
    *a = blk + i;
    *b = blk + ((i + 1 + (unsigned)((h >> 38) % 63)) & 63);
}

/* Counts a lookup of key; returns its estimated count. */
static inline uint8_t heat_add(kern_table_t *t, int64_t key)
{
    uint8_t *a, *b;
    heat_slots(t, key, &a, &b);
    *a += *a < 255;
    *b += *b < 255;
    t->hk_adds++;
    return *a < *b ? *a : *b;
}

static inline uint8_t heat_of(const kern_table_t *t, int64_t key)
{
    uint8_t *a, *b;
    heat_slots(t, key, &a, &b);
    return *a < *b ? *a : *b;
}

/* Halves the sketch and the RAM rows' heat once a window of lookups has
 * been counted, so old popularity fades. Heats 2h and 2h + 1 become h:
 * their lists are merged into list h, the last used first still (each
 * list is in that order, so a merge by age keeps it). */
static void heat_decay(kern_table_t *t, int64_t step)
{
    if (t->hk_adds < t->hk_window)
        return;
    for (int64_t i = 0; i < 2 * t->hk_width; i++)
        t->hk[i] >>= 1;
    for (int64_t r = 0; r < t->capacity; r++)
        t->heat[r] >>= 1;
    t->hk_adds = 0;
    for (const seg_t *g = t->seg; g < t->seg + t->nseg; g++) {
        for (unsigned h = 0; h < 128; h++) {
            /* old lists 2h and 2h + 1 (untouched yet: h <= 2h), into list h
             * (read already: its rows went to list h / 2) */
            const uint32_t sa = hl_list(t, g, 2 * h), sb = hl_list(t, g, 2 * h + 1),
                           s = hl_list(t, g, h);
            uint32_t x = t->hl_next[sa], y = t->hl_next[sb];
            t->hl_next[s] = t->hl_prev[s] = s;
            while (x != sa || y != sb) {
                uint32_t pick;
                if (y == sb || (x != sa && age_of(t, x, step) <= age_of(t, y, step))) {
                    pick = x;
                    x = t->hl_next[x];
                } else {
                    pick = y;
                    y = t->hl_next[y];
                }
                const uint32_t last = t->hl_prev[s];
                t->hl_next[last] = pick;
                t->hl_prev[pick] = last;
                t->hl_next[pick] = s;
                t->hl_prev[s] = pick;
            }
        }
        for (unsigned h = 128; h < 256; h++) {
            const uint32_t s = hl_list(t, g, h);
            t->hl_next[s] = t->hl_prev[s] = s;
        }
    }
}

/* A fetch's row r counts as used at step until kern_table_unpin. */
static int pin(kern_table_t *t, int64_t r, int64_t step)
{
    if (t->used[r] == (uint16_t)step)
        return 0; /* used by a lookup of the step, or pinned already */
    KILN_CHECK(kiln_grow_to((void **)&t->pins, &t->cappins, t->npins + 1, sizeof *t->pins, 1024));
    t->pins[t->npins++] = (int32_t)r;
    t->used[r] = (uint16_t)step;
    return 0;
}

void kern_table_unpin(kern_table_t *t, int64_t step)
{
    for (int64_t i = 0; i < t->npins; i++) {
        int32_t r = t->pins[i];
        if (t->stamps[r] >= 0 && t->used[r] == (uint16_t)step)
            t->used[r] = (uint16_t)(step - 1);
    }
    t->npins = 0;
}

/* A find's first pass (find_ext's and the plain one's) asks for a key's
 * home slot (and heat block) FIND_AHEAD keys before it gets there, and for
 * the key of the row that slot names half as far ahead, when the slot has
 * arrived: each is a cache miss a key otherwise, and a probe's hit-or-miss
 * branch keeps the CPU from running ahead by itself (perf on a tiered lr
 * run: find_ext's samples -30 %; the plain find's -40 % all in RAM). */
#define FIND_AHEAD 16

/* The address of key's heat block (see home_slot_at). */
static inline const uint8_t *heat_at(const kern_table_t *t, int64_t key)
{
    uint8_t *a, *b;
    heat_slots(t, key, &a, &b);
    return a;
}

/* The address of the key of the row that key's home slot (after 0) or the
 * slot after it (after 1) names, or NULL: a probe for a key not in the
 * table (a miss: 30 % of the lookups of a tiered table's RAM) compares the
 * keys of the slots up to an empty one (perf on a tiered lr run: find_ext
 * -15 % with the second). */
static inline const int64_t *row_key_ahead(const kern_table_t *t, int64_t key, int after)
{
    const seg_t *g = seg_of_key(t, key);
    const uint64_t i = slot_of(g, key);
    const uint32_t s = slot_get(g, after ? next_slot(g, i) : i);
    return s ? &t->keys[g->base + (int64_t)s - 1] : NULL;
}

/* find_or_insert (insert) or fetch (!insert) for a table with a tier or
 * admission. */
static int find_ext(kern_table_t *t, int64_t n, const int64_t *keys, int64_t step, int insert,
                    int32_t *rows /* OUT (n) */)
{
    int rc = 0;
    int64_t *u = NULL, *mult = NULL, nu = 0, nmiss = 0, ntaken = 0, nnew = 0;
    uint8_t *found = NULL, *recs = NULL, *is_new = NULL, *heat_u = NULL;
    const size_t rb = t->cold ? kern_tier_rec_bytes(t->cold) : 0;
    age_sweep(t, step);
    if (insert && t->sketch)
        sketch_decay(t, step);
    if (t->cold)
        heat_decay(t, step);

    /* Pass 1: rows in RAM, counting a use (fetch: only the RAM's lru word). */
    for (int64_t i = 0; i < n; i++) {
        if (i + FIND_AHEAD < n) {
            __builtin_prefetch(home_slot_at(t, keys[i + FIND_AHEAD]));
            if (t->cold)
                __builtin_prefetch(heat_at(t, keys[i + FIND_AHEAD]), 1);
        }
        if (i + FIND_AHEAD / 2 < n) {
            for (int after = 0; after < 2; after++) {
                const int64_t *k = row_key_ahead(t, keys[i + FIND_AHEAD / 2], after);
                if (k)
                    __builtin_prefetch(k);
            }
        }
        seg_t *g = seg_of_key(t, keys[i]);
        int hit;
        uint64_t s = probe(t, g, keys[i], &hit);
        rows[i] = hit ? (int32_t)slot_row(g, s) : -1;
        uint8_t heat = t->cold ? heat_add(t, keys[i]) : 0;
        if (!hit) {
            nmiss++;
            continue;
        }
        t->ram_hits++;
        if (t->cold)
            t->heat[rows[i]] = heat; /* and to the head of that list, below */
        if (insert)
            touch(t, rows[i], step);
        else
            KILN_CHECK_GOTO(pin(t, rows[i], step), rc, out);
    }
    /* The rows found go to the heads of their lists, in key order, each
     * row's links asked for 8 keys ahead and its neighbours' 4 ahead (three
     * cache misses a row otherwise: moving them in pass 1 was 4 % of a
     * tiered lr run). */
    for (int64_t i = 0; t->hl_on && i < n; i++) {
        if (i + 8 < n && rows[i + 8] >= 0) {
            __builtin_prefetch(&t->hl_next[rows[i + 8]], 1);
            __builtin_prefetch(&t->hl_prev[rows[i + 8]], 1);
        }
        if (i + 4 < n && rows[i + 4] >= 0) {
            __builtin_prefetch(&t->hl_next[t->hl_prev[rows[i + 4]]], 1);
            __builtin_prefetch(&t->hl_prev[t->hl_next[rows[i + 4]]], 1);
        }
        if (rows[i] >= 0)
            hl_move(t, rows[i]);
    }
    if (nmiss == 0)
        return 0;
    if (!(u = kiln_malloc(sizeof *u * (size_t)nmiss)) ||
        !(mult = kiln_malloc(sizeof *mult * (size_t)nmiss)) ||
        !(found = kiln_calloc((size_t)nmiss, 1)) || !(is_new = kiln_calloc((size_t)nmiss, 1)) ||
        (rb && !(recs = kiln_malloc(rb * (size_t)nmiss))) ||
        (t->cold && !(heat_u = kiln_malloc((size_t)nmiss)))) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int64_t i = 0, k = 0; i < n; i++)
        if (rows[i] < 0)
            u[k++] = keys[i];
    sort_i64(u, nmiss, mult); /* mult: scratch until filled below */
    for (int64_t i = 0; i < nmiss; i++) {
        if (nu > 0 && u[nu - 1] == u[i]) {
            mult[nu - 1]++;
        } else {
            u[nu] = u[i];
            mult[nu++] = 1;
        }
    }

    /* Disk: take the rows the tier holds. Their heat first, while pass 1
     * left the sketch's blocks in cache (the reads push them out; read
     * after, they were 8 % of find_ext). */
    if (t->cold) {
        for (int64_t j = 0; j < nu; j++)
            heat_u[j] = heat_of(t, u[j]);
        KILN_CHECK_GOTO(kern_tier_take(t->cold, nu, u, recs, found), rc, out);
        for (int64_t j = 0; j < nu; j++)
            ntaken += found[j];
    }
    /* New keys, those admitted. */
    for (int64_t j = 0; insert && j < nu; j++) {
        if (found[j])
            continue;
        if (t->sketch && sketch_add(t, u[j], mult[j]) < (uint32_t)t->admit_min) {
            t->admit_rejected += mult[j];
            continue;
        }
        is_new[j] = 1;
        nnew++;
    }
    /* The whole table's limit, kept on disk. */
    if (t->cold && nnew > 0) {
        int64_t over = t->size + kern_tier_size(t->cold) + nnew - t->all_limit;
        if (over > 0 && t->evict != KERN_EVICT_NONE) {
            int64_t batch = (int64_t)(t->evict_fraction * (double)t->all_limit), got;
            KILN_CHECK_GOTO(kern_tier_evict(t->cold, over > batch ? over : batch,
                                            t->seed ^ (uint64_t)step ^
                                                (uint64_t)t->eviction_batches,
                                            tier_prio, t, tier_gone, t, &got),
                            rc, putback);
            t->evictions += got;
            t->eviction_batches++;
            over -= got;
        }
        if (over > 0) {
            rc = kiln_errf(KILN_EFULL,
                           "table '%s' is full (%s) with %lld rows in RAM and %lld on disk; "
                           "raise model.embedding.capacity%s",
                           t->name, t->capacity_note ? t->capacity_note : "its capacity",
                           (long long)t->size, (long long)kern_tier_size(t->cold),
                           t->evict == KERN_EVICT_NONE ? " or set eviction: lru" : "");
            goto putback;
        }
    }
    /* RAM room for the rows coming in: demote (tier) or evict (plain). */
    int64_t nin = 0;
    for (int64_t j = 0; j < nu; j++)
        if (found[j] || is_new[j])
            mult[nin++] = u[j]; /* mult now holds the incoming keys */
    seg_t *over = nin ? count_new(t, mult, nin, 1, 1) : NULL;
    if (over && !t->cold && t->evict == KERN_EVICT_NONE) {
        rc = full_error(t, over);
        goto putback;
    }
    for (seg_t *g = t->seg; over && g < t->seg + t->nseg; g++) {
        int64_t room = g->lim - g->size, freed;
        if (g->pending <= room)
            continue;
        KILN_CHECK_GOTO(evict_round(t, g, g->pending - room, step, t->cold != NULL, &freed), rc,
                        putback);
        if (g->lim - g->size < g->pending) {
            if (t->cold)
                rc = kiln_errf(KILN_EFULL,
                               "table '%s': model.embedding.memory gives it %lld rows in RAM on "
                               "this rank, fewer than the %lld keys of one step; raise it",
                               t->name, (long long)t->limit, (long long)(g->size + g->pending));
            else
                rc = full_error(t, g);
            goto putback;
        }
    }
    if (t->cold && t->ndem > 0)
        KILN_CHECK_GOTO(dem_flush(t), rc, out);
    KILN_CHECK_GOTO(reserve_pending(t), rc, out);

    /* Bring the taken rows in and give the admitted keys fresh rows. */
    for (int64_t j = 0; j < nu; j++) {
        if (!found[j] && !is_new[j])
            continue;
        int added;
        int64_t r = find_or_add(t, u[j], &added);
        if (found[j]) {
            rec_to_row(t, recs + (size_t)j * rb, r);
            t->disk_hits++;
        } else {
            init_row(t, r, u[j]);
            t->stamps[r] = step;
            mark_one(t, r);
        }
        if (t->cold) {
            t->heat[r] = heat_u[j];
            hl_move(t, r);
        }
        if (insert)
            touch(t, r, step);
        else
            KILN_CHECK_GOTO(pin(t, r, step), rc, out);
    }
    for (int64_t i = 0; i < n; i++) {
        if (rows[i] >= 0)
            continue;
        seg_t *g = seg_of_key(t, keys[i]);
        int hit;
        uint64_t s = probe(t, g, keys[i], &hit);
        rows[i] = hit ? (int32_t)slot_row(g, s) : -1;
    }
    goto out;
putback:
    /* Nothing came in: the taken rows go back to the tier as they were. */
    if (t->cold && ntaken > 0) {
        int64_t k = 0;
        for (int64_t j = 0; j < nu; j++)
            if (found[j])
                memmove(recs + (size_t)k++ * rb, recs + (size_t)j * rb, rb);
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", kiln_errmsg());
        if (kern_tier_put(t->cold, k, recs) == 0)
            kiln_errf(rc, "%s", msg);
    }
out:
    KILN_FREE_ALL(u, mult, found, recs, is_new, heat_u);
    return rc;
}

/* ---- public: the disk tier, expiry, admission --------------------------------------------- */

bool kern_table_tiered(const kern_table_t *t) { return t->cold != NULL; }

int kern_table_fetch(kern_table_t *t, int64_t n, const int64_t *keys, int64_t step,
                     int32_t *rows /* OUT (n) */)
{
    if (!t->cold) {
        kern_table_find(t, n, keys, rows);
        return 0;
    }
    return find_ext(t, n, keys, step, 0, rows);
}

bool kern_table_prefetching(const kern_table_t *t)
{
    return t->cold && kern_tier_slow(t->cold);
}

int kern_table_prefetch(kern_table_t *t, int64_t n, const int64_t *keys)
{
    if (n == 0 || !kern_table_prefetching(t))
        return 0;
    int64_t *miss = kiln_malloc(sizeof *miss * (size_t)n), m = 0;
    if (!miss)
        return KILN_ENOMEM;
    for (int64_t i = 0; i < n; i++) {
        int hit;
        probe(t, seg_of_key(t, keys[i]), keys[i], &hit);
        if (!hit)
            miss[m++] = keys[i];
    }
    int rc = kern_tier_prefetch(t->cold, m, miss);
    free(miss);
    return rc;
}

int kern_table_expire(kern_table_t *t, int64_t before, int64_t step, int64_t *nexpired /* OUT */)
{
    int rc = 0;
    int64_t k = 0;
    *nexpired = 0;
    for (seg_t *g = t->seg; g < t->seg + t->nseg; g++) {
        for (int64_t r = g->base; r < g->base + g->hiwater; r++) {
            if (t->stamps[r] < 0 || t->stamps[r] >= before)
                continue;
            int found;
            uint64_t i = probe(t, g, t->keys[r], &found);
            KILN_CHECK(free_row(t, g, r, i, step));
            k++;
        }
    }
    if (t->cold) {
        int64_t d = 0, keep = t->last_step;
        t->last_step = step; /* tier_gone logs at last_step */
        rc = kern_tier_expire(t->cold, before, tier_gone, t, &d);
        t->last_step = keep;
        k += d;
    }
    t->expired += k;
    *nexpired = k;
    return rc;
}

int kern_table_disk_count(kern_table_t *t, int64_t since, int64_t *n /* OUT */)
{
    *n = 0;
    return t->cold ? kern_tier_count(t->cold, since, n) : 0;
}

typedef struct {
    const kern_table_t *t;
    kern_rows_fn fn;
    void *ctx;
    int64_t *keys;
    float *values, *opt;
    uint32_t *steps;
    int64_t cap;
} each_ctx_t;

static int each_chunk(void *ctx, int64_t n, const void *recs)
{
    each_ctx_t *e = ctx;
    const kern_table_t *t = e->t;
    const size_t rb = kern_tier_rec_bytes(t->cold), dim = (size_t)t->dim,
                 sdim = (size_t)t->nstate * dim;
    if (n > e->cap) {
        free(e->keys);
        free(e->values);
        free(e->opt);
        free(e->steps);
        e->keys = kiln_malloc(sizeof *e->keys * (size_t)n);
        e->values = kiln_malloc(sizeof(float) * dim * (size_t)n);
        e->opt = kiln_malloc(sizeof(float) * (sdim ? sdim : 1) * (size_t)n);
        e->steps = kiln_malloc(sizeof *e->steps * (size_t)n);
        e->cap = n;
        if (!e->keys || !e->values || !e->opt || !e->steps) {
            e->cap = 0;
            return KILN_ENOMEM;
        }
    }
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *rec = (const uint8_t *)recs + (size_t)i * rb;
        kern_rec_t h;
        memcpy(&h, rec, sizeof h);
        const float *f = (const float *)(rec + sizeof h);
        e->keys[i] = h.key;
        e->steps[i] = h.opt_steps;
        memcpy(e->values + (size_t)i * dim, f, sizeof(float) * dim);
        if (sdim)
            memcpy(e->opt + (size_t)i * sdim, f + dim, sizeof(float) * sdim);
    }
    return e->fn(e->ctx, n, e->keys, e->values, sdim ? e->opt : NULL,
                 t->opt_steps ? e->steps : NULL);
}

int kern_table_disk_each(kern_table_t *t, int64_t since, kern_rows_fn fn, void *ctx)
{
    if (!t->cold)
        return 0;
    each_ctx_t e = {.t = t, .fn = fn, .ctx = ctx};
    int rc = kern_tier_each(t->cold, since, each_chunk, &e);
    KILN_FREE_ALL(e.keys, e.values, e.opt, e.steps);
    return rc;
}

const uint16_t *kern_table_admit_sketch(const kern_table_t *t, int64_t *n /* OUT */,
                                        int64_t *epoch /* OUT */)
{
    *n = t->sketch ? SKETCH_DEPTH * t->sk_width : 0;
    *epoch = t->sk_epoch;
    return t->sketch;
}

int kern_table_admit_load(kern_table_t *t, const uint16_t *counters, int64_t n, int64_t step,
                          bool add)
{
    if (!t->sketch || n != SKETCH_DEPTH * t->sk_width)
        return kiln_errf(KILN_EINVAL, "table '%s': the admission sketch has %lld counters, the "
                         "checkpoint's %lld; keep model.embedding.admit.sketch_width as it was",
                         t->name, (long long)(t->sketch ? SKETCH_DEPTH * t->sk_width : 0),
                         (long long)n);
    for (int64_t i = 0; i < n; i++) {
        uint32_t v = (add ? t->sketch[i] : 0u) + counters[i];
        t->sketch[i] = (uint16_t)(v < 65535 ? v : 65535);
    }
    t->sk_epoch = t->admit_decay > 0 && step > 0 ? step / t->admit_decay : 0;
    return 0;
}

/* ---- public: life cycle ------------------------------------------------------------ */

/* One per-row (or per-slot) array of the table and its size in bytes. */
typedef struct {
    void **p;
    size_t bytes;
} array_t;

#define MAX_ARRAYS 14

/* Lists the slab arrays a table of this shape has (capacity, dim, nstate,
 * opt_kind and evict set); returns how many. The one list that create,
 * destroy and kern_table_bytes walk (the segments' indexes are apart). */
static int table_arrays(kern_table_t *t, array_t a[MAX_ARRAYS] /* OUT */)
{
    size_t cap = (size_t)t->capacity, dim = (size_t)t->dim;
    int n = 0;
    a[n++] = (array_t){(void **)&t->keys, sizeof(int64_t) * cap};
    a[n++] = (array_t){(void **)&t->values, sizeof(float) * cap * dim};
    a[n++] = (array_t){(void **)&t->stamps, sizeof(int64_t) * cap};
    a[n++] = (array_t){(void **)&t->chg, sizeof(uint64_t) * ((cap + 63) / 64)};
    a[n++] = (array_t){(void **)&t->chg_sum, sizeof(uint64_t) * ((cap + 4095) / 4096)};
    if (t->nstate > 0)
        a[n++] = (array_t){(void **)&t->opt, sizeof(float) * cap * dim * (size_t)t->nstate};
    if (t->opt_kind == KERN_OPT_ADAM)
        a[n++] = (array_t){(void **)&t->opt_steps, sizeof(uint32_t) * cap};
    if (t->evict == KERN_EVICT_LRU || t->all_capacity > 0) /* a tier's RAM is lru */
        a[n++] = (array_t){(void **)&t->used, sizeof(uint16_t) * cap};
    if (t->all_capacity > 0) {
        a[n++] = (array_t){(void **)&t->heat, cap};
        const size_t links = cap + 256 * (size_t)t->nseg; /* the rows', the sentinels' */
        a[n++] = (array_t){(void **)&t->hl_next, sizeof(uint32_t) * links};
        a[n++] = (array_t){(void **)&t->hl_prev, sizeof(uint32_t) * links};
    }
    if (t->evict == KERN_EVICT_LFU) {
        a[n++] = (array_t){(void **)&t->freq, sizeof(uint16_t) * cap};
        a[n++] = (array_t){(void **)&t->use_step, sizeof(uint32_t) * ((cap + 63) / 64)};
    }
    return n;
}

int kern_table_create(const kern_table_config_t *cfg, kern_table_t **out /* OUT */)
{
    int rc = 0;
    kern_table_t *t = NULL;
    *out = NULL;
    const char *name = cfg->name ? cfg->name : "?";
    if (cfg->dim < 1 || cfg->dim > KERN_MAX_DIM)
        return kiln_errf(KILN_EINVAL, "table '%s': dim %d is out of range 1..%d", name,
                         cfg->dim, KERN_MAX_DIM);
    if (cfg->capacity < 1 || cfg->capacity > KERN_MAX_CAPACITY)
        return kiln_errf(KILN_EINVAL, "table '%s': capacity %lld is out of range 1..%lld",
                         name, (long long)cfg->capacity, (long long)KERN_MAX_CAPACITY);
    if ((unsigned)cfg->opt > KERN_OPT_ADAM || (unsigned)cfg->init > KERN_INIT_NORMAL ||
        (unsigned)cfg->evict > KERN_EVICT_LFU)
        return kiln_errf(KILN_EINVAL, "table '%s': unknown optimizer, init or eviction kind",
                         name);
    if (!(cfg->evict_fraction >= 0.0f && cfg->evict_fraction <= 1.0f))
        return kiln_errf(KILN_EINVAL, "table '%s': evict_fraction %g is not in [0, 1]", name,
                         (double)cfg->evict_fraction);
    if (!(cfg->opt_init >= 0.0f && cfg->opt_init <= FLT_MAX))
        return kiln_errf(KILN_EINVAL,
                         "table '%s': the initial accumulator %g must be finite and >= 0", name,
                         (double)cfg->opt_init);
    if (cfg->segment_rows < 0 || cfg->segment_rows > SEG_MAX_ROWS)
        return kiln_errf(KILN_EINVAL, "table '%s': segment_rows %lld is out of range 0..%lld",
                         name, (long long)cfg->segment_rows, (long long)SEG_MAX_ROWS);
    if (cfg->ram_rows < 0 || cfg->admit_min < 0 || cfg->admit_width < 0 || cfg->admit_decay < 0)
        return kiln_errf(KILN_EINVAL, "table '%s': ram_rows and the admission settings must "
                         "not be negative", name);
    int64_t limit = cfg->limit > 0 && cfg->limit < cfg->capacity ? cfg->limit : cfg->capacity;
    const int tiered = cfg->ram_rows > 0 && cfg->ram_rows < limit;
    if (tiered && !cfg->spill_path)
        return kiln_errf(KILN_EINVAL, "table '%s': ram_rows needs a spill_path", name);

    t = kiln_calloc(1, sizeof *t);
    if (!t)
        return KILN_ENOMEM;
    t->name = kiln_strdup(name);
    t->dim = cfg->dim;
    t->nstate = kern_opt_nstate(cfg->opt);
    t->capacity = cfg->capacity;
    t->limit = limit;
    if (tiered) {
        /* The slab holds the RAM's rows; the whole table's bounds apart. */
        t->all_capacity = cfg->capacity;
        t->all_limit = limit;
        t->capacity = t->limit = cfg->ram_rows;
    }
    t->max_load = tiered ? TIER_RAM_LOAD : MAX_LOAD;
    t->init = cfg->init;
    t->init_scale = cfg->init_scale;
    t->opt_init = cfg->opt == KERN_OPT_ADAGRAD ? cfg->opt_init : 0.0f;
    t->seed = cfg->seed;
    t->evict = cfg->evict;
    t->evict_fraction = cfg->evict_fraction > 0.0f ? cfg->evict_fraction : 0.01;
    t->base = -1;
    t->opt_kind = cfg->opt;
    if (!t->name || (cfg->capacity_note && !(t->capacity_note = kiln_strdup(cfg->capacity_note)))) {
        rc = KILN_ENOMEM;
        goto out;
    }

    /* Segments of equal size (the last takes the remainder), as few as
     * SEG_MAX_ROWS (or the configured segment_rows) allow. */
    int64_t most = cfg->segment_rows > 0 ? cfg->segment_rows : SEG_MAX_ROWS;
    t->nseg = (int)((t->capacity + most - 1) / most);
    t->seg_rows = (t->capacity + t->nseg - 1) / t->nseg; /* <= most; no segment is empty */
    t->seg = kiln_calloc((size_t)t->nseg, sizeof *t->seg);
    if (!t->seg) {
        t->nseg = 0;
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int k = 0; k < t->nseg; k++) {
        seg_t *g = &t->seg[k];
        g->base = k * t->seg_rows;
        g->cap = t->capacity - g->base < t->seg_rows ? t->capacity - g->base : t->seg_rows;
        g->lim = t->limit == t->capacity ? g->cap : g->cap * t->limit / t->capacity;
        if (g->lim < 1)
            g->lim = 1;
        g->free_head = NO_ROW;
        /* The smallest slot count with load <= max_load (not rounded up to
         * a power of two: slot_of scales the hash instead of masking it). */
        g->max_slots = (int64_t)((double)g->cap / t->max_load) + 1;
        if (g->max_slots < 8)
            g->max_slots = 8;
        g->nslots = g->max_slots < 1024 ? g->max_slots : 1024;
        if (!(g->slots = big_alloc((size_t)SLOT_BYTES * (size_t)g->nslots))) {
            rc = KILN_ENOMEM;
            goto out;
        }
    }
    array_t arr[MAX_ARRAYS];
    int narr = table_arrays(t, arr);
    for (int i = 0; i < narr; i++) {
        if (!(*arr[i].p = big_alloc(arr[i].bytes))) {
            rc = kiln_errf(KILN_ENOMEM, "table '%s': out of memory for %zu bytes (capacity "
                           "%lld rows); lower model.embedding.capacity",
                           name, arr[i].bytes, (long long)cfg->capacity);
            goto out;
        }
    }
    if (tiered) {
        int nfloat = t->dim * (1 + t->nstate);
        KILN_CHECK_GOTO(kern_tier_open(cfg->spill_path, name, t->all_capacity, nfloat, cfg->spill_io,
                                       &t->cold),
                        rc, out);
        kern_tier_prefetch_always(t->cold, cfg->spill_prefetch_always);
        /* 8 counters a RAM row (8 bytes),
         * halved every 8 x ram_rows lookups: a longer window kept more of
         * the hottest keys in RAM (bench/tier_bench, 1e6 keys at 10%: RAM
         * hit rate 0.605 at 2 x, 0.636 at 8 x, 0.645 at 32 x; lru 0.586). */
        t->hk_width = 64;
        while (t->hk_width < 4 * t->capacity)
            t->hk_width *= 2;
        t->hk_window = 8 * t->capacity;
        /* on a cache line: a key's two counters are one block of 64 bytes */
        void *hk = NULL;
        if (posix_memalign(&hk, 64, (size_t)(2 * t->hk_width)) != 0) {
            rc = KILN_ENOMEM;
            goto out;
        }
        t->hk = memset(hk, 0, (size_t)(2 * t->hk_width));
        for (const seg_t *g = t->seg; g < t->seg + t->nseg; g++)
            for (unsigned h = 0; h < 256; h++) {
                const uint32_t s = hl_list(t, g, h);
                t->hl_next[s] = t->hl_prev[s] = s; /* empty */
            }
        t->hl_on = true;
    }
    if (cfg->admit_min > 1) {
        t->admit_min = cfg->admit_min;
        t->admit_decay = cfg->admit_decay;
        t->sk_width = cfg->admit_width > 0 ? cfg->admit_width : 65536;
        t->sketch = kiln_calloc((size_t)(SKETCH_DEPTH * t->sk_width), sizeof *t->sketch);
        if (!t->sketch) {
            rc = KILN_ENOMEM;
            goto out;
        }
    }
    *out = t;
    t = NULL;
out:
    kern_table_destroy(t);
    return rc;
}

void kern_table_destroy(kern_table_t *t)
{
    if (!t)
        return;
    array_t arr[MAX_ARRAYS];
    int narr = table_arrays(t, arr);
    for (int i = 0; i < narr; i++)
        big_free(*arr[i].p, arr[i].bytes);
    for (int k = 0; k < t->nseg; k++)
        big_free(t->seg[k].slots, (size_t)SLOT_BYTES * (size_t)t->seg[k].nslots);
    kern_tier_close(t->cold);
    free(t->hk);
    KILN_FREE_ALL(t->seg, t->name, t->capacity_note, t->log, t->dem, t->sketch, t->pins);
    free(t);
}

/* ---- public: keys ----------------------------------------------------------------------- */

int kern_table_find_or_insert(kern_table_t *t, int64_t n, const int64_t *keys, int64_t step,
                              int32_t *rows /* OUT (n) */)
{
    if (t->cold || t->sketch)
        return find_ext(t, n, keys, step, 1, rows);
    int rc = 0;
    int64_t *missing = NULL, nmiss = 0;
    age_sweep(t, step);

    /* Pass 1: existing keys, counting a use; collect the missing ones (their
     * slots and rows' keys asked for ahead, as find_ext does). */
    for (int64_t i = 0; i < n; i++) {
        if (i + FIND_AHEAD < n)
            __builtin_prefetch(home_slot_at(t, keys[i + FIND_AHEAD]));
        if (i + FIND_AHEAD / 2 < n) {
            const int64_t *k = row_key_ahead(t, keys[i + FIND_AHEAD / 2], 0);
            if (k)
                __builtin_prefetch(k);
        }
        seg_t *g = seg_of_key(t, keys[i]);
        int found;
        uint64_t s = probe(t, g, keys[i], &found);
        if (found) {
            rows[i] = (int32_t)slot_row(g, s);
            touch(t, rows[i], step);
        } else {
            rows[i] = -1;
            if (!missing && !(missing = kiln_malloc(sizeof(int64_t) * (size_t)(n - i)))) {
                rc = KILN_ENOMEM;
                goto out;
            }
            missing[nmiss++] = keys[i];
        }
    }
    if (nmiss == 0)
        goto out;

    /* Make room for the distinct new keys in their segments before
     * inserting any: `none` refuses as a whole, lru/lfu evict a round in
     * each segment that lacks room. */
    seg_t *over = count_new(t, missing, nmiss, 1, 0);
    if (over && t->evict == KERN_EVICT_NONE) {
        rc = full_error(t, over);
        goto out;
    }
    for (seg_t *g = t->seg; over && g < t->seg + t->nseg; g++) {
        int64_t room = g->lim - g->size, freed; /* < 0 after a load past the limit */
        if (g->pending <= room)
            continue;
        KILN_CHECK_GOTO(evict_round(t, g, g->pending - room, step, 0, &freed), rc, out);
        if (g->lim - g->size < g->pending) {
            rc = full_error(t, g);
            goto out;
        }
    }
    KILN_CHECK_GOTO(reserve_pending(t), rc, out);

    /* Pass 2: insert (a repeated new key finds the row its first copy got). */
    for (int64_t i = 0; i < n; i++) {
        if (rows[i] >= 0)
            continue;
        int added;
        int64_t r = find_or_add(t, keys[i], &added);
        if (added) {
            init_row(t, r, keys[i]);
            t->stamps[r] = step;
            mark_one(t, r);
        }
        rows[i] = (int32_t)r;
        touch(t, r, step);
    }
out:
    free(missing);
    return rc;
}

int64_t kern_table_find(const kern_table_t *t, int64_t n, const int64_t *keys,
                        int32_t *rows /* OUT (n) */)
{
    int64_t nfound = 0;
    for (int64_t i = 0; i < n; i++) {
        const seg_t *g = seg_of_key(t, keys[i]);
        int found;
        uint64_t s = probe(t, g, keys[i], &found);
        rows[i] = found ? (int32_t)slot_row(g, s) : -1;
        nfound += found;
    }
    if (t->cold && nfound < n) {
        /* Keys on disk count as found; their rows stay -1. */
        int64_t *miss = kiln_malloc(sizeof *miss * (size_t)(n - nfound));
        uint8_t *hit = kiln_calloc((size_t)(n - nfound), 1);
        int64_t k = 0;
        for (int64_t i = 0; miss && i < n; i++)
            if (rows[i] < 0)
                miss[k++] = keys[i];
        if (miss && hit && kern_tier_has(t->cold, k, miss, hit) == 0)
            for (int64_t i = 0; i < k; i++)
                nfound += hit[i];
        KILN_FREE_ALL(miss, hit);
    }
    return nfound;
}

int kern_table_delete(kern_table_t *t, int64_t n, const int64_t *keys, int64_t step,
                      int64_t *ndeleted /* OUT, may be NULL */)
{
    int64_t nd = 0;
    int rc = 0;
    for (int64_t i = 0; i < n; i++) {
        seg_t *g = seg_of_key(t, keys[i]);
        int found;
        uint64_t s = probe(t, g, keys[i], &found);
        if (!found)
            continue;
        KILN_CHECK_GOTO(free_row(t, g, slot_row(g, s), s, step), rc, out);
        nd++;
    }
    if (t->cold) {
        int64_t d = 0, keep = t->last_step;
        t->last_step = step; /* tier_gone logs at last_step */
        rc = kern_tier_delete(t->cold, n, keys, tier_gone, t, &d);
        t->last_step = keep;
        nd += d;
    }
out:
    if (ndeleted)
        *ndeleted = nd;
    return rc;
}

/* Sets row r from entry i of a bulk load (insert_rows' arrays), stamped
 * with step. */
static void load_row(kern_table_t *t, int64_t r, int64_t i, const float *values,
                     const float *opt_state, const uint32_t *opt_steps, int64_t step)
{
    const size_t dim = (size_t)t->dim, sdim = (size_t)t->nstate * dim;
    memcpy(t->values + (size_t)r * dim, values + (size_t)i * dim, sizeof(float) * dim);
    if (t->opt) {
        if (opt_state)
            memcpy(t->opt + (size_t)r * sdim, opt_state + (size_t)i * sdim,
                   sizeof(float) * sdim);
        else
            fresh_state(t, r);
    }
    if (t->opt_steps)
        t->opt_steps[r] = opt_steps ? opt_steps[i] : 0;
    t->stamps[r] = step;
    mark_one(t, r);
    touch(t, r, step);
    if (t->hl_on)
        hl_move(t, r); /* used now */
}

/* insert_rows for a table with a disk tier: keys in RAM are overwritten
 * there, the others fill RAM while it has room and go to disk after. */
static int insert_rows_tiered(kern_table_t *t, int64_t n, const int64_t *keys,
                              const float *values, const float *opt_state,
                              const uint32_t *opt_steps, int64_t step)
{
    const size_t rb = kern_tier_rec_bytes(t->cold), dim = (size_t)t->dim,
                 sdim = (size_t)t->nstate * dim;
    int32_t *rows = kiln_malloc(sizeof *rows * (size_t)(n > 0 ? n : 1));
    int64_t *miss = kiln_malloc(sizeof *miss * (size_t)(n > 0 ? n : 1));
    uint8_t *hit = kiln_calloc((size_t)(n > 0 ? n : 1), 1);
    uint8_t *recs = kiln_malloc(rb * (size_t)(n > 0 ? n : 1));
    int64_t nmiss = 0, nold = 0, ndisk = 0;
    int rc = 0;
    if (!rows || !miss || !hit || !recs) {
        rc = KILN_ENOMEM;
        goto out;
    }
    age_sweep(t, step);
    for (int64_t i = 0; i < n; i++) {
        const seg_t *g = seg_of_key(t, keys[i]);
        int found;
        uint64_t s = probe(t, g, keys[i], &found);
        rows[i] = found ? (int32_t)slot_row(g, s) : -1;
        if (!found)
            miss[nmiss++] = keys[i];
    }
    /* The disk's copies of the other keys are replaced (taken out here). */
    KILN_CHECK_GOTO(kern_tier_take(t->cold, nmiss, miss, recs, hit), rc, out);
    for (int64_t i = 0; i < nmiss; i++)
        nold += hit[i];
    if (t->size + kern_tier_size(t->cold) + nold + (nmiss - nold) > t->all_capacity) {
        rc = kiln_errf(KILN_EFULL, "table '%s' is full (capacity %lld rows): cannot load %lld "
                       "new keys; raise model.embedding.capacity",
                       t->name, (long long)t->all_capacity, (long long)(nmiss - nold));
        int64_t k = 0; /* what was taken goes back */
        for (int64_t i = 0; i < nmiss; i++)
            if (hit[i])
                memmove(recs + (size_t)k++ * rb, recs + (size_t)i * rb, rb);
        kern_tier_put(t->cold, k, recs);
        goto out;
    }
    /* RAM while its segments have room (under the limit), disk after. */
    for (seg_t *g = t->seg; g < t->seg + t->nseg; g++)
        g->pending = 0;
    for (int64_t i = 0; i < n; i++) {
        if (rows[i] >= 0)
            continue;
        seg_t *g = seg_of_key(t, keys[i]);
        if (g->size + g->pending < g->lim) {
            g->pending++;
            rows[i] = -2; /* to RAM */
        }
    }
    KILN_CHECK_GOTO(reserve_pending(t), rc, out);
    for (int64_t i = 0; i < n; i++) {
        if (rows[i] == -1) {
            uint8_t *rec = recs + (size_t)ndisk++ * rb;
            kern_rec_t h = {.key = keys[i], .stamp = step, .use = t->freq ? 0 : (uint32_t)step,
                            .opt_steps = opt_steps ? opt_steps[i] : 0};
            memcpy(rec, &h, sizeof h);
            float *f = (float *)(rec + sizeof h);
            memcpy(f, values + (size_t)i * dim, sizeof(float) * dim);
            for (size_t j = 0; j < sdim; j++)
                f[dim + j] = opt_state ? opt_state[(size_t)i * sdim + j] : t->opt_init;
            continue;
        }
        int added;
        int64_t r = rows[i] >= 0 ? rows[i] : find_or_add(t, keys[i], &added);
        if (t->freq && rows[i] < 0)
            t->freq[r] = 0;
        load_row(t, r, i, values, opt_state, opt_steps, step);
    }
    rc = kern_tier_put(t->cold, ndisk, recs);
out:
    KILN_FREE_ALL(rows, miss, hit, recs);
    return rc;
}

int kern_table_insert_rows(kern_table_t *t, int64_t n, const int64_t *keys,
                           const float *values, const float *opt_state,
                           const uint32_t *opt_steps, int64_t step)
{
    if (t->cold)
        return insert_rows_tiered(t, n, keys, values, opt_state, opt_steps, step);
    int32_t *rows = kiln_malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    int64_t *missing = NULL;
    if (!rows)
        return KILN_ENOMEM;
    age_sweep(t, step);
    int64_t nmiss = n - kern_table_find(t, n, keys, rows);
    int rc = 0;
    if (nmiss > 0) {
        if (!(missing = kiln_malloc(sizeof(int64_t) * (size_t)nmiss))) {
            rc = KILN_ENOMEM;
            goto out;
        }
        for (int64_t i = 0, k = 0; i < n; i++)
            if (rows[i] < 0)
                missing[k++] = keys[i];
        seg_t *over = count_new(t, missing, nmiss, 0, 0);
        if (over) {
            char where[160] = "";
            if (t->nseg > 1)
                snprintf(where, sizeof where, " in its index segment %d of %d",
                         (int)(over - t->seg), t->nseg);
            rc = kiln_errf(KILN_EFULL,
                           "table '%s' is full (capacity %lld rows): cannot load %lld new "
                           "keys into %lld free rows%s; raise model.embedding.capacity",
                           t->name, (long long)t->capacity, (long long)over->pending,
                           (long long)(over->cap - over->size), where);
            goto out;
        }
        KILN_CHECK_GOTO(reserve_pending(t), rc, out);
    }
    for (int64_t i = 0; i < n; i++) {
        int added;
        int64_t r = find_or_add(t, keys[i], &added);
        if (added && t->freq)
            t->freq[r] = 0;
        load_row(t, r, i, values, opt_state, opt_steps, step);
    }
out:
    free(missing);
    free(rows);
    return rc;
}

/* ---- public: change tracking and export ---------------------------------------------- */

void kern_table_mark_changed(kern_table_t *t, int64_t n, const int32_t *rows)
{
    for (int64_t i = 0; i < n; i++)
        if (is_live(t, rows[i]))
            mark_one(t, rows[i]);
}

int kern_table_changed_since(kern_table_t *t, int64_t since, int32_t *rows /* OUT (cap) */,
                             int64_t cap, int64_t *n /* OUT */)
{
    int64_t k = 0;
    *n = 0;
    if (since >= t->base) {
        /* Every row with stamp > base has its bit in chg; a marked row may
         * have been freed (stamp -1) or reused since, which the stamp test
         * sorts out. The summary words skip empty stretches 4096 rows at a
         * time. */
        int64_t nsum = (t->capacity + 4095) / 4096;
        for (int64_t sw = 0; sw < nsum; sw++) {
            for (uint64_t sm = t->chg_sum[sw]; sm; sm &= sm - 1) {
                int64_t w = sw * 64 + __builtin_ctzll(sm);
                for (uint64_t bits = t->chg[w]; bits; bits &= bits - 1) {
                    int64_t r = w * 64 + __builtin_ctzll(bits);
                    if (t->stamps[r] > since) {
                        if (k == cap)
                            return kiln_errf(KILN_ERANGE, "table '%s': changed_since needs "
                                             "more than %lld entries", t->name, (long long)cap);
                        rows[k++] = (int32_t)r;
                    }
                }
            }
        }
        t->last_visited = t->nchg;
    } else {
        t->last_visited = 0;
        for (const seg_t *g = t->seg; g < t->seg + t->nseg; g++) {
            for (int64_t r = g->base; r < g->base + g->hiwater; r++) {
                if (t->stamps[r] > since) {
                    if (k == cap)
                        return kiln_errf(KILN_ERANGE, "table '%s': changed_since needs more "
                                         "than %lld entries", t->name, (long long)cap);
                    rows[k++] = (int32_t)r;
                }
            }
            t->last_visited += g->hiwater;
        }
    }
    *n = k;
    return 0;
}

void kern_table_set_base(kern_table_t *t, int64_t base)
{
    int64_t k = 0, nsum = (t->capacity + 4095) / 4096;
    for (int64_t sw = 0; sw < nsum; sw++) {
        uint64_t keep_sum = 0;
        for (uint64_t sm = t->chg_sum[sw]; sm; sm &= sm - 1) {
            int b = __builtin_ctzll(sm);
            int64_t w = sw * 64 + b;
            uint64_t keep = 0;
            for (uint64_t bits = t->chg[w]; bits; bits &= bits - 1) {
                int64_t r = w * 64 + __builtin_ctzll(bits);
                if (t->stamps[r] > base)
                    keep |= bits & -bits;
            }
            t->chg[w] = keep;
            k += __builtin_popcountll(keep);
            if (keep)
                keep_sum |= (uint64_t)1 << b;
        }
        t->chg_sum[sw] = keep_sum;
    }
    t->nchg = k;
    t->base = base;
}

int kern_table_scan(const kern_table_t *t, int32_t *rows /* OUT (cap) */, int64_t cap,
                    int64_t *n /* OUT */)
{
    int64_t k = 0;
    *n = 0;
    if (cap < t->size)
        return kiln_errf(KILN_ERANGE, "table '%s' has %lld live rows, more than %lld",
                         t->name, (long long)t->size, (long long)cap);
    for (const seg_t *g = t->seg; g < t->seg + t->nseg; g++)
        for (int64_t r = g->base; r < g->base + g->hiwater; r++)
            if (t->stamps[r] >= 0)
                rows[k++] = (int32_t)r;
    *n = k;
    return 0;
}

const kern_evicted_t *kern_table_evicted(const kern_table_t *t, int64_t *n /* OUT */)
{
    *n = t->nlog;
    return t->log;
}

void kern_table_evicted_clear(kern_table_t *t)
{
    free(t->log);
    t->log = NULL;
    t->nlog = t->caplog = 0;
}

/* ---- public: accessors --------------------------------------------------------------- */

void kern_table_slab(kern_table_t *t, kern_slab_t *slab /* OUT */)
{
    *slab = (kern_slab_t){.values = t->values,
                          .opt_state = t->opt,
                          .stamps = t->stamps,
                          .opt_steps = t->opt_steps,
                          .capacity = t->capacity,
                          .dim = t->dim,
                          .nstate = t->nstate};
}

const int64_t *kern_table_keys(const kern_table_t *t) { return t->keys; }
int64_t kern_table_size(const kern_table_t *t)
{
    return t->size + (t->cold ? kern_tier_size(t->cold) : 0);
}
int64_t kern_table_capacity(const kern_table_t *t) { return t->capacity; }
int kern_table_dim(const kern_table_t *t) { return t->dim; }
const char *kern_table_name(const kern_table_t *t) { return t->name; }

void kern_table_stats(const kern_table_t *t, kern_table_stats_t *st /* OUT */)
{
    int64_t nslots = 0;
    for (const seg_t *g = t->seg; g < t->seg + t->nseg; g++)
        nslots += g->nslots;
    *st = (kern_table_stats_t){.size = kern_table_size(t),
                               .capacity = t->cold ? t->all_capacity : t->capacity,
                               .limit = t->cold ? t->all_limit : t->limit,
                               .nslots = nslots,
                               .nsegments = t->nseg,
                               .evictions = t->evictions,
                               .eviction_batches = t->eviction_batches,
                               .changed_pending = t->nchg,
                               .last_visited = t->last_visited,
                               .ram_size = t->size,
                               .ram_hits = t->ram_hits,
                               .disk_hits = t->disk_hits,
                               .demoted = t->demoted,
                               .admit_rejected = t->admit_rejected,
                               .expired = t->expired};
    if (t->cold) {
        kern_tier_stats_t ts;
        kern_tier_stats(t->cold, &ts);
        st->disk_size = kern_tier_size(t->cold);
        st->disk_reads = ts.reads;
        st->disk_writes = ts.writes;
        st->disk_read_bytes = ts.read_bytes;
        st->disk_written_bytes = ts.written_bytes;
        st->disk_submits = ts.submits;
        st->prefetched = ts.prefetched;
        st->page_bytes = ts.page_bytes;
        st->disk_io = ts.io;
    }
}

size_t kern_table_bytes(const kern_table_t *t)
{
    array_t arr[MAX_ARRAYS];
    int narr = table_arrays((kern_table_t *)t, arr);
    size_t b = sizeof *t + strlen(t->name) + 1;
    for (int i = 0; i < narr; i++)
        b += arr[i].bytes;
    b += sizeof(seg_t) * (size_t)t->nseg;
    for (const seg_t *g = t->seg; g < t->seg + t->nseg; g++)
        b += (size_t)SLOT_BYTES * (size_t)g->nslots;
    b += (size_t)t->caplog * sizeof(kern_evicted_t);
    return b;
}

int64_t kern_table_tier_ram_row_bytes(int dim, kern_opt_kind_t opt)
{
    return (int64_t)sizeof(float) * dim * (1 + kern_opt_nstate(opt)) +
           (opt == KERN_OPT_ADAM ? (int64_t)sizeof(uint32_t) : 0) + (int64_t)sizeof(int64_t) +
           (int64_t)sizeof(int64_t) + (int64_t)sizeof(uint16_t) +
           2 * (int64_t)sizeof(uint32_t) /* heat lists */ + (int64_t)(SLOT_BYTES / TIER_RAM_LOAD);
}

size_t kern_table_row_bytes(const kern_table_t *t)
{
    size_t dim = (size_t)t->dim;
    return sizeof(int64_t) + dim * sizeof(float) + dim * (size_t)t->nstate * sizeof(float) +
           (t->opt_steps ? sizeof(uint32_t) : 0) + sizeof(int64_t);
}
