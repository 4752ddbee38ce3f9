/*
 * runtime/rt_dd.h - double-double sums: a float64 pair (hi, lo) whose sum
 * carries about 106 bits, so that a gradient summed in any order (one rank
 * over the whole batch, or N ranks' partial sums added by an allreduce)
 * rounds to the same float32 (docs/models.md, "Rank-count invariance").
 * Float64 alone was not enough: its last-bit differences between orders
 * flipped a float32 rounding now and then, and adagrad amplified the flip
 * (bench dlrm: eval logloss 0.661 on 1 rank vs 0.666 on 2 for one seed).
 *
 * The error of a double-double sum is about 2^-106 of the sum of the terms'
 * magnitudes; float32 rounding of it differs between orders only when the
 * exact sum lies that close to a rounding boundary. Internal to runtime/;
 * the MPI op that adds pairs is rt_dd_mpi_init in rt_shard.h.
 */
#ifndef KILN_RUNTIME_RT_DD_H
#define KILN_RUNTIME_RT_DD_H

/* (*hi, *lo) += x, Knuth's TwoSum: exact, whatever the magnitudes. */
static inline void rt_dd_add(double *hi, double *lo, double x)
{
    const double s = *hi + x;
    const double bp = s - *hi;
    const double err = (*hi - (s - bp)) + (x - bp);
    *hi = s;
    *lo += err;
}

/* (*hi, *lo) += (bhi, blo). */
static inline void rt_dd_add_dd(double *hi, double *lo, double bhi, double blo)
{
    rt_dd_add(hi, lo, bhi);
    *lo += blo;
}

/* The pair rounded once to float32 (lo folded into hi first). */
static inline float rt_dd_float(double hi, double lo) { return (float)(hi + lo); }

#endif /* KILN_RUNTIME_RT_DD_H */
