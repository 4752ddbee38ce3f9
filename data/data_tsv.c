/*
 * data/data_tsv.c - Criteo-format TSV: one line is a label, ndense
 * integer fields and nslots categorical fields, separated by tabs. This file
 * holds the line parser (a hand-written loop over the bytes, no strtok or
 * sscanf), the key hash, the line cursor that walks several files as one
 * sequence of lines through a big read buffer, and the newline-count pre-pass
 * that tells the reader how many rows there are. Both read a file's bytes
 * through data_src (data_src.c), so gzip and zstd files read like plain ones.
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

static void log1p_fill(void)
{
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

int data_tsv_parse_line(const char *p, size_t len, int ndense, int nslots, float *label,
                      float *dense, int64_t *keys, unsigned char *has_key, char *why,
                      size_t whysz)
{
    const int nf = 1 + ndense + nslots;
    const char *e;
    const char *q = p;
    int f = 0;
    char first_err[DATA_MESSAGE_LEN];
    int have_err = 0;
    char quoted[32];

    log1p_init();
    if (len > 0 && p[len - 1] == '\r')
        len--;
    e = p + len;
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
                has_key[s] = flen != 0;
                if (flen != 0)
                    keys[s] = data_key_hash(s, q, flen);
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
            for (const char *p = buf, *e = buf + want;
                 (p = memchr(p, '\n', (size_t)(e - p))) != NULL; p++)
                count++;
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

int data_tsv_count_rows(const char *path, int64_t *rows, int64_t *bytes)
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
        while (p < e && (p = memchr(p, '\n', (size_t)(e - p))) != NULL) {
            nl++;
            p++;
        }
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
        char *s, *e, *nl;
        if (c->src == NULL) {
            rc = open_next(c);
            if (rc < 0)
                return rc;
            if (rc == 0)
                return kiln_errf(KILN_ECORRUPT, "the data files ended %lld lines early; did "
                                 "they change while being read?", (long long)n);
        }
        s = c->buf + c->beg;
        e = c->buf + c->end;
        while (n > 0 && s < e && (nl = memchr(s, '\n', (size_t)(e - s))) != NULL) {
            s = nl + 1;
            n--;
            c->lineno++;
            c->partial = 0;
        }
        c->beg = (size_t)(s - c->buf);
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
