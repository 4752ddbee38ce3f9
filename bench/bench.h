/*
 * bench/bench.h - what every benchmark program shares: the median of a
 * set of timings (benchmarks quote medians; docs/benchmarks.md) and a small
 * seeded xorshift generator, so runs draw the same inputs every time.
 */
#ifndef KILN_BENCH_BENCH_H
#define KILN_BENCH_BENCH_H

#include <stdint.h>
#include <stdlib.h>

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

#endif /* KILN_BENCH_BENCH_H */
