/*
 * kernels/kern_ops.h - the per-element math that both backends share: the
 * counter-based RNG behind the seeded row initializer, the combine scale of
 * a bag, the element update of each optimizer (sparse, and the dense one in
 * model/model_opt.c) and the double-double sums of gradients. kern_cpu.c and
 * kern_table.c loop over these with OpenMP; kern_cuda.cu calls the very same
 * functions from its kernels, so the two backends differ only in how they
 * schedule the loops (and in whether the compiler fuses a*b+c).
 *
 * The file compiles as C11 and as CUDA C++: KERN_HD expands to
 * `__host__ __device__` under nvcc and to nothing in C. Everything here is
 * `static inline`, takes plain scalars and touches no global state.
 */
#ifndef KILN_KERNELS_KERN_OPS_H
#define KILN_KERNELS_KERN_OPS_H

#include <math.h>
#include <stdint.h>

#include "kern.h" /* the enums: kern_init_t, kern_evict_t, kern_combine_t, kern_opt_kind_t */

#if defined(__CUDACC__)
#define KERN_HD __host__ __device__
#else
#define KERN_HD
#endif

/* ---- vector width ---------------------------------------------------------------
 * The build's baseline is x86-64's SSE2, so `omp simd` loops run 128 bits
 * wide even on AVX-512 hosts. A host function marked KERN_CLONES is also
 * compiled for AVX2 (x86-64-v3) and AVX-512 (x86-64-v4), and the loader
 * picks the body the CPU runs. Only for loops whose elements are
 * independent (no reduction across the vector, like `y += c * x` or a
 * double-double sum per element): each element then sees the same IEEE
 * operations at every width (C11 does not contract a*b+c into an FMA), so
 * every body computes the same bits, and hosts of different vector widths
 * train the same model. A reduction (a dot product) is not marked: its
 * order would follow the width. */
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && defined(__x86_64__)
#define KERN_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define KERN_CLONES
#endif

/* ---- counter-based RNG ------------------------------------------------------
 * Element j of the initial row of key k in a table seeded s is a pure
 * function of (s, k, j): no state, no insertion order, no rank. The mixer is
 * the splitmix64 finalizer (Steele, Lea, Flood 2014). */
KERN_HD static inline uint64_t kern_mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Returns the 64 random bits number `ctr` of key under seed. */
KERN_HD static inline uint64_t kern_rand_bits(uint64_t seed, int64_t key, uint64_t ctr)
{
    return kern_mix64(kern_mix64(seed ^ kern_mix64((uint64_t)key)) + ctr);
}

/* Maps the top 24 bits of h to a float in [0, 1) (exact in float). */
KERN_HD static inline float kern_u01(uint64_t h)
{
    return (float)(h >> 40) * (1.0f / 16777216.0f);
}

/* Returns element j of the initial row of key: U(-scale, scale),
 * N(0, scale) (Box-Muller on two counter draws) or 0. */
KERN_HD static inline float kern_init_elem(int kind, float scale, uint64_t seed,
                                           int64_t key, int j)
{
    if (kind == KERN_INIT_UNIFORM) {
        float u = kern_u01(kern_rand_bits(seed, key, (uint64_t)j));
        return (2.0f * u - 1.0f) * scale;
    }
    if (kind == KERN_INIT_NORMAL) {
        /* u1 in (0, 1] so the log is finite. */
        float u1 = 1.0f - kern_u01(kern_rand_bits(seed, key, 2 * (uint64_t)j));
        float u2 = kern_u01(kern_rand_bits(seed, key, 2 * (uint64_t)j + 1));
        return scale * sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
    }
    return 0.0f;
}

/* Writes the initial row of key, v[0..dim), element by element. */
KERN_HD static inline void kern_init_row(float *v, int dim, int kind, float scale,
                                         uint64_t seed, int64_t key)
{
    for (int j = 0; j < dim; j++)
        v[j] = kern_init_elem(kind, scale, seed, key, j);
}

/* ---- hashing and eviction (the CPU table and the GPU table) ------------------
 * Where a key lives: its hash's top 32 bits scaled to [0, n), n < 2^32 (n
 * need not be a power of two). The CPU table's n is its slot count, the GPU
 * table's its bucket count; the hash is the same. */
KERN_HD static inline uint64_t kern_key_hash(int64_t key)
{
    return kern_mix64((uint64_t)key ^ 0x6b696c6e5f6b6579ULL);
}

KERN_HD static inline uint64_t kern_hash_index(uint64_t h, uint64_t n)
{
    return ((h >> 32) * n) >> 32;
}

/* The largest use count lfu tells apart, and the largest age lru does. */
#define KERN_FREQ_MAX 0x7fffu
#define KERN_AGE_MAX 65535u

/* Returns a row's eviction priority, lower goes first: lfu its use count,
 * lru its age (steps since its last use) counted down; both saturate. */
KERN_HD static inline uint32_t kern_evict_priority(int evict, uint32_t age, uint32_t freq)
{
    if (evict == KERN_EVICT_LFU)
        return freq < KERN_FREQ_MAX ? freq : KERN_FREQ_MAX;
    return KERN_AGE_MAX - (age < KERN_AGE_MAX ? age : KERN_AGE_MAX);
}

/* ---- combine ------------------------------------------------------------------ */
/* Returns the factor a bag's summed rows (and, backward, its gradient) are
 * multiplied by: 1 for sum, 1/len for mean, 0 for an empty bag. */
KERN_HD static inline float kern_combine_scale(int combine, int64_t len)
{
    if (len <= 0)
        return 0.0f;
    return combine == KERN_COMBINE_MEAN ? 1.0f / (float)len : 1.0f;
}

/* ---- optimizers -----------------------------------------------------------------
 * State per element: sgd none, adagrad one float (sum of squared gradients),
 * adam two (first and second moment, stored as the row's first dim floats
 * then its next dim floats). */
KERN_HD static inline int kern_opt_nstate(int kind)
{
    return kind == KERN_OPT_ADAM ? 2 : kind == KERN_OPT_ADAGRAD ? 1 : 0;
}

/* Whether slab s carries what optimizer kind updates (values, stamps, its
 * state floats and, for adam, the per-row counts); 0 or KILN_EINVAL naming
 * table t, with op ("update", "cuda update") leading the message. Host
 * side. */
static inline int kern_slab_check_opt(const kern_slab_t *s, int kind, int t, const char *op)
{
    const int nstate = kern_opt_nstate(kind);
    if (!s->values || !s->stamps || s->nstate != nstate || (nstate > 0 && !s->opt_state) ||
        (kind == KERN_OPT_ADAM && !s->opt_steps))
        return kiln_errf(KILN_EINVAL,
                         "%s: table %d does not carry the state of this optimizer (it has %d "
                         "state floats per element, the optimizer needs %d)",
                         op, t, s->nstate, nstate);
    return 0;
}

KERN_HD static inline void kern_sgd_elem(float *w, float g, float lr)
{
    *w -= lr * g;
}

KERN_HD static inline void kern_adagrad_elem(float *w, float *acc, float g, float lr,
                                             float eps)
{
    float a = *acc + g * g;
    *acc = a;
    *w -= lr * g / (sqrtf(a) + eps);
}

/* Bias correction 1 - beta^t for a row updated for the t-th time (t >= 1). */
KERN_HD static inline float kern_adam_bias(float beta, uint32_t t)
{
    return 1.0f - powf(beta, (float)t);
}

/* One Adam element step; bc1 and bc2 are kern_adam_bias(beta1|beta2, t). */
KERN_HD static inline void kern_adam_elem(float *w, float *m, float *v, float g, float lr,
                                          float beta1, float beta2, float eps, float bc1,
                                          float bc2)
{
    float mm = beta1 * *m + (1.0f - beta1) * g;
    float vv = beta2 * *v + (1.0f - beta2) * g * g;
    *m = mm;
    *v = vv;
    *w -= lr * (mm / bc1) / (sqrtf(vv / bc2) + eps);
}

/* ---- double-double sums ------------------------------------------------------
 * A float64 pair (hi, lo) whose sum
 * carries about 106 bits, so that a gradient summed in any order (one rank
 * over the whole batch, or N ranks' partial sums added by an allreduce)
 * rounds to the same float32 (docs/models.md, "Rank-count invariance").
 * Float64 alone was not enough: its last-bit differences between orders
 * flipped a float32 rounding now and then, and adagrad amplified the flip
 * (bench dlrm: eval logloss 0.661 on 1 rank vs 0.666 on 2 for one seed).
 *
 * The error of a double-double sum is about 2^-106 of the sum of the terms'
 * magnitudes; float32 rounding of it differs between orders only when the
 * exact sum lies that close to a rounding boundary. The MPI op that adds
 * pairs is shard_comm_allreduce_sum_dd in shard/shard.h. */

/* (*hi, *lo) += x, Knuth's TwoSum: exact, whatever the magnitudes. */
KERN_HD static inline void kern_dd_add(double *hi, double *lo, double x)
{
    const double s = *hi + x;
    const double bp = s - *hi;
    const double err = (*hi - (s - bp)) + (x - bp);
    *hi = s;
    *lo += err;
}

/* (*hi, *lo) += (bhi, blo). */
KERN_HD static inline void kern_dd_add_dd(double *hi, double *lo, double bhi, double blo)
{
    kern_dd_add(hi, lo, bhi);
    *lo += blo;
}

/* The pair rounded once to float32 (lo folded into hi first). */
KERN_HD static inline float kern_dd_float(double hi, double lo) { return (float)(hi + lo); }

#endif /* KILN_KERNELS_KERN_OPS_H */
