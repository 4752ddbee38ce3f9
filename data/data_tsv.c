/*
 * data/data_tsv.c - Criteo-format TSV: one line is a label, ndense
 * integer fields and nslots categorical fields, separated by tabs. This file
 * holds the line parser (a vector path for well-formed lines, a loop over
 * the bytes for the rest and for the messages; no strtok or sscanf), the key
 * hash, the newline count and search, the line cursor that walks several
 * files as one sequence of lines through a big read buffer, and the
 * newline-count pre-pass that tells the reader how many rows there are.
 * Both read a file's bytes through data_src (data_src.c), so gzip and zstd
 * files read like plain ones.
 * The rules are in docs/data-formats.md.
 */
#include "data_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
/* xxHash's own code, inlined: the key hash runs 26 times a row, and a call
 * through the shared library costs as much as hashing 8 bytes. Same XXH64,
 * same keys as common/hash.c's kiln_xxh64. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#define READ_CHUNK ((size_t)4 << 20)
#define LOG1P_TABLE 4096

static float log1p_table[LOG1P_TABLE];
static pthread_once_t log1p_once = PTHREAD_ONCE_INIT;

int64_t data_key_hash(int slot, const char *value, size_t len)
{
    return (int64_t)(XXH64(value, len, (XXH64_hash_t)slot) & (uint64_t)DATA_KEY_MASK);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define TSV_AVX512 1
#include <immintrin.h>
static bool cpu_avx512; /* the CPU has what fields_avx512 uses */
#endif

static void log1p_fill(void)
{
#ifdef TSV_AVX512
    cpu_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                 __builtin_cpu_supports("avx512vl");
#endif
    for (int i = 0; i < LOG1P_TABLE; i++)
        log1p_table[i] = (float)log1p((double)i);
}

static void log1p_init(void)
{
    pthread_once(&log1p_once, log1p_fill);
}

static inline float dense_value(int64_t x)
{
    if (x <= 0)
        return 0.0f;
    if (x < LOG1P_TABLE)
        return log1p_table[x];
    return (float)log1p((double)x);
}

float data_dense_int(int64_t x)
{
    log1p_init();
    return dense_value(x);
}

/* Copies at most 24 bytes of a field into a printable quote for messages. */
static void quote_field(char *dst, size_t dstsz, const char *p, size_t len)
{
    size_t n = len < 24 ? len : 24;
    size_t j = 0;
    for (size_t i = 0; i < n && j + 1 < dstsz; i++) {
        unsigned char ch = (unsigned char)p[i];
        dst[j++] = (ch >= 32 && ch < 127) ? (char)ch : '?';
    }
    if (len > n && j + 4 < dstsz) {
        memcpy(dst + j, "...", 3);
        j += 3;
    }
    dst[j] = '\0';
}

/* The first tab at or after q (or e), eight bytes at a time while eight
 * remain: a byte b is a tab when (b ^ '\t') is zero, and the classic test
 * (x - 0x01..) & ~x & 0x80.. flags the first zero byte of a word exactly
 * (bits above it may be false alarms, never bits below). */
static inline const char *field_end(const char *q, const char *e)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    while (e - q >= 8) {
        uint64_t w;
        memcpy(&w, q, 8);
        w ^= ones * (unsigned char)'\t';
        const uint64_t z = (w - ones) & ~w & highs;
        if (z != 0)
            return q + (__builtin_ctzll(z) >> 3); /* little-endian: the lowest byte first */
        q += 8;
    }
#endif
    while (q < e && *q != '\t')
        q++;
    return q;
}

/* The field-by-field parser: any line, and the messages that say what is
 * wrong with a bad one. p[0..len) has no '\r' at its end. */
static int parse_scalar(const char *p, size_t len, int ndense, int nslots, float *label,
                        float *dense, int64_t *keys, unsigned char *has_key, size_t ks,
                        char *why, size_t whysz)
{
    const int nf = 1 + ndense + nslots;
    const char *e = p + len;
    const char *q = p;
    int f = 0;
    char first_err[DATA_MESSAGE_LEN];
    int have_err = 0;
    char quoted[32];

    /* One pass over the line: each field is scanned to its tab by the loop
     * that reads it (a memchr call per field costs more than the ~6 bytes
     * of a typical field). */
    for (;;) {
        const char *t = q;
        if (f >= 1 && f <= ndense) {
            int neg = 0, ok = 1, range = 1;
            uint64_t v = 0;
            if (t < e && (*t == '-' || *t == '+')) {
                neg = *t == '-';
                t++;
                if (t == e || *t == '\t')
                    ok = 0;
            }
            /* Up to 18 digits cannot overflow: no check per digit. */
            const char *d0 = t;
            for (; t < e; t++) {
                unsigned d = (unsigned)((unsigned char)*t - '0');
                if (d > 9)
                    break;
                v = v * 10 + d;
            }
            if (t < e && *t != '\t') {
                ok = 0;
                t = field_end(t, e);
            } else if (t - d0 > 18) {
                v = 0;
                for (const char *c = d0; c < t && range; c++) {
                    uint64_t d = (uint64_t)(*c - '0');
                    if (v > ((uint64_t)INT64_MAX - d) / 10)
                        range = 0;
                    else
                        v = v * 10 + d;
                }
            }
            if ((!ok || !range) && !have_err) {
                quote_field(quoted, sizeof quoted, q, (size_t)(t - q));
                if (ok)
                    snprintf(first_err, sizeof first_err,
                             "integer feature %d (field %d) is out of range: '%s' (at most "
                             "%" PRId64 " in magnitude)",
                             f, f + 1, quoted, INT64_MAX);
                else
                    snprintf(first_err, sizeof first_err,
                             "integer feature %d (field %d) is not an integer: '%s'", f, f + 1,
                             quoted);
                have_err = 1;
            }
            dense[f - 1] = neg || !ok || !range ? 0.0f : dense_value((int64_t)v);
        } else {
            t = field_end(t, e);
            const size_t flen = (size_t)(t - q);
            if (f == 0) {
                if (flen == 1 && (q[0] == '0' || q[0] == '1')) {
                    *label = (float)(q[0] - '0');
                } else if (!have_err) {
                    quote_field(quoted, sizeof quoted, q, flen);
                    snprintf(first_err, sizeof first_err, "label must be 0 or 1, got '%s'",
                             quoted);
                    have_err = 1;
                }
            } else if (f < nf) {
                int s = f - 1 - ndense;
                has_key[(size_t)s * ks] = flen != 0;
                if (flen != 0)
                    keys[(size_t)s * ks] = data_key_hash(s, q, flen);
            }
        }
        f++;
        if (t == e)
            break;
        q = t + 1;
    }
    if (f != nf) {
        snprintf(why, whysz, "wrong number of fields: %d (expected %d: label, %d integer, %d "
                 "categorical, tab-separated)", f, nf, ndense, nslots);
        return -1;
    }
    if (have_err) {
        snprintf(why, whysz, "%s", first_err);
        return -1;
    }
    return 0;
}

/* ---- the vector parser ---------------------------------------------------------
 *
 * A well-formed line takes three passes over a copy of it, none with a
 * branch that depends on the bytes: the tabs of each 64-byte block become a
 * bit mask (a compare per 16 bytes), the masks become the fields' end
 * offsets, and then the fields are read in place: an integer of up to 8
 * digits is one 8-byte load and three multiplies (the digits checked all at
 * once), an 8-byte categorical value is XXH64's 8-byte case. Where the CPU
 * has AVX-512 that last pass takes 8 fields a vector (fields_avx512).
 * Whatever this path does not take (a field count that is wrong, a label
 * other than 0 or 1, an integer longer than 8 digits or not an integer, a
 * line over FAST_MAX_LINE bytes) goes to parse_scalar, which gives the same
 * values and the messages. The byte loop alone made ~40 mispredicted
 * branches a row (the digit loop's exit, empty fields, the tab scan) and
 * read 1.6 M rows/s on one core here; this path 2.1 M, 2.3 M with AVX-512
 * (docs/benchmarks.md). test_data and fuzz_tsv compare the three paths. */

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

enum {
    FAST_MAX_LINE = 4096, /* longer lines (rare: Criteo's are ~250 bytes) take parse_scalar */
    FAST_MAX_FIELDS = 512,
};

static int tsv_paths = 2; /* data_tsv_paths: the tests compare the parsers */

void data_tsv_paths(int level)
{
    tsv_paths = level;
}

/* Bits set in x (no popcnt instruction in the baseline x86-64 this builds
 * for, and the library call costs more than these few operations). */
static inline int popcount64(uint64_t x)
{
    x -= (x >> 1) & 0x5555555555555555ull;
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
    return (int)((x * 0x0101010101010101ull) >> 56);
}

/* Bit i set where src[i] is c, for the 64 bytes at src. With copy set,
 * the bytes are copied there with the same loads (the line copy: a copy
 * made by memcpy and read back at once stalls each load on the stores it
 * spans). */
static inline uint64_t byte_mask(const char *src, char c, char *copy)
{
#if defined(__SSE2__)
    const __m128i cv = _mm_set1_epi8(c);
    uint64_t m = 0;
    for (int k = 0; k < 4; k++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(src + 16 * k));
        if (copy)
            _mm_storeu_si128((__m128i *)(void *)(copy + 16 * k), v);
        m |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, cv)) << (16 * k);
    }
    return m;
#else
    uint64_t m = 0;
    if (copy)
        memcpy(copy, src, 64);
    for (int i = 0; i < 64; i++)
        m |= (uint64_t)(src[i] == c) << i;
    return m;
#endif
}

/* Appends the offsets base + i of the bits i of m to o; returns how many. */
static inline int mask_offsets(uint32_t *o, uint32_t base, uint64_t m)
{
    const int cnt = popcount64(m);
    /* 16 offsets written whatever the count (those past it are junk, and
     * the next block's overwrite them), so the loop's exit does not depend
     * on the bytes for up to 16 tabs a block. */
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
        o[i] = base + (uint32_t)__builtin_ctzll(m | 1ull << 63);
        m &= m - 1;
    }
    for (int i = 16; i < cnt; i++) {
        o[i] = base + (uint32_t)__builtin_ctzll(m);
        m &= m - 1;
    }
    return cnt;
}

/* data_key_hash of the 8 bytes at v: XXH64 as xxHash's own XXH64_finalize
 * takes an 8-byte input, made of its pieces here because the compiler does
 * not inline that function for a length it knows (test_data checks both
 * give the same keys). */
static inline int64_t key_hash8(int slot, const char *v)
{
    uint64_t h = (uint64_t)slot + XXH_PRIME64_5 + 8;
    h ^= XXH64_round(0, XXH_readLE64(v));
    h = XXH_rotl64(h, 27) * XXH_PRIME64_1 + XXH_PRIME64_4;
    return (int64_t)(XXH64_avalanche(h) & (uint64_t)DATA_KEY_MASK);
}

static inline uint64_t load_u64(const char *b)
{
    uint64_t w;
    memcpy(&w, b, 8);
    return w;
}

/* The integer in bytes [s, e) of lb (0 to 8 digits, an optional sign in
 * front): 1 and *v, or 0 when it is not one (parse_scalar says why). lb
 * holds 8 readable bytes before any field. A minus sign gives *v = -1: the
 * value is 0 either way (dense_value). */
static inline int int_field(const char *lb, uint32_t s, uint32_t e, int64_t *v)
{
    const unsigned char c = (unsigned char)lb[s];
    const uint32_t sign = (uint32_t)(e > s) & ((uint32_t)(c == '-') | (uint32_t)(c == '+'));
    const uint32_t n = e - s - sign;
    if ((n > 8) | (sign & (uint32_t)(n == 0)))
        return 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    /* The field's digits are the top n bytes of the word that ends at e,
     * the first digit lowest; the bytes below them count as leading zeros. */
    uint64_t d = load_u64(lb + e - 8) ^ 0x3030303030303030ull;
    d &= -(uint64_t)(n != 0) & (~0ull << ((64 - 8 * n) & 63));
    if (((d | (d + 0x7676767676767676ull)) & 0x8080808080808080ull) != 0)
        return 0; /* a byte that is not a digit */
    d = (d * 10 + (d >> 8)) & 0x00ff00ff00ff00ffull;
    d = (d * 100 + (d >> 16)) & 0x0000ffff0000ffffull;
    d = (d * 10000 + (d >> 32)) & 0xffffffffull;
#else
    uint64_t d = 0;
    for (uint32_t i = e - n; i < e; i++) {
        unsigned x = (unsigned)((unsigned char)lb[i] - '0');
        if (x > 9)
            return 0;
        d = d * 10 + x;
    }
#endif
    *v = (int64_t)d | -(int64_t)(sign & (uint32_t)(c == '-'));
    return 1;
}

#ifdef TSV_AVX512
#define AVX512_FIELDS __attribute__((target("avx512f,avx512dq,avx512vl")))

/* The last bits of parse_fast with AVX-512, 8 fields a vector: the same
 * integers (int_field, dense_value) and keys (key_hash8) from the line copy
 * lb and its tabs' offsets end[]. Returns 1, or 0 where parse_scalar must. */
AVX512_FIELDS static int fields_avx512(const char *lb, const uint32_t *end, int ndense,
                                       int nslots, float *dense, int64_t *keys,
                                       unsigned char *has_key, size_t ks)
{
    const __m512i zero = _mm512_setzero_si512(), ones = _mm512_set1_epi64(-1);
    const __m512i c64 = _mm512_set1_epi64(64), one = _mm512_set1_epi64(1);
    const __m256i one32 = _mm256_set1_epi32(1);
    for (int j = 0; j < ndense; j += 8) {
        const int cnt = ndense - j < 8 ? ndense - j : 8;
        const __mmask8 lm = (__mmask8)((1u << cnt) - 1);
        /* Field 1 + j + i: bytes [s, e); lanes past cnt are empty fields. */
        const __m256i e32 = _mm256_maskz_loadu_epi32(lm, end + 1 + j);
        const __m256i s32 = _mm256_maskz_add_epi32(lm, _mm256_maskz_loadu_epi32(lm, end + j), one32);
        const __m512i L = _mm512_sub_epi64(_mm512_cvtepu32_epi64(e32), _mm512_cvtepu32_epi64(s32));
        const __m512i v = _mm512_mask_i32gather_epi64(zero, lm, e32, lb - 8, 1);
        /* The first byte, a sign or not (counts over 63 shift to 0). */
        const __m512i c = _mm512_and_si512(
            _mm512_srlv_epi64(v, _mm512_sub_epi64(c64, _mm512_slli_epi64(L, 3))),
            _mm512_set1_epi64(0xff));
        const __mmask8 minus = _mm512_cmpeq_epi64_mask(c, _mm512_set1_epi64('-'));
        const __mmask8 sign = minus | _mm512_cmpeq_epi64_mask(c, _mm512_set1_epi64('+'));
        const __m512i n = _mm512_mask_sub_epi64(L, sign, L, one);
        if ((_mm512_cmpgt_epu64_mask(n, _mm512_set1_epi64(8)) |
             (sign & _mm512_cmpeq_epi64_mask(n, zero))) & lm)
            return 0;
        __m512i d = _mm512_xor_si512(v, _mm512_set1_epi64(0x3030303030303030ll));
        d = _mm512_and_si512(d, _mm512_sllv_epi64(ones, _mm512_sub_epi64(c64, _mm512_slli_epi64(n, 3))));
        const __m512i t = _mm512_or_si512(d, _mm512_add_epi64(d, _mm512_set1_epi64(0x7676767676767676ll)));
        if (_mm512_test_epi64_mask(t, _mm512_set1_epi64((long long)0x8080808080808080ull)))
            return 0; /* a byte that is not a digit */
        d = _mm512_and_si512(_mm512_add_epi64(_mm512_mullo_epi64(d, _mm512_set1_epi64(10)),
                                              _mm512_srli_epi64(d, 8)),
                             _mm512_set1_epi64(0x00ff00ff00ff00ffll));
        d = _mm512_and_si512(_mm512_add_epi64(_mm512_mullo_epi64(d, _mm512_set1_epi64(100)),
                                              _mm512_srli_epi64(d, 16)),
                             _mm512_set1_epi64(0x0000ffff0000ffffll));
        d = _mm512_and_si512(_mm512_add_epi64(_mm512_mullo_epi64(d, _mm512_set1_epi64(10000)),
                                              _mm512_srli_epi64(d, 32)),
                             _mm512_set1_epi64(0xffffffffll));
        /* dense_value: 0 for a minus sign, the table below LOG1P_TABLE. */
        const __mmask8 big = _mm512_cmpge_epu64_mask(d, _mm512_set1_epi64(LOG1P_TABLE)) & ~minus & lm;
        const __m512i idx = _mm512_maskz_mov_epi64(lm & ~minus & ~big, d);
        _mm256_mask_storeu_ps(dense + j, lm, _mm512_i64gather_ps(idx, log1p_table, 4));
        if (big) {
            int64_t x[8];
            _mm512_storeu_si512(x, d);
            for (int i = 0; i < cnt; i++)
                if (big >> i & 1)
                    dense[j + i] = dense_value(x[i]);
        }
    }
    for (int j = 0; j < nslots; j += 8) {
        const int cnt = nslots - j < 8 ? nslots - j : 8;
        const __mmask8 lm = (__mmask8)((1u << cnt) - 1);
        const uint32_t *fe = end + 1 + ndense + j; /* slot j + i is field 1 + ndense + j + i */
        const __m256i e32 = _mm256_maskz_loadu_epi32(lm, fe);
        const __m256i s32 = _mm256_maskz_add_epi32(lm, _mm256_maskz_loadu_epi32(lm, fe - 1), one32);
        const __m256i n32 = _mm256_sub_epi32(e32, s32);
        const __m512i v = _mm512_mask_i32gather_epi64(zero, lm, s32, lb, 1);
        /* key_hash8, 8 lanes */
        __m512i k1 = _mm512_mullo_epi64(v, _mm512_set1_epi64((long long)XXH_PRIME64_2));
        k1 = _mm512_mullo_epi64(_mm512_rol_epi64(k1, 31), _mm512_set1_epi64((long long)XXH_PRIME64_1));
        __m512i h = _mm512_add_epi64(_mm512_set_epi64(j + 7, j + 6, j + 5, j + 4, j + 3, j + 2, j + 1, j),
                                     _mm512_set1_epi64((long long)(XXH_PRIME64_5 + 8)));
        h = _mm512_xor_si512(h, k1);
        h = _mm512_add_epi64(_mm512_mullo_epi64(_mm512_rol_epi64(h, 27),
                                                _mm512_set1_epi64((long long)XXH_PRIME64_1)),
                             _mm512_set1_epi64((long long)XXH_PRIME64_4));
        h = _mm512_xor_si512(h, _mm512_srli_epi64(h, 33));
        h = _mm512_mullo_epi64(h, _mm512_set1_epi64((long long)XXH_PRIME64_2));
        h = _mm512_xor_si512(h, _mm512_srli_epi64(h, 29));
        h = _mm512_mullo_epi64(h, _mm512_set1_epi64((long long)XXH_PRIME64_3));
        h = _mm512_xor_si512(h, _mm512_srli_epi64(h, 32));
        h = _mm512_and_si512(h, _mm512_set1_epi64(DATA_KEY_MASK));
        const __mmask8 has = _mm256_cmpneq_epi32_mask(n32, _mm256_setzero_si256()) & lm;
        const __mmask8 other = has & _mm256_cmpneq_epi32_mask(n32, _mm256_set1_epi32(8));
        /* Scattered, not read back from a store: a load from a vector
         * just stored waits for the store to finish. */
        const __m256i at = _mm256_mullo_epi32(
            _mm256_add_epi32(_mm256_set1_epi32(j), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
            _mm256_set1_epi32((int)ks));
        _mm512_mask_i32scatter_epi64(keys, lm, at, h, 8);
        for (int i = 0; i < cnt; i++)
            has_key[(size_t)(j + i) * ks] = has >> i & 1;
        if (other) { /* a value of another length: the general XXH64 */
            uint32_t sv[8], nv[8];
            _mm256_storeu_si256((__m256i *)(void *)sv, s32);
            _mm256_storeu_si256((__m256i *)(void *)nv, n32);
            for (int i = 0; i < cnt; i++)
                if (other >> i & 1)
                    keys[(size_t)(j + i) * ks] = data_key_hash(j + i, lb + sv[i], nv[i]);
        }
    }
    return 1;
}
#endif

/* 1 when the line parsed; 0 when parse_scalar must (see above). */
static int parse_fast(const char *p, size_t len, int ndense, int nslots, float *label,
                      float *dense, int64_t *keys, unsigned char *has_key, size_t ks)
{
    const int nf = 1 + ndense + nslots;
    if (len > FAST_MAX_LINE || nf > FAST_MAX_FIELDS)
        return 0;
    /* A copy of the line with 8 bytes before it (the integers' loads) and
     * 16 zero bytes after it (the last value's 8-byte hash load). */
    _Alignas(64) char buf[8 + FAST_MAX_LINE + 64];
    char *lb = buf + 8;
    memset(buf, 0, 8);
    memset(lb + len, 0, 16);
    /* end[f] = the offset of field f's tab (the line's end for the last);
     * 64 more for a block's offsets written past nf - 1 before the check. */
    uint32_t end[FAST_MAX_FIELDS + 64];
    int nt = 0;
    uint32_t b = 0;
    for (; b + 64 <= len; b += 64) {
        nt += mask_offsets(end + nt, b, byte_mask(p + b, '\t', lb + b));
        if (nt > nf - 1)
            return 0; /* too many fields */
    }
    if (b < len) { /* the last bytes: the 64 that end the line, or a copy of a short line */
        uint64_t m;
        if (len >= 64) {
            m = byte_mask(p + len - 64, '\t', lb + len - 64) >> (64 - (len - b));
        } else {
            char tail[64] = {0};
            memcpy(tail, p, len);
            m = byte_mask(tail, '\t', lb);
        }
        nt += mask_offsets(end + nt, b, m);
    }
    if (nt != nf - 1)
        return 0;
    end[nt] = (uint32_t)len;
    if (end[0] != 1 || (lb[0] != '0' && lb[0] != '1'))
        return 0;
#ifdef TSV_AVX512
    /* (The vector path scatters keys at 32-bit offsets slot x ks.) */
    if (tsv_paths >= 2 && cpu_avx512 && (uint64_t)nslots * ks < INT32_MAX) {
        if (!fields_avx512(lb, end, ndense, nslots, dense, keys, has_key, ks))
            return 0;
        *label = (float)(lb[0] - '0');
        return 1;
    }
#endif
    uint32_t s = end[0] + 1;
    for (int j = 0; j < ndense; j++) {
        int64_t v;
        if (!int_field(lb, s, end[1 + j], &v))
            return 0;
        /* dense_value without its branch on 0 (empty fields are common). */
        dense[j] = (uint64_t)v < LOG1P_TABLE ? log1p_table[v] : dense_value(v);
        s = end[1 + j] + 1;
    }
    for (int j = 0; j < nslots; j++) {
        const uint32_t e = end[1 + ndense + j], n = e - s;
        /* Criteo's values are 8 hex digits or empty: the hash of the 8
         * bytes at s is taken either way, and kept when n is 8. */
        const int64_t h8 = key_hash8(j, lb + s);
        has_key[(size_t)j * ks] = n != 0;
        keys[(size_t)j * ks] = h8;
        if ((n != 0) & (n != 8)) /* any other length: the general XXH64 */
            keys[(size_t)j * ks] = data_key_hash(j, lb + s, n);
        s = e + 1;
    }
    *label = (float)(lb[0] - '0');
    return 1;
}

/* ---- newlines -------------------------------------------------------------------
 * Lines are ~250 bytes: a memchr call a line costs its call and a
 * mispredicted exit, a compare per 16 bytes does not. */

int64_t data_tsv_count_nl(const char *p, size_t n)
{
    int64_t count = 0;
    size_t i = 0;
#if defined(__SSE2__)
    /* Each byte lane counts its newlines (a compare gives -1), up to 255
     * blocks of 64 bytes, then the lanes are summed. */
    const __m128i nl = _mm_set1_epi8('\n'), zero = _mm_setzero_si128();
    while (i + 64 <= n) {
        __m128i acc = zero;
        for (int it = 0; it < 255 && i + 64 <= n; it++, i += 64)
            for (int k = 0; k < 4; k++)
                acc = _mm_sub_epi8(acc, _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(const void *)(p + i + 16 * k)), nl));
        const __m128i sum = _mm_sad_epu8(acc, zero);
        count += _mm_cvtsi128_si64(sum) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(sum, sum));
    }
#endif
    for (; i + 64 <= n; i += 64)
        count += popcount64(byte_mask(p + i, '\n', NULL));
    for (; i < n; i++)
        count += p[i] == '\n';
    return count;
}

int data_tsv_find_nl(const char *p, size_t n, size_t base, size_t *out, int max)
{
    int k = 0;
    size_t i = 0;
    for (; i + 64 <= n && k < max; i += 64)
        for (uint64_t m = byte_mask(p + i, '\n', NULL); m != 0 && k < max; m &= m - 1)
            out[k++] = base + i + (size_t)__builtin_ctzll(m);
    for (; i < n && k < max; i++)
        if (p[i] == '\n')
            out[k++] = base + i;
    return k;
}

int64_t data_tsv_skip_nl(const char *p, size_t n, int64_t k, size_t *after)
{
    int64_t got = 0;
    size_t i = 0;
    *after = 0;
    for (; i + 64 <= n && got < k; i += 64) {
        uint64_t m = byte_mask(p + i, '\n', NULL);
        const int c = popcount64(m);
        if (c == 0)
            continue;
        if (got + c <= k) {
            got += c;
            *after = i + 64 - (size_t)__builtin_clzll(m); /* past the block's last */
            continue;
        }
        for (int64_t drop = k - got - 1; drop > 0; drop--) /* the (k - got)-th newline */
            m &= m - 1;
        *after = i + (size_t)__builtin_ctzll(m) + 1;
        return k;
    }
    for (; i < n && got < k; i++)
        if (p[i] == '\n') {
            got++;
            *after = i + 1;
        }
    return got;
}

int data_tsv_parse_row(const char *p, size_t len, int ndense, int nslots, float *label,
                       float *dense, int64_t *keys, unsigned char *has_key, size_t ks, char *why,
                       size_t whysz)
{
    log1p_init();
    if (len > 0 && p[len - 1] == '\r')
        len--;
    if (tsv_paths >= 1 && parse_fast(p, len, ndense, nslots, label, dense, keys, has_key, ks))
        return 0;
    return parse_scalar(p, len, ndense, nslots, label, dense, keys, has_key, ks, why, whysz);
}

int data_tsv_parse_line(const char *p, size_t len, int ndense, int nslots, float *label,
                      float *dense, int64_t *keys, unsigned char *has_key, char *why,
                      size_t whysz)
{
    return data_tsv_parse_row(p, len, ndense, nslots, label, dense, keys, has_key, 1, why, whysz);
}

void data_stats_malformed(data_reader_stats_t *st, const char *path, int64_t lineno,
                        const char *why)
{
    st->malformed++;
    if (st->nmessages < DATA_MAX_MESSAGES) {
        snprintf(st->messages[st->nmessages], DATA_MESSAGE_LEN, "%s:%lld: %s", path,
                 (long long)lineno, why);
        st->nmessages++;
    }
}

/* ---- formats ------------------------------------------------------------------ */

int data_format_detect(const char *path, data_format_t *out)
{
    char magic[8];
    int64_t n = 0;
    data_src_t *src = NULL;
    /* The decompressed start: a compressed kiln-bin file is detected as
     * kiln-bin, whose reader then says why it cannot be read. */
    int rc = data_src_open(path, &src);
    while (rc == 0 && n < 8) {
        int64_t got = data_src_read(src, magic + n, sizeof magic - (size_t)n);
        if (got < 0)
            rc = (int)got;
        else if (got == 0)
            break;
        else
            n += got;
    }
    data_src_close(src);
    if (rc < 0)
        return rc;
    *out = (n == 8 && memcmp(magic, "KILNBIN1", 8) == 0)  ? DATA_FMT_BIN
           : (n >= 4 && memcmp(magic, "PAR1", 4) == 0) ? DATA_FMT_PARQUET
                                                       : DATA_FMT_TSV;
    return 0;
}

/* ---- the pre-pass ------------------------------------------------------------- */

/* Newlines in bytes [from, size) of the plain file path, counted by the
 * OpenMP team, each thread pread'ing its own 1 MiB pieces (the copy out of
 * the page cache is most of the work, and it runs in parallel too); *last
 * gets the file's last byte. Returns 0 or KILN_EIO naming the file. */
static int count_plain_rest(const char *path, int64_t from, int64_t size, int64_t *nl, char *last)
{
    enum { PIECE = 1 << 20 };
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kiln_errf(KILN_EIO, "cannot open data file %s: %s", path, strerror(errno));
    const int64_t npieces = (size - from + PIECE - 1) / PIECE;
    int64_t count = 0;
    int bad_errno = 0;
    char tail = '\n';
#pragma omp parallel reduction(+ : count)
    {
        char *buf = malloc(PIECE);
#pragma omp for schedule(dynamic, 4)
        for (int64_t k = 0; k < npieces; k++) {
            const int64_t off = from + k * PIECE;
            const size_t want = (size_t)(size - off < PIECE ? size - off : PIECE);
            ssize_t got = buf != NULL ? pread(fd, buf, want, off) : -1;
            if (got != (ssize_t)want) {
#pragma omp atomic write
                bad_errno = buf == NULL ? ENOMEM : got < 0 ? errno : EIO;
                continue;
            }
            count += data_tsv_count_nl(buf, want);
            if (off + (int64_t)want == size)
                tail = buf[want - 1];
        }
        free(buf);
    }
    close(fd);
    if (bad_errno != 0)
        return kiln_errf(KILN_EIO, "cannot read data file %s: %s (did it shrink while being "
                         "counted?)", path, strerror(bad_errno));
    *nl += count;
    *last = tail;
    return 0;
}

/* Files this process has counted, by identity: device, inode, size and
 * the modification and change times (nanoseconds), so that each epoch
 * after the first, which opens the same files again, does not read them
 * twice (the count is ~5% of an lr epoch on TSV). A file that changed in
 * any of these is counted again. */
enum { COUNT_CACHE = 64 };
typedef struct {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtim, ctim;
    int64_t rows;
} counted_t;
static counted_t counted[COUNT_CACHE];
static int ncounted, counted_next;
static pthread_mutex_t counted_mu = PTHREAD_MUTEX_INITIALIZER;

static counted_t identity(const struct stat *st, int64_t rows)
{
    return (counted_t){.dev = st->st_dev, .ino = st->st_ino, .size = st->st_size,
                       .mtim = st->st_mtim, .ctim = st->st_ctim, .rows = rows};
}

static bool same_file(const counted_t *c, const struct stat *st)
{
    return c->dev == st->st_dev && c->ino == st->st_ino && c->size == st->st_size &&
           c->mtim.tv_sec == st->st_mtim.tv_sec && c->mtim.tv_nsec == st->st_mtim.tv_nsec &&
           c->ctim.tv_sec == st->st_ctim.tv_sec && c->ctim.tv_nsec == st->st_ctim.tv_nsec;
}

/* The cached row count of the file st describes: 1 and *rows, or 0. */
static int counted_get(const struct stat *st, int64_t *rows)
{
    int hit = 0;
    pthread_mutex_lock(&counted_mu);
    for (int i = 0; i < ncounted && !hit; i++)
        if (same_file(&counted[i], st)) {
            *rows = counted[i].rows;
            hit = 1;
        }
    pthread_mutex_unlock(&counted_mu);
    return hit;
}

static void counted_put(const struct stat *st, int64_t rows)
{
    pthread_mutex_lock(&counted_mu);
    counted[counted_next] = identity(st, rows);
    counted_next = (counted_next + 1) % COUNT_CACHE;
    ncounted += ncounted < COUNT_CACHE;
    pthread_mutex_unlock(&counted_mu);
}

static int count_rows_of(const char *path, int64_t *rows, int64_t *bytes);

int data_tsv_count_rows(const char *path, int64_t *rows, int64_t *bytes)
{
    struct stat before, after;
    const bool reg = stat(path, &before) == 0 && S_ISREG(before.st_mode);
    if (reg && counted_get(&before, rows)) {
        if (bytes)
            *bytes = 0;
        return 0;
    }
    KILN_CHECK(count_rows_of(path, rows, bytes));
    if (reg) { /* kept only when the file did not change while it was counted */
        const counted_t was = identity(&before, *rows);
        if (stat(path, &after) == 0 && same_file(&was, &after))
            counted_put(&after, *rows);
    }
    return 0;
}

static int count_rows_of(const char *path, int64_t *rows, int64_t *bytes)
{
    int rc = 0;
    int64_t nl = 0, total = 0;
    char last = '\n';
    char *buf = NULL;
    data_src_t *src = NULL;
    KILN_CHECK(data_src_open(path, &src));
    buf = kiln_malloc(READ_CHUNK);
    if (!buf) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (;;) {
        int64_t n = data_src_read(src, buf, READ_CHUNK);
        const char *p, *e;
        if (n < 0) {
            rc = (int)n;
            goto out;
        }
        if (n == 0)
            break;
        if (total == 0 && n >= 8 && memcmp(buf, "KILNBIN1", 8) == 0) {
            rc = kiln_errf(KILN_EINVAL,
                           "data file %s is a kiln-bin file (kiln convert's format), read here "
                           "as Criteo TSV: set data.format: kiln-bin in the job spec",
                           path);
            goto out;
        }
        total += n;
        last = buf[n - 1];
        p = buf;
        e = buf + n;
        nl += data_tsv_count_nl(p, (size_t)(e - p));
        /* A plain file's rest is counted in parallel, from the file itself. */
        struct stat st;
        if (total == n && (size_t)n == READ_CHUNK && data_src_comp(src) == DATA_COMP_NONE &&
            stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > total) {
            KILN_CHECK_GOTO(count_plain_rest(path, total, st.st_size, &nl, &last), rc, out);
            total = st.st_size;
            if (bytes)
                *bytes = total;
            *rows = nl + (last != '\n' ? 1 : 0);
            goto out;
        }
    }
    *rows = nl + (total > 0 && last != '\n' ? 1 : 0);
    if (bytes)
        *bytes = data_src_file_bytes(src);
out:
    free(buf);
    data_src_close(src);
    return rc;
}

/* ---- the cursor --------------------------------------------------------------- */

struct data_tsv_cursor {
    const char *const *paths; /* borrowed: must outlive the cursor */
    int npaths;
    int fi;      /* index of the open file, -1 before the first */
    data_src_t *src; /* the open file's bytes (decompressed); NULL when none is open */
    char *buf;   /* [cap] */
    size_t cap, beg, end;
    int eof;     /* the open file has no more bytes */
    int partial; /* bytes of the current line were dropped (skip / too long) */
    int64_t lineno;
    int64_t bytes;
};

int data_tsv_cursor_create(const char *const *paths, int npaths, data_tsv_cursor_t **out)
{
    data_tsv_cursor_t *c = kiln_calloc(1, sizeof *c);
    if (!c)
        return KILN_ENOMEM;
    c->paths = paths;
    c->npaths = npaths;
    c->fi = -1;
    c->cap = READ_CHUNK + DATA_TSV_MAX_LINE + 1;
    c->buf = kiln_malloc(c->cap);
    if (!c->buf) {
        free(c);
        return KILN_ENOMEM;
    }
    log1p_init();
    *out = c;
    return 0;
}

void data_tsv_cursor_destroy(data_tsv_cursor_t *c)
{
    if (!c)
        return;
    data_src_close(c->src);
    free(c->buf);
    free(c);
}

int64_t data_tsv_cursor_bytes(const data_tsv_cursor_t *c)
{
    return c->bytes;
}

/* Opens the next file. Returns 1, 0 when there is none, or an error. */
static int open_next(data_tsv_cursor_t *c)
{
    data_src_close(c->src);
    c->src = NULL;
    if (c->fi + 1 >= c->npaths)
        return 0;
    c->fi++;
    KILN_CHECK(data_src_open(c->paths[c->fi], &c->src));
    c->beg = c->end = 0;
    c->eof = 0;
    c->partial = 0;
    c->lineno = 0;
    return 1;
}

/* Moves the unread bytes to the front and reads more (decompressed).
 * Returns 0, KILN_EIO or KILN_ECORRUPT (bad compressed data). */
static int fill(data_tsv_cursor_t *c)
{
    if (c->beg > 0) {
        memmove(c->buf, c->buf + c->beg, c->end - c->beg);
        c->end -= c->beg;
        c->beg = 0;
    }
    int64_t before = data_src_file_bytes(c->src);
    int64_t n = data_src_read(c->src, c->buf + c->end, c->cap - c->end);
    if (n < 0)
        return (int)n;
    if (n == 0)
        c->eof = 1;
    c->end += (size_t)n;
    c->bytes += data_src_file_bytes(c->src) - before;
    return 0;
}

int data_tsv_cursor_next(data_tsv_cursor_t *c, const char **line, size_t *len, int *too_long,
                       int *file, int64_t *lineno)
{
    int rc;
    for (;;) {
        char *s, *nl;
        size_t avail;
        if (c->src == NULL) {
            rc = open_next(c);
            if (rc <= 0)
                return rc;
        }
        s = c->buf + c->beg;
        avail = c->end - c->beg;
        nl = avail ? memchr(s, '\n', avail) : NULL;
        if (nl || (c->eof && (avail || c->partial))) {
            size_t l = nl ? (size_t)(nl - s) : avail;
            c->beg += l + (nl ? 1 : 0);
            c->lineno++;
            *file = c->fi;
            *lineno = c->lineno;
            *too_long = c->partial || l > DATA_TSV_MAX_LINE;
            *line = *too_long ? NULL : s;
            *len = *too_long ? 0 : l;
            c->partial = 0;
            return 1;
        }
        if (c->eof) {
            data_src_close(c->src);
            c->src = NULL;
            continue;
        }
        if (avail > DATA_TSV_MAX_LINE) {
            /* Too long already: drop what we have, keep looking for its end. */
            c->beg = c->end;
            c->partial = 1;
        }
        rc = fill(c);
        if (rc < 0)
            return rc;
    }
}

int data_tsv_cursor_peek(data_tsv_cursor_t *c, const char **p, size_t *avail, int *file,
                         int64_t *lineno)
{
    for (;;) {
        if (c->src == NULL) {
            int rc = open_next(c);
            if (rc <= 0)
                return rc;
        }
        if (c->beg == c->end && !c->partial) {
            if (c->eof) {
                data_src_close(c->src);
                c->src = NULL;
                continue;
            }
            KILN_CHECK(fill(c));
            continue;
        }
        *p = c->buf + c->beg;
        *avail = c->partial ? 0 : c->end - c->beg;
        *file = c->fi;
        *lineno = c->lineno + 1;
        return 1;
    }
}

void data_tsv_cursor_consume(data_tsv_cursor_t *c, size_t bytes, int64_t lines)
{
    c->beg += bytes;
    c->lineno += lines;
}

int data_tsv_cursor_skip(data_tsv_cursor_t *c, int64_t n)
{
    int rc;
    while (n > 0) {
        if (c->src == NULL) {
            rc = open_next(c);
            if (rc < 0)
                return rc;
            if (rc == 0)
                return kiln_errf(KILN_ECORRUPT, "the data files ended %lld lines early; did "
                                 "they change while being read?", (long long)n);
        }
        size_t after;
        const int64_t got = data_tsv_skip_nl(c->buf + c->beg, c->end - c->beg, n, &after);
        if (got > 0) {
            c->beg += after;
            n -= got;
            c->lineno += got;
            c->partial = 0;
        }
        if (n == 0)
            break;
        if (c->eof) {
            if (c->beg < c->end || c->partial) {
                c->beg = c->end;
                c->partial = 0;
                c->lineno++;
                n--;
            }
            data_src_close(c->src);
            c->src = NULL;
            continue;
        }
        if (c->beg < c->end) {
            c->partial = 1;
            c->beg = c->end;
        }
        rc = fill(c);
        if (rc < 0)
            return rc;
    }
    return 0;
}
