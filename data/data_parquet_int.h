/*
 * data/data_parquet_int.h - the pieces of Kiln's Parquet reader
 * (data_parquet.c) that the rest of data/ uses: an opened file (footer
 * read, mapped columns found and type-checked) and the row reader the batch
 * reader calls from its producer thread. Not included from outside data/
 * (the fuzz harness in tests/fuzz/ goes through data_reader_open like the
 * trainer does).
 *
 * Who owns what: data_pq_open returns a file the caller closes with
 * data_pq_close; the file owns its descriptor, its footer's row-group table and
 * the decoded columns of at most one row group (the one rows were last read
 * from), which is the reader's whole memory for Parquet.
 */
#ifndef KILN_DATA_PARQUET_INT_H
#define KILN_DATA_PARQUET_INT_H

#include "data_int.h"

typedef struct data_pq_file data_pq_file_t;

/* Opens path, reads and checks its footer and finds the mapped columns
 * (cols may be NULL: Criteo names) for ndense dense features and nslots
 * categorical slots. Returns 0, KILN_ENOENT / KILN_EIO, KILN_EBUSY (no
 * trailing PAR1: cut short or still being written), KILN_ECORRUPT (a footer
 * that does not decode), KILN_EINVAL (a mapped column missing or of a type
 * it cannot be read as) or KILN_ENOMEM, the message naming the file. */
int data_pq_open(const char *path, const data_columns_t *cols, int ndense, int nslots,
               data_pq_file_t **out /* OUT */);
void data_pq_close(data_pq_file_t *f); /* accepts NULL */
/* Frees the decoded row group and the decoder's buffers (the footer stays):
 * the reader calls it when it moves on to the next file, so its memory is
 * one row group, not one per file. The next read decodes again. */
void data_pq_release(data_pq_file_t *f);
int64_t data_pq_rows(const data_pq_file_t *f);
/* With team set, a row group's columns are decoded on the calling thread's
 * OpenMP team (the reader without a producer thread); else on the caller. */
void data_pq_set_team(data_pq_file_t *f, bool team);
/* 0 when b's mapped columns have the same types and nesting as a's, else
 * KILN_EINVAL naming both files and the first column that differs. */
int data_pq_same_schema(const data_pq_file_t *a, const data_pq_file_t *b);
/* Appends rows [lo, hi) of the file to the builder and to b (labels, dense)
 * at builder row bb->n onwards, decoding the row groups they lie in (one at
 * a time; the last stays decoded). A row whose label is null or not 0/1 is
 * left out and recorded in st (and b->nskipped). Returns 0 or KILN_EIO /
 * KILN_ECORRUPT / KILN_EINVAL naming the file, the row group, the column
 * and the page. */
int data_pq_read_rows(data_pq_file_t *f, int64_t lo, int64_t hi, data_batch_builder_t *bb,
                    data_batch_t *b, data_reader_stats_t *st, int64_t *bytes /* OUT: added to */);

#endif /* KILN_DATA_PARQUET_INT_H */
