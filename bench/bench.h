/*
 * bench/bench.h - what every benchmark program shares: the median of a
 * set of timings (benchmarks quote medians; docs/benchmarks.md), a small
 * seeded xorshift generator, so runs draw the same inputs every time, a
 * Zipf draw, and a table-driven reader of "--name VALUE" options.
 */
#ifndef KILN_BENCH_BENCH_H
#define KILN_BENCH_BENCH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v (n >= 1); sorts v in place. */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* xorshift64; the same sequence on every run of a program. */
static inline uint64_t bench_rnd(void)
{
    static uint64_t s = 0x9e3779b97f4a7c15ULL;
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
}

/* A Zipf(s) rank in [1, n] (s != 1) for the uniform draw u in [0, 1), by
 * inverting the continuous CDF of k^-s. */
static inline int64_t bench_zipf(int64_t n, double s, double u)
{
    double hn = (pow((double)n + 1.0, 1.0 - s) - 1.0) / (1.0 - s);
    double x = pow(1.0 + (1.0 - s) * u * hn, 1.0 / (1.0 - s));
    int64_t k = (int64_t)x;
    return k < 1 ? 1 : k > n ? n : k;
}

/* One "--name VALUE" option of a benchmark and where its value goes: read
 * as an int64_t, as an int, or kept as the string. */
typedef enum { BENCH_I64, BENCH_INT, BENCH_STR } bench_opt_kind_t;
typedef struct {
    const char *name; /* "--keys" */
    bench_opt_kind_t kind;
    void *out; /* int64_t *, int * or const char ** by kind */
} bench_opt_t;

/* Reads argv's "--name VALUE" pairs into the n options of opts; a name not
 * among them is passed over, and a value left unread keeps its default. */
static inline void bench_options(int argc, char **argv, const bench_opt_t *opts, size_t n)
{
    for (int i = 1; i + 1 < argc; i += 2)
        for (size_t k = 0; k < n; k++) {
            if (strcmp(argv[i], opts[k].name) != 0)
                continue;
            if (opts[k].kind == BENCH_I64)
                *(int64_t *)opts[k].out = strtoll(argv[i + 1], NULL, 10);
            else if (opts[k].kind == BENCH_INT)
                *(int *)opts[k].out = atoi(argv[i + 1]);
            else
                *(const char **)opts[k].out = argv[i + 1];
        }
}

#endif /* KILN_BENCH_BENCH_H */
