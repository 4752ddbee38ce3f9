/*
 * tests/test_data.c - the trainer's input side (data/data.h): Criteo
 * TSV parsing and key hashing, malformed lines, block-cyclic partitioning
 * over 1, 2 and 3 ranks, TSV -> kiln-bin round trips (multi-hot too),
 * corruption detection, the prefetch thread, the data generator, gzip and
 * zstd files (made by the real gzip and zstd), and files that are not
 * regular files (/dev/zero, a FIFO, a directory).
 * Files live in a mkdtemp directory under /tmp and are small.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln.h"
#include "data_int.h"
#include "proc.h"

static char tmpdir[64];

static char *tpath(const char *name)
{
    char *p = kiln_asprintf("%s/%s", tmpdir, name);
    assert_non_null(p);
    return p;
}

static void write_file(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    fclose(f);
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

/* A TSV line with 13 integer and 26 categorical fields; row i gets values
 * that tell rows apart, and empty fields here and there. Returns where the
 * line starts in *buf (for a test to spoil it; valid till the next append). */
static char *append_line(char **buf, size_t *len, size_t *cap, int i)
{
    char line[1024];
    int n = snprintf(line, sizeof line, "%d", i % 3 == 0);
    for (int j = 0; j < 13; j++) {
        if ((i + j) % 7 == 0)
            n += snprintf(line + n, sizeof line - (size_t)n, "\t");
        else
            n += snprintf(line + n, sizeof line - (size_t)n, "\t%d", (i * 13 + j) % 50 - 3);
    }
    for (int s = 0; s < 26; s++) {
        if ((i + s) % 11 == 0)
            n += snprintf(line + n, sizeof line - (size_t)n, "\t");
        else
            n += snprintf(line + n, sizeof line - (size_t)n, "\t%08x", (unsigned)(i * 31 + s));
    }
    n += snprintf(line + n, sizeof line - (size_t)n, "\n");
    if (*len + (size_t)n + 1 > *cap) {
        *cap = (*cap + (size_t)n + 1) * 2;
        *buf = realloc(*buf, *cap);
        assert_non_null(*buf);
    }
    char *at = *buf + *len;
    memcpy(at, line, (size_t)n + 1);
    *len += (size_t)n;
    return at;
}

/* Spoils row i of a file being written: may change its line (at `line`,
 * in *buf) or append more after it. */
typedef void spoil_fn(char **buf, size_t *len, size_t *cap, char *line, int i);

/* Writes rows [from, to) of the synthetic sequence to path, each handed to
 * spoil (when not NULL) once appended; without the last newline when
 * drop_last_newline. */
static void write_rows(const char *path, int from, int to, int drop_last_newline, spoil_fn *spoil)
{
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (int i = from; i < to; i++) {
        char *line = append_line(&buf, &len, &cap, i);
        if (spoil != NULL)
            spoil(&buf, &len, &cap, line, i);
    }
    if (drop_last_newline && len > 0)
        len--;
    write_file(path, buf ? buf : "", len);
    free(buf);
}

/* ---- one row of a batch, for comparisons ------------------------------------------- */

typedef struct {
    float label;
    float dense[16];
    int nkeys[32];
    int64_t keys[32][4];
} row_t;

static void batch_row(const data_batch_t *b, int i, row_t *r)
{
    memset(r, 0, sizeof *r);
    assert_true(b->ndense <= 16 && b->nslots <= 32);
    r->label = b->labels[i];
    memcpy(r->dense, b->dense + (size_t)i * (size_t)b->ndense, (size_t)b->ndense * sizeof(float));
    for (int s = 0; s < b->nslots; s++) {
        const int64_t *o = b->offsets + (size_t)s * (size_t)(b->n + 1);
        int64_t c = o[i + 1] - o[i];
        assert_true(c >= 0 && c <= 4);
        r->nkeys[s] = (int)c;
        for (int64_t k = 0; k < c; k++)
            r->keys[s][k] = b->keys[o[i] + k];
    }
}

/* Checks the CSR invariants of a batch. */
static void check_batch(const data_batch_t *b)
{
    int64_t prev = 0;
    for (int s = 0; s < b->nslots; s++) {
        const int64_t *o = b->offsets + (size_t)s * (size_t)(b->n + 1);
        assert_int_equal(o[0], prev);
        for (int i = 0; i < b->n; i++)
            assert_true(o[i + 1] >= o[i]);
        prev = o[b->n];
    }
    assert_int_equal(prev, b->nkeys);
    for (int64_t k = 0; k < b->nkeys; k++)
        assert_true(b->keys[k] >= 0);
}

typedef struct {
    int nsteps;
    int *step_rows; /* [nsteps] */
    int nrows;
    row_t *rows;    /* [nrows] in the order read */
    data_reader_stats_t stats;
} run_t;

static void run_reader(const char *const *paths, int npaths, data_format_t fmt, int rank,
                       int nranks, int batch, int prefetch, run_t *out)
{
    data_reader_t *r = NULL;
    data_batch_t *b;
    int rc, cap = 64;
    memset(out, 0, sizeof *out);
    rc = data_reader_open(paths, npaths, fmt, rank, nranks, batch, DATA_DIMS_AUTO, DATA_DIMS_AUTO,
                        prefetch, &r);
    if (rc < 0)
        fail_msg("data_reader_open: %s", kiln_errmsg());
    out->rows = calloc((size_t)cap, sizeof(row_t));
    out->step_rows = calloc((size_t)data_reader_nsteps(r) + 1, sizeof(int));
    assert_non_null(out->rows);
    while ((rc = data_reader_next(r, &b)) == 1) {
        assert_int_equal(b->step, out->nsteps);
        assert_true(b->n <= batch);
        check_batch(b);
        out->step_rows[out->nsteps++] = b->n;
        for (int i = 0; i < b->n; i++) {
            if (out->nrows == cap) {
                cap *= 2;
                out->rows = realloc(out->rows, (size_t)cap * sizeof(row_t));
                assert_non_null(out->rows);
            }
            batch_row(b, i, &out->rows[out->nrows++]);
        }
    }
    if (rc < 0)
        fail_msg("data_reader_next: %s", kiln_errmsg());
    assert_int_equal(out->nsteps, data_reader_nsteps(r));
    data_reader_stats(r, &out->stats);
    data_reader_close(r);
}

static void run_free(run_t *r)
{
    KILN_FREE_ALL(r->rows, r->step_rows);
}

static void assert_rows_equal(const row_t *a, const row_t *b)
{
    assert_memory_equal(a, b, sizeof *a);
}

/* Two runs read the same rows in the same steps; both are freed. */
static void assert_same_run(run_t *x, run_t *y)
{
    assert_int_equal(x->nsteps, y->nsteps);
    assert_int_equal(x->nrows, y->nrows);
    assert_memory_equal(x->step_rows, y->step_rows, (size_t)x->nsteps * sizeof(int));
    for (int i = 0; i < x->nrows; i++)
        assert_rows_equal(&x->rows[i], &y->rows[i]);
    run_free(x);
    run_free(y);
}

/* ---- parsing ----------------------------------------------------------------------- */

static void test_parse_good_line(void **state)
{
    (void)state;
    /* label 1; dense: 0, empty, 5, -3 (clamped), 1000000, then 8 x 7;
     * cats: "68fd1e64" in slot 0, empty slot 1, "abc" in slot 2, rest "x". */
    char line[1024];
    int n = snprintf(line, sizeof line, "1\t0\t\t5\t-3\t1000000");
    for (int j = 5; j < 13; j++)
        n += snprintf(line + n, sizeof line - (size_t)n, "\t7");
    n += snprintf(line + n, sizeof line - (size_t)n, "\t68fd1e64\t\tabc");
    for (int s = 3; s < 26; s++)
        n += snprintf(line + n, sizeof line - (size_t)n, "\tx");
    n += snprintf(line + n, sizeof line - (size_t)n, "\r"); /* CRLF files work too */

    float label = -1, dense[13];
    int64_t keys[26];
    unsigned char has[26];
    char why[DATA_MESSAGE_LEN] = "";
    int rc = data_tsv_parse_line(line, (size_t)n, 13, 26, &label, dense, keys, has, why,
                               sizeof why);
    assert_int_equal(rc, 0);
    assert_true(label == 1.0f);
    assert_true(dense[0] == 0.0f);
    assert_true(dense[1] == 0.0f);
    assert_true(fabsf(dense[2] - (float)log1p(5.0)) < 1e-6f);
    assert_true(dense[3] == 0.0f);
    assert_true(fabsf(dense[4] - (float)log1p(1e6)) < 1e-5f);
    assert_true(fabsf(dense[12] - (float)log1p(7.0)) < 1e-6f);
    assert_int_equal(has[0], 1);
    assert_int_equal(has[1], 0);
    assert_int_equal(has[2], 1);
    assert_int_equal(keys[0], data_key_hash(0, "68fd1e64", 8));
    assert_int_equal(keys[2], data_key_hash(2, "abc", 3));
    assert_int_equal(keys[25], data_key_hash(25, "x", 1));
}

static void test_key_hash(void **state)
{
    (void)state;
    int64_t a0 = data_key_hash(0, "68fd1e64", 8);
    int64_t a1 = data_key_hash(1, "68fd1e64", 8);
    assert_true(a0 != a1);
    assert_int_equal(a0, data_key_hash(0, "68fd1e64", 8));
    assert_true(a0 >= 0 && a1 >= 0);
    assert_int_equal(a0, (int64_t)(kiln_xxh64("68fd1e64", 8, 0) & (uint64_t)DATA_KEY_MASK));
    assert_int_equal(a1, (int64_t)(kiln_xxh64("68fd1e64", 8, 1) & (uint64_t)DATA_KEY_MASK));
    assert_true(data_key_hash(3, "a", 1) != data_key_hash(3, "b", 1));
}

static void test_parse_bad_lines(void **state)
{
    (void)state;
    float label, dense[13];
    int64_t keys[26];
    unsigned char has[26];
    char why[DATA_MESSAGE_LEN];
    char line[1024];
    int n;

    /* too few fields */
    assert_int_equal(data_tsv_parse_line("1\t2\t3", 5, 13, 26, &label, dense, keys, has, why,
                                       sizeof why), -1);
    assert_non_null(strstr(why, "wrong number of fields: 3 (expected 40"));
    /* empty line */
    assert_int_equal(data_tsv_parse_line("", 0, 13, 26, &label, dense, keys, has, why, sizeof why),
                     -1);
    assert_non_null(strstr(why, "wrong number of fields: 1"));
    /* a full line with a bad label, then with a bad integer */
    n = snprintf(line, sizeof line, "2");
    for (int j = 0; j < 13; j++)
        n += snprintf(line + n, sizeof line - (size_t)n, "\t1");
    for (int s = 0; s < 26; s++)
        n += snprintf(line + n, sizeof line - (size_t)n, "\tab");
    assert_int_equal(data_tsv_parse_line(line, (size_t)n, 13, 26, &label, dense, keys, has, why,
                                       sizeof why), -1);
    assert_non_null(strstr(why, "label must be 0 or 1, got '2'"));
    line[0] = '0';
    line[4] = 'z'; /* "0\t1\tz..." : the second integer field */
    assert_int_equal(data_tsv_parse_line(line, (size_t)n, 13, 26, &label, dense, keys, has, why,
                                       sizeof why), -1);
    assert_non_null(strstr(why, "integer feature 2 (field 3) is not an integer: 'z'"));
    line[4] = '1';
    /* 2^63 - 1 is an integer (19 digits); one more is out of range, and
     * says so rather than "not an integer" (issue 27). */
    char big[1024];
    int m = snprintf(big, sizeof big, "1\t9223372036854775807%s", line + 3);
    assert_int_equal(data_tsv_parse_line(big, (size_t)m, 13, 26, &label, dense, keys, has, why,
                                       sizeof why), 0);
    assert_true(dense[0] > 43.0f && dense[0] < 44.0f); /* log1p(2^63 - 1) = 43.67 */
    m = snprintf(big, sizeof big, "1\t9223372036854775808%s", line + 3);
    assert_int_equal(data_tsv_parse_line(big, (size_t)m, 13, 26, &label, dense, keys, has, why,
                                       sizeof why), -1);
    assert_non_null(strstr(why, "integer feature 1 (field 2) is out of range: "
                                "'9223372036854775808' (at most 9223372036854775807"));
    assert_int_equal(data_tsv_parse_line(line, (size_t)n, 13, 26, &label, dense, keys, has, why,
                                       sizeof why), 0);
    /* one field too many */
    line[n] = '\t';
    line[n + 1] = 'q';
    assert_int_equal(data_tsv_parse_line(line, (size_t)n + 2, 13, 26, &label, dense, keys, has, why,
                                       sizeof why), -1);
    assert_non_null(strstr(why, "wrong number of fields: 41"));
}

/* The parser's three paths (data_tsv_paths: the byte loop, the portable
 * vector path, AVX-512 where this CPU has it) give the same row or the same
 * message for lines built to hit each path's edges: empty, signed, 8- and
 * 9-digit, over-long and non-digit integers, values of 0, 7, 8 and 9 bytes,
 * a wrong field count, a bad label, CR, lines near 64-byte block ends and
 * over the vector path's 4096 bytes. */
static uint64_t pr_state = 12345;

static unsigned pr(unsigned n)
{
    pr_state = pr_state * 6364136223846793005ull + 1442695040888963407ull;
    return (unsigned)(pr_state >> 33) % n;
}

static int random_line(char *line, size_t cap, int nd, int ns)
{
    static const char *const ints[] = {"", "0", "7", "-1", "+3", "-", "+", "12345678", "99999999",
                                       "123456789", "4095", "4096", "1x", "00000001", "-0",
                                       "9223372036854775807", "9223372036854775808", " 5", "3:", "/2"};
    static const char *const vals[] = {"", "68fd1e64", "a", "abcdefg", "abcdefgh1", "0000000",
                                       "\t", "x\ry"};
    size_t n = 0;
    const int nf = 1 + nd + ns + (pr(20) == 0 ? (int)pr(3) - 1 : 0);
    for (int f = 0; f < nf; f++) {
        const char *v;
        char hex[16];
        if (f == 0)
            v = pr(30) == 0 ? "2" : pr(2) ? "1" : "0";
        else if (f <= nd)
            v = pr(3) ? ints[pr(12)] : ints[pr(sizeof ints / sizeof ints[0])];
        else if (pr(4)) {
            snprintf(hex, sizeof hex, "%08x", pr(1u << 30));
            v = hex;
        } else
            v = vals[pr(sizeof vals / sizeof vals[0])];
        n += (size_t)snprintf(line + n, cap - n, "%s%s", f ? "\t" : "", v);
    }
    if (pr(8) == 0) /* pad a value so the line ends near a 64-byte block's end */
        while (n % 64 != 63 && n + 1 < cap)
            line[n++] = 'p';
    if (pr(10) == 0)
        line[n++] = '\r';
    if (pr(200) == 0) { /* over the vector path's length: a long last value */
        while (n < 4200 && n + 1 < cap)
            line[n++] = 'q';
    }
    return (int)n;
}

static void test_parse_paths_agree(void **state)
{
    (void)state;
    static char line[8192];
    const int shapes[][2] = {{13, 26}, {2, 3}, {0, 1}, {9, 17}};
    int parsed = 0;
    for (int it = 0; it < 6000; it++) {
        const int nd = shapes[it % 4][0], ns = shapes[it % 4][1];
        const int n = random_line(line, sizeof line, nd, ns);
        float label[3], dense[3][16];
        int64_t keys[3][32];
        unsigned char has[3][32];
        char why[3][DATA_MESSAGE_LEN];
        int rc[3];
        for (int lv = 0; lv < 3; lv++) {
            data_tsv_paths(lv);
            memset(why[lv], 0, sizeof why[lv]);
            rc[lv] = data_tsv_parse_line(line, (size_t)n, nd, ns, &label[lv], dense[lv], keys[lv],
                                         has[lv], why[lv], sizeof why[lv]);
        }
        data_tsv_paths(2);
        for (int lv = 1; lv < 3; lv++) {
            if (rc[lv] != rc[0] || strcmp(why[lv], why[0]) != 0)
                fail_msg("line %d, path %d: rc %d '%s', byte loop rc %d '%s'", it, lv, rc[lv],
                         why[lv], rc[0], why[0]);
            if (rc[0] != 0)
                continue;
            assert_true(label[lv] == label[0]);
            assert_memory_equal(dense[lv], dense[0], sizeof(float) * (size_t)nd);
            for (int s = 0; s < ns; s++) {
                assert_int_equal(has[lv][s], has[0][s]);
                if (has[0][s])
                    assert_int_equal(keys[lv][s], keys[0][s]);
            }
        }
        parsed += rc[0] == 0;
    }
    assert_true(parsed > 1000); /* the good lines are a good share */
}

/* The newline scans (count, find, skip: 64 bytes a step, then the tail)
 * against a byte loop, on buffers of every length up to 300 with newlines
 * sparse, dense and at block edges. */
static void test_newline_scans(void **state)
{
    (void)state;
    static char buf[320];
    size_t at[320];
    for (int it = 0; it < 3000; it++) {
        const size_t n = (size_t)pr(301);
        const unsigned every = 1 + pr(it % 3 == 0 ? 3 : 80);
        for (size_t i = 0; i < n; i++)
            buf[i] = pr(every) == 0 || (it % 7 == 0 && i % 64 == 63) ? '\n' : 'a';
        int64_t want = 0;
        for (size_t i = 0; i < n; i++)
            want += buf[i] == '\n';
        assert_int_equal(data_tsv_count_nl(buf, n), want);
        const int max = (int)pr(40);
        const int got = data_tsv_find_nl(buf, n, 1000, at, max);
        int k = 0;
        for (size_t i = 0; i < n && k < max; i++)
            if (buf[i] == '\n') {
                assert_true(k < got);
                assert_int_equal(at[k], 1000 + i);
                k++;
            }
        assert_int_equal(got, k);
        const int64_t skip = (int64_t)pr(40);
        size_t after = 7, ref_after = 0;
        int64_t ref = 0;
        for (size_t i = 0; i < n && ref < skip; i++)
            if (buf[i] == '\n') {
                ref++;
                ref_after = i + 1;
            }
        assert_int_equal(data_tsv_skip_nl(buf, n, skip, &after), ref);
        assert_int_equal(after, ref_after);
    }
}

/* A file counted again unchanged is not read again (0 bytes); a line
 * appended, or the file replaced, makes it counted anew. */
static void test_count_rows_cached(void **state)
{
    (void)state;
    char *path = tpath("counted.tsv");
    write_file(path, "a\nb\nc\n", 6);
    int64_t rows = -1, bytes = -1;
    assert_int_equal(data_tsv_count_rows(path, &rows, &bytes), 0);
    assert_int_equal(rows, 3);
    assert_int_equal(bytes, 6);
    assert_int_equal(data_tsv_count_rows(path, &rows, &bytes), 0);
    assert_int_equal(rows, 3);
    assert_int_equal(bytes, 0); /* from the cache */
    FILE *f = fopen(path, "ab");
    assert_non_null(f);
    fputs("d\n", f);
    fclose(f);
    assert_int_equal(data_tsv_count_rows(path, &rows, &bytes), 0);
    assert_int_equal(rows, 4);
    assert_int_equal(bytes, 8);
    char *other = tpath("counted2.tsv");
    write_file(other, "x\ny\nz\nw\n", 8); /* same size, another inode */
    assert_int_equal(rename(other, path), 0);
    assert_int_equal(data_tsv_count_rows(path, &rows, &bytes), 0);
    assert_int_equal(rows, 4);
    assert_int_equal(bytes, 8);
    unlink(path);
    free(other);
    free(path);
}

/* A file with good and malformed lines read through the reader. */
static void test_malformed_lines_in_reader(void **state)
{
    (void)state;
    char *path = tpath("bad.tsv");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    append_line(&buf, &len, &cap, 1);                /* line 1: good */
    const char *extra = "1\t2\t3\n";                 /* line 2: wrong field count */
    cap = len + 200000;
    buf = realloc(buf, cap);
    assert_non_null(buf);
    memcpy(buf + len, extra, strlen(extra));
    len += strlen(extra);
    size_t l3 = len;
    append_line(&buf, &len, &cap, 2);                /* line 3: bad label */
    buf[l3] = '7';
    size_t l4 = len;
    append_line(&buf, &len, &cap, 4);                /* line 4: bad integer */
    buf[l4 + 2] = 'x';
    cap = len + 200000;
    buf = realloc(buf, cap);
    assert_non_null(buf);
    memset(buf + len, 'a', 100000);                  /* line 5: very long */
    len += 100000;
    buf[len++] = '\n';
    append_line(&buf, &len, &cap, 5);                /* line 6: good */
    buf[len++] = '\n';                               /* line 7: empty */
    append_line(&buf, &len, &cap, 6);                /* line 8: good */
    append_line(&buf, &len, &cap, 7);                /* line 9: a field too many */
    buf[len - 2] = '\t';
    write_file(path, buf, len);

    run_t run;
    const char *paths[] = {path};
    run_reader(paths, 1, DATA_FMT_TSV, 0, 1, 4, 2, &run);
    assert_int_equal(run.nsteps, 3); /* 9 rows, batches of 4 */
    assert_int_equal(run.step_rows[0], 1);
    assert_int_equal(run.step_rows[1], 2);
    assert_int_equal(run.step_rows[2], 0);
    assert_int_equal(run.stats.rows, 3);
    assert_int_equal(run.stats.malformed, 6);
    assert_int_equal(run.stats.nmessages, DATA_MAX_MESSAGES);
    char want[512];
    snprintf(want, sizeof want, "%s:2: wrong number of fields: 3", path);
    assert_non_null(strstr(run.stats.messages[0], want));
    snprintf(want, sizeof want, "%s:3: label must be 0 or 1, got '7'", path);
    assert_non_null(strstr(run.stats.messages[1], want));
    snprintf(want, sizeof want, "%s:4: integer feature 1", path);
    assert_non_null(strstr(run.stats.messages[2], want));
    snprintf(want, sizeof want, "%s:5: line longer than", path);
    assert_non_null(strstr(run.stats.messages[3], want));
    snprintf(want, sizeof want, "%s:7: wrong number of fields: 1", path);
    assert_non_null(strstr(run.stats.messages[4], want));
    run_free(&run);

    /* Two ranks skip over each other's malformed lines (the long one too)
     * and still agree on positions and step counts. */
    run_t r0, r1;
    run_reader(paths, 1, DATA_FMT_TSV, 0, 2, 2, 1, &r0);
    run_reader(paths, 1, DATA_FMT_TSV, 1, 2, 2, 1, &r1);
    assert_int_equal(r0.nsteps, 3);
    assert_int_equal(r1.nsteps, 3);
    assert_int_equal(r0.stats.malformed + r1.stats.malformed, 6);
    assert_int_equal(r0.stats.rows + r1.stats.rows, 3);
    assert_int_equal(r0.stats.rows, 2); /* lines 1 and 6 */
    run_free(&r0);
    run_free(&r1);

    /* An empty file has no rows and no steps. */
    char *empty = tpath("empty.tsv");
    write_file(empty, "", 0);
    const char *epaths[] = {empty};
    run_reader(epaths, 1, DATA_FMT_TSV, 0, 2, 4, 2, &run);
    assert_int_equal(run.nsteps, 0);
    run_free(&run);
    KILN_FREE_ALL(empty, buf, path);
}

static void test_missing_file(void **state)
{
    (void)state;
    data_reader_t *r = NULL;
    char *path = tpath("no-such-file.tsv");
    const char *paths[] = {path};
    int rc = data_reader_open(paths, 1, DATA_FMT_TSV, 0, 1, 8, 13, 26, 2, &r);
    assert_int_equal(rc, KILN_ENOENT);
    assert_null(r);
    assert_non_null(strstr(kiln_errmsg(), path));
    rc = data_reader_open(paths, 1, DATA_FMT_BIN, 0, 1, 8, 13, 26, 2, &r);
    assert_int_equal(rc, KILN_ENOENT);
    free(path);
}

/* ---- partitioning -------------------------------------------------------------------- */

/* 103 rows over two files, the first without a final newline. */
static void make_partition_files(char **a, char **b)
{
    *a = tpath("part-a.tsv");
    *b = tpath("part-b.tsv");
    write_rows(*a, 0, 47, 1, NULL);
    write_rows(*b, 47, 103, 0, NULL);
}

/* make_partition_files (their paths into a and b), converted to kiln-bin
 * at tpath(name) in chunks of chunk_rows rows; the stats into st (may be
 * NULL). Returns the kiln-bin path (free it). */
static char *convert_partition_files(const char *name, int chunk_rows, char **a, char **b,
                                     data_reader_stats_t *st)
{
    char *bin = tpath(name);
    make_partition_files(a, b);
    const char *tsv[] = {*a, *b};
    data_convert_opts_t o = {.chunk_rows = chunk_rows};
    if (data_convert_tsv_to_bin(tsv, 2, bin, &o, st) != 0)
        fail_msg("convert: %s", kiln_errmsg());
    return bin;
}

/* Rank runs of size nranks, batch B must interleave into the 1-rank run of
 * batch B*nranks, step by step. */
static void check_partition(const char *const *paths, int npaths, data_format_t fmt, int nranks,
                            int B, int total)
{
    run_t whole;
    run_t parts[4];
    int per_step = B * nranks;
    int nsteps = (total + per_step - 1) / per_step;
    run_reader(paths, npaths, fmt, 0, 1, per_step, 3, &whole);
    assert_int_equal(whole.nsteps, nsteps);
    assert_int_equal(whole.nrows, total);
    for (int r = 0; r < nranks; r++) {
        run_reader(paths, npaths, fmt, r, nranks, B, 1 + r, &parts[r]);
        assert_int_equal(parts[r].nsteps, nsteps); /* equal batch counts on every rank */
    }
    int wi = 0;
    int pi[4] = {0};
    for (int k = 0; k < nsteps; k++) {
        int sum = 0;
        for (int r = 0; r < nranks; r++) {
            int expect = total - (k * per_step + r * B);
            expect = expect < 0 ? 0 : expect > B ? B : expect;
            assert_int_equal(parts[r].step_rows[k], expect);
            for (int i = 0; i < parts[r].step_rows[k]; i++)
                assert_rows_equal(&parts[r].rows[pi[r]++], &whole.rows[wi++]);
            sum += parts[r].step_rows[k];
        }
        assert_int_equal(sum, whole.step_rows[k]);
    }
    assert_int_equal(wi, total);
    run_free(&whole);
    for (int r = 0; r < nranks; r++)
        run_free(&parts[r]);
}

static void test_block_cyclic_tsv(void **state)
{
    (void)state;
    char *a, *b;
    make_partition_files(&a, &b);
    const char *paths[] = {a, b};
    /* 2 ranks x 5: 10 full steps and a last step of 3 rows, rank 1 empty. */
    check_partition(paths, 2, DATA_FMT_TSV, 2, 5, 103);
    /* 3 ranks x 4: last step 96..102 -> 4, 3, 0 rows. */
    check_partition(paths, 2, DATA_FMT_TSV, 3, 4, 103);
    /* batches larger than the data */
    check_partition(paths, 2, DATA_FMT_TSV, 2, 80, 103);

    /* The 1-rank run is the file order: row 0 has label 1 and no key in slot 0. */
    run_t one;
    run_reader(paths, 2, DATA_FMT_TSV, 0, 1, 7, 2, &one);
    assert_int_equal(one.nrows, 103);
    assert_true(one.rows[0].label == 1.0f && one.rows[1].label == 0.0f);
    assert_int_equal(one.rows[0].nkeys[0], 0);
    assert_int_equal(one.rows[1].nkeys[0], 1);
    assert_int_equal(one.rows[1].keys[0][0], data_key_hash(0, "0000001f", 8));
    assert_int_equal(one.rows[102].keys[25][0], data_key_hash(25, "00000c73", 8));
    run_free(&one);
    KILN_FREE_ALL(a, b);
}

/* Rows 4 and 17 get a bad label. */
static void spoil_4_17(char **buf, size_t *len, size_t *cap, char *line, int i)
{
    if (i == 4 || i == 17)
        line[0] = 'y';
}

/* Malformed lines keep their row positions: every rank agrees. */
static void test_block_cyclic_with_malformed(void **state)
{
    (void)state;
    char *path = tpath("part-bad.tsv");
    write_rows(path, 0, 30, 0, spoil_4_17);
    const char *paths[] = {path};
    run_t r0, r1;
    run_reader(paths, 1, DATA_FMT_TSV, 0, 2, 4, 2, &r0);
    run_reader(paths, 1, DATA_FMT_TSV, 1, 2, 4, 2, &r1);
    assert_int_equal(r0.nsteps, 4);
    assert_int_equal(r1.nsteps, 4);
    /* row 4 is rank 1's first row of step 0; row 17 is rank 0's second of step 2 */
    assert_int_equal(r1.step_rows[0], 3);
    assert_int_equal(r0.step_rows[2], 3);
    assert_int_equal(r0.stats.malformed, 1);
    assert_int_equal(r1.stats.malformed, 1);
    assert_int_equal(r0.step_rows[3], 4);
    assert_int_equal(r1.step_rows[3], 2);
    run_free(&r0);
    run_free(&r1);
    free(path);
}

/* A bad label, a bad integer or two lines as one, here and there. */
static void spoil_some(char **buf, size_t *len, size_t *cap, char *line, int i)
{
    if (i % 97 == 5)
        line[0] = 'y'; /* a bad label */
    else if (i % 89 == 7 && line[2] != '\t')
        line[2] = 'z'; /* the first integer is not one */
    else if (i % 83 == 3)
        (*buf)[*len - 1] = '\t', append_line(buf, len, cap, i); /* two lines as one */
}

/* A reader without a thread (prefetch 0) makes its batches on the caller's
 * OpenMP team: a batch of 300 lines is parsed by two threads. It must read
 * what the producer thread reads, bit for bit, and count the malformed lines
 * (a bad label, a bad integer, a line with too many fields) in the
 * same order with the same messages. */
static void test_team_reads_as_thread(void **state)
{
    (void)state;
    char *path = tpath("part-team.tsv");
    write_rows(path, 0, 1300, 0, spoil_some);
    const char *paths[] = {path};
    int saved = omp_get_max_threads();
    omp_set_num_threads(2);
    for (int rank = 0; rank < 2; rank++) {
        run_t thread, team;
        run_reader(paths, 1, DATA_FMT_TSV, rank, 2, 300, 2, &thread);
        run_reader(paths, 1, DATA_FMT_TSV, rank, 2, 300, 0, &team);
        assert_true(thread.stats.malformed >= 10);
        assert_int_equal(team.stats.malformed, thread.stats.malformed);
        assert_int_equal(team.stats.nmessages, thread.stats.nmessages);
        for (int m = 0; m < team.stats.nmessages; m++)
            assert_string_equal(team.stats.messages[m], thread.stats.messages[m]);
        assert_same_run(&thread, &team);
    }
    omp_set_num_threads(saved);
    free(path);
}

/* ---- kiln-bin ------------------------------------------------------------------------- */

static void test_bin_roundtrip(void **state)
{
    (void)state;
    char *a, *b;
    data_reader_stats_t st;
    char *bin = convert_partition_files("part.kbin", 16, &a, &b, &st);
    const char *tsv[] = {a, b};
    assert_int_equal(st.rows, 103);
    assert_int_equal(st.malformed, 0);
    data_format_t f;
    assert_int_equal(data_format_detect(bin, &f), 0);
    assert_int_equal(f, DATA_FMT_BIN);
    assert_int_equal(data_format_detect(a, &f), 0);
    assert_int_equal(f, DATA_FMT_TSV);
    /* A kiln-bin file read as TSV (data.format left at criteo-tsv) is
     * refused by name, not read as a file of malformed lines. */
    int64_t nrows = 0, nbytes = 0;
    assert_int_equal(data_tsv_count_rows(bin, &nrows, &nbytes), KILN_EINVAL);
    assert_non_null(strstr(kiln_errmsg(), "set data.format: kiln-bin"));

    const char *bins[] = {bin};
    for (int nranks = 1; nranks <= 3; nranks++) {
        for (int B = 3; B <= 40; B += 37 - 3 * nranks) {
            for (int r = 0; r < nranks; r++) {
                run_t x, y;
                run_reader(tsv, 2, DATA_FMT_TSV, r, nranks, B, 2, &x);
                run_reader(bins, 1, DATA_FMT_AUTO, r, nranks, B, 2, &y);
                assert_same_run(&x, &y);
            }
        }
    }
    /* Two kiln-bin files read as one sequence, partitioned like anything else. */
    char *ba = tpath("a.kbin"), *bb = tpath("b.kbin");
    const char *ta[] = {a}, *tb[] = {b};
    data_convert_opts_t o = {.chunk_rows = 16};
    assert_int_equal(data_convert_tsv_to_bin(ta, 1, ba, &o, NULL), 0);
    assert_int_equal(data_convert_tsv_to_bin(tb, 1, bb, NULL, NULL), 0);
    const char *two[] = {ba, bb};
    check_partition(two, 2, DATA_FMT_BIN, 3, 4, 103);
    KILN_FREE_ALL(ba, bb, a, b, bin);
}

static void test_bin_multihot(void **state)
{
    (void)state;
    char *path = tpath("multi.kbin");
    data_batch_t b;
    data_bin_writer_t *w = NULL;
    const int n = 50, D = 2, S = 3;
    assert_int_equal(data_batch_init(&b, n, D, S), 0);
    b.keys_cap = 4 * n * S;
    b.keys = realloc(b.keys, (size_t)b.keys_cap * sizeof(int64_t));
    assert_non_null(b.keys);
    /* slot s, row i has (i + s) % 4 keys: 0..3, values 1000*s + 10*i + j */
    int64_t pos = 0;
    b.n = n;
    for (int i = 0; i < n; i++) {
        b.labels[i] = (float)(i % 2);
        b.dense[i * D] = (float)i;
        b.dense[i * D + 1] = 0.5f * (float)i;
    }
    for (int s = 0; s < S; s++) {
        for (int i = 0; i < n; i++) {
            b.offsets[s * (n + 1) + i] = pos;
            for (int j = 0; j < (i + s) % 4; j++)
                b.keys[pos++] = 1000 * s + 10 * i + j;
        }
        b.offsets[s * (n + 1) + n] = pos;
    }
    b.nkeys = pos;
    assert_int_equal(data_bin_writer_create(path, D, S, 7, &w), 0);
    assert_int_equal(data_bin_writer_add(w, &b), 0);
    assert_int_equal(data_bin_writer_add(w, &b), 0); /* 100 rows: the batch twice */
    assert_int_equal(data_bin_writer_commit(w), 0);

    const char *paths[] = {path};
    run_t run;
    run_reader(paths, 1, DATA_FMT_BIN, 1, 2, 9, 2, &run); /* rank 1 of 2, batch 9 */
    assert_int_equal(run.nsteps, 6);                    /* ceil(100 / 18) */
    int got = 0;
    for (int k = 0; k < run.nsteps; k++) {
        for (int i = 0; i < run.step_rows[k]; i++) {
            int g = k * 18 + 9 + i, src = g % n;
            row_t want;
            batch_row(&b, src, &want);
            assert_rows_equal(&run.rows[got++], &want);
        }
    }
    assert_int_equal(got, 9 * 5 + 1); /* last step: rows 99 only */
    run_free(&run);
    data_batch_fini(&b);

    /* ndense / nslots that do not match the file are refused */
    data_reader_t *r = NULL;
    assert_int_equal(data_reader_open(paths, 1, DATA_FMT_BIN, 0, 1, 8, 13, 26, 1, &r), KILN_EINVAL);
    assert_non_null(strstr(kiln_errmsg(), path));
    free(path);
}

static void flip_byte(const char *path, long off)
{
    FILE *f = fopen(path, "r+b");
    int c;
    assert_non_null(f);
    fseek(f, off, SEEK_SET);
    c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
}

static void test_bin_corrupt(void **state)
{
    (void)state;
    char *a, *b;
    char *bin = convert_partition_files("corrupt.kbin", 10, &a, &b, NULL);
    const char *tsv[] = {a, b};
    struct stat sb;
    assert_int_equal(stat(bin, &sb), 0);
    /* a byte in the middle of the data: some chunk past the first */
    flip_byte(bin, (long)sb.st_size / 2);
    const char *paths[] = {bin};
    data_reader_t *r = NULL;
    data_batch_t *batch;
    int rc;
    int nb = 0;
    assert_int_equal(data_reader_open(paths, 1, DATA_FMT_BIN, 0, 1, 10, 13, 26, 2, &r), 0);
    while ((rc = data_reader_next(r, &batch)) == 1)
        nb++;
    assert_int_equal(rc, KILN_ECHECKSUM);
    assert_true(nb >= 1 && nb < 10); /* the good chunks before it came through */
    char want[512];
    snprintf(want, sizeof want, "%s: chunk %d of 11", bin, nb);
    if (!strstr(kiln_errmsg(), want))
        fail_msg("message '%s' lacks '%s'", kiln_errmsg(), want);
    assert_non_null(strstr(kiln_errmsg(), "checksum"));
    assert_int_equal(data_reader_next(r, &batch), KILN_ECHECKSUM); /* stays failed */
    data_reader_close(r);

    /* a corrupt header is caught at open */
    flip_byte(bin, (long)sb.st_size / 2);
    flip_byte(bin, 20);
    r = NULL;
    assert_int_equal(data_reader_open(paths, 1, DATA_FMT_BIN, 0, 1, 10, 13, 26, 2, &r),
                     KILN_ECHECKSUM);
    assert_non_null(strstr(kiln_errmsg(), bin));
    flip_byte(bin, 20);
    /* a truncated file too */
    assert_int_equal(truncate(bin, sb.st_size - 5), 0);
    assert_int_equal(data_reader_open(paths, 1, DATA_FMT_BIN, 0, 1, 10, 13, 26, 2, &r),
                     KILN_ECORRUPT);
    /* TSV handed to the bin reader */
    assert_int_equal(data_reader_open(tsv, 1, DATA_FMT_BIN, 0, 1, 10, 13, 26, 2, &r), KILN_ECORRUPT);
    assert_non_null(strstr(kiln_errmsg(), "not a kiln-bin file"));
    KILN_FREE_ALL(a, b, bin);
}

/* ---- prefetch ----------------------------------------------------------------------------- */

static void test_prefetch_repeat_and_close(void **state)
{
    (void)state;
    char *path = tpath("gen-prefetch.tsv");
    data_datagen_opts_t g = {.path = path, .rows = 20000, .seed = 3, .day = 0};
    assert_int_equal(data_datagen(&g), 0);
    const char *paths[] = {path};
    run_t x, y;
    run_reader(paths, 1, DATA_FMT_TSV, 0, 1, 256, 4, &x);
    run_reader(paths, 1, DATA_FMT_TSV, 0, 1, 256, 1, &y);
    assert_int_equal(x.nrows, 20000);
    assert_same_run(&x, &y);

    /* Closing mid-stream (the producer is blocked on a full ring, or still
     * parsing) and closing before the first batch are both clean. */
    for (int take = 0; take < 4; take++) {
        data_reader_t *r = NULL;
        data_batch_t *b;
        assert_int_equal(data_reader_open(paths, 1, DATA_FMT_AUTO, 0, 1, 64, DATA_DIMS_AUTO,
                                        DATA_DIMS_AUTO, 2, &r), 0);
        for (int i = 0; i < take; i++)
            assert_int_equal(data_reader_next(r, &b), 1);
        if (take == 3)
            usleep(20000);
        data_reader_close(r);
    }
    data_reader_close(NULL);
    free(path);
}

/* ---- datagen ---------------------------------------------------------------------------------- */

static void test_datagen(void **state)
{
    (void)state;
    char *p1 = tpath("gen1.tsv"), *p2 = tpath("gen2.tsv"), *p3 = tpath("gen3.tsv");
    char *p4 = tpath("gen4.tsv");
    data_datagen_opts_t g = {.path = p1, .rows = 30000, .seed = 42, .day = 0};
    assert_int_equal(data_datagen(&g), 0);
    g.path = p2;
    assert_int_equal(data_datagen(&g), 0);
    g.path = p3;
    g.day = 1;
    assert_int_equal(data_datagen(&g), 0);
    g.path = p4;
    g.day = 0;
    g.seed = 43;
    assert_int_equal(data_datagen(&g), 0);

    size_t l1, l2, l3, l4;
    char *t1 = read_all(p1, &l1), *t2 = read_all(p2, &l2), *t3 = read_all(p3, &l3);
    char *t4 = read_all(p4, &l4);
    assert_int_equal(l1, l2);
    assert_memory_equal(t1, t2, l1);
    assert_true(l1 != l3 || memcmp(t1, t3, l1) != 0);
    assert_true(l1 != l4 || memcmp(t1, t4, l1) != 0);
    KILN_FREE_ALL(t2, t3, t4);

    /* It parses cleanly, has a sensible click rate, empty fields and
     * repeated ids, and the dense signal is there. */
    const char *paths[] = {p1};
    run_t run;
    run_reader(paths, 1, DATA_FMT_TSV, 0, 1, 1000, 2, &run);
    assert_int_equal(run.nrows, 30000);
    assert_int_equal(run.stats.malformed, 0);
    double pos = 0;
    int empty0 = 0, empty18 = 0;
    double hi_pos = 0, hi_n = 0, lo_pos = 0, lo_n = 0;
    for (int i = 0; i < run.nrows; i++) {
        const row_t *r = &run.rows[i];
        pos += r->label;
        empty0 += r->nkeys[0] == 0;
        empty18 += r->nkeys[18] == 0;
        /* I11 carries weight +0.3 in the hidden model */
        if (r->dense[10] >= 2.0f) {
            hi_pos += r->label;
            hi_n++;
        } else {
            lo_pos += r->label;
            lo_n++;
        }
    }
    double ctr = pos / run.nrows;
    if (ctr < 0.18 || ctr > 0.32)
        fail_msg("base CTR %.3f out of [0.18, 0.32]", ctr);
    assert_true(empty0 > 0 && empty0 < run.nrows / 10);
    assert_true(empty18 > run.nrows / 5);
    assert_true(hi_n > 100 && lo_n > 100);
    if (hi_pos / hi_n < lo_pos / lo_n + 0.02)
        fail_msg("no dense signal: CTR %.3f (I11 high) vs %.3f", hi_pos / hi_n, lo_pos / lo_n);
    /* the head of the small slots repeats a lot */
    int same = 0;
    for (int i = 1; i < run.nrows; i++)
        same += run.rows[i].nkeys[0] && run.rows[0].nkeys[0] &&
                run.rows[i].keys[0][0] == run.rows[0].keys[0][0];
    assert_true(same > 100);
    run_free(&run);

    /* A line of the text format: label, 13 integers, 26 ids of 8 hex digits or empty. */
    char *nl = strchr(t1, '\n');
    assert_non_null(nl);
    int tabs = 0;
    for (char *c = t1; c < nl; c++)
        tabs += *c == '\t';
    assert_int_equal(tabs, 39);
    free(t1);

    data_datagen_opts_t bad = {.path = NULL, .rows = 1};
    assert_int_equal(data_datagen(&bad), KILN_EINVAL);
    KILN_FREE_ALL(p1, p2, p3, p4);
}

/* ---- compressed files and files that are not files ------------------------------------
 * The gzip and zstd files are made by the real gzip and zstd programs. */

/* Runs a shell command (the test's own paths only); fails the test if it fails. */
static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (system(cmd) != 0)
        fail_msg("command failed: %s", cmd);
}

/* Reads paths on nranks ranks with batch B and checks every rank's rows
 * equal the plain files' rows, step by step. */
static void check_same_rows(const char *const *plain, const char *const *other, int npaths,
                            int nranks, int B)
{
    int saved = omp_get_max_threads();
    omp_set_num_threads(2);
    for (int r = 0; r < nranks; r++) {
        run_t x, y, z;
        run_reader(plain, npaths, DATA_FMT_TSV, r, nranks, B, 2, &x);
        run_reader(other, npaths, DATA_FMT_TSV, r, nranks, B, 2, &y);
        assert_true(x.nrows > 0);
        assert_int_equal(y.stats.malformed, 0);
        assert_same_run(&x, &y); /* frees both */
        /* The plain files again on a team of two, windows split between them. */
        run_reader(plain, npaths, DATA_FMT_TSV, r, nranks, B, 2, &x);
        run_reader(plain, npaths, DATA_FMT_TSV, r, nranks, B, 0, &z);
        assert_same_run(&x, &z);
    }
    omp_set_num_threads(saved);
}

/* gzip and zstd files (several members / frames too) read exactly as the
 * plain files do, on 1, 2 and 3 ranks, whatever their names say; so does
 * kiln convert. A file bigger than the decoders' buffers crosses line and
 * buffer boundaries many times. */
static void test_compressed_tsv(void **state)
{
    (void)state;
    char *a, *b;
    make_partition_files(&a, &b);
    /* a as gzip in two members (named .tsv: the magic decides), b as zstd in two frames. */
    char *agz = tpath("part-a-gzip.tsv"), *bzst = tpath("part-b.zst");
    char *half1 = tpath("half1"), *half2 = tpath("half2");
    sh("head -n 20 '%s' > '%s' && tail -n +21 '%s' > '%s'", a, half1, a, half2);
    sh("gzip -c '%s' > '%s' && gzip -c '%s' >> '%s'", half1, agz, half2, agz);
    sh("head -n 30 '%s' > '%s' && tail -n +31 '%s' > '%s'", b, half1, b, half2);
    sh("zstd -q -c '%s' > '%s' && zstd -q -c '%s' >> '%s'", half1, bzst, half2, bzst);
    const char *plain[] = {a, b}, *comp[] = {agz, bzst};
    for (int nranks = 1; nranks <= 3; nranks++)
        check_same_rows(plain, comp, 2, nranks, 4 + nranks);
    check_partition(comp, 2, DATA_FMT_TSV, 2, 5, 103);
    int64_t rows = 0, bytes = 0;
    char *agz2 = tpath("part-a-gzip-copy.tsv"); /* a copy: agz's count is cached by now */
    sh("cp '%s' '%s'", agz, agz2);
    assert_int_equal(data_tsv_count_rows(agz2, &rows, &bytes), 0);
    assert_int_equal(rows, 47);
    struct stat sb;
    assert_int_equal(stat(agz2, &sb), 0);
    assert_int_equal(bytes, sb.st_size); /* the file's bytes, not the text's */
    free(agz2);

    /* A plain file named .gz is read as plain text. */
    char *fake = tpath("plain-text.gz");
    sh("cp '%s' '%s'", b, fake);
    const char *p1[] = {b}, *p2[] = {fake};
    check_same_rows(p1, p2, 1, 2, 8);

    /* Big: 24000 generated rows, about 5 MB of text, each format: more than
     * the 4 MiB the row count reads first, so a plain file's rest is counted
     * on the team; and once more without its last newline. */
    char *big = tpath("big.tsv"), *biggz = tpath("big.tsv.gz"), *bigzst = tpath("big.tsv.zst");
    data_datagen_opts_t g = {.path = big, .rows = 24000, .seed = 5, .day = 0};
    assert_int_equal(data_datagen(&g), 0);
    sh("gzip -c '%s' > '%s' && zstd -q -c '%s' > '%s'", big, biggz, big, bigzst);
    const char *bp[] = {big}, *bg[] = {biggz}, *bz[] = {bigzst};
    check_same_rows(bp, bg, 1, 2, 1000);
    check_same_rows(bp, bz, 1, 3, 700);
    char *cut = tpath("big-cut.tsv"), *cutgz = tpath("big-cut.tsv.gz");
    sh("head -c -1 '%s' > '%s' && gzip -c '%s' > '%s'", big, cut, cut, cutgz);
    int64_t nrows = 0;
    assert_int_equal(data_tsv_count_rows(cut, &nrows, NULL), 0);
    assert_int_equal(nrows, 24000);
    const char *cp[] = {cut}, *cg[] = {cutgz};
    check_same_rows(cp, cg, 1, 2, 4096);

    /* kiln convert reads them too. */
    char *kb1 = tpath("from-plain.kbin"), *kb2 = tpath("from-comp.kbin");
    assert_int_equal(data_convert_tsv_to_bin(plain, 2, kb1, NULL, NULL), 0);
    if (data_convert_tsv_to_bin(comp, 2, kb2, NULL, NULL) != 0)
        fail_msg("convert: %s", kiln_errmsg());
    size_t l1, l2;
    char *c1 = read_all(kb1, &l1), *c2 = read_all(kb2, &l2);
    assert_int_equal(l1, l2);
    assert_memory_equal(c1, c2, l1);
    KILN_FREE_ALL(c1, c2);
    char *all[] = {a, b, agz, bzst, half1, half2, fake, big, biggz, bigzst, cut, cutgz, kb1, kb2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

/* Opens paths as TSV (rank 0 of 1) and expects code with every `want`
 * string in the message. */
static void open_fails(const char *path, data_format_t fmt, int code, const char *want1,
                       const char *want2)
{
    data_reader_t *r = NULL;
    const char *paths[] = {path};
    int rc = data_reader_open(paths, 1, fmt, 0, 1, 8, DATA_DIMS_AUTO, DATA_DIMS_AUTO, 2, &r);
    if (rc == 0) {
        data_batch_t *b;
        while ((rc = data_reader_next(r, &b)) == 1) {
        }
        data_reader_close(r);
    }
    if (rc != code || strstr(kiln_errmsg(), want1) == NULL ||
        (want2 != NULL && strstr(kiln_errmsg(), want2) == NULL))
        fail_msg("%s: rc %d (want %d), message: %s (want: %s / %s)", path, rc, code, kiln_errmsg(),
                 want1, want2 ? want2 : "");
}

/* A compressed file that is cut short or damaged is an error naming the
 * file; a compressed kiln-bin file is refused with the reason. */
static void test_compressed_damaged(void **state)
{
    (void)state;
    char *big = tpath("dmg.tsv"), *gz = tpath("dmg.tsv.gz"), *zst = tpath("dmg.tsv.zst");
    char *cut = tpath("cut.tsv.gz"), *cutz = tpath("cut.tsv.zst"), *bad = tpath("bad.tsv.zst");
    data_datagen_opts_t g = {.path = big, .rows = 3000, .seed = 9, .day = 0};
    assert_int_equal(data_datagen(&g), 0);
    sh("gzip -c '%s' > '%s' && zstd -q -c '%s' > '%s'", big, gz, big, zst);
    sh("head -c 20000 '%s' > '%s' && head -c 20000 '%s' > '%s'", gz, cut, zst, cutz);
    open_fails(cut, DATA_FMT_TSV, KILN_ECORRUPT, cut, "the gzip stream ends early at byte 20000");
    open_fails(cutz, DATA_FMT_TSV, KILN_ECORRUPT, cutz, "the zstd stream ends early at byte 20000");
    /* Bytes 5000..5099 of the zstd file overwritten. */
    sh("cp '%s' '%s' && printf '%%0100d' 0 | dd of='%s' bs=1 seek=5000 conv=notrunc 2>/dev/null",
       zst, bad, bad);
    open_fails(bad, DATA_FMT_TSV, KILN_ECORRUPT, bad, "the zstd data is corrupt near byte");

    char *kb = tpath("dmg.kbin"), *kbgz = tpath("dmg.kbin.gz"), *kbz = tpath("dmg.kbin.zst");
    const char *in[] = {big};
    assert_int_equal(data_convert_tsv_to_bin(in, 1, kb, NULL, NULL), 0);
    sh("gzip -c '%s' > '%s' && zstd -q -c '%s' > '%s'", kb, kbgz, kb, kbz);
    open_fails(kbgz, DATA_FMT_BIN, KILN_EINVAL,
               "is gzip-compressed; kiln-bin files are read by "
               "seeking to their chunks and cannot be compressed",
               kbgz);
    open_fails(kbz, DATA_FMT_AUTO, KILN_EINVAL, "is zstd-compressed", kbz);
    char *all[] = {big, gz, zst, cut, cutz, bad, kb, kbgz, kbz};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

/* /dev/zero (endless), a FIFO (blocks) and a directory are refused at open,
 * in either format. alarm(): the reader used to read /dev/zero forever. */
static void test_not_regular_files(void **state)
{
    (void)state;
    alarm(60);
    char *fifo = tpath("fifo.tsv"), *dir = tpath("dir.tsv");
    assert_int_equal(mkfifo(fifo, 0644), 0);
    assert_int_equal(mkdir(dir, 0755), 0);
    const data_format_t fmts[] = {DATA_FMT_TSV, DATA_FMT_BIN, DATA_FMT_AUTO};
    for (size_t i = 0; i < 3; i++) {
        open_fails("/dev/zero", fmts[i], KILN_EINVAL,
                   "data file /dev/zero is a character device, not a regular file", NULL);
        open_fails(fifo, fmts[i], KILN_EINVAL, "is a FIFO, not a regular file", fifo);
        open_fails(dir, fmts[i], KILN_EINVAL, "is a directory, not a regular file", dir);
    }
    int64_t rows, bytes;
    assert_int_equal(data_tsv_count_rows("/dev/zero", &rows, &bytes), KILN_EINVAL);
    alarm(0);
    KILN_FREE_ALL(fifo, dir);
}

/* Share of rows whose slot s holds its most frequent key, and of empty
 * fields, over a run of rows. */
static void slot_stats(const run_t *run, int s, double *top_share, double *empty_share,
                       int64_t *top_key)
{
    int64_t *k = malloc(sizeof(int64_t) * (size_t)run->nrows);
    int n = 0, empty = 0;
    for (int i = 0; i < run->nrows; i++) {
        if (run->rows[i].nkeys[s] == 0)
            empty++;
        else
            k[n++] = run->rows[i].keys[s][0];
    }
    int best = 0;
    *top_key = -1;
    for (int i = 0; i < n; i++) { /* O(n^2) is fine for a test's sample */
        if (i > 2000)
            break;
        int c = 0;
        for (int j = 0; j < n; j++)
            c += k[j] == k[i];
        if (c > best) {
            best = c;
            *top_key = k[i];
        }
    }
    *top_share = (double)best / run->nrows;
    *empty_share = (double)empty / run->nrows;
    free(k);
}

/* kiln datagen's skew options: the Zipf exponent decides how often the head
 * id occurs, --vocab bounds the distinct ids, --empty the share of empty
 * fields; a second part is another draw of the same ids; the Bayes-optimal
 * logloss is reported and lies below the entropy of the click rate. */
static void test_datagen_skew(void **state)
{
    (void)state;
    char *pz = tpath("gen-zipf.tsv"), *pu = tpath("gen-uniform.tsv"), *pp = tpath("gen-part1.tsv");
    double bayes = -1.0, ctr = -1.0;
    data_datagen_opts_t g = {.path = pz, .rows = 20000, .seed = 5, .zipf_set = 1, .zipf = 1.15,
                           .vocab = 200000, .empty_set = 1, .empty = 0.04,
                           .bayes_logloss = &bayes, .ctr = &ctr};
    assert_int_equal(data_datagen(&g), 0);
    assert_true(ctr > 0.1 && ctr < 0.4);
    double h = -(ctr * log(ctr) + (1 - ctr) * log(1 - ctr));
    if (!(bayes > 0.05 && bayes < h))
        fail_msg("Bayes logloss %.4f not in (0.05, %.4f), the entropy of the click rate", bayes,
                 h);
    g.path = pp;
    g.part = 1;
    g.bayes_logloss = NULL;
    assert_int_equal(data_datagen(&g), 0);
    g.path = pu;
    g.part = 0;
    g.zipf = 0.0; /* uniform over the vocabulary */
    g.vocab = 1000;
    g.empty = 0.5;
    assert_int_equal(data_datagen(&g), 0);

    const char *paths[] = {pz}, *ppart[] = {pp}, *punif[] = {pu};
    run_t z, p, u;
    run_reader(paths, 1, DATA_FMT_TSV, 0, 1, 1000, 2, &z);
    run_reader(ppart, 1, DATA_FMT_TSV, 0, 1, 1000, 2, &p);
    run_reader(punif, 1, DATA_FMT_TSV, 0, 1, 1000, 2, &u);
    assert_int_equal(z.stats.malformed + p.stats.malformed + u.stats.malformed, 0);
    /* A power law of exponent a on [1, V+1), floored: the head rank holds
     * (2^(1-a) - 1) / ((V+1)^(1-a) - 1) of the draws, 11.8% for a = 1.15,
     * V = 200k (less the 8% of draws that go to the day's new ids). */
    double head = (pow(2.0, -0.15) - 1.0) / (pow(200001.0, -0.15) - 1.0) * 0.92 * 0.96;
    for (int s = 0; s < 26; s += 5) {
        double top, empty, top_u, empty_u, top_p, empty_p;
        int64_t key, key_u, key_p;
        slot_stats(&z, s, &top, &empty, &key);
        slot_stats(&u, s, &top_u, &empty_u, &key_u);
        slot_stats(&p, s, &top_p, &empty_p, &key_p);
        if (fabs(top - head) > 0.015 || fabs(empty - 0.04) > 0.01)
            fail_msg("slot %d: head id in %.4f of rows (expected %.4f), %.4f empty (0.04)", s,
                     top, head, empty);
        /* part 1 draws other rows of the same ids: same head id */
        assert_true(key_p == key && fabs(top_p - top) < 0.015);
        /* uniform over 1000 ids: no id above ~0.1% + noise; half empty */
        if (top_u > 0.004 || fabs(empty_u - 0.5) > 0.02)
            fail_msg("uniform slot %d: head id in %.4f of rows, %.4f empty", s, top_u, empty_u);
    }
    /* Two parts of one day are different rows. */
    size_t lz, lp;
    char *tz = read_all(pz, &lz), *tp = read_all(pp, &lp);
    assert_true(lz != lp || memcmp(tz, tp, lz) != 0);
    KILN_FREE_ALL(tz, tp);
    run_free(&z);
    run_free(&p);
    run_free(&u);

    /* Out-of-range skew is refused with a message naming it. */
    data_datagen_opts_t bad = {.path = pz, .rows = 1, .zipf_set = 1, .zipf = -1.0};
    assert_int_equal(data_datagen(&bad), KILN_EINVAL);
    assert_non_null(strstr(kiln_errmsg(), "Zipf exponent"));
    bad = (data_datagen_opts_t){.path = pz, .rows = 1, .empty_set = 1, .empty = 1.5};
    assert_int_equal(data_datagen(&bad), KILN_EINVAL);
    assert_non_null(strstr(kiln_errmsg(), "empty fields"));
    KILN_FREE_ALL(pz, pu, pp);
}

static int setup(void **state)
{
    (void)state;
    return proc_tmpdir("data", tmpdir, sizeof tmpdir);
}

static int teardown(void **state)
{
    (void)state;
    char *cmd = kiln_asprintf("rm -rf '%s'", tmpdir);
    int rc = cmd ? system(cmd) : -1;
    free(cmd);
    return rc == 0 ? 0 : -1;
}

PROC_TEST_MAIN(setup, teardown,
    cmocka_unit_test(test_parse_good_line),
    cmocka_unit_test(test_key_hash),
    cmocka_unit_test(test_parse_bad_lines),
    cmocka_unit_test(test_parse_paths_agree),
    cmocka_unit_test(test_newline_scans),
    cmocka_unit_test(test_count_rows_cached),
    cmocka_unit_test(test_malformed_lines_in_reader),
    cmocka_unit_test(test_missing_file),
    cmocka_unit_test(test_block_cyclic_tsv),
    cmocka_unit_test(test_block_cyclic_with_malformed),
    cmocka_unit_test(test_team_reads_as_thread),
    cmocka_unit_test(test_bin_roundtrip),
    cmocka_unit_test(test_bin_multihot),
    cmocka_unit_test(test_bin_corrupt),
    cmocka_unit_test(test_prefetch_repeat_and_close),
    cmocka_unit_test(test_datagen),
    cmocka_unit_test(test_compressed_tsv),
    cmocka_unit_test(test_compressed_damaged),
    cmocka_unit_test(test_not_regular_files),
    cmocka_unit_test(test_datagen_skew))
