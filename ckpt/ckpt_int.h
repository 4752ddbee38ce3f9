/*
 * ckpt/ckpt_int.h - what the ckpt*.c files share and nothing else
 * includes: the file entries of a part, the .npy writer and reader, the
 * manifest's in-memory form and the errno -> KILN_E* mapping of checkpoint
 * I/O.
 */
#ifndef KILN_CKPT_CKPT_INT_H
#define KILN_CKPT_CKPT_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ckpt.h"

/* What one file of a checkpoint is: table "" for dense arrays. array is
 * keys | values | opt | opt_steps | evicted | dense. */
typedef struct ckpt_file {
    char name[160];
    char table[CKPT_NAME_MAX];
    char array[CKPT_NAME_MAX];
    int rank;
    int64_t rows;
    int64_t size;
    uint64_t xxh;
} ckpt_file_t;

struct ckpt_part {
    ckpt_file_t *files;
    int nfiles, cap;
    ckpt_table_info_t tables[CKPT_MAX_TABLES];
    int ntables;
};

struct ckpt {
    char *path;
    ckpt_info_t info;
    ckpt_file_t *files;
    int nfiles;
};

/* Adds f to p (and the table's counts). Returns 0 or KILN_ENOMEM. */
int ckpt_part_add(ckpt_part_t *p, const ckpt_file_t *f);
/* Adds or merges table counts. Returns 0 or KILN_ERANGE (too many tables). */
int ckpt_part_table(ckpt_part_t *p, const ckpt_table_info_t *t);

/* Maps an errno of a write or fsync of path to a KILN_E* code and message:
 * ENOSPC, EDQUOT and EFBIG are KILN_ENOSPC. */
int ckpt_io_err(int err, const char *what, const char *path);

/* ---- .npy (version 1.0: magic, u16 header length, a Python dict literal) ---- */

typedef enum { NPY_I8 = 0, NPY_F4 = 1, NPY_U4 = 2 } npy_dtype_t;

/* Streams one .npy file: the header first, then rows, hashed as they go. */
typedef struct npy_writer {
    int fd;
    char *path;
    kiln_hasher_t *h;
    int64_t size;
} npy_writer_t;

/* Creates dir/name with a header for shape (rows) or (rows, cols) when
 * cols > 0. Returns 0, KILN_ENOSPC, KILN_EIO or KILN_ENOMEM. */
int npy_open(npy_writer_t *w, const char *dir, const char *name, npy_dtype_t dt, int64_t rows,
             int64_t cols);
int npy_write(npy_writer_t *w, const void *data, size_t len);
/* fsyncs and closes; fills f's name, size and xxh. Frees w's state either way. */
int npy_close(npy_writer_t *w, ckpt_file_t *f /* OUT, may be NULL */);
/* Closes and removes the file after a failure. */
void npy_abort(npy_writer_t *w);

/* An open .npy for reading: fd positioned anywhere, data at `offset`. */
typedef struct npy_reader {
    FILE *f;
    int64_t rows, cols; /* cols 0 for 1-D */
    npy_dtype_t dt;
    long offset;
} npy_reader_t;

/* Opens path, checks the header against dt and (when cols >= 0) cols.
 * Returns 0, KILN_ENOENT or KILN_ECORRUPT naming the file. */
int npy_read_open(npy_reader_t *r, const char *path, npy_dtype_t dt, int64_t cols);
/* Reads rows [first, first + n) into out. Returns 0 or KILN_ECORRUPT. */
int npy_read_rows(npy_reader_t *r, const char *path, int64_t first, int64_t n, void *out);
void npy_read_close(npy_reader_t *r);
size_t npy_dtype_size(npy_dtype_t dt);


#endif /* KILN_CKPT_CKPT_INT_H */
