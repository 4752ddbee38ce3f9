/*
 * data/data_bin.c - kiln-bin, Kiln's compact binary training-data format:
 * a 64-byte header, chunks of up to chunk_rows rows (labels, dense floats
 * after log1p, per-(slot,row) key counts, keys slot-major) and a chunk index
 * at the end, every part covered by an xxh64 checksum. A reader seeks to
 * the chunk holding row i (i / chunk_rows) without scanning. This file has
 * the writer and the chunk reader (the converters that use the writer are in
 * data_convert.c); the layout byte by byte is in docs/data-formats.md. All integers are little endian.
 */
#include "data_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kiln-bin is read and written with memcpy, which assumes a little-endian host"
#endif

#define BIN_MAGIC "KILNBIN1"
#define BIN_VERSION 1u
#define BIN_HEADER_SIZE 64
#define BIN_ENTRY_SIZE 32
#define BIN_CHUNK_HEADER 16
#define BIN_FLAG_MULTIHOT 1u
#define BIN_MAX_BAG 65535

typedef struct {
    uint64_t offset;
    uint64_t size;
    uint32_t nrows;
    uint64_t checksum;
} bin_entry_t;

static size_t pad8(size_t x)
{
    return (x + 7) & ~(size_t)7;
}

static void put32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static void put64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static uint32_t get32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t get64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Bytes of a chunk of n rows and nkeys keys. */
static size_t chunk_size(size_t n, int ndense, int nslots, uint64_t nkeys)
{
    return BIN_CHUNK_HEADER + pad8(n) + pad8(n * (size_t)ndense * 4) +
           pad8(n * (size_t)nslots * 2) + (size_t)nkeys * 8;
}

static int write_all(int fd, const void *p, size_t n, const char *path)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return kiln_errf(errno == ENOSPC ? KILN_ENOSPC : KILN_EIO, "cannot write %s: %s",
                             path, strerror(errno));
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static int pread_all(int fd, void *p, size_t n, uint64_t off, const char *path)
{
    char *c = p;
    while (n > 0) {
        ssize_t r = pread(fd, c, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return kiln_errf(KILN_EIO, "cannot read %s: %s", path, strerror(errno));
        if (r == 0)
            return kiln_errf(KILN_ECORRUPT, "%s ends early (at byte %llu): the kiln-bin file "
                             "is truncated", path, (unsigned long long)off);
        c += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/* ---- the writer --------------------------------------------------------------- */

struct data_bin_writer {
    kiln_atomic_t out;  /* the file, written to a temporary name until commit */
    const char *tmp;    /* its temporary name (owned by out), for messages */
    int fd;             /* out's descriptor: chunks are written, the header pwritten */
    int ndense, nslots, chunk_rows;
    uint32_t flags;
    uint64_t nrows, offset;
    /* the chunk being filled */
    int n;
    unsigned char *labels; /* [chunk_rows] */
    float *dense;          /* [chunk_rows * ndense] */
    uint16_t *counts;      /* [nslots * chunk_rows], slot s row i at s*chunk_rows+i */
    int64_t **skeys;       /* [nslots][scap[s]] */
    int64_t *slen, *scap;  /* [nslots] */
    unsigned char *cbuf;   /* serialised chunk */
    size_t ccap;
    bin_entry_t *entries;
    int nentries, centries;
};

int data_bin_writer_create(const char *path, int ndense, int nslots, int chunk_rows,
                         data_bin_writer_t **out)
{
    data_bin_writer_t *w;
    unsigned char zero[BIN_HEADER_SIZE] = {0};
    int rc = KILN_ENOMEM;
    if (ndense < 0 || nslots < 0 || ndense > 65536 || nslots > 65536)
        return kiln_errf(KILN_EINVAL, "kiln-bin: bad dimensions %d dense, %d slots", ndense,
                         nslots);
    if (chunk_rows <= 0)
        chunk_rows = DATA_BIN_CHUNK_ROWS;
    w = kiln_calloc(1, sizeof *w);
    if (!w)
        return KILN_ENOMEM;
    w->fd = -1;
    w->ndense = ndense;
    w->nslots = nslots;
    w->chunk_rows = chunk_rows;
    w->labels = kiln_calloc((size_t)chunk_rows, 1);
    w->dense = kiln_calloc((size_t)chunk_rows * (size_t)(ndense ? ndense : 1), sizeof(float));
    w->counts = kiln_calloc((size_t)chunk_rows * (size_t)(nslots ? nslots : 1), sizeof(uint16_t));
    w->skeys = kiln_calloc((size_t)(nslots ? nslots : 1), sizeof(int64_t *));
    w->slen = kiln_calloc((size_t)(nslots ? nslots : 1), sizeof(int64_t));
    w->scap = kiln_calloc((size_t)(nslots ? nslots : 1), sizeof(int64_t));
    if (!w->labels || !w->dense || !w->counts || !w->skeys || !w->slen ||
        !w->scap)
        goto fail;
    if ((rc = kiln_atomic_open(path, &w->out)) < 0)
        goto fail;
    w->tmp = w->out.tmp;
    w->fd = fileno(w->out.f); /* no stdio writes: nothing buffered */
    rc = write_all(w->fd, zero, sizeof zero, w->tmp);
    if (rc < 0)
        goto fail;
    w->offset = BIN_HEADER_SIZE;
    *out = w;
    return 0;
fail:
    data_bin_writer_abort(w);
    return rc;
}

/* Serialises the pending rows as one chunk and writes it. */
static int flush_chunk(data_bin_writer_t *w)
{
    const size_t n = (size_t)w->n;
    const int S = w->nslots, D = w->ndense;
    uint64_t nkeys = 0;
    size_t size, pos;
    int rc;
    if (n == 0)
        return 0;
    for (int s = 0; s < S; s++)
        nkeys += (uint64_t)w->slen[s];
    size = chunk_size(n, D, S, nkeys);
    if (size > w->ccap) {
        unsigned char *nb = realloc(w->cbuf, size);
        if (!nb)
            return kiln_errf(KILN_ENOMEM, "out of memory for a %zu-byte kiln-bin chunk", size);
        w->cbuf = nb;
        w->ccap = size;
    }
    memset(w->cbuf, 0, size);
    put32(w->cbuf, (uint32_t)n);
    put64(w->cbuf + 8, nkeys);
    pos = BIN_CHUNK_HEADER;
    memcpy(w->cbuf + pos, w->labels, n);
    pos += pad8(n);
    memcpy(w->cbuf + pos, w->dense, n * (size_t)D * 4);
    pos += pad8(n * (size_t)D * 4);
    for (int s = 0; s < S; s++)
        memcpy(w->cbuf + pos + (size_t)s * n * 2, w->counts + (size_t)s * (size_t)w->chunk_rows,
               n * 2);
    pos += pad8(n * (size_t)S * 2);
    for (int s = 0; s < S; s++) {
        if (w->slen[s] > 0)
            memcpy(w->cbuf + pos, w->skeys[s], (size_t)w->slen[s] * 8);
        pos += (size_t)w->slen[s] * 8;
        w->slen[s] = 0;
    }
    if (w->nentries == w->centries) {
        int nc = w->centries ? 2 * w->centries : 64;
        bin_entry_t *ne = kiln_reallocarray(w->entries, (size_t)nc, sizeof *ne);
        if (!ne)
            return KILN_ENOMEM;
        w->entries = ne;
        w->centries = nc;
    }
    w->entries[w->nentries].offset = w->offset;
    w->entries[w->nentries].size = size;
    w->entries[w->nentries].nrows = (uint32_t)n;
    w->entries[w->nentries].checksum = kiln_xxh64(w->cbuf, size, 0);
    w->nentries++;
    rc = write_all(w->fd, w->cbuf, size, w->tmp);
    if (rc < 0)
        return rc;
    w->offset += size;
    w->nrows += n;
    w->n = 0;
    return 0;
}

int data_bin_writer_add(data_bin_writer_t *w, const data_batch_t *b)
{
    const int S = w->nslots, D = w->ndense;
    int rc;
    if (b->ndense != D || b->nslots != S)
        return kiln_errf(KILN_EINVAL, "kiln-bin writer for %d dense / %d slots got a batch with "
                         "%d / %d", D, S, b->ndense, b->nslots);
    for (int i = 0; i < b->n; i++) {
        if (w->n == w->chunk_rows) {
            rc = flush_chunk(w);
            if (rc < 0)
                return rc;
        }
        w->labels[w->n] = b->labels[i] > 0.5f ? 1 : 0;
        memcpy(w->dense + (size_t)w->n * (size_t)D, b->dense + (size_t)i * (size_t)D,
               (size_t)D * sizeof(float));
        for (int s = 0; s < S; s++) {
            const int64_t *o = b->offsets + (size_t)s * (size_t)(b->n + 1);
            int64_t cnt = o[i + 1] - o[i];
            if (cnt > BIN_MAX_BAG)
                return kiln_errf(KILN_ERANGE, "kiln-bin: a bag of %lld keys in slot %d is over "
                                 "the limit of %d", (long long)cnt, s, BIN_MAX_BAG);
            if (cnt > 1)
                w->flags |= BIN_FLAG_MULTIHOT;
            KILN_CHECK(kiln_grow_to((void **)&w->skeys[s], &w->scap[s], w->slen[s] + cnt,
                                    sizeof(int64_t), 4096));
            if (cnt > 0)
                memcpy(w->skeys[s] + w->slen[s], b->keys + o[i], (size_t)cnt * sizeof(int64_t));
            w->slen[s] += cnt;
            w->counts[(size_t)s * (size_t)w->chunk_rows + (size_t)w->n] = (uint16_t)cnt;
        }
        w->n++;
    }
    return 0;
}

int data_bin_writer_commit(data_bin_writer_t *w)
{
    unsigned char hdr[BIN_HEADER_SIZE] = {0};
    unsigned char *idx = NULL;
    size_t idxsz;
    int rc = flush_chunk(w);
    if (rc < 0)
        goto out;
    idxsz = (size_t)w->nentries * BIN_ENTRY_SIZE + 8;
    idx = kiln_calloc(1, idxsz);
    if (!idx) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int k = 0; k < w->nentries; k++) {
        unsigned char *e = idx + (size_t)k * BIN_ENTRY_SIZE;
        put64(e, w->entries[k].offset);
        put64(e + 8, w->entries[k].size);
        put32(e + 16, w->entries[k].nrows);
        put64(e + 24, w->entries[k].checksum);
    }
    put64(idx + idxsz - 8, kiln_xxh64(idx, idxsz - 8, 0));
    rc = write_all(w->fd, idx, idxsz, w->tmp);
    if (rc < 0)
        goto out;
    memcpy(hdr, BIN_MAGIC, 8);
    put32(hdr + 8, BIN_VERSION);
    put32(hdr + 12, w->flags);
    put32(hdr + 16, (uint32_t)w->ndense);
    put32(hdr + 20, (uint32_t)w->nslots);
    put64(hdr + 24, w->nrows);
    put32(hdr + 32, (uint32_t)w->chunk_rows);
    put32(hdr + 36, (uint32_t)w->nentries);
    put64(hdr + 40, w->offset);
    put64(hdr + 56, kiln_xxh64(hdr, 56, 0));
    if (pwrite(w->fd, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr) {
        rc = kiln_errf(KILN_EIO, "cannot write the header of %s: %s", w->tmp, strerror(errno));
        goto out;
    }
    rc = kiln_atomic_commit(&w->out); /* leaves out empty */
out:
    free(idx);
    data_bin_writer_abort(w); /* frees; removes the temporary file unless it was committed */
    return rc;
}

void data_bin_writer_abort(data_bin_writer_t *w)
{
    if (!w)
        return;
    kiln_atomic_abort(&w->out);
    for (int s = 0; w->skeys && s < w->nslots; s++)
        free(w->skeys[s]);
    KILN_FREE_ALL(w->skeys, w->slen, w->scap, w->labels, w->dense, w->counts, w->cbuf, w->entries);
    free(w);
}

/* ---- the chunk reader --------------------------------------------------------- */

struct data_bin_file {
    char *path;
    int fd;
    int ndense, nslots, chunk_rows, nchunks;
    uint32_t flags;
    int64_t nrows;
    bin_entry_t *entries; /* [nchunks] */
    /* the cached chunk */
    int cached;           /* chunk index, -1 when none */
    unsigned char *cbuf;
    size_t ccap;
    const float *dense;
    const uint16_t *counts;
    const int64_t *keys;
    int64_t *pref;        /* [nslots * (chunk_rows + 1)] key position of (slot, row) */
};

data_bin_info_t data_bin_info(const data_bin_file_t *f)
{
    return (data_bin_info_t){.rows = f->nrows, .ndense = f->ndense, .nslots = f->nslots};
}

void data_bin_close(data_bin_file_t *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    KILN_FREE_ALL(f->path, f->entries, f->cbuf, f->pref);
    free(f);
}

int data_bin_open(const char *path, data_bin_file_t **out)
{
    unsigned char hdr[BIN_HEADER_SIZE];
    unsigned char *idx = NULL;
    size_t idxsz;
    uint64_t index_off, rows_sum = 0, expect;
    struct stat sb;
    int rc = 0;
    data_bin_file_t *f = kiln_calloc(1, sizeof *f);
    if (!f)
        return KILN_ENOMEM;
    f->cached = -1;
    f->fd = -1;
    f->path = kiln_strdup(path);
    if (!f->path) {
        rc = KILN_ENOMEM;
        goto out;
    }
    KILN_CHECK_GOTO(data_open(path, &f->fd), rc, out);
    if (fstat(f->fd, &sb) == 0 && sb.st_size >= 4) {
        /* A reader seeks to each rank's chunks: a compressed stream has no
         * chunks to seek to. */
        unsigned char head[4];
        KILN_CHECK_GOTO(pread_all(f->fd, head, sizeof head, 0, path), rc, out);
        data_comp_t comp = data_comp_detect(head, sizeof head);
        if (comp != DATA_COMP_NONE) {
            rc = kiln_errf(KILN_EINVAL,
                           "%s is %s-compressed; kiln-bin files are read by seeking "
                           "to their chunks and cannot be compressed: decompress it, or compress "
                           "the TSV and use format criteo-tsv",
                           path, data_comp_name(comp));
            goto out;
        }
    }
    if (fstat(f->fd, &sb) < 0 || sb.st_size < BIN_HEADER_SIZE) {
        rc = kiln_errf(KILN_ECORRUPT, "%s is not a kiln-bin file (shorter than its %d-byte "
                       "header)", path, BIN_HEADER_SIZE);
        goto out;
    }
    KILN_CHECK_GOTO(pread_all(f->fd, hdr, sizeof hdr, 0, path), rc, out);
    if (memcmp(hdr, BIN_MAGIC, 8) != 0) {
        rc = kiln_errf(KILN_ECORRUPT, "%s is not a kiln-bin file (no KILNBIN1 magic); pass "
                       "--format tsv for text data", path);
        goto out;
    }
    if (get64(hdr + 56) != kiln_xxh64(hdr, 56, 0)) {
        rc = kiln_errf(KILN_ECHECKSUM, "%s: the kiln-bin header fails its checksum: the file "
                       "is corrupt or was not finished; convert it again", path);
        goto out;
    }
    if (get32(hdr + 8) != BIN_VERSION) {
        rc = kiln_errf(KILN_EVERSION, "%s: kiln-bin version %u, this build reads version %u",
                       path, get32(hdr + 8), BIN_VERSION);
        goto out;
    }
    f->flags = get32(hdr + 12);
    f->ndense = (int)get32(hdr + 16);
    f->nslots = (int)get32(hdr + 20);
    f->nrows = (int64_t)get64(hdr + 24);
    f->chunk_rows = (int)get32(hdr + 32);
    f->nchunks = (int)get32(hdr + 36);
    index_off = get64(hdr + 40);
    idxsz = (size_t)f->nchunks * BIN_ENTRY_SIZE + 8;
    if (f->ndense < 0 || f->nslots < 0 || f->ndense > 65536 || f->nslots > 65536 ||
        f->chunk_rows <= 0 || f->nchunks < 0 || f->nrows < 0 ||
        index_off + idxsz != (uint64_t)sb.st_size) {
        rc = kiln_errf(KILN_ECORRUPT, "%s: the kiln-bin header does not match the file size "
                       "(%lld bytes): truncated or corrupt", path, (long long)sb.st_size);
        goto out;
    }
    idx = kiln_malloc(idxsz);
    f->entries = kiln_calloc((size_t)f->nchunks + 1, sizeof *f->entries);
    f->pref = kiln_calloc((size_t)(f->nslots ? f->nslots : 1) * ((size_t)f->chunk_rows + 1),
                          sizeof(int64_t));
    if (!idx || !f->entries || !f->pref) {
        rc = KILN_ENOMEM;
        goto out;
    }
    KILN_CHECK_GOTO(pread_all(f->fd, idx, idxsz, index_off, path), rc, out);
    if (get64(idx + idxsz - 8) != kiln_xxh64(idx, idxsz - 8, 0)) {
        rc = kiln_errf(KILN_ECHECKSUM, "%s: the kiln-bin chunk index fails its checksum: the "
                       "file is corrupt; convert it again", path);
        goto out;
    }
    expect = BIN_HEADER_SIZE;
    for (int k = 0; k < f->nchunks; k++) {
        const unsigned char *e = idx + (size_t)k * BIN_ENTRY_SIZE;
        bin_entry_t *en = &f->entries[k];
        en->offset = get64(e);
        en->size = get64(e + 8);
        en->nrows = get32(e + 16);
        en->checksum = get64(e + 24);
        if (en->offset != expect || en->size < BIN_CHUNK_HEADER ||
            en->offset + en->size > index_off ||
            (k + 1 < f->nchunks ? en->nrows != (uint32_t)f->chunk_rows
                                : (en->nrows == 0 || en->nrows > (uint32_t)f->chunk_rows))) {
            rc = kiln_errf(KILN_ECORRUPT, "%s: chunk %d of %d has an impossible index entry: "
                           "the file is corrupt", path, k, f->nchunks);
            goto out;
        }
        expect += en->size;
        rows_sum += en->nrows;
    }
    if (rows_sum != (uint64_t)f->nrows || expect != index_off) {
        rc = kiln_errf(KILN_ECORRUPT, "%s: the chunk index holds %llu rows, the header says "
                       "%lld: the file is corrupt", path, (unsigned long long)rows_sum,
                       (long long)f->nrows);
        goto out;
    }
out:
    free(idx);
    if (rc < 0) {
        data_bin_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

/* Reads, checks and indexes chunk k into the cache. */
static int load_chunk(data_bin_file_t *f, int k, int64_t *bytes)
{
    const bin_entry_t *en = &f->entries[k];
    const int S = f->nslots, D = f->ndense;
    size_t n, pos;
    uint64_t nkeys;
    int64_t base = 0;
    int rc;
    if (f->cached == k)
        return 0;
    f->cached = -1;
    if (en->size > f->ccap) {
        free(f->cbuf);
        f->cbuf = kiln_malloc(en->size);
        f->ccap = f->cbuf ? en->size : 0;
        if (!f->cbuf)
            return KILN_ENOMEM;
    }
    rc = pread_all(f->fd, f->cbuf, en->size, en->offset, f->path);
    if (rc < 0)
        return rc;
    if (bytes)
        *bytes += (int64_t)en->size;
    if (kiln_xxh64(f->cbuf, en->size, 0) != en->checksum)
        return kiln_errf(KILN_ECHECKSUM, "%s: chunk %d of %d (bytes %llu..%llu, rows %lld..%lld) "
                         "fails its xxh64 checksum: the file is corrupt; convert it again",
                         f->path, k, f->nchunks, (unsigned long long)en->offset,
                         (unsigned long long)(en->offset + en->size),
                         (long long)k * f->chunk_rows,
                         (long long)k * f->chunk_rows + en->nrows);
    n = get32(f->cbuf);
    nkeys = get64(f->cbuf + 8);
    if (n != en->nrows || nkeys > en->size || chunk_size(n, D, S, nkeys) != en->size)
        return kiln_errf(KILN_ECORRUPT, "%s: chunk %d of %d has an inconsistent header",
                         f->path, k, f->nchunks);
    pos = BIN_CHUNK_HEADER + pad8(n);
    f->dense = (const float *)(f->cbuf + pos);
    pos += pad8(n * (size_t)D * 4);
    f->counts = (const uint16_t *)(f->cbuf + pos);
    pos += pad8(n * (size_t)S * 2);
    f->keys = (const int64_t *)(f->cbuf + pos);
    for (int s = 0; s < S; s++) {
        int64_t *p = f->pref + (size_t)s * (n + 1);
        const uint16_t *c = f->counts + (size_t)s * n;
        p[0] = base;
        for (size_t i = 0; i < n; i++)
            p[i + 1] = p[i] + c[i];
        base = p[n];
    }
    if ((uint64_t)base != nkeys)
        return kiln_errf(KILN_ECORRUPT, "%s: chunk %d of %d counts %lld keys but holds %llu",
                         f->path, k, f->nchunks, (long long)base, (unsigned long long)nkeys);
    f->cached = k;
    return 0;
}

int data_bin_read_rows(data_bin_file_t *f, int64_t lo, int64_t hi, data_batch_builder_t *bb,
                     data_batch_t *b, int64_t *bytes)
{
    const int S = f->nslots, D = f->ndense;
    int rc;
    if (lo < 0 || hi > f->nrows || lo > hi || hi - lo > (int64_t)(bb->cap_rows - bb->n))
        return kiln_errf(KILN_EINTERNAL, "kiln-bin: rows %lld..%lld out of range for %s",
                         (long long)lo, (long long)hi, f->path);
    while (lo < hi) {
        int k = (int)(lo / f->chunk_rows);
        int64_t c0 = (int64_t)k * f->chunk_rows;
        size_t n, a, e;
        rc = load_chunk(f, k, bytes);
        if (rc < 0)
            return rc;
        n = f->entries[k].nrows;
        a = (size_t)(lo - c0);
        e = (size_t)(hi - c0) < n ? (size_t)(hi - c0) : n;
        for (size_t i = a; i < e; i++)
            b->labels[bb->n + (int)(i - a)] = (float)f->cbuf[BIN_CHUNK_HEADER + i];
        memcpy(b->dense + (size_t)bb->n * (size_t)D, f->dense + a * (size_t)D,
               (e - a) * (size_t)D * sizeof(float));
        for (int s = 0; s < S; s++) {
            const int64_t *p = f->pref + (size_t)s * (n + 1);
            const uint16_t *c = f->counts + (size_t)s * n;
            int64_t cnt = p[e] - p[a];
            rc = data_builder_reserve(bb, s, cnt);
            if (rc < 0)
                return rc;
            memcpy(bb->slot_keys[s] + bb->slot_len[s], f->keys + p[a],
                   (size_t)cnt * sizeof(int64_t));
            bb->slot_len[s] += cnt;
            for (size_t i = a; i < e; i++)
                bb->counts[(size_t)s * (size_t)bb->cap_rows + (size_t)bb->n + (i - a)] = c[i];
        }
        bb->n += (int)(e - a);
        lo = c0 + (int64_t)e;
    }
    return 0;
}
