/*
 * tests/test_parquet.c - Kiln's Parquet reader against files written by two
 * independent implementations (DuckDB and Apache Arrow's Rust parquet crate,
 * installed from npm by tools/deps.sh into tests/parquet/node_modules;
 * tests/parquet/write.mjs writes them) from the rows of a `kiln datagen` TSV
 * file: every codec (UNCOMPRESSED, SNAPPY, GZIP, ZSTD), data page v1 and v2,
 * dictionary on and off, DELTA encodings, nullable columns, several row
 * groups, LIST columns, a multi-hot LIST<INT64> column and an
 * NVTabular-shaped file.
 *
 * Each plain file gives the TSV's rows exactly: its kiln-bin conversion is
 * byte for byte the TSV's, and the batches one rank of two reads are the
 * TSV's; kiln-train under mpirun on Parquet and on TSV gives bitwise the
 * same losses, eval loss and checkpoint. The multi-hot and NVTabular files
 * give the bags and values the TSV's rows say. Bad files are refused by name
 * and reason: cut short (no trailing PAR1), a footer length past the file, a
 * page that does not decode, an encoding or codec Kiln does not read, a
 * mapped column missing or of the wrong type, partitions whose schemas
 * differ; kiln-train writes no checkpoint from them. An online kiln-train
 * leaves a Parquet file that is still being written until it is whole.
 *
 * Without the npm packages the test fails (it does not skip): run
 * tools/deps.sh.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt.h"
#include "data_int.h"
#include "fixtures.h"
#include "proc.h"

#ifndef KILN_TRAIN_BIN
#error "KILN_TRAIN_BIN and KILN_BIN must name kiln-train and kiln"
#endif

#define ROWS 2400
#define EVAL_ROWS 600

static char tmpdir[256];

/* The files that hold the TSV's columns as they are (strings, nullable
 * integers, some as one-element lists): each must read as the TSV does. */
static const char *const plain_files[] = {
    "duck-snappy-v1",      "duck-zstd-v2",         "duck-gzip-v1",       "duck-uncompressed-v2",
    "duck-snappy-v2",      "duck-zstd-v1",         "duck-lists",         "arrow-v1-dict-snappy",
    "arrow-v1-plain-gzip", "arrow-v2-dict-zstd",   "arrow-v2-delta-zstd", "arrow-v1-delta-none",
};
#define NPLAIN (sizeof plain_files / sizeof plain_files[0])

static void pq_path(char *out, size_t cap, const char *dir, const char *name)
{
    snprintf(out, cap, "%s/%s/%s.parquet", tmpdir, dir, name);
}

/* Runs write.mjs on in into tmpdir/dir (only the named files, or all). */
static void write_parquet(const char *in, const char *dir, const char *only)
{
    proc_result_t *r = malloc(sizeof *r);
    assert_non_null(r);
    int rc = proc_sh(r, tmpdir, "node '%s/tests/parquet/write.mjs' '%s/%s' '%s/%s' %s",
                     KILN_SOURCE_DIR, tmpdir, in, tmpdir, dir, only);
    if (rc != 0)
        fail_msg("the Parquet writers did not run (exit %d): %s\nThey come from npm: run "
                 "tools/deps.sh (it installs them into tests/parquet/node_modules)",
                 rc, r->err);
    free(r);
}

static int setup(void **state)
{
    if (fx_train_tmpdir("test_parquet", tmpdir, sizeof tmpdir, ROWS, EVAL_ROWS, 7) < 0)
        return -1;
    *state = tmpdir;
    /* Open MPI's runtime leaves allocations LeakSanitizer cannot name. */
    proc_mpi_env(true);
    write_parquet("data/day=0.tsv", "pq", "");
    write_parquet("data/eval.tsv", "pq-eval", "duck-zstd-v2");
    return 0;
}

/* ---- the same rows ------------------------------------------------------------------ */

static void assert_same_file(const char *a, const char *b, const char *what)
{
    size_t na, nb;
    unsigned char *x = proc_read_file(a, &na), *y = proc_read_file(b, &nb);
    if (na != nb || memcmp(x, y, na) != 0)
        fail_msg("%s: %s (%zu bytes) differs from %s (%zu bytes)", what, b, nb, a, na);
    free(x);
    free(y);
}

static void assert_same_batch(const data_batch_t *a, const data_batch_t *b, const char *what)
{
    assert_int_equal(a->n, b->n);
    assert_int_equal(a->nkeys, b->nkeys);
    assert_int_equal(a->first_row, b->first_row);
    if (memcmp(a->labels, b->labels, (size_t)a->n * sizeof(float)) != 0 ||
        memcmp(a->dense, b->dense, (size_t)a->n * (size_t)a->ndense * sizeof(float)) != 0 ||
        memcmp(a->offsets, b->offsets, (size_t)a->nslots * (size_t)(a->n + 1) * 8) != 0 ||
        memcmp(a->keys, b->keys, (size_t)a->nkeys * 8) != 0)
        fail_msg("%s: step %lld differs from the TSV's", what, (long long)a->step);
}

static data_reader_t *open_reader(const char *path, data_format_t fmt, const data_columns_t *cols,
                                int rank, int nranks, int batch)
{
    data_reader_t *r = NULL;
    const char *paths[1] = {path};
    int rc = data_reader_open_cols(paths, 1, fmt, cols, rank, nranks, batch, DATA_DIMS_AUTO,
                                 DATA_DIMS_AUTO, 2, &r);
    if (rc < 0)
        fail_msg("open %s: %s", path, kiln_errmsg());
    return r;
}

/* Rank 1 of 2 reads the same batches from the TSV files and the Parquet
 * files (npaths of each, read in order as one row sequence), the Parquet
 * ones twice: with the producer thread, and without one (prefetch 0), the
 * columns decoded on an OpenMP team of two. */
static void assert_same_batches_n(const char *const *tsv, const char *const *pq, int npaths,
                                  const char *what)
{
    data_reader_t *a = NULL, *b = NULL, *c = NULL;
    int saved = omp_get_max_threads();
    omp_set_num_threads(2);
    if (data_reader_open_cols(tsv, npaths, DATA_FMT_TSV, NULL, 1, 2, 97, DATA_DIMS_AUTO, DATA_DIMS_AUTO,
                            2, &a) < 0 ||
        data_reader_open_cols(pq, npaths, DATA_FMT_PARQUET, NULL, 1, 2, 97, DATA_DIMS_AUTO,
                            DATA_DIMS_AUTO, 2, &b) < 0 ||
        data_reader_open_cols(pq, npaths, DATA_FMT_PARQUET, NULL, 1, 2, 97, DATA_DIMS_AUTO,
                            DATA_DIMS_AUTO, 0, &c) < 0)
        fail_msg("%s: %s", what, kiln_errmsg());
    assert_int_equal(data_reader_nsteps(a), data_reader_nsteps(b));
    data_batch_t *x, *y, *z;
    int ra, steps = 0;
    while ((ra = data_reader_next(a, &x)) == 1) {
        if (data_reader_next(b, &y) != 1 || data_reader_next(c, &z) != 1)
            fail_msg("%s: %s", what, kiln_errmsg());
        assert_same_batch(x, y, what);
        assert_same_batch(x, z, what);
        steps++;
    }
    assert_int_equal(ra, 0);
    assert_int_equal(data_reader_next(b, &y), 0);
    assert_int_equal(data_reader_next(c, &z), 0);
    assert_true(steps > 10);
    data_reader_close(a);
    data_reader_close(b);
    data_reader_close(c);
    omp_set_num_threads(saved);
}

static void assert_same_batches(const char *tsv, const char *pq, const char *what)
{
    const char *a[1] = {tsv}, *b[1] = {pq};
    assert_same_batches_n(a, b, 1, what);
}

static void test_every_writer_reads_as_tsv(void **state)
{
    (void)state;
    char tsv[400], ref[400], path[400], out[400];
    snprintf(tsv, sizeof tsv, "%s/data/day=0.tsv", tmpdir);
    snprintf(ref, sizeof ref, "%s/ref.kb", tmpdir);
    const char *in[1] = {tsv};
    data_reader_stats_t st;
    assert_int_equal(data_convert_tsv_to_bin(in, 1, ref, NULL, &st), 0);
    assert_int_equal(st.rows, ROWS);
    for (size_t i = 0; i < NPLAIN; i++) {
        pq_path(path, sizeof path, "pq", plain_files[i]);
        snprintf(out, sizeof out, "%s/%s.kb", tmpdir, plain_files[i]);
        const char *pin[1] = {path};
        if (data_convert_parquet_to_bin(pin, 1, NULL, out, NULL, &st) < 0)
            fail_msg("%s: %s", plain_files[i], kiln_errmsg());
        assert_int_equal(st.rows, ROWS);
        assert_int_equal(st.malformed, 0);
        assert_same_file(ref, out, plain_files[i]);
        assert_same_batches(tsv, path, plain_files[i]);
    }
    /* Three partitions by two writers as one row sequence: batches cross
     * from file to file (the reader frees each file's row group as it
     * moves on) as they do over the same TSV three times. */
    char p1[400], p2[400];
    pq_path(p1, sizeof p1, "pq", "duck-zstd-v2");
    pq_path(p2, sizeof p2, "pq", "arrow-v1-dict-snappy");
    const char *tsv3[3] = {tsv, tsv, tsv}, *pq3[3] = {p1, p2, p1};
    assert_same_batches_n(tsv3, pq3, 3, "three partitions");
    /* The decoder's scalar loops, which a CPU without AVX-512 runs (this
     * one may have it): nullable dense columns, page v1 and v2. */
    data_pq_no_simd(true);
    pq_path(path, sizeof path, "pq", "duck-snappy-v1");
    assert_same_batches(tsv, path, "duck-snappy-v1, scalar loops");
    pq_path(path, sizeof path, "pq", "duck-zstd-v2");
    assert_same_batches(tsv, path, "duck-zstd-v2, scalar loops");
    data_pq_no_simd(false);
    /* BOOLEAN labels (RLE) and DOUBLE features (BYTE_STREAM_SPLIT), read
     * with dense_transform log1p: log(1 + max(x, 0)) of a double is the
     * float a TSV integer gives. */
    const data_columns_t log1p_all = {.dense_transform = DATA_DENSE_LOG1P};
    pq_path(path, sizeof path, "pq", "arrow-v2-bss-double");
    snprintf(out, sizeof out, "%s/bss.kb", tmpdir);
    const char *pin[1] = {path};
    if (data_convert_parquet_to_bin(pin, 1, &log1p_all, out, NULL, &st) < 0)
        fail_msg("arrow-v2-bss-double: %s", kiln_errmsg());
    assert_same_file(ref, out, "arrow-v2-bss-double");
}

/* ---- kiln-train on Parquet and on TSV ---------------------------------------------- */

static void write_spec(const char *name, const char *format, const char *train, const char *eval,
                       char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s.yaml", tmpdir, name);
    fx_write(path,
             "name: %s\n"
             "data: {format: %s, train: \"%s\", eval: \"%s\"}\n"
             "model:\n  type: dlrm\n  embedding: {dim: 8, capacity: 200000}\n"
             "  bottom_mlp: [16, 8]\n  top_mlp: [16, 1]\n"
             "train: {batch_size: 300, seed: 7, log_every: 1, init_from: none}\n"
             "checkpoint: {dir: ckpt/%s, full_every: 1, keep: 1}\n",
             name, format, train, eval, name);
}

/* Runs kiln-train on 2 ranks; its result JSON, or NULL with r->err. */
static json_t *train(const char *spec, const char *run, proc_result_t *r)
{
    char run_dir[400];
    snprintf(run_dir, sizeof run_dir, "%s/%s", tmpdir, run);
    const char *argv[] = {"mpirun", "-np", "2", "--oversubscribe", KILN_TRAIN_BIN, "--spec", spec,
                          "--run-dir", run_dir, "--quiet", "--threads", "1", NULL};
    proc_run(r, tmpdir, argv);
    return fx_train_result(r);
}

static void bitwise(void *ud, fx_array_kind_t kind, const char *what, const float *ref,
                    const float *x, size_t n)
{
    if (memcmp(ref, x, n * sizeof(float)) != 0)
        fail_msg("%s: %s differs from the TSV run's", (const char *)ud, what);
}

static void test_train_matches_tsv(void **state)
{
    (void)state;
    proc_result_t *r = malloc(sizeof *r);
    char spec[400], train_glob[400], root_a[400], root_b[400];
    double la[64], lb[64];
    write_spec("tsv", "criteo-tsv", "data/day=*.tsv", "data/eval.tsv", spec, sizeof spec);
    json_t *a = train(spec, "tsv", r);
    if (a == NULL)
        fail_msg("the TSV run failed (%d): %s", r->code, r->err);
    snprintf(root_a, sizeof root_a, "%s/ckpt/tsv", tmpdir);
    snprintf(root_b, sizeof root_b, "%s/tsv", tmpdir);
    int na = fx_losses(root_b, la, 64);
    assert_true(na >= 4);
    for (size_t i = 0; i < NPLAIN; i++) {
        char name[64], run_dir[400];
        snprintf(name, sizeof name, "pq-%s", plain_files[i]);
        snprintf(train_glob, sizeof train_glob, "pq/%s.parquet", plain_files[i]);
        write_spec(name, "parquet", train_glob, "pq-eval/duck-zstd-v2.parquet", spec,
                   sizeof spec);
        json_t *b = train(spec, name, r);
        if (b == NULL)
            fail_msg("%s failed (%d): %s", name, r->code, r->err);
        assert_int_equal(json_integer_value(json_object_get(b, "rows")), ROWS);
        assert_int_equal(json_integer_value(json_object_get(b, "eval_rows")), EVAL_ROWS);
        assert_true(json_real_value(json_object_get(a, "eval_logloss")) ==
                    json_real_value(json_object_get(b, "eval_logloss")));
        assert_int_equal(json_integer_value(json_object_get(a, "keys")),
                         json_integer_value(json_object_get(b, "keys")));
        snprintf(run_dir, sizeof run_dir, "%s/%s", tmpdir, name);
        int nb = fx_losses(run_dir, lb, 64);
        assert_int_equal(na, nb);
        for (int k = 0; k < na; k++)
            if (la[k] != lb[k])
                fail_msg("%s: loss at step %d is %.17g, the TSV run's %.17g", name, k, lb[k],
                         la[k]);
        ckpt_chain_t ca, cb;
        snprintf(root_b, sizeof root_b, "%s/ckpt/%s", tmpdir, name);
        fx_open_latest(root_a, &ca);
        fx_open_latest(root_b, &cb);
        fx_ckpt_walk(&ca, &cb, bitwise, name, NULL, NULL);
        ckpt_chain_fini(&ca);
        ckpt_chain_fini(&cb);
        json_decref(b);
    }
    json_decref(a);
    free(r);
}

/* ---- multi-hot lists and NVTabular's shape ------------------------------------------- */

/* The rows of the TSV file, split into fields: rows[i][f] (f 0 the label). */
typedef struct {
    char *text;
    char *(*f)[40];
    int n;
} tsv_rows_t;

static void tsv_load(tsv_rows_t *t)
{
    char path[400];
    size_t len;
    snprintf(path, sizeof path, "%s/data/day=0.tsv", tmpdir);
    t->text = (char *)proc_read_file(path, &len);
    t->f = calloc(ROWS, sizeof *t->f);
    assert_non_null(t->f);
    t->n = 0;
    for (char *line = t->text, *nl; *line != '\0' && t->n < ROWS; line = nl + 1) {
        nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = '\0';
        char *p = line;
        for (int k = 0; k < 40; k++) {
            t->f[t->n][k] = p;
            char *tab = strchr(p, '\t');
            if (tab != NULL) {
                *tab = '\0';
                p = tab + 1;
            }
        }
        t->n++;
    }
    assert_int_equal(t->n, ROWS);
}

static int64_t hex_key(const char *s)
{
    return (int64_t)strtoull(s, NULL, 16);
}

/* Reads the whole file as one rank and hands each batch to check. */
typedef void (*row_check_fn)(const tsv_rows_t *t, const data_batch_t *b, int64_t row0);

static void read_all(const char *name, const data_columns_t *cols, const tsv_rows_t *t,
                     row_check_fn check)
{
    char path[400];
    pq_path(path, sizeof path, "pq", name);
    data_reader_t *r = open_reader(path, DATA_FMT_PARQUET, cols, 0, 1, 256);
    data_batch_t *b;
    int rc, rows = 0;
    while ((rc = data_reader_next(r, &b)) == 1) {
        check(t, b, b->first_row);
        rows += b->n;
    }
    if (rc < 0)
        fail_msg("%s: %s", name, kiln_errmsg());
    assert_int_equal(rows, ROWS);
    data_reader_close(r);
}

/* Slot 0 is the bag of C1's and C2's ids; every other slot is as in TSV. */
static void check_multihot(const tsv_rows_t *t, const data_batch_t *b, int64_t row0)
{
    for (int i = 0; i < b->n; i++) {
        char *const *f = t->f[row0 + i];
        int64_t want[2], nw = 0;
        for (int k = 0; k < 2; k++)
            if (f[14 + k][0] != '\0')
                want[nw++] = hex_key(f[14 + k]);
        const int64_t *o = b->offsets;
        assert_int_equal(o[i + 1] - o[i], nw);
        for (int k = 0; k < nw; k++)
            assert_int_equal(b->keys[o[i] + k], want[k]);
        for (int s = 1; s < b->nslots; s++) {
            const int64_t *os = b->offsets + (size_t)s * (size_t)(b->n + 1);
            const char *v = f[14 + s];
            assert_int_equal(os[i + 1] - os[i], v[0] != '\0');
            if (v[0] != '\0')
                assert_int_equal(b->keys[os[i]], data_key_hash(s, v, strlen(v)));
        }
    }
}

/* Keys are the ids as they are; dense values the floats as written (no
 * log1p: dense_transform auto leaves float columns alone), 0 for nulls. */
static void check_nvt(const tsv_rows_t *t, const data_batch_t *b, int64_t row0)
{
    for (int i = 0; i < b->n; i++) {
        char *const *f = t->f[row0 + i];
        assert_true(b->labels[i] == (float)atoi(f[0]));
        for (int d = 0; d < 13; d++) {
            double x = f[1 + d][0] ? (double)atoll(f[1 + d]) : 0.0;
            double want = f[1 + d][0] ? log(1 + (x > 0 ? x : 0)) : 0.0;
            assert_true(fabs(b->dense[(size_t)i * 13 + (size_t)d] - want) <= 1e-6 * (1 + want));
        }
        for (int s = 0; s < 26; s++) {
            const int64_t *os = b->offsets + (size_t)s * (size_t)(b->n + 1);
            const char *v = f[14 + s];
            assert_int_equal(os[i + 1] - os[i], v[0] != '\0');
            if (v[0] != '\0')
                assert_int_equal(b->keys[os[i]], hex_key(v));
        }
    }
}

/* duck-types: I1 a DECIMAL (a fraction: no log1p under auto), I2 and I3
 * unsigned (I3 past 2^31: log1p as an integer), I4 a DOUBLE (as it is),
 * C1 an unsigned id (the key as it is); the rest as TSV. */
static void check_types(const tsv_rows_t *t, const data_batch_t *b, int64_t row0)
{
    for (int i = 0; i < b->n; i++) {
        char *const *f = t->f[row0 + i];
        const float *d = b->dense + (size_t)i * 13;
        double x[4];
        for (int k = 0; k < 4; k++)
            x[k] = f[1 + k][0] ? (double)atoll(f[1 + k]) : 0.0;
        assert_true(b->labels[i] == (float)atoi(f[0]));
        assert_true(d[0] == (float)x[0]);
        assert_true(d[1] == data_dense_int((int64_t)x[1]));
        if (f[3][0] != '\0')
            assert_true(d[2] == data_dense_int((int64_t)x[2] + INT64_C(3000000000)));
        else
            assert_true(d[2] == 0.0f);
        assert_true(d[3] == (float)x[3]);
        const int64_t *o = b->offsets;
        assert_int_equal(o[i + 1] - o[i], f[14][0] != '\0');
        if (f[14][0] != '\0')
            assert_int_equal(b->keys[o[i]], hex_key(f[14]));
    }
}

static void test_multihot_and_nvtabular(void **state)
{
    (void)state;
    tsv_rows_t t;
    tsv_load(&t);
    read_all("duck-multihot", NULL, &t, check_multihot);
    read_all("duck-nvt", NULL, &t, check_nvt);
    read_all("duck-types", NULL, &t, check_types);
    /* The multi-hot file trains, its bags pooled by the mean combiner. */
    char spec[400];
    snprintf(spec, sizeof spec, "%s/multihot.yaml", tmpdir);
    fx_write(spec, "name: multihot\n"
                   "data: {format: parquet, train: pq/duck-multihot.parquet}\n"
                   "model: {type: fm, embedding: {dim: 8, combiner: mean, capacity: 200000}}\n"
                   "train: {batch_size: 300, seed: 7, init_from: none}\n"
                   "checkpoint: {dir: ckpt/multihot, keep: 1}\n");
    proc_result_t *res = malloc(sizeof *res);
    json_t *out = train(spec, "multihot", res);
    if (out == NULL)
        fail_msg("training on the multi-hot file failed (%d): %s", res->code, res->err);
    assert_int_equal(json_integer_value(json_object_get(out, "rows")), ROWS);
    json_decref(out);
    free(res);
    /* The same NVTabular file with log1p asked for: floats get it too. */
    data_columns_t with_log1p = {.dense_transform = DATA_DENSE_LOG1P};
    char path[400];
    pq_path(path, sizeof path, "pq", "duck-nvt");
    data_reader_t *r = open_reader(path, DATA_FMT_PARQUET, &with_log1p, 0, 1, ROWS);
    data_batch_t *b;
    assert_int_equal(data_reader_next(r, &b), 1);
    for (int i = 0; i < b->n; i++) {
        const char *v = t.f[i][1];
        double x = v[0] ? atoll(v) : 0;
        double want = log1p(log(1 + (x > 0 ? x : 0)));
        assert_true(fabs(b->dense[(size_t)i * 13] - want) <= 1e-6 * (1 + want));
    }
    data_reader_close(r);
    free(t.f);
    free(t.text);
}

/* ---- bad files ------------------------------------------------------------------------ */

/* A copy of pq/name.parquet at tmpdir/bad/out, its bytes changed by edit. */
static void bad_copy(const char *name, const char *out, char *path, size_t cap,
                     void (*edit)(unsigned char *b, size_t *n))
{
    char src[400];
    size_t n;
    pq_path(src, sizeof src, "pq", name);
    unsigned char *b = proc_read_file(src, &n);
    edit(b, &n);
    snprintf(path, cap, "%s/bad/%s", tmpdir, out);
    assert_int_equal(kiln_mkdir_parent(path), 0);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
    free(b);
}

static void cut_short(unsigned char *b, size_t *n)
{
    *n -= 100;
}

static void footer_past_end(unsigned char *b, size_t *n)
{
    uint32_t big = (uint32_t)*n;
    memcpy(b + *n - 8, &big, 4);
}

/* Garbles the first page header of the first column chunk (byte 4 on). */
static void garble_page(unsigned char *b, size_t *n)
{
    memset(b + 4, 0xff, 16);
}

/* The first data page header's encoding (PLAIN, 0) becomes 1
 * (GROUP_VAR_INT, which no writer uses): in the compact protocol the
 * header's DataPageHeader is 0x2c (field 5, a struct), then num_values
 * (0x15, a varint) and encoding (0x15, zigzag 0 = 0x00). */
static void unknown_encoding(unsigned char *b, size_t *n)
{
    for (size_t i = 4; i + 8 < *n && i < 64; i++) {
        if (b[i] != 0x2c || b[i + 1] != 0x15)
            continue;
        size_t j = i + 2;
        while (b[j] & 0x80)
            j++;
        if (b[j + 1] == 0x15 && b[j + 2] == 0x00) {
            b[j + 2] = 0x02;
            return;
        }
    }
    fail_msg("no PLAIN data page header near the start of the file");
}

/* data_reader_open (and, when open succeeds, reading every batch) fails
 * with code, the message holding each of says[] (NULL-ended). */
static void refused(const char *const *paths, int npaths, const data_columns_t *cols, int code,
                    const char *const *says)
{
    data_reader_t *r = NULL;
    int rc = data_reader_open_cols(paths, npaths, DATA_FMT_PARQUET, cols, 0, 1, 256, DATA_DIMS_AUTO,
                                 DATA_DIMS_AUTO, 2, &r);
    if (rc == 0) {
        data_batch_t *b;
        while ((rc = data_reader_next(r, &b)) == 1)
            ;
        data_reader_close(r);
    }
    const char *msg = kiln_errmsg();
    if (rc != code)
        fail_msg("%s: got %d (%s), want %d", paths[npaths - 1], rc, msg, code);
    for (int i = 0; says[i] != NULL; i++)
        if (strstr(msg, says[i]) == NULL)
            fail_msg("the message does not say \"%s\": %s", says[i], msg);
}

static void test_bad_files_refused(void **state)
{
    (void)state;
    char p[400], q[400];
    const char *one[1] = {p};

    bad_copy("duck-snappy-v1", "cut.parquet", p, sizeof p, cut_short);
    refused(one, 1, NULL, KILN_EBUSY,
            (const char *[]){"cut.parquet", "does not end with PAR1", "still being written",
                             NULL});
    assert_int_equal(data_parquet_complete(p), 0);
    pq_path(q, sizeof q, "pq", "duck-snappy-v1");
    assert_int_equal(data_parquet_complete(q), 1);

    bad_copy("duck-snappy-v1", "footer.parquet", p, sizeof p, footer_past_end);
    refused(one, 1, NULL, KILN_ECORRUPT,
            (const char *[]){"footer.parquet", "footer length", "past the file", NULL});

    bad_copy("arrow-v1-plain-gzip", "page.parquet", p, sizeof p, garble_page);
    refused(one, 1, NULL, KILN_ECORRUPT,
            (const char *[]){"page.parquet", "row group 0", "column label", "page at byte 4",
                             "does not decode", NULL});

    bad_copy("arrow-v1-delta-none", "enc.parquet", p, sizeof p, unknown_encoding);
    refused(one, 1, NULL, KILN_EINVAL,
            (const char *[]){"enc.parquet", "encoding GROUP_VAR_INT (1) is not one Kiln reads",
                             NULL});

    pq_path(p, sizeof p, "pq", "arrow-brotli");
    refused(one, 1, NULL, KILN_EINVAL,
            (const char *[]){"arrow-brotli.parquet", "codec BROTLI (4) is not one Kiln reads",
                             NULL});

    pq_path(p, sizeof p, "pq", "duck-snappy-v1");
    data_columns_t missing = {.label = "clicked"};
    refused(one, 1, &missing, KILN_EINVAL,
            (const char *[]){"duck-snappy-v1.parquet", "no column 'clicked'", "data.columns",
                             NULL});
    const char *dense[13] = {"I1", "I2", "I3", "I4", "I5", "I6", "C7",
                             "I8", "I9", "I10", "I11", "I12", "I13"};
    data_columns_t wrong = {.dense = dense};
    refused(one, 1, &wrong, KILN_EINVAL,
            (const char *[]){"column 'C7' is BYTE_ARRAY", "dense column", NULL});

    const char *two[2] = {q, p};
    pq_path(q, sizeof q, "pq", "duck-snappy-v1");
    pq_path(p, sizeof p, "pq", "duck-nvt");
    refused(two, 2, NULL, KILN_EINVAL,
            (const char *[]){"duck-snappy-v1.parquet and", "duck-nvt.parquet", "differ in column",
                             "same schema", NULL});
}

/* kiln-train over a file still being written fails, names it and writes no
 * checkpoint. */
static void test_train_refuses_incomplete(void **state)
{
    (void)state;
    char spec[400], p[400], ckpt[400];
    bad_copy("duck-zstd-v2", "writing.parquet", p, sizeof p, cut_short);
    write_spec("writing", "parquet", "bad/writing.parquet", "pq-eval/duck-zstd-v2.parquet", spec,
               sizeof spec);
    proc_result_t *r = malloc(sizeof *r);
    json_t *v = train(spec, "writing", r);
    assert_null(v);
    assert_int_not_equal(r->code, 0);
    assert_non_null(strstr(r->err, "writing.parquet does not end with PAR1"));
    char uid[CKPT_UID_MAX];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt/writing", tmpdir);
    if (ckpt_latest(ckpt, uid) == 0)
        fail_msg("%s holds checkpoint %s", ckpt, uid);
    free(r);
}

/* An online run (kiln-train alone, no kilnd) starts on the complete
 * partition, passes over one still being written, and trains on it once the
 * writer finishes: max_steps needs both. */
static void test_online_waits_for_whole_files(void **state)
{
    (void)state;
    char spec[400], src[400], part[400], log[400], run_dir[400];
    pq_path(src, sizeof src, "pq", "duck-snappy-v1");
    snprintf(part, sizeof part, "%s/online/part-0.parquet", tmpdir);
    assert_int_equal(kiln_mkdir_parent(part), 0);
    assert_int_equal(fx_land(src, part), 0);
    size_t len;
    unsigned char *bytes = proc_read_file(src, &len);
    snprintf(part, sizeof part, "%s/online/part-1.parquet", tmpdir);
    FILE *f = fopen(part, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, len / 2, f), len / 2);
    fclose(f);
    /* 2 ranks x 300 rows a step: a file is 4 steps; 6 need part-1. */
    snprintf(spec, sizeof spec, "%s/online.yaml", tmpdir);
    fx_write(spec,
             "name: online\n"
             "data: {format: parquet, train: \"online/part-*.parquet\"}\n"
             "model: {type: lr, embedding: {dim: 4, capacity: 100000}}\n"
             "train: {mode: online, batch_size: 300, max_steps: 6, seed: 7, init_from: none}\n"
             "export: {every: none}\n"
             "checkpoint: {dir: ckpt/online, keep: 1}\n");
    snprintf(log, sizeof log, "%s/online.log", tmpdir);
    snprintf(run_dir, sizeof run_dir, "%s/online-run", tmpdir);
    const char *argv[] = {"mpirun", "-np", "2", "--oversubscribe", KILN_TRAIN_BIN, "--spec", spec,
                          "--run-dir", run_dir, "--quiet", "--threads", "1", NULL};
    pid_t pid = proc_spawn(log, NULL, argv);
    assert_true(pid > 0);
    int status = 0;
    proc_sleep_ms(3000);
    if (waitpid(pid, &status, WNOHANG) == pid) {
        char text[4096];
        proc_slurp(log, text, sizeof text);
        fail_msg("the online run ended (status %d) before part-1.parquet was whole: %s", status,
                 text);
    }
    f = fopen(part, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, len, f), len);
    fclose(f);
    free(bytes);
    int i = 0;
    for (; i < 600 && waitpid(pid, &status, WNOHANG) == 0; i++)
        proc_sleep_ms(100);
    if (i == 600) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("the online run did not reach max_steps within 60 s of part-1 completing");
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char text[4096];
        proc_slurp(log, text, sizeof text);
        fail_msg("the online run failed (status %d): %s", status, text);
    }
    char res[500], text[4096];
    snprintf(res, sizeof res, "%s/result.json", run_dir);
    proc_slurp(res, text, sizeof text);
    json_t *v = json_loads(text, 0, NULL);
    assert_non_null(v);
    assert_int_equal(json_integer_value(json_object_get(v, "steps")), 6);
    json_decref(v);
}

/* kiln convert --spec reads the spec's column mapping: its kiln-bin is the
 * library's with the same mapping, and a wrong-typed column is refused. */
static void test_convert_with_spec(void **state)
{
    (void)state;
    char spec[400], src[400], a[400], b[400];
    pq_path(src, sizeof src, "pq", "arrow-v2-delta-zstd");
    snprintf(spec, sizeof spec, "%s/conv.yaml", tmpdir);
    fx_write(spec, "name: conv\n"
                   "data:\n  format: parquet\n  train: x\n  dense_features: 1\n  cat_slots: 2\n"
                   "  columns: {label: label, dense: [I2], categorical: [C3, C1]}\n");
    snprintf(a, sizeof a, "%s/conv-cli.kb", tmpdir);
    snprintf(b, sizeof b, "%s/conv-lib.kb", tmpdir);
    proc_result_t *r = malloc(sizeof *r);
    const char *argv[] = {KILN_BIN, "convert", "--spec", spec, src, "--out", a, NULL};
    proc_run(r, tmpdir, argv);
    if (r->code != 0)
        fail_msg("kiln convert --spec: %d: %s", r->code, r->err);
    const char *dense[] = {"I2"}, *cat[] = {"C3", "C1"};
    const data_columns_t cols = {.label = "label", .dense = dense, .categorical = cat};
    const data_convert_opts_t opts = {.ndense = 1, .nslots = 2};
    const char *in[1] = {src};
    data_reader_stats_t st;
    assert_int_equal(data_convert_parquet_to_bin(in, 1, &cols, b, &opts, &st), 0);
    assert_int_equal(st.rows, ROWS);
    assert_same_file(b, a, "kiln convert --spec");
    fx_write(spec, "name: conv\n"
                   "data:\n  format: parquet\n  train: x\n  dense_features: 1\n  cat_slots: 2\n"
                   "  columns: {label: label, dense: [C2], categorical: [C3, C1]}\n");
    proc_run(r, tmpdir, argv);
    assert_int_not_equal(r->code, 0);
    assert_non_null(strstr(r->err, "column 'C2' is BYTE_ARRAY"));
    free(r);
}

PROC_TEST_MAIN(setup, proc_tmpdir_teardown, cmocka_unit_test(test_every_writer_reads_as_tsv),
               cmocka_unit_test(test_multihot_and_nvtabular),
               cmocka_unit_test(test_convert_with_spec),
               cmocka_unit_test(test_bad_files_refused),
               cmocka_unit_test(test_train_refuses_incomplete),
               cmocka_unit_test(test_online_waits_for_whole_files),
               cmocka_unit_test(test_train_matches_tsv))
