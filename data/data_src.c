/*
 * data/data_src.c - the bytes of one training file, whatever holds them:
 * a plain file, or one compressed with gzip (zlib's inflate) or zstd
 * (libzstd's streaming decoder). The kind is told by the magic bytes at the
 * file's start (1f 8b for gzip, 28 b5 2f fd for zstd), never by its name, so
 * a part-0.tsv that is really gzip reads right and a part-0.gz that is plain
 * text too. Concatenated members (gzip) and frames (zstd) read as one
 * stream, as gunzip and zstd -d give them. A file that ends inside a
 * compressed stream, or holds bytes the decoder refuses, is KILN_ECORRUPT
 * naming the file and the byte where it stopped.
 *
 * Also here: opening a data file at all, which refuses what is not a
 * regular file (/dev/zero, a FIFO, a directory) before reading a byte.
 *
 * The TSV pre-pass and the line cursor (data_tsv.c) read through this, so
 * decompression runs where they run: the count at data_reader_open, the
 * parsing in the reader's producer thread (docs/data-formats.md,
 * "Compressed files").
 */
#include "data_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#define SRC_IN_CHUNK ((size_t)256 << 10)

static const char *file_kind(mode_t m)
{
    return S_ISDIR(m)    ? "a directory"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISSOCK(m) ? "a socket"
                         : "not a regular file";
}

int data_open(const char *path, int *fd_out)
{
    /* O_NONBLOCK: opening a FIFO would otherwise wait for a writer. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat sb;
    if (fd < 0)
        return kiln_errf(errno == ENOENT ? KILN_ENOENT : KILN_EIO, "cannot open data file %s: %s",
                         path, strerror(errno));
    if (fstat(fd, &sb) < 0) {
        int e = errno;
        close(fd);
        return kiln_errf(KILN_EIO, "cannot stat data file %s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return kiln_errf(KILN_EINVAL,
                         "data file %s is %s, not a regular file; training reads "
                         "regular files only (plain, gzip or zstd): check data.train",
                         path, file_kind(sb.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fd_out = fd;
    return 0;
}

data_comp_t data_comp_detect(const unsigned char *head, size_t n)
{
    if (n >= 2 && head[0] == 0x1f && head[1] == 0x8b)
        return DATA_COMP_GZIP;
    if (n >= 4 && head[0] == 0x28 && head[1] == 0xb5 && head[2] == 0x2f && head[3] == 0xfd)
        return DATA_COMP_ZSTD;
    return DATA_COMP_NONE;
}

const char *data_comp_name(data_comp_t c)
{
    return c == DATA_COMP_GZIP ? "gzip" : c == DATA_COMP_ZSTD ? "zstd" : "plain";
}

struct data_src {
    char *path;
    int fd;
    data_comp_t comp;
    int64_t file_bytes; /* bytes read from the file so far */
    unsigned char *in;  /* [SRC_IN_CHUNK] compressed bytes read ahead */
    size_t in_pos, in_end;
    bool file_eof;  /* read() said 0 */
    bool done;      /* the last stream ended with the file */
    bool in_stream; /* a gzip member / zstd frame is open (not yet ended) */
    z_stream zs;
    bool zs_init;
    ZSTD_DStream *zd;
};

/* Reads more of the file into the input buffer. Returns 0 or KILN_EIO. */
static int src_fill(data_src_t *s)
{
    if (s->in_pos > 0) {
        memmove(s->in, s->in + s->in_pos, s->in_end - s->in_pos);
        s->in_end -= s->in_pos;
        s->in_pos = 0;
    }
    if (s->in_end == SRC_IN_CHUNK) /* full: the decoder takes some first */
        return 0;
    for (;;) {
        ssize_t n = read(s->fd, s->in + s->in_end, SRC_IN_CHUNK - s->in_end);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return kiln_errf(KILN_EIO, "cannot read data file %s: %s", s->path, strerror(errno));
        if (n == 0)
            s->file_eof = true;
        s->in_end += (size_t)n;
        s->file_bytes += n;
        return 0;
    }
}

int data_src_open(const char *path, data_src_t **out)
{
    data_src_t *s = kiln_calloc(1, sizeof *s);
    int rc = 0;
    if (s == NULL)
        return KILN_ENOMEM;
    s->fd = -1;
    s->path = kiln_strdup(path);
    s->in = kiln_malloc(SRC_IN_CHUNK);
    if (s->path == NULL || s->in == NULL) {
        rc = KILN_ENOMEM;
        goto fail;
    }
    KILN_CHECK_GOTO(data_open(path, &s->fd), rc, fail);
    (void)posix_fadvise(s->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    KILN_CHECK_GOTO(src_fill(s), rc, fail);
    while (s->in_end < 4 && !s->file_eof)
        KILN_CHECK_GOTO(src_fill(s), rc, fail);
    s->comp = data_comp_detect(s->in, s->in_end);
    if (s->comp == DATA_COMP_GZIP) {
        /* 15 + 16: a gzip wrapper (not zlib's), the largest window. */
        if (inflateInit2(&s->zs, 15 + 16) != Z_OK) {
            rc = kiln_errf(KILN_ENOMEM, "cannot start a gzip decoder for %s", path);
            goto fail;
        }
        s->zs_init = true;
    } else if (s->comp == DATA_COMP_ZSTD) {
        s->zd = ZSTD_createDStream();
        if (s->zd == NULL || ZSTD_isError(ZSTD_initDStream(s->zd))) {
            rc = kiln_errf(KILN_ENOMEM, "cannot start a zstd decoder for %s", path);
            goto fail;
        }
    }
    *out = s;
    return 0;
fail:
    data_src_close(s);
    return rc;
}

/* The byte of the file the decoder has reached (for messages). */
static int64_t src_at(const data_src_t *s)
{
    return s->file_bytes - (int64_t)(s->in_end - s->in_pos);
}

static int truncated(const data_src_t *s)
{
    return kiln_errf(KILN_ECORRUPT,
                     "data file %s: the %s stream ends early at byte %lld (the "
                     "file is cut short or still being written); recompress or replace it",
                     s->path, data_comp_name(s->comp), (long long)src_at(s));
}

/* One decoder step of whichever kind: consumes input at s->in_pos, writes
 * at out[*pos]. Sets *ended when a member / frame ended. */
static int decode_step(data_src_t *s, char *out, size_t cap, size_t *pos, bool *ended)
{
    *ended = false;
    if (s->comp == DATA_COMP_GZIP) {
        s->zs.next_in = s->in + s->in_pos;
        s->zs.avail_in = (uInt)(s->in_end - s->in_pos);
        s->zs.next_out = (Bytef *)out + *pos;
        s->zs.avail_out = (uInt)(cap - *pos);
        int zr = inflate(&s->zs, Z_NO_FLUSH);
        s->in_pos = s->in_end - s->zs.avail_in;
        *pos = cap - s->zs.avail_out;
        if (zr == Z_STREAM_END) {
            *ended = true;
            inflateReset(&s->zs);
        } else if (zr != Z_OK && zr != Z_BUF_ERROR) {
            return kiln_errf(zr == Z_MEM_ERROR ? KILN_ENOMEM : KILN_ECORRUPT,
                             "data file %s: the gzip data is corrupt near byte %lld (%s)", s->path,
                             (long long)src_at(s), s->zs.msg ? s->zs.msg : zError(zr));
        }
        return 0;
    }
    ZSTD_inBuffer in = {s->in + s->in_pos, s->in_end - s->in_pos, 0};
    ZSTD_outBuffer o = {out, cap, *pos};
    size_t zr = ZSTD_decompressStream(s->zd, &o, &in);
    s->in_pos += in.pos;
    *pos = o.pos;
    if (ZSTD_isError(zr))
        return kiln_errf(KILN_ECORRUPT,
                         "data file %s: the zstd data is corrupt near byte %lld (%s)", s->path,
                         (long long)src_at(s), ZSTD_getErrorName(zr));
    *ended = zr == 0;
    return 0;
}

int64_t data_src_read(data_src_t *s, char *buf, size_t cap)
{
    if (cap == 0)
        return 0;
    if (s->comp == DATA_COMP_NONE) {
        /* What open read ahead to find the magic goes out first. */
        if (s->in_pos < s->in_end) {
            size_t n = s->in_end - s->in_pos < cap ? s->in_end - s->in_pos : cap;
            memcpy(buf, s->in + s->in_pos, n);
            s->in_pos += n;
            return (int64_t)n;
        }
        for (;;) {
            ssize_t n = read(s->fd, buf, cap);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                return kiln_errf(KILN_EIO, "cannot read data file %s: %s", s->path,
                                 strerror(errno));
            s->file_bytes += n;
            return n;
        }
    }
    size_t pos = 0;
    while (pos < cap && !s->done) {
        if (s->in_pos == s->in_end) {
            if (s->file_eof) {
                if (s->in_stream)
                    return truncated(s);
                s->done = true;
                break;
            }
            int rc = src_fill(s);
            if (rc < 0)
                return rc;
            continue;
        }
        bool ended = false;
        size_t before = pos, used = s->in_pos;
        int rc = decode_step(s, buf, cap, &pos, &ended);
        if (rc < 0)
            return rc;
        s->in_stream = !ended;
        if (!ended && pos == before && s->in_pos == used) {
            /* No progress: the decoder wants more input than is buffered. */
            if (s->file_eof)
                return truncated(s);
            rc = src_fill(s);
            if (rc < 0)
                return rc;
        }
    }
    return (int64_t)pos;
}

int64_t data_src_file_bytes(const data_src_t *s)
{
    return s->file_bytes;
}

data_comp_t data_src_comp(const data_src_t *s)
{
    return s->comp;
}

void data_src_close(data_src_t *s)
{
    if (s == NULL)
        return;
    if (s->zs_init)
        inflateEnd(&s->zs);
    ZSTD_freeDStream(s->zd);
    if (s->fd >= 0)
        close(s->fd);
    free(s->in);
    free(s->path);
    free(s);
}
