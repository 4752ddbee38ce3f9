/*
 * data/data_reader.c - the batch reader kiln-train consumes. It treats its
 * files as one row sequence, deals rows to ranks block-cyclically (global
 * step k, rank r: rows [k*B*N + r*B, k*B*N + (r+1)*B)), and runs a producer
 * thread that reads and parses up to `prefetch` batches ahead into a ring of
 * reusable batch buffers while the trainer computes; with prefetch 0 the
 * caller makes each batch itself, on its OpenMP team (data.h says when
 * that is better). Every rank returns the
 * same number of batches, short or empty ones at the end, because the
 * trainer does collectives every step. The rows it reads go through the
 * batch builder (data_batch.c), as data_bin.c's do. Parquet files
 * (data_parquet.c) are read like kiln-bin ones: row counts from their
 * footers at open, and the producer decodes the row groups that hold this
 * rank's rows, one row group at a time.
 *
 * A TSV batch is made from the cursor's buffer in place, a window at a
 * time: the team counts the window's newlines (each thread its own part of
 * the bytes; one thread alone just finds them), places the lines, and
 * parses them into tsv_rows_t (keys slot-major); then the rows move into
 * the batch a slot at a time
 * (data_builder_add_rows). Nothing is copied and nothing is serial but a
 * prefix sum. A line the window does not hold whole (the end of the
 * buffer, a line over DATA_TSV_MAX_LINE being dropped) goes through
 * data_tsv_cursor_next, one at a time. Malformed lines are counted in row
 * order, so the stats read the same on any number of threads.
 */
#include "data_int.h"
#include "data_parquet_int.h"

#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the reader ------------------------------------------------------------------ */

/* One TSV batch: where its lines are, and their fields (keys slot-major). */
typedef struct {
    size_t *at;            /* [cap] row i's line starts at the window + at[i] */
    size_t *len;           /* [cap] */
    int *file;             /* [cap] the file and line number, for messages */
    int64_t *lineno;       /* [cap] */
    float *labels, *dense; /* [cap], [cap * ndense] */
    int cap;
    int64_t *keys;         /* [nslots * cap] slot-major: slot s of row i at s * cap + i */
    unsigned char *has;    /* [nslots * cap] */
    unsigned char *skip;   /* [cap] malformed: why[i] says why */
    char (*why)[DATA_MESSAGE_LEN]; /* [cap] */
} tsv_rows_t;

struct data_reader {
    /* set at open, read-only afterwards */
    data_format_t fmt;
    int rank, nranks, batch, ndense, nslots;
    int npaths;
    char **paths;          /* [npaths] owned copies */
    int64_t *file_start;   /* [npaths + 1] global row where file f starts */
    int64_t total_rows, nsteps;
    data_bin_file_t **bins;  /* [npaths] for DATA_FMT_BIN */
    data_pq_file_t **pqs;    /* [npaths] for DATA_FMT_PARQUET */
    int pq_cur;            /* producer: the Parquet file holding a decoded row group */

    bool on_caller;        /* prefetch 0: no producer thread (data.h) */
    int64_t next_k;        /* on_caller: the step data_reader_next makes next */
    int64_t prepass_bytes; /* TSV: bytes the row count read at open */

    /* producer-owned */
    data_tsv_cursor_t *cur;
    int64_t cur_row;       /* TSV: global row the cursor stands at */
    double line_bytes;     /* TSV: the mean line length so far, to size a window */
    data_batch_builder_t bb;
    tsv_rows_t tr;         /* TSV: the batch being parsed */

    /* the ring, guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t cv_filled, cv_free;
    int nbuf;              /* prefetch + 1: one more than the producer may fill */
    data_batch_t *bufs;      /* [nbuf] */
    int head, tail, nfilled, held;
    int done, stop, err_code;
    char err_msg[512];
    data_reader_stats_t stats;
    pthread_t thread;
    int thread_started;
};

int64_t data_reader_total_rows(const data_reader_t *r)
{
    return r->total_rows;
}

int64_t data_reader_nsteps(const data_reader_t *r)
{
    return r->nsteps;
}

void data_reader_stats(data_reader_t *r, data_reader_stats_t *out)
{
    pthread_mutex_lock(&r->mu);
    *out = r->stats;
    pthread_mutex_unlock(&r->mu);
}

static void tsv_rows_fini(tsv_rows_t *t)
{
    KILN_FREE_ALL(t->at, t->len, t->file, t->lineno, t->labels, t->dense, t->keys,
                  t->has, t->skip, t->why);
}

static int tsv_rows_init(tsv_rows_t *t, int cap, int ndense, int nslots)
{
    const size_t n = (size_t)cap, D = (size_t)ndense + 1, S = (size_t)nslots + 1;
    t->cap = cap;
    t->at = kiln_calloc(n, sizeof *t->at);
    t->len = kiln_calloc(n, sizeof *t->len);
    t->file = kiln_calloc(n, sizeof *t->file);
    t->lineno = kiln_calloc(n, sizeof *t->lineno);
    t->labels = kiln_calloc(n, sizeof *t->labels);
    t->dense = kiln_calloc(n * D, sizeof *t->dense);
    t->keys = kiln_calloc(n * S, sizeof *t->keys);
    t->has = kiln_calloc(n * S, 1);
    t->skip = kiln_calloc(n, 1);
    t->why = kiln_calloc(n, sizeof *t->why);
    if (!t->at || !t->len || !t->file || !t->lineno || !t->labels || !t->dense || !t->keys ||
        !t->has || !t->skip || !t->why)
        return KILN_ENOMEM;
    return 0;
}

/* Parses row i of the batch from line p[0..len) (NULL: a line too long,
 * dropped by the cursor). */
static void parse_row(data_reader_t *r, int i, const char *p, size_t len)
{
    tsv_rows_t *t = &r->tr;
    const int D = r->ndense, S = r->nslots;
    if (p == NULL || len > DATA_TSV_MAX_LINE) {
        t->skip[i] = 1;
        snprintf(t->why[i], DATA_MESSAGE_LEN, "line longer than %d bytes", DATA_TSV_MAX_LINE);
        return;
    }
    t->skip[i] = data_tsv_parse_row(p, len, D, S, &t->labels[i], t->dense + (size_t)i * (size_t)D,
                                    t->keys + i, t->has + i, (size_t)t->cap, t->why[i],
                                    DATA_MESSAGE_LEN) < 0;
}

/* Places and parses rows [i, i + k) from the first whole lines of window
 * w[0..avail) (k at most want; 0 when the window holds no '\n' in the
 * bytes looked at). The window is cut where `want` lines should end, from
 * the mean line length, and looked at further when that was short. Each
 * thread of the team counts the newlines of its share of the bytes, a
 * prefix sum gives each its first row, and it places its lines; then the
 * rows are parsed, split over the team. Returns k; *used = the bytes they
 * took, newlines included. */
static int window_rows(data_reader_t *r, int i, int want, const char *w, size_t avail,
                       size_t *used)
{
    tsv_rows_t *t = &r->tr;
    size_t limit = (size_t)((double)want * r->line_bytes * 1.125) + 4096;
    if (limit > avail)
        limit = avail;
    int k = 0;
    size_t from = 0;
    enum { MAXT = 64 };
    int counts[MAXT + 1];
    while (k < want && from < limit) {
        int found;
        if (!r->on_caller || limit - from < 65536 || omp_get_max_threads() == 1) {
            /* One thread: it places the lines as it finds them. */
            found = data_tsv_find_nl(w + from, limit - from, from, t->len + i + k, want - k);
        } else {
            int nt = 1;
#pragma omp parallel
            {
#pragma omp single
                nt = omp_get_num_threads() < MAXT ? omp_get_num_threads() : MAXT;
                const int me = omp_get_thread_num();
                const size_t seg = limit - from;
                const size_t a = from + seg * (size_t)me / (size_t)nt;
                const size_t e = from + seg * (size_t)(me + 1) / (size_t)nt;
                if (me < nt)
                    counts[me + 1] = (int)data_tsv_count_nl(w + a, e - a);
#pragma omp barrier
#pragma omp single
                {
                    counts[0] = k;
                    for (int x = 1; x <= nt; x++)
                        counts[x] += counts[x - 1];
                }
                if (me < nt && counts[me] < want) /* the newlines' offsets, for now */
                    data_tsv_find_nl(w + a, e - a, a, t->len + i + counts[me], want - counts[me]);
            }
            found = counts[nt] - k;
        }
        k += found < want - k ? found : want - k;
        from = limit;
        if (k < want && limit < avail) { /* the estimate was short: look further */
            limit += (size_t)((double)(want - k) * r->line_bytes * 1.125) + 4096;
            if (limit > avail)
                limit = avail;
        }
    }
    if (k == 0)
        return 0;
    /* Newline offsets -> line starts and lengths. */
    size_t start = 0;
    for (int j = 0; j < k; j++) {
        size_t nl = t->len[i + j];
        t->at[i + j] = start;
        t->len[i + j] = nl - start;
        start = nl + 1;
    }
    *used = start;
#pragma omp parallel for schedule(static) if (r->on_caller && k >= 256)
    for (int j = i; j < i + k; j++)
        parse_row(r, j, w + t->at[j], t->len[j]);
    r->line_bytes = 0.75 * r->line_bytes + 0.25 * (double)start / (double)k;
    return k;
}

/* Parses TSV rows [lo, hi) (global) into r->tr, the cursor standing at
 * r->cur_row <= lo, window by window (see the top of this file). */
static int parse_tsv(data_reader_t *r, int64_t lo, int64_t hi)
{
    tsv_rows_t *t = &r->tr;
    int rc;
    if (lo > r->cur_row) {
        KILN_CHECK(data_tsv_cursor_skip(r->cur, lo - r->cur_row));
        r->cur_row = lo;
    }
    const int n = (int)(hi - lo);
    for (int i = 0; i < n;) {
        const char *w;
        size_t avail = 0, used = 0;
        int file;
        int64_t lineno;
        rc = data_tsv_cursor_peek(r->cur, &w, &avail, &file, &lineno);
        if (rc < 0)
            return rc;
        if (rc == 0)
            return kiln_errf(KILN_ECORRUPT, "the data files ended at row %lld, before the %lld "
                             "rows counted at open; did they change while being read?",
                             (long long)(lo + i), (long long)r->total_rows);
        int k = avail > 0 ? window_rows(r, i, n - i, w, avail, &used) : 0;
        if (k > 0) {
            for (int j = 0; j < k; j++) {
                t->file[i + j] = file;
                t->lineno[i + j] = lineno + j;
            }
            data_tsv_cursor_consume(r->cur, used, k);
            i += k;
            continue;
        }
        /* No whole line in the window: the cursor reads on to its end. */
        const char *line;
        size_t len;
        int too_long;
        rc = data_tsv_cursor_next(r->cur, &line, &len, &too_long, &t->file[i], &t->lineno[i]);
        if (rc < 0)
            return rc;
        if (rc == 0)
            continue; /* peek says so next time round */
        parse_row(r, i, too_long ? NULL : line, len);
        i++;
    }
    r->cur_row = hi;
    return 0;
}

/* Appends TSV rows [lo, hi) (global) to the builder: parsed on the team
 * (on_caller) or this thread, moved in. Malformed lines are counted and
 * left out. */
static int fill_tsv(data_reader_t *r, int64_t lo, int64_t hi, data_batch_t *b)
{
    tsv_rows_t *t = &r->tr;
    const int n = (int)(hi - lo);
    KILN_CHECK(parse_tsv(r, lo, hi));
    int bad = 0;
    for (int i = 0; i < n; i++)
        bad += t->skip[i];
    if (bad > 0) {
        pthread_mutex_lock(&r->mu);
        for (int i = 0; i < n; i++)
            if (t->skip[i])
                data_stats_malformed(&r->stats, r->paths[t->file[i]], t->lineno[i], t->why[i]);
        pthread_mutex_unlock(&r->mu);
        b->nskipped += bad;
    }
    data_rows_t rows = {.n = n, .stride = (size_t)t->cap, .labels = t->labels, .dense = t->dense,
                        .keys = t->keys, .has = t->has, .skip = t->skip};
    return data_builder_add_rows(&r->bb, b, &rows);
}

/* Appends Parquet rows [lo, hi) of file f; rows with a bad label are
 * counted in the reader's stats. Rows are read in order, so moving on to
 * a file frees the one before it: the reader holds one decoded row group. */
static int read_pq(data_reader_t *r, int f, int64_t lo, int64_t hi, data_batch_t *b, int64_t *bytes)
{
    data_reader_stats_t bad = {0};
    if (r->pq_cur != f) {
        data_pq_release(r->pqs[r->pq_cur]);
        r->pq_cur = f;
    }
    int rc = data_pq_read_rows(r->pqs[f], lo, hi, &r->bb, b, &bad, bytes);
    if (bad.malformed > 0) {
        pthread_mutex_lock(&r->mu);
        for (int i = 0; i < bad.nmessages && r->stats.nmessages < DATA_MAX_MESSAGES; i++)
            memcpy(r->stats.messages[r->stats.nmessages++], bad.messages[i], DATA_MESSAGE_LEN);
        r->stats.malformed += bad.malformed;
        pthread_mutex_unlock(&r->mu);
    }
    return rc;
}

/* Appends kiln-bin or Parquet rows [lo, hi) (global) to the builder, file
 * by file. */
static int fill_files(data_reader_t *r, int64_t lo, int64_t hi, data_batch_t *b, int64_t *bytes)
{
    for (int f = 0; f < r->npaths && lo < hi; f++) {
        int64_t fs = r->file_start[f], fe = r->file_start[f + 1];
        int64_t a = lo > fs ? lo : fs, e = hi < fe ? hi : fe;
        if (a >= e)
            continue;
        int rc = r->fmt == DATA_FMT_PARQUET
                     ? read_pq(r, f, a - fs, e - fs, b, bytes)
                     : data_bin_read_rows(r->bins[f], a - fs, e - fs, &r->bb, b, bytes);
        if (rc < 0)
            return rc;
        lo = e;
    }
    return 0;
}

/* Fills b with this rank's part of global step k. */
static int produce_step(data_reader_t *r, int64_t k, data_batch_t *b)
{
    const int64_t B = r->batch, N = r->nranks;
    int64_t lo = k * B * N + (int64_t)r->rank * B;
    int64_t hi = lo + B;
    int64_t bytes = 0;
    int rc;
    if (lo > r->total_rows)
        lo = r->total_rows;
    if (hi > r->total_rows)
        hi = r->total_rows;
    data_builder_reset(&r->bb);
    b->step = k;
    b->first_row = lo;
    b->nskipped = 0;
    if (r->fmt == DATA_FMT_TSV)
        rc = fill_tsv(r, lo, hi, b);
    else
        rc = fill_files(r, lo, hi, b, &bytes);
    if (rc < 0)
        return rc;
    rc = data_builder_finish(&r->bb, b);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&r->mu);
    r->stats.rows += b->n;
    r->stats.bytes += bytes;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

static void *producer(void *arg)
{
    data_reader_t *r = arg;
    for (int64_t k = 0; k < r->nsteps; k++) {
        data_batch_t *b;
        int rc;
        pthread_mutex_lock(&r->mu);
        while (!r->stop && r->nfilled + r->held >= r->nbuf)
            pthread_cond_wait(&r->cv_free, &r->mu);
        if (r->stop) {
            pthread_mutex_unlock(&r->mu);
            return NULL;
        }
        b = &r->bufs[r->head];
        pthread_mutex_unlock(&r->mu);

        rc = produce_step(r, k, b);

        pthread_mutex_lock(&r->mu);
        if (r->cur)
            r->stats.bytes = r->prepass_bytes + data_tsv_cursor_bytes(r->cur);
        if (rc < 0) {
            r->err_code = rc;
            snprintf(r->err_msg, sizeof r->err_msg, "%s", kiln_errmsg());
            r->done = 1;
            pthread_cond_broadcast(&r->cv_filled);
            pthread_mutex_unlock(&r->mu);
            return NULL;
        }
        r->head = (r->head + 1) % r->nbuf;
        r->nfilled++;
        pthread_cond_signal(&r->cv_filled);
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_lock(&r->mu);
    r->done = 1;
    pthread_cond_broadcast(&r->cv_filled);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* data_reader_next without a producer: makes step next_k in the one buffer.
 * A failure stays: every later call returns it again. */
static int next_on_caller(data_reader_t *r, data_batch_t **batch)
{
    if (r->err_code < 0)
        return kiln_errf(r->err_code, "rank %d: %s", r->rank, r->err_msg);
    if (r->next_k >= r->nsteps)
        return 0;
    int rc = produce_step(r, r->next_k, &r->bufs[0]);
    if (rc < 0) {
        r->err_code = rc;
        snprintf(r->err_msg, sizeof r->err_msg, "%s", kiln_errmsg());
        return kiln_errf(rc, "rank %d: %s", r->rank, r->err_msg);
    }
    if (r->cur)
        r->stats.bytes = r->prepass_bytes + data_tsv_cursor_bytes(r->cur);
    r->next_k++;
    *batch = &r->bufs[0];
    return 1;
}

int data_reader_next(data_reader_t *r, data_batch_t **batch)
{
    int rc;
    if (r->on_caller)
        return next_on_caller(r, batch);
    pthread_mutex_lock(&r->mu);
    if (r->held) {
        r->held = 0;
        pthread_cond_signal(&r->cv_free);
    }
    while (r->nfilled == 0 && !r->done)
        pthread_cond_wait(&r->cv_filled, &r->mu);
    if (r->nfilled > 0) {
        *batch = &r->bufs[r->tail];
        r->tail = (r->tail + 1) % r->nbuf;
        r->nfilled--;
        r->held = 1;
        rc = 1;
    } else if (r->err_code < 0) {
        rc = kiln_errf(r->err_code, "rank %d: %s", r->rank, r->err_msg);
    } else {
        rc = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void data_reader_close(data_reader_t *r)
{
    if (!r)
        return;
    if (r->thread_started) {
        pthread_mutex_lock(&r->mu);
        r->stop = 1;
        pthread_cond_broadcast(&r->cv_free);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->thread, NULL);
    }
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv_filled);
    pthread_cond_destroy(&r->cv_free);
    for (int i = 0; r->bufs && i < r->nbuf; i++)
        data_batch_fini(&r->bufs[i]);
    free(r->bufs);
    for (int f = 0; r->bins && f < r->npaths; f++)
        data_bin_close(r->bins[f]);
    free(r->bins);
    for (int f = 0; r->pqs && f < r->npaths; f++)
        data_pq_close(r->pqs[f]);
    free(r->pqs);
    kiln_strv_free(r->paths, (size_t)r->npaths);
    free(r->file_start);
    data_tsv_cursor_destroy(r->cur);
    data_builder_fini(&r->bb);
    tsv_rows_fini(&r->tr);
    free(r);
}

/* Opens the Parquet files (footers, mapped columns, one schema for all). */
static int scan_parquet(data_reader_t *r, const data_columns_t *cols)
{
    r->pqs = kiln_calloc((size_t)r->npaths, sizeof *r->pqs);
    if (!r->pqs)
        return KILN_ENOMEM;
    for (int f = 0; f < r->npaths; f++) {
        KILN_CHECK(data_pq_open(r->paths[f], cols, r->ndense, r->nslots, &r->pqs[f]));
        if (f > 0)
            KILN_CHECK(data_pq_same_schema(r->pqs[0], r->pqs[f]));
        r->file_start[f + 1] = r->file_start[f] + data_pq_rows(r->pqs[f]);
    }
    return 0;
}

/* Counts rows (TSV pre-pass) or opens the kiln-bin or Parquet files,
 * filling file_start and the dimensions. */
static int scan_files(data_reader_t *r, int ndense, int nslots, const data_columns_t *cols)
{
    int rc;
    r->file_start[0] = 0;
    if (r->fmt == DATA_FMT_PARQUET) {
        r->ndense = ndense == DATA_DIMS_AUTO ? DATA_CRITEO_NDENSE : ndense;
        r->nslots = nslots == DATA_DIMS_AUTO ? DATA_CRITEO_NSLOTS : nslots;
        return scan_parquet(r, cols);
    }
    if (r->fmt == DATA_FMT_TSV) {
        r->ndense = ndense == DATA_DIMS_AUTO ? DATA_CRITEO_NDENSE : ndense;
        r->nslots = nslots == DATA_DIMS_AUTO ? DATA_CRITEO_NSLOTS : nslots;
        for (int f = 0; f < r->npaths; f++) {
            int64_t rows, bytes;
            rc = data_tsv_count_rows(r->paths[f], &rows, &bytes);
            if (rc < 0)
                return rc;
            r->stats.bytes += bytes;
            r->file_start[f + 1] = r->file_start[f] + rows;
        }
        return 0;
    }
    r->bins = kiln_calloc((size_t)r->npaths, sizeof *r->bins);
    if (!r->bins)
        return KILN_ENOMEM;
    for (int f = 0; f < r->npaths; f++) {
        rc = data_bin_open(r->paths[f], &r->bins[f]);
        if (rc < 0)
            return rc;
        const data_bin_info_t bi = data_bin_info(r->bins[f]);
        if (f == 0) {
            r->ndense = ndense == DATA_DIMS_AUTO ? bi.ndense : ndense;
            r->nslots = nslots == DATA_DIMS_AUTO ? bi.nslots : nslots;
        }
        if (bi.ndense != r->ndense || bi.nslots != r->nslots)
            return kiln_errf(KILN_EINVAL, "%s holds %d dense features and %d slots, but %d and "
                             "%d were expected", r->paths[f], bi.ndense, bi.nslots, r->ndense,
                             r->nslots);
        r->file_start[f + 1] = r->file_start[f] + bi.rows;
    }
    return 0;
}

int data_reader_open(const char *const *paths, int npaths, data_format_t format, int rank,
                   int nranks, int batch_size, int ndense, int nslots, int prefetch,
                   data_reader_t **out)
{
    return data_reader_open_cols(paths, npaths, format, NULL, rank, nranks, batch_size, ndense,
                               nslots, prefetch, out);
}

int data_reader_open_cols(const char *const *paths, int npaths, data_format_t format,
                        const data_columns_t *cols, int rank, int nranks, int batch_size,
                        int ndense, int nslots, int prefetch, data_reader_t **out)
{
    data_reader_t *r;
    int64_t per_step;
    int rc;
    if (npaths <= 0 || !paths)
        return kiln_errf(KILN_EINVAL, "the reader needs at least one data file");
    if (nranks <= 0 || rank < 0 || rank >= nranks)
        return kiln_errf(KILN_EINVAL, "bad rank %d of %d", rank, nranks);
    if (batch_size <= 0)
        return kiln_errf(KILN_EINVAL, "batch size must be positive, got %d", batch_size);
    if ((ndense < 0 && ndense != DATA_DIMS_AUTO) || (nslots < 0 && nslots != DATA_DIMS_AUTO))
        return kiln_errf(KILN_EINVAL, "bad dimensions %d dense, %d slots", ndense, nslots);
    if (prefetch < 0)
        prefetch = 0;
    r = kiln_calloc(1, sizeof *r);
    if (!r)
        return KILN_ENOMEM;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv_filled, NULL);
    pthread_cond_init(&r->cv_free, NULL);
    r->rank = rank;
    r->nranks = nranks;
    r->batch = batch_size;
    r->npaths = npaths;
    r->paths = kiln_calloc((size_t)npaths, sizeof *r->paths);
    r->file_start = kiln_calloc((size_t)npaths + 1, sizeof *r->file_start);
    if (!r->paths || !r->file_start) {
        rc = KILN_ENOMEM;
        goto fail;
    }
    for (int f = 0; f < npaths; f++) {
        r->paths[f] = kiln_strdup(paths[f]);
        if (!r->paths[f]) {
            rc = KILN_ENOMEM;
            goto fail;
        }
    }
    r->fmt = format;
    if (format == DATA_FMT_AUTO)
        KILN_CHECK_GOTO(data_format_detect(paths[0], &r->fmt), rc, fail);
    KILN_CHECK_GOTO(scan_files(r, ndense, nslots, cols), rc, fail);
    r->total_rows = r->file_start[npaths];
    per_step = (int64_t)batch_size * nranks;
    r->nsteps = (r->total_rows + per_step - 1) / per_step;

    r->prepass_bytes = r->stats.bytes;
    r->on_caller = prefetch == 0;
    r->nbuf = prefetch + 1;
    r->bufs = kiln_calloc((size_t)r->nbuf, sizeof *r->bufs);
    if (!r->bufs) {
        rc = KILN_ENOMEM;
        goto fail;
    }
    for (int i = 0; i < r->nbuf; i++)
        KILN_CHECK_GOTO(data_batch_init(&r->bufs[i], batch_size, r->ndense, r->nslots), rc, fail);
    KILN_CHECK_GOTO(data_builder_init(&r->bb, batch_size, r->ndense, r->nslots), rc, fail);
    r->bb.team = r->on_caller;
    for (int f = 0; r->pqs && f < npaths; f++)
        data_pq_set_team(r->pqs[f], r->on_caller);
    if (r->fmt == DATA_FMT_TSV) {
        KILN_CHECK_GOTO(data_tsv_cursor_create((const char *const *)r->paths, npaths, &r->cur), rc,
                        fail);
        KILN_CHECK_GOTO(tsv_rows_init(&r->tr, batch_size, r->ndense, r->nslots), rc, fail);
        r->line_bytes = 256; /* a Criteo line's size; learnt from the first window */
    }
    if (r->on_caller) {
        *out = r;
        return 0;
    }
    if (pthread_create(&r->thread, NULL, producer, r) != 0) {
        rc = kiln_errf(KILN_ENOMEM, "cannot start the data reader thread");
        goto fail;
    }
    r->thread_started = 1;
    *out = r;
    return 0;
fail:
    data_reader_close(r);
    return rc;
}
