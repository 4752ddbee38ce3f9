/*
 * data/data_gen.c - synthetic Criteo-format training data with a signal a
 * model can learn and a drift from day to day, for demos, tests and
 * benchmarks (`kiln datagen`). Each of the 26 slots draws ids from a
 * Zipf-like law over its own vocabulary (10 to 1e6 ids, scaled down for
 * small files); a hidden logistic model gives every id a weight (a hash of
 * slot, id and seed) and adds a few dense terms; the label is drawn from it
 * with the bias tuned on a pilot sample so the click rate is near 25%.
 * From one day to the next ids within a popularity tier swap ranks, a share
 * of traffic goes to ids new that day, and a fifth of the ids get new
 * weights. Same (seed, day, part, rows, skew options) -> same bytes.
 * `kiln datagen --zipf S --vocab N --empty F` replaces the per-slot mix of
 * exponents, vocabularies and empty shares with one value for every slot,
 * and the generator reports the Bayes-optimal logloss of what it wrote (it
 * knows each row's true click probability). docs/data-formats.md has the
 * numbers.
 */
#include "data_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define G_NDENSE DATA_CRITEO_NDENSE
#define G_NSLOTS DATA_CRITEO_NSLOTS
#define G_CTR 0.25
#define G_PILOT 4096
#define G_NEW_ID_SHARE 0.08 /* share of draws that go to ids new on this day */
#define G_VOLATILE 51       /* of 256: ids whose hidden weight changes every day */
#define G_OUTBUF ((size_t)1 << 20)
#define G_MAX_VOCAB INT64_C(100000000) /* ids print as 32-bit hashes: keep collisions rare */

typedef struct {
    int64_t vocab;     /* ids in the stable vocabulary */
    int64_t vocab_new; /* ids new on each day */
    double zipf_c, zipf_inv, zipf_cn; /* inverse-CDF constants (stable, new);
                                         zipf_inv 0: exponent 1, the log form */
    double empty;      /* probability that the field is empty */
    double sigma;      /* spread of the hidden weights */
    uint64_t wseed;    /* hash seed of the slot's weights */
    uint64_t idseed;   /* hash seed of the slot's id strings */
} slot_model_t;

typedef struct {
    double empty, scale, alpha, neg, coef;
} dense_model_t;

/* Integer feature shapes, loosely after Criteo's I1..I13: how often empty,
 * the Pareto scale and tail, how often negative, and the weight in the
 * hidden model. */
static const dense_model_t dense_models[G_NDENSE] = {
    {0.45, 1.0, 1.2, 0.00, 0.25},  {0.00, 20.0, 1.1, 0.05, 0.0},  {0.20, 3.0, 1.3, 0.00, -0.2},
    {0.22, 2.0, 1.5, 0.00, 0.0},   {0.03, 500.0, 1.1, 0.00, 0.15}, {0.22, 30.0, 1.2, 0.00, 0.0},
    {0.04, 2.0, 1.3, 0.00, 0.0},   {0.00, 4.0, 2.0, 0.00, -0.15}, {0.04, 30.0, 1.2, 0.00, 0.0},
    {0.45, 0.5, 2.5, 0.00, 0.0},   {0.04, 1.0, 2.0, 0.00, 0.3},   {0.77, 1.0, 1.5, 0.00, 0.0},
    {0.22, 3.0, 1.4, 0.00, 0.0},
};

typedef struct {
    uint64_t s;
} rng_t;

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    x ^= x >> 31;
    return x;
}

static inline uint64_t rng_next(rng_t *r)
{
    r->s += UINT64_C(0x9e3779b97f4a7c15);
    return mix64(r->s);
}

/* Uniform in (0, 1]. */
static inline double rng_unit(rng_t *r)
{
    return (double)((rng_next(r) >> 11) + 1) * (1.0 / 9007199254740992.0);
}

/* The inverse-CDF constant of a power law of exponent a on [1, V + 1):
 * (V + 1)^(1 - a) - 1, or log(V + 1) for a = 1 (zipf_rank's log form). */
static double zipf_const(double a, int64_t v)
{
    return fabs(1.0 - a) < 1e-9 ? log((double)v + 1.0) : pow((double)v + 1.0, 1.0 - a) - 1.0;
}

static void slot_models(slot_model_t *m, const data_datagen_opts_t *o)
{
    int64_t rows = o->rows;
    double scale = rows >= 1000000 ? 1.0 : (double)(rows > 0 ? rows : 1) / 1e6;
    uint64_t seed = o->seed;
    for (int s = 0; s < G_NSLOTS; s++) {
        /* A fixed shuffle of the slots spreads the sizes 10 .. 1e6. */
        double t = (double)((s * 7) % G_NSLOTS) / (G_NSLOTS - 1);
        double base = floor(10.0 * pow(10.0, 5.0 * t) + 0.5);
        double v = base * scale;
        double a = 1.1 + 0.1 * (double)((s * 11) % G_NSLOTS) / (G_NSLOTS - 1);
        if (v < (base < 10.0 ? base : 10.0))
            v = base < 10.0 ? base : 10.0;
        if (o->vocab > 0)
            v = (double)o->vocab;
        if (o->zipf_set)
            a = o->zipf;
        m[s].vocab = (int64_t)v;
        m[s].vocab_new = m[s].vocab / 8 > 0 ? m[s].vocab / 8 : 1;
        m[s].zipf_inv = fabs(1.0 - a) < 1e-9 ? 0.0 : 1.0 / (1.0 - a);
        m[s].zipf_c = zipf_const(a, m[s].vocab);
        m[s].zipf_cn = zipf_const(a, m[s].vocab_new);
        m[s].empty = 0.02 + 0.03 * (double)((s * 5) % G_NSLOTS) / (G_NSLOTS - 1);
        if (s == 5 || s == 11 || s == 18 || s == 19 || s == 21 || s == 24)
            m[s].empty = 0.30 + 0.03 * (double)(s % 5);
        if (o->empty_set)
            m[s].empty = o->empty;
        m[s].sigma = 0.1 + 0.4 * (double)((s * 3) % G_NSLOTS) / (G_NSLOTS - 1);
        m[s].wseed = mix64(seed ^ mix64(UINT64_C(0x5eed0000) + (uint64_t)s));
        m[s].idseed = mix64(seed ^ mix64(UINT64_C(0x1d000000) + (uint64_t)s));
    }
}

/* Continuous inverse CDF of a power law x^-a on [1, V+1), floored: rank in
 * [0, V), so P(rank k) ~ (k + 1)^-a for large k: a Zipf law of exponent a
 * (a = 0: uniform). inv = 1 / (1 - a), or 0 for a = 1 (then c = log(V + 1)). */
static inline int64_t zipf_rank(double u, double c, double inv, int64_t v)
{
    double x = inv == 0.0 ? exp(u * c) : pow(1.0 + u * c, inv);
    int64_t k = x < 9.2e18 ? (int64_t)x - 1 : v - 1;
    return k < 0 ? 0 : k >= v ? v - 1 : k;
}

/* The id index that rank k of slot s has on day d: within tiers of 8 ranks
 * the order is reshuffled every day. */
static inline int64_t rank_to_index(const slot_model_t *m, int64_t k, int day)
{
    int64_t idx = k ^ (int64_t)(mix64(m->wseed ^ ((uint64_t)day << 40) ^ (uint64_t)(k >> 3)) & 7);
    return idx < m->vocab ? idx : k;
}

/* Hidden weight of id index idx on day d: approximately N(0, sigma^2), new
 * every day for the volatile ids. */
static inline double hidden_weight(const slot_model_t *m, int64_t idx, int day)
{
    uint64_t h = mix64(m->wseed + (uint64_t)idx * UINT64_C(0x9e3779b97f4a7c15));
    double sum;
    if ((h >> 56) < G_VOLATILE)
        h = mix64(h ^ mix64((uint64_t)day + 1));
    sum = (double)(h & 0xffff) + (double)((h >> 16) & 0xffff) + (double)((h >> 32) & 0xffff) +
          (double)((h >> 48) & 0xffff);
    return m->sigma * (sum / 65536.0 - 2.0) * 1.7320508075688772;
}

typedef struct {
    int64_t dense[G_NDENSE];
    unsigned char dense_empty[G_NDENSE];
    int64_t idx[G_NSLOTS]; /* -1 when empty */
    double logit;          /* without the bias */
} row_t;

static void draw_row(rng_t *r, const slot_model_t *m, int day, row_t *row)
{
    double z = 0.0;
    for (int j = 0; j < G_NDENSE; j++) {
        const dense_model_t *d = &dense_models[j];
        if (rng_unit(r) < d->empty) {
            row->dense_empty[j] = 1;
            continue;
        }
        double x = floor(d->scale * (pow(rng_unit(r), -1.0 / d->alpha) - 1.0));
        if (x > 1e9)
            x = 1e9;
        row->dense_empty[j] = 0;
        row->dense[j] = (int64_t)x;
        if (d->neg > 0.0 && rng_unit(r) < d->neg)
            row->dense[j] = -1 - (int64_t)(rng_next(r) & 1);
        if (d->coef != 0.0)
            z += d->coef * (log1p(x > 0.0 && row->dense[j] > 0 ? x : 0.0) - 1.5);
    }
    for (int s = 0; s < G_NSLOTS; s++) {
        const slot_model_t *sm = &m[s];
        int64_t idx;
        if (rng_unit(r) < sm->empty) {
            row->idx[s] = -1;
            continue;
        }
        if (rng_unit(r) < G_NEW_ID_SHARE) {
            int64_t k = zipf_rank(rng_unit(r), sm->zipf_cn, sm->zipf_inv, sm->vocab_new);
            idx = sm->vocab + (int64_t)day * sm->vocab_new + k;
        } else {
            int64_t k = zipf_rank(rng_unit(r), sm->zipf_c, sm->zipf_inv, sm->vocab);
            idx = rank_to_index(sm, k, day);
        }
        row->idx[s] = idx;
        z += hidden_weight(sm, idx, day);
    }
    row->logit = z;
}

static inline double sigmoid(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

/* The bias that puts the mean click probability of a pilot sample at G_CTR. */
static double calibrate_bias(const slot_model_t *m, uint64_t seed, int day)
{
    double z[G_PILOT];
    rng_t r = {mix64(seed ^ UINT64_C(0x9170700000000000) ^ (uint64_t)day)};
    row_t row;
    double lo = -20.0, hi = 20.0;
    for (int i = 0; i < G_PILOT; i++) {
        draw_row(&r, m, day, &row);
        z[i] = row.logit;
    }
    for (int it = 0; it < 50; it++) {
        double mid = 0.5 * (lo + hi), mean = 0.0;
        for (int i = 0; i < G_PILOT; i++)
            mean += sigmoid(z[i] + mid);
        if (mean / G_PILOT < G_CTR)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

static inline char *put_int(char *p, int64_t v)
{
    char tmp[24];
    int n = 0;
    uint64_t u;
    if (v < 0) {
        *p++ = '-';
        u = (uint64_t)(-(v + 1)) + 1;
    } else {
        u = (uint64_t)v;
    }
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    while (n)
        *p++ = tmp[--n];
    return p;
}

static inline char *put_hex8(char *p, uint32_t v)
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 7; i >= 0; i--) {
        p[i] = hex[v & 15];
        v >>= 4;
    }
    return p + 8;
}

int data_datagen(const data_datagen_opts_t *o)
{
    slot_model_t m[G_NSLOTS];
    rng_t r;
    row_t row;
    double bias, entropy = 0.0;
    int64_t clicks = 0;
    char *buf = NULL, *p;
    kiln_atomic_t out = {0};
    FILE *fp = NULL;
    int rc = 0;

    if (!o || !o->path || o->rows < 0 || o->day < 0 || o->part < 0)
        return kiln_errf(KILN_EINVAL,
                         "datagen needs an output path, rows >= 0, day >= 0 and part >= 0");
    if (o->zipf_set && !(o->zipf >= 0.0 && o->zipf <= 10.0))
        return kiln_errf(KILN_EINVAL, "datagen: the Zipf exponent must be in [0, 10], got %g",
                         o->zipf);
    if (o->empty_set && !(o->empty >= 0.0 && o->empty <= 1.0))
        return kiln_errf(KILN_EINVAL,
                         "datagen: the share of empty fields must be in [0, 1], got %g", o->empty);
    if (o->vocab < 0 || o->vocab > G_MAX_VOCAB)
        return kiln_errf(KILN_EINVAL, "datagen: the vocabulary must be 1 to %lld ids, got %lld",
                         (long long)G_MAX_VOCAB, (long long)o->vocab);
    slot_models(m, o);
    bias = calibrate_bias(m, o->seed, o->day);
    r.s = mix64(o->seed ^ mix64(UINT64_C(0xda7a000000) + (uint64_t)o->day));
    if (o->part > 0) /* part 0 keeps the stream it always had */
        r.s = mix64(r.s ^ mix64(UINT64_C(0x9a27000000) + (uint64_t)o->part));
    buf = kiln_malloc(G_OUTBUF + 4096);
    if (!buf) {
        rc = KILN_ENOMEM;
        goto out;
    }
    if ((rc = kiln_atomic_open(o->path, &out)) < 0)
        goto out;
    fp = out.f;
    p = buf;
    for (int64_t i = 0; i < o->rows; i++) {
        draw_row(&r, m, o->day, &row);
        double pc = sigmoid(row.logit + bias);
        int label = rng_unit(&r) < pc;
        /* binary entropy of the true probability: the Bayes-optimal loss */
        if (pc > 0.0 && pc < 1.0)
            entropy -= pc * log(pc) + (1.0 - pc) * log1p(-pc);
        clicks += label;
        *p++ = label ? '1' : '0';
        for (int j = 0; j < G_NDENSE; j++) {
            *p++ = '\t';
            if (!row.dense_empty[j])
                p = put_int(p, row.dense[j]);
        }
        for (int s = 0; s < G_NSLOTS; s++) {
            *p++ = '\t';
            if (row.idx[s] >= 0)
                p = put_hex8(p, (uint32_t)mix64(m[s].idseed + (uint64_t)row.idx[s]));
        }
        *p++ = '\n';
        if ((size_t)(p - buf) >= G_OUTBUF) {
            if (fwrite(buf, 1, (size_t)(p - buf), fp) != (size_t)(p - buf)) {
                rc = kiln_errf(KILN_EIO, "cannot write %s: %s", out.tmp,
                               strerror(errno));
                goto out;
            }
            p = buf;
        }
    }
    if (p > buf && fwrite(buf, 1, (size_t)(p - buf), fp) != (size_t)(p - buf)) {
        rc = kiln_errf(KILN_EIO, "cannot write %s: %s", out.tmp, strerror(errno));
        goto out;
    }
    rc = kiln_atomic_commit(&out); /* leaves out empty, for the abort below */
    if (rc < 0)
        goto out;
    if (o->bayes_logloss)
        *o->bayes_logloss = o->rows > 0 ? entropy / (double)o->rows : 0.0;
    if (o->ctr)
        *o->ctr = o->rows > 0 ? (double)clicks / (double)o->rows : 0.0;
out:
    kiln_atomic_abort(&out);
    free(buf);
    return rc;
}
