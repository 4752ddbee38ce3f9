/*
 * ckpt/ckpt.c - writing checkpoints: the .npy writer, a rank's shard files
 * (full: every live row from kern_table_scan; incremental: the rows of
 * kern_table_changed_since plus the removal log), the dense arrays, the
 * manifest written last, and the fsync + rename that makes a checkpoint
 * appear whole or not at all. Rows are streamed in chunks, so a dump needs
 * memory for one chunk, not for the table. Layout: docs/checkpoint-format.md.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_int.h"

#define CHUNK_ROWS 65536

const char *ckpt_kind_name(ckpt_kind_t k)
{
    return k == CKPT_INCREMENTAL ? "incremental" : "full";
}

int ckpt_io_err(int err, const char *what, const char *path)
{
    if (err == ENOSPC || err == EFBIG || err == EDQUOT)
        return kiln_errf(KILN_ENOSPC,
                         "no space left while %s %s (%s): free space on that "
                         "device (or lower checkpoint.keep) and retry",
                         what, path, strerror(err));
    return kiln_errf(KILN_EIO, "cannot %s %s: %s", what, path, strerror(err));
}

/* ---- parts ---------------------------------------------------------------------------- */

int ckpt_part_create(ckpt_part_t **out)
{
    *out = kiln_calloc(1, sizeof **out);
    return *out ? 0 : KILN_ENOMEM;
}

void ckpt_part_destroy(ckpt_part_t *p)
{
    if (p == NULL)
        return;
    free(p->files);
    free(p);
}

int ckpt_part_add(ckpt_part_t *p, const ckpt_file_t *f)
{
    if (p->nfiles == p->cap) {
        int cap = p->cap ? p->cap * 2 : 16;
        ckpt_file_t *nf = kiln_reallocarray(p->files, (size_t)cap, sizeof *nf);
        if (nf == NULL)
            return KILN_ENOMEM;
        p->files = nf;
        p->cap = cap;
    }
    p->files[p->nfiles++] = *f;
    return 0;
}

int ckpt_part_table(ckpt_part_t *p, const ckpt_table_info_t *t)
{
    for (int i = 0; i < p->ntables; i++) {
        if (strcmp(p->tables[i].name, t->name) == 0) {
            p->tables[i].rows += t->rows;
            p->tables[i].evicted += t->evicted;
            return 0;
        }
    }
    if (p->ntables == CKPT_MAX_TABLES)
        return kiln_errf(KILN_ERANGE, "a checkpoint holds at most %d tables", CKPT_MAX_TABLES);
    p->tables[p->ntables++] = *t;
    return 0;
}

char *ckpt_part_encode(const ckpt_part_t *p)
{
    json_t *files = json_array(), *tables = json_array();
    for (int i = 0; files && i < p->nfiles; i++) {
        const ckpt_file_t *f = &p->files[i];
        char hex[17];
        json_array_append_new(files,
                              json_pack("{s:s, s:s, s:s, s:i, s:I, s:I, s:s}", "name", f->name,
                                        "table", f->table, "array", f->array, "rank", f->rank,
                                        "rows", (json_int_t)f->rows, "size", (json_int_t)f->size,
                                        "xxh64", kiln_hash_hex(f->xxh, hex, sizeof hex)));
    }
    for (int i = 0; tables && i < p->ntables; i++) {
        const ckpt_table_info_t *t = &p->tables[i];
        json_array_append_new(tables, json_pack("{s:s, s:i, s:i, s:b, s:I, s:I}", "name", t->name,
                                                "dim", t->dim, "nstate", t->nstate, "opt_steps",
                                                t->opt_steps, "rows", (json_int_t)t->rows,
                                                "evicted", (json_int_t)t->evicted));
    }
    json_t *o = json_pack("{s:o, s:o}", "files", files, "tables", tables);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s == NULL)
        kiln_errf(KILN_ENOMEM, "out of memory encoding a checkpoint part");
    return s;
}

int ckpt_part_merge(ckpt_part_t *p, const char *text)
{
    json_error_t e;
    json_t *o = json_loads(text, 0, &e);
    json_t *files = json_object_get(o, "files"), *tables = json_object_get(o, "tables");
    int rc = 0;
    if (!json_is_array(files) || !json_is_array(tables)) {
        rc = kiln_errf(KILN_ECORRUPT, "bad checkpoint part from another rank");
        goto out;
    }
    size_t i;
    json_t *v;
    json_array_foreach(files, i, v)
    {
        ckpt_file_t f = {0};
        const char *name = NULL, *table = NULL, *array = NULL, *hex = NULL;
        json_int_t rows = 0, size = 0;
        if (json_unpack(v, "{s:s, s:s, s:s, s:i, s:I, s:I, s:s}", "name", &name, "table", &table,
                        "array", &array, "rank", &f.rank, "rows", &rows, "size", &size, "xxh64",
                        &hex) < 0 ||
            kiln_hash_parse_hex(hex, &f.xxh) < 0) {
            rc = kiln_errf(KILN_ECORRUPT, "bad file entry in a checkpoint part");
            goto out;
        }
        snprintf(f.name, sizeof f.name, "%s", name);
        snprintf(f.table, sizeof f.table, "%s", table);
        snprintf(f.array, sizeof f.array, "%s", array);
        f.rows = rows;
        f.size = size;
        KILN_CHECK_GOTO(ckpt_part_add(p, &f), rc, out);
    }
    json_array_foreach(tables, i, v)
    {
        ckpt_table_info_t t = {0};
        const char *name = NULL;
        int steps = 0;
        json_int_t rows = 0, ev = 0;
        if (json_unpack(v, "{s:s, s:i, s:i, s:b, s:I, s:I}", "name", &name, "dim", &t.dim, "nstate",
                        &t.nstate, "opt_steps", &steps, "rows", &rows, "evicted", &ev) < 0) {
            rc = kiln_errf(KILN_ECORRUPT, "bad table entry in a checkpoint part");
            goto out;
        }
        snprintf(t.name, sizeof t.name, "%s", name);
        t.opt_steps = steps != 0;
        t.rows = rows;
        t.evicted = ev;
        KILN_CHECK_GOTO(ckpt_part_table(p, &t), rc, out);
    }
out:
    json_decref(o);
    return rc;
}

/* ---- .npy writer ------------------------------------------------------------------------- */

static const char *const npy_descr[] = {"<i8", "<f4", "<u4"};

size_t npy_dtype_size(npy_dtype_t dt)
{
    return dt == NPY_I8 ? 8 : 4;
}

static int write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (w == 0) {
            errno = ENOSPC;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int npy_open(npy_writer_t *w, const char *dir, const char *name, npy_dtype_t dt, int64_t rows,
             int64_t cols)
{
    *w = (npy_writer_t){.fd = -1};
    w->path = kiln_asprintf("%s/%s", dir, name);
    w->h = kiln_hasher_create(0);
    if (w->path == NULL || w->h == NULL) {
        npy_abort(w);
        return KILN_ENOMEM;
    }
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int rc = ckpt_io_err(errno, "creating", w->path);
        npy_abort(w);
        return rc;
    }
    char dict[160], shape[64];
    if (cols > 0)
        snprintf(shape, sizeof shape, "(%" PRId64 ", %" PRId64 ")", rows, cols);
    else
        snprintf(shape, sizeof shape, "(%" PRId64 ",)", rows);
    int dl = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                      npy_descr[dt], shape);
    /* magic(6) + version(2) + len(2) + dict + padding + '\n', a multiple of 64. */
    size_t total = (size_t)(10 + dl + 1 + 63) / 64 * 64;
    char hdr[256];
    memcpy(hdr, "\x93NUMPY\x01\x00", 8);
    uint16_t hl = (uint16_t)(total - 10);
    hdr[8] = (char)(hl & 0xff);
    hdr[9] = (char)(hl >> 8);
    memcpy(hdr + 10, dict, (size_t)dl);
    memset(hdr + 10 + dl, ' ', total - 10 - (size_t)dl);
    hdr[total - 1] = '\n';
    int rc = npy_write(w, hdr, total);
    if (rc < 0)
        npy_abort(w);
    return rc;
}

int npy_write(npy_writer_t *w, const void *data, size_t len)
{
    if (len == 0)
        return 0;
    if (write_all(w->fd, data, len) < 0)
        return ckpt_io_err(errno, "writing", w->path);
    kiln_hasher_update(w->h, data, len);
    w->size += (int64_t)len;
    return 0;
}

int npy_close(npy_writer_t *w, ckpt_file_t *f)
{
    int rc = 0;
    if (fsync(w->fd) < 0)
        rc = ckpt_io_err(errno, "syncing", w->path);
    if (close(w->fd) < 0 && rc == 0)
        rc = ckpt_io_err(errno, "closing", w->path);
    w->fd = -1;
    if (rc == 0 && f != NULL) {
        const char *base = strrchr(w->path, '/');
        snprintf(f->name, sizeof f->name, "%s", base ? base + 1 : w->path);
        f->size = w->size;
        f->xxh = kiln_hasher_digest(w->h);
    }
    if (rc < 0)
        unlink(w->path);
    free(w->path);
    kiln_hasher_destroy(w->h);
    *w = (npy_writer_t){.fd = -1};
    return rc;
}

void npy_abort(npy_writer_t *w)
{
    if (w->fd >= 0) {
        close(w->fd);
        unlink(w->path);
    }
    free(w->path);
    kiln_hasher_destroy(w->h);
    *w = (npy_writer_t){.fd = -1};
}

/* ---- shard files ------------------------------------------------------------------------- */

/* Index of the first value of v[0..n) that is NaN or infinite, or -1. */
static int64_t first_nonfinite(const float *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return i;
    return -1;
}

/* A checkpoint never holds a value that is not finite: a diverged run's
 * state would be served (or resumed) as if it were a model. */
static int refuse_nonfinite(const char *what, float v)
{
    return kiln_errf(KILN_ERANGE,
                     "%s holds %s: training diverged; the checkpoint is not written "
                     "(lower the learning rates or check the data)",
                     what, isnan(v) ? "NaN" : "an infinite value");
}

/* The arrays of one table's shard, written side by side chunk by chunk. */
enum { A_KEYS, A_VALUES, A_OPT, A_STEPS, A_COUNT };
static const char *const array_names[A_COUNT] = {"keys", "values", "opt", "opt_steps"};

/* One table's arrays being written: the writers, and what every chunk
 * is checked for. */
typedef struct {
    npy_writer_t w[A_COUNT];
    const char *tname;
    int rank, dim, ns;
    bool steps;
} rows_out_t;

/* Writes m rows given as parallel arrays (opt and sb as the arrays in
 * use), refusing values that are not finite. */
static int emit_rows(rows_out_t *o, int64_t m, const int64_t *kb, const float *vb,
                     const float *ob, const uint32_t *sb)
{
    const int dim = o->dim, ns = o->ns;
    int64_t bad = first_nonfinite(vb, m * dim), bad_opt = -1;
    if (bad < 0 && ns > 0)
        bad_opt = first_nonfinite(ob, m * ns * dim);
    if (bad >= 0 || bad_opt >= 0) {
        char what[256];
        int64_t row = bad >= 0 ? bad / dim : bad_opt / (ns * dim);
        snprintf(what, sizeof what, "table '%s' (rank %d): the %s of key %" PRId64, o->tname,
                 o->rank, bad >= 0 ? "row" : "optimizer state", kb[row]);
        return refuse_nonfinite(what, bad >= 0 ? vb[bad] : ob[bad_opt]);
    }
    KILN_CHECK(npy_write(&o->w[A_KEYS], kb, (size_t)m * 8));
    KILN_CHECK(npy_write(&o->w[A_VALUES], vb, (size_t)(m * dim) * 4));
    if (ns > 0)
        KILN_CHECK(npy_write(&o->w[A_OPT], ob, (size_t)(m * ns * dim) * 4));
    if (o->steps)
        KILN_CHECK(npy_write(&o->w[A_STEPS], sb, (size_t)m * 4));
    return 0;
}

/* kern_table_disk_each's callback: the rows on disk, straight through. */
static int emit_disk(void *ctx, int64_t n, const int64_t *keys, const float *values,
                     const float *opt, const uint32_t *opt_steps)
{
    return emit_rows(ctx, n, keys, values, opt, opt_steps);
}

/* Writes the rows (n) of t's RAM, then (disk_since > -2) the rows on disk
 * with stamp > disk_since: a tiered table's dump covers both tiers. */
static int write_rows(const char *dir, int rank, kern_table_t *t, const int32_t *rows, int64_t n,
                      int64_t disk_since, bool include_opt, int64_t *nout, ckpt_part_t *part)
{
    kern_slab_t sl;
    kern_table_slab(t, &sl);
    const int64_t *keys = kern_table_keys(t);
    const char *tname = kern_table_name(t);
    const int dim = sl.dim, ns = include_opt ? sl.nstate : 0;
    const bool steps = include_opt && sl.opt_steps != NULL;
    const int64_t width[A_COUNT] = {0, dim, (int64_t)ns * dim, 0};
    const npy_dtype_t dts[A_COUNT] = {NPY_I8, NPY_F4, NPY_F4, NPY_U4};
    const bool on[A_COUNT] = {true, true, ns > 0, steps};
    rows_out_t o = {.tname = tname, .rank = rank, .dim = dim, .ns = ns, .steps = steps};
    ckpt_file_t files[A_COUNT];
    int64_t ndisk = 0;
    int rc = kern_table_disk_count(t, disk_since, &ndisk);
    if (rc < 0)
        return rc;
    int64_t total = n + ndisk;
    int64_t chunk = n < CHUNK_ROWS ? (n > 0 ? n : 1) : CHUNK_ROWS;
    size_t rowb = 8 + 4 * (size_t)dim + 4 * (size_t)ns * (size_t)dim + 4;
    char *buf = kiln_malloc((size_t)chunk * rowb);
    for (int a = 0; a < A_COUNT; a++)
        o.w[a] = (npy_writer_t){.fd = -1};
    if (buf == NULL)
        return KILN_ENOMEM;
    for (int a = 0; a < A_COUNT; a++) {
        if (!on[a])
            continue;
        char name[160];
        snprintf(name, sizeof name, "%s.r%d.%s.npy", tname, rank, array_names[a]);
        KILN_CHECK_GOTO(npy_open(&o.w[a], dir, name, dts[a], total, width[a]), rc, out);
    }
    int64_t *kb = (int64_t *)buf;
    float *vb = (float *)(kb + chunk);
    float *ob = vb + chunk * dim;
    uint32_t *sb = (uint32_t *)(ob + chunk * ns * dim);
    for (int64_t at = 0; at < n; at += chunk) {
        int64_t m = n - at < chunk ? n - at : chunk;
        for (int64_t i = 0; i < m; i++) {
            int64_t r = rows[at + i];
            kb[i] = keys[r];
            memcpy(vb + i * dim, sl.values + r * dim, (size_t)dim * sizeof(float));
            if (ns > 0)
                memcpy(ob + i * ns * dim, sl.opt_state + r * ns * dim,
                       (size_t)(ns * dim) * sizeof(float));
            if (steps)
                sb[i] = sl.opt_steps[r];
        }
        KILN_CHECK_GOTO(emit_rows(&o, m, kb, vb, ob, sb), rc, out);
    }
    if (ndisk > 0)
        KILN_CHECK_GOTO(kern_table_disk_each(t, disk_since, emit_disk, &o), rc, out);
    for (int a = 0; a < A_COUNT; a++) {
        if (!on[a])
            continue;
        files[a] = (ckpt_file_t){.rank = rank, .rows = total};
        snprintf(files[a].table, sizeof files[a].table, "%s", tname);
        snprintf(files[a].array, sizeof files[a].array, "%s", array_names[a]);
        rc = npy_close(&o.w[a], &files[a]);
        if (rc < 0)
            goto out;
        KILN_CHECK_GOTO(ckpt_part_add(part, &files[a]), rc, out);
    }
    *nout = total;
out:
    for (int a = 0; a < A_COUNT; a++)
        if (o.w[a].path != NULL)
            npy_abort(&o.w[a]);
    free(buf);
    return rc;
}

/* Writes t's 1-D array `array` of n elements of dt, element i given by
 * get(src, i) (a key of the removal log, a counter of the sketch). */
static int write_flat(const char *dir, int rank, kern_table_t *t, const char *array,
                      npy_dtype_t dt, int64_t n, int64_t (*get)(const void *src, int64_t i),
                      const void *src, ckpt_part_t *part)
{
    char name[160];
    snprintf(name, sizeof name, "%s.r%d.%s.npy", kern_table_name(t), rank, array);
    npy_writer_t w;
    KILN_CHECK(npy_open(&w, dir, name, dt, n, 0));
    const size_t esz = dt == NPY_I8 ? 8 : 4;
    uint8_t buf[8 * 1024];
    for (int64_t at = 0; at < n; at += 1024) {
        int64_t m = n - at < 1024 ? n - at : 1024;
        for (int64_t i = 0; i < m; i++) {
            int64_t v = get(src, at + i);
            if (esz == 8)
                memcpy(buf + i * 8, &v, 8);
            else {
                uint32_t u = (uint32_t)v;
                memcpy(buf + i * 4, &u, 4);
            }
        }
        int rc = npy_write(&w, buf, (size_t)m * esz);
        if (rc < 0) {
            npy_abort(&w);
            return rc;
        }
    }
    ckpt_file_t f = {.rank = rank, .rows = n};
    snprintf(f.table, sizeof f.table, "%s", kern_table_name(t));
    snprintf(f.array, sizeof f.array, "%s", array);
    KILN_CHECK(npy_close(&w, &f));
    return ckpt_part_add(part, &f);
}

static int64_t evicted_key(const void *src, int64_t i) { return ((const kern_evicted_t *)src)[i].key; }
static int64_t counter(const void *src, int64_t i) { return ((const uint16_t *)src)[i]; }

/* The admission sketch of a table that has one, as uint32 counters (its
 * decay epoch follows from the checkpoint's step). */
static int write_admit(const char *dir, int rank, kern_table_t *t, ckpt_part_t *part)
{
    int64_t n = 0, epoch = 0;
    const uint16_t *c = kern_table_admit_sketch(t, &n, &epoch);
    return n > 0 ? write_flat(dir, rank, t, "admit", NPY_U4, n, counter, c, part) : 0;
}

static int write_evicted(const char *dir, int rank, kern_table_t *t, int64_t *nout,
                         ckpt_part_t *part)
{
    int64_t n = 0;
    const kern_evicted_t *ev = kern_table_evicted(t, &n);
    *nout = n;
    return write_flat(dir, rank, t, "evicted", NPY_I8, n, evicted_key, ev, part);
}

int ckpt_write_tables(const char *dir, int rank, int ntables, kern_table_t *const *tables,
                         int64_t since, bool include_opt, ckpt_part_t *part)
{
    int rc = 0;
    int32_t *rows = NULL;
    for (int ti = 0; ti < ntables; ti++) {
        kern_table_t *t = tables[ti];
        kern_slab_t sl;
        kern_table_slab(t, &sl);
        int64_t n = 0, nev = 0;
        if (since < 0) {
            int64_t cap = kern_table_size(t) + 1;
            rows = kiln_malloc((size_t)cap * sizeof *rows);
            if (rows == NULL)
                return KILN_ENOMEM;
            KILN_CHECK_GOTO(kern_table_scan(t, rows, cap, &n), rc, out);
        } else {
            /* The change list bounds the answer when since is at or after the
             * base; otherwise changed_since scans and may need the table size. */
            kern_table_stats_t st;
            kern_table_stats(t, &st);
            int64_t cap = st.changed_pending + 1;
            rows = kiln_malloc((size_t)cap * sizeof *rows);
            if (rows == NULL)
                return KILN_ENOMEM;
            rc = kern_table_changed_since(t, since, rows, cap, &n);
            if (rc == KILN_ERANGE) {
                free(rows);
                cap = kern_table_size(t) + 1;
                rows = kiln_malloc((size_t)cap * sizeof *rows);
                if (rows == NULL)
                    return KILN_ENOMEM;
                rc = kern_table_changed_since(t, since, rows, cap, &n);
            }
            if (rc < 0)
                goto out;
        }
        int64_t nall = 0;
        KILN_CHECK_GOTO(write_rows(dir, rank, t, rows, n, since, include_opt, &nall, part), rc,
                        out);
        n = nall;
        if (since >= 0)
            KILN_CHECK_GOTO(write_evicted(dir, rank, t, &nev, part), rc, out);
        if (include_opt)
            KILN_CHECK_GOTO(write_admit(dir, rank, t, part), rc, out);
        ckpt_table_info_t ti_ = {.dim = sl.dim,
                                    .nstate = include_opt ? sl.nstate : 0,
                                    .opt_steps = include_opt && sl.opt_steps != NULL,
                                    .rows = n,
                                    .evicted = nev};
        snprintf(ti_.name, sizeof ti_.name, "%s", kern_table_name(t));
        KILN_CHECK_GOTO(ckpt_part_table(part, &ti_), rc, out);
        free(rows);
        rows = NULL;
    }
out:
    free(rows);
    return rc;
}

int ckpt_write_dense(const char *dir, const ckpt_array_t *arrays, int narrays,
                        ckpt_part_t *part)
{
    for (int i = 0; i < narrays; i++) {
        char name[160];
        snprintf(name, sizeof name, "%s.npy", arrays[i].name);
        int64_t bad = first_nonfinite(arrays[i].data, (int64_t)arrays[i].count);
        if (bad >= 0) {
            char what[200];
            snprintf(what, sizeof what, "dense array %s (element %" PRId64 ")", arrays[i].name,
                     bad);
            return refuse_nonfinite(what, arrays[i].data[bad]);
        }
        npy_writer_t w;
        KILN_CHECK(npy_open(&w, dir, name, NPY_F4, (int64_t)arrays[i].count, 0));
        int rc = npy_write(&w, arrays[i].data, arrays[i].count * sizeof(float));
        if (rc < 0) {
            npy_abort(&w);
            return rc;
        }
        ckpt_file_t f = {.rank = 0, .rows = (int64_t)arrays[i].count};
        snprintf(f.array, sizeof f.array, "%s", arrays[i].name);
        KILN_CHECK(npy_close(&w, &f));
        KILN_CHECK(ckpt_part_add(part, &f));
    }
    return 0;
}

/* ---- manifest and commit ------------------------------------------------------------------ */

static json_t *manifest_json(const ckpt_info_t *in, const ckpt_part_t *all)
{
    json_t *tables = json_array(), *files = json_array();
    for (int i = 0; i < in->ntables; i++) {
        const ckpt_table_info_t *t = &in->tables[i];
        json_t *slots = json_array();
        if (t->nstate == 1)
            json_array_append_new(slots, json_string("adagrad_acc"));
        if (t->nstate == 2) {
            json_array_append_new(slots, json_string("adam_m"));
            json_array_append_new(slots, json_string("adam_v"));
        }
        json_array_append_new(
            tables, json_pack("{s:s, s:i, s:i, s:o, s:b, s:I, s:I}", "name", t->name, "dim", t->dim,
                              "nstate", t->nstate, "slots", slots, "opt_steps", t->opt_steps,
                              "rows", (json_int_t)t->rows, "evicted", (json_int_t)t->evicted));
    }
    for (int i = 0; i < all->nfiles; i++) {
        const ckpt_file_t *f = &all->files[i];
        char hex[17];
        json_array_append_new(files, json_pack("{s:s, s:I, s:s, s:s, s:s, s:i, s:I}", "name",
                                               f->name, "size", (json_int_t)f->size, "xxh64",
                                               kiln_hash_hex(f->xxh, hex, sizeof hex), "table",
                                               f->table, "array", f->array, "rank", f->rank, "rows",
                                               (json_int_t)f->rows));
    }
    return json_pack("{s:s, s:i, s:s, s:s, s:s, s:s, s:i, s:s, s:s, s:s, s:s, s:s, s:b, s:i, "
                     "s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o}",
                     "format", "kiln-checkpoint", "version", CKPT_FORMAT_VERSION, "uid", in->uid,
                     "kind", ckpt_kind_name(in->kind), "parent", in->parent, "base", in->base,
                     "chain", in->chain, "job", in->job, "model", in->model, "optimizer",
                     in->optimizer, "spec_hash", in->spec_hash, "inputs_hash", in->inputs_hash,
                     "include_optimizer", in->include_optimizer, "world_size", in->world_size,
                     "step", (json_int_t)in->step, "since", (json_int_t)in->since, "epoch",
                     (json_int_t)in->epoch, "epoch_step", (json_int_t)in->epoch_step, "samples",
                     (json_int_t)in->samples, "dense_step", (json_int_t)in->dense_step, "keys",
                     (json_int_t)in->keys, "evicted", (json_int_t)in->evicted, "created_at",
                     (json_int_t)in->created_at, "tables", tables, "files", files);
}

int ckpt_commit(const char *root, const char *tmp_dir, ckpt_info_t *info,
                   const ckpt_part_t *all)
{
    int rc = 0;
    char *text = NULL, *mpath = NULL, *final = NULL;
    info->ntables = all->ntables;
    memcpy(info->tables, all->tables, sizeof(ckpt_table_info_t) * (size_t)all->ntables);
    info->keys = info->evicted = 0;
    for (int i = 0; i < all->ntables; i++) {
        info->keys += all->tables[i].rows;
        info->evicted += all->tables[i].evicted;
    }
    info->created_at = kiln_now_s();
    json_t *m = manifest_json(info, all);
    if (m != NULL && info->inputs != NULL)
        json_object_set_new(m, "inputs", json_loads(info->inputs, 0, NULL));
    text = m ? json_dumps(m, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(m);
    mpath = kiln_asprintf("%s/%s", tmp_dir, CKPT_MANIFEST);
    final = kiln_asprintf("%s/%s", root, info->uid);
    if (text == NULL || mpath == NULL || final == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    size_t len = strlen(text);
    int fd = open(mpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = ckpt_io_err(errno, "creating", mpath);
        goto out;
    }
    if (write_all(fd, text, len) < 0 || write_all(fd, "\n", 1) < 0 || fsync(fd) < 0) {
        rc = ckpt_io_err(errno, "writing", mpath);
        close(fd);
        goto out;
    }
    close(fd);
    int64_t bytes = (int64_t)len + 1;
    for (int i = 0; i < all->nfiles; i++)
        bytes += all->files[i].size;
    info->bytes = bytes;
    /* The checksum covers the manifest file as written (text and newline). */
    kiln_hasher_t *h = kiln_hasher_create(0);
    if (h == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    kiln_hasher_update(h, text, len);
    kiln_hasher_update(h, "\n", 1);
    kiln_hash_hex(kiln_hasher_digest(h), info->checksum, sizeof info->checksum);
    kiln_hasher_destroy(h);
    KILN_CHECK_GOTO(kiln_fsync_dir(tmp_dir), rc, out);
    if (rename(tmp_dir, final) < 0) {
        rc = errno == EEXIST || errno == ENOTEMPTY
                 ? kiln_errf(KILN_EEXIST, "checkpoint %s already exists", final)
                 : kiln_errf(KILN_EIO, "cannot rename %s to %s: %s", tmp_dir, final,
                             strerror(errno));
        goto out;
    }
    rc = kiln_fsync_dir(root);
out:
    KILN_FREE_ALL(text, mpath, final);
    return rc;
}

int ckpt_remove(const char *dir)
{
    char *m = kiln_asprintf("%s/%s", dir, CKPT_MANIFEST);
    if (m == NULL)
        return KILN_ENOMEM;
    unlink(m);
    free(m);
    DIR *d = opendir(dir);
    if (d == NULL)
        return errno == ENOENT ? 0
                               : kiln_errf(KILN_EIO, "cannot open %s: %s", dir, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char *p = kiln_asprintf("%s/%s", dir, e->d_name);
        if (p == NULL) {
            rc = KILN_ENOMEM;
            break;
        }
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            rc = ckpt_remove(p);
        else if (unlink(p) < 0 && errno != ENOENT)
            rc = kiln_errf(KILN_EIO, "cannot remove %s: %s", p, strerror(errno));
        free(p);
        if (rc < 0)
            break;
    }
    closedir(d);
    if (rc == 0 && rmdir(dir) < 0 && errno != ENOENT)
        rc = kiln_errf(KILN_EIO, "cannot remove %s: %s", dir, strerror(errno));
    return rc;
}

void ckpt_mark_dumped(int ntables, kern_table_t *const *tables, int64_t step)
{
    for (int t = 0; t < ntables; t++) {
        kern_table_set_base(tables[t], step);
        kern_table_evicted_clear(tables[t]);
    }
}

void ckpt_new_uid(int64_t step, char *buf)
{
    static int64_t last_ms;
    int64_t ms = kiln_now_ms();
    if (ms <= last_ms)
        ms = last_ms + 1;
    last_ms = ms;
    snprintf(buf, CKPT_UID_MAX, "%013" PRId64 "-%012" PRId64, ms, step < 0 ? 0 : step);
}
