/*
 * ckpt/ckpt_export.c - turns a checkpoint (full, or full + incremental
 * chain, resolved first) into formats other stacks load: HugeCTR's model
 * files and plain .npy arrays.
 *
 * HugeCTR's sparse model is a folder per table with raw int64 `key` and
 * float32 `emb_vector`, row n of each matching. An fm row is (1 + k): the
 * slot's linear weight, then its factor; HugeCTR keeps the two as separate
 * embeddings (a 1-wide one feeding the sum, a k-wide one feeding FmOrder2),
 * so the row is cut in two folders, <table>_linear (1) and <table> (k).
 * HugeCTR's dense model file is the raw float32 parameters of the layers in
 * network order, each fully connected layer as its weight (in, out)
 * row-major then its bias (out): Kiln's (out, in) weights transposed.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_int.h"

int ckpt_export_format_parse(const char *s, ckpt_export_format_t *out)
{
    if (strcmp(s, "hugectr") == 0) {
        *out = CKPT_EXPORT_HUGECTR;
        return 0;
    }
    if (strcmp(s, "npy") == 0) {
        *out = CKPT_EXPORT_NPY;
        return 0;
    }
    return kiln_errf(KILN_EINVAL, "unknown export format '%s'; use hugectr or npy", s);
}

/* Writes a raw file (no header), fsynced. */
static int write_raw(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return ckpt_io_err(errno, "creating", path);
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int rc = ckpt_io_err(w < 0 ? errno : ENOSPC, "writing", path);
            close(fd);
            unlink(path);
            return rc;
        }
        p += w;
        len -= (size_t)w;
    }
    int rc = fsync(fd) < 0 ? ckpt_io_err(errno, "syncing", path) : 0;
    close(fd);
    return rc;
}

static int write_npy(const char *dir, const char *name, npy_dtype_t dt, int64_t rows, int64_t cols,
                     const void *data, int64_t *bytes)
{
    npy_writer_t w;
    KILN_CHECK(npy_open(&w, dir, name, dt, rows, cols));
    size_t len = (size_t)rows * (size_t)(cols > 0 ? cols : 1) * npy_dtype_size(dt);
    int rc = npy_write(&w, data, len);
    if (rc < 0) {
        npy_abort(&w);
        return rc;
    }
    ckpt_file_t f;
    KILN_CHECK(npy_close(&w, &f));
    *bytes += f.size;
    return 0;
}

/* Writes dir/key (n) and dir/emb_vector (n, w): columns [c0, c0 + w) of
 * rows' values. */
static int write_hugectr_table(const char *dir, const ckpt_rows_t *rows, int c0, int w,
                               int64_t *total)
{
    char *kp = kiln_asprintf("%s/key", dir);
    char *vp = kiln_asprintf("%s/emb_vector", dir);
    float *cut = NULL;
    const float *vals = rows->values;
    int rc = kp && vp ? kiln_mkdir_p(dir) : KILN_ENOMEM;
    if (rc == 0 && w != rows->dim) { /* an fm row's part: (n, w) of (n, dim) */
        cut = kiln_calloc((size_t)rows->n * (size_t)w + 1, sizeof(float));
        rc = cut ? 0 : KILN_ENOMEM;
        for (int64_t i = 0; cut != NULL && i < rows->n; i++)
            memcpy(cut + i * w, rows->values + i * rows->dim + c0, (size_t)w * sizeof(float));
        vals = cut;
    }
    if (rc == 0)
        rc = write_raw(kp, rows->keys, (size_t)rows->n * sizeof(int64_t));
    if (rc == 0)
        rc = write_raw(vp, vals, (size_t)rows->n * (size_t)w * sizeof(float));
    if (rc == 0) {
        *total += rows->n * (int64_t)(sizeof(int64_t) + (size_t)w * sizeof(float));
        rc = kiln_fsync_dir(dir);
    }
    free(cut);
    free(kp);
    free(vp);
    return rc;
}

/* The dense model file: each matrix of d transposed, in order. */
static int write_hugectr_dense(const ckpt_t *last, const ckpt_export_dense_t *d,
                               const char *out_dir, int64_t *total)
{
    ckpt_array_t *a = NULL;
    int na = 0;
    KILN_CHECK(ckpt_read_dense(last, &a, &na));
    const ckpt_array_t *params = NULL;
    for (int i = 0; i < na; i++)
        if (strcmp(a[i].name, "dense.params") == 0)
            params = &a[i];
    size_t want = 0;
    for (int i = 0; i < d->n; i++)
        want += (size_t)d->m[i].rows * (size_t)d->m[i].cols;
    int rc = 0;
    float *out = NULL;
    char *path = kiln_asprintf("%s/%s", out_dir, d->file);
    if (params == NULL || params->count != want) {
        rc = kiln_errf(KILN_EINVAL, "the job's spec describes %zu dense parameters, checkpoint %s "
                                    "holds %zu: was the model changed since it was written?",
                       want, last->info.uid, params ? params->count : (size_t)0);
        goto out;
    }
    out = kiln_calloc(want + 1, sizeof(float));
    if (out == NULL || path == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    size_t off = 0;
    for (int i = 0; i < d->n; i++) { /* (rows, cols) -> (cols, rows) */
        const int R = d->m[i].rows, C = d->m[i].cols;
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++)
                out[off + (size_t)c * (size_t)R + (size_t)r] =
                    params->data[off + (size_t)r * (size_t)C + (size_t)c];
        off += (size_t)R * (size_t)C;
    }
    rc = write_raw(path, out, want * sizeof(float));
    if (rc == 0)
        *total += (int64_t)(want * sizeof(float));
out:
    free(out);
    free(path);
    ckpt_arrays_free(a, na);
    return rc;
}

int ckpt_export(const ckpt_chain_t *ch, ckpt_export_format_t fmt, const char *out_dir,
                   const ckpt_export_dense_t *dense, int64_t *bytes)
{
    if (ch->n == 0)
        return kiln_errf(KILN_EINVAL, "empty checkpoint chain");
    const ckpt_t *last = ch->items[ch->n - 1];
    int64_t total = 0;
    int rc = kiln_mkdir_p(out_dir);
    if (rc < 0)
        return rc;
    /* Every table any link of the chain has, in the order of the last. */
    for (int t = 0; t < last->info.ntables && rc == 0; t++) {
        const char *name = last->info.tables[t].name;
        ckpt_rows_t rows;
        rc = ckpt_read_table(ch, name, &rows);
        if (rc < 0)
            break;
        if (fmt == CKPT_EXPORT_HUGECTR) {
            bool fm = strcmp(last->info.model, "fm") == 0 && rows.dim > 1;
            char *dir = kiln_asprintf("%s/%s", out_dir, name);
            char *lin = kiln_asprintf("%s/%s_linear", out_dir, name);
            rc = dir && lin ? 0 : KILN_ENOMEM;
            if (rc == 0 && fm)
                rc = write_hugectr_table(lin, &rows, 0, 1, &total);
            if (rc == 0)
                rc = write_hugectr_table(dir, &rows, fm ? 1 : 0, fm ? rows.dim - 1 : rows.dim,
                                         &total);
            free(dir);
            free(lin);
        } else {
            char kn[160], vn[160];
            snprintf(kn, sizeof kn, "%s.keys.npy", name);
            snprintf(vn, sizeof vn, "%s.values.npy", name);
            rc = write_npy(out_dir, kn, NPY_I8, rows.n, 0, rows.keys, &total);
            if (rc == 0)
                rc = write_npy(out_dir, vn, NPY_F4, rows.n, rows.dim, rows.values, &total);
        }
        ckpt_rows_fini(&rows);
    }
    if (rc == 0 && fmt == CKPT_EXPORT_HUGECTR && dense != NULL)
        rc = write_hugectr_dense(last, dense, out_dir, &total);
    if (rc == 0 && fmt == CKPT_EXPORT_NPY) {
        ckpt_array_t *a = NULL;
        int na = 0;
        rc = ckpt_read_dense(last, &a, &na);
        for (int i = 0; rc == 0 && i < na; i++) {
            char n[160];
            snprintf(n, sizeof n, "%s.npy", a[i].name);
            rc = write_npy(out_dir, n, NPY_F4, (int64_t)a[i].count, 0, a[i].data, &total);
        }
        ckpt_arrays_free(a, na);
    }
    if (rc == 0)
        rc = kiln_fsync_dir(out_dir);
    if (bytes)
        *bytes = total;
    return rc;
}
