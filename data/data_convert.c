/*
 * data/data_convert.c - `kiln convert`: Criteo TSV or Parquet files into one
 * kiln-bin file. TSV goes line by line through the parser and the batch
 * builder (malformed lines counted and left out, as training does); Parquet
 * goes through the batch reader, so a converted file holds exactly the rows
 * training on the Parquet files would see. Both write with data_bin.c's
 * writer, which commits the file whole or not at all.
 */
#include "data_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int data_convert_tsv_to_bin(const char *const *inputs, int ninputs, const char *out_path,
                          const data_convert_opts_t *opts, data_reader_stats_t *stats)
{
    int D = opts && opts->ndense > 0 ? opts->ndense : DATA_CRITEO_NDENSE;
    int S = opts && opts->nslots > 0 ? opts->nslots : DATA_CRITEO_NSLOTS;
    int cr = opts && opts->chunk_rows > 0 ? opts->chunk_rows : DATA_BIN_CHUNK_ROWS;
    data_reader_stats_t st;
    data_tsv_cursor_t *cur = NULL;
    data_bin_writer_t *w = NULL;
    data_batch_builder_t bb = {0};
    data_batch_t b = {0};
    float *dense = NULL;
    int64_t *keys = NULL;
    unsigned char *has = NULL;
    int rc;

    memset(&st, 0, sizeof st);
    if (ninputs <= 0 || !out_path)
        return kiln_errf(KILN_EINVAL, "kiln convert needs at least one input file and --out");
    for (int i = 0; i < ninputs; i++) {
        if (access(inputs[i], R_OK) < 0)
            return kiln_errf(errno == ENOENT ? KILN_ENOENT : KILN_EIO,
                             "cannot open data file %s: %s", inputs[i], strerror(errno));
    }
    dense = kiln_calloc((size_t)D + 1, sizeof(float));
    keys = kiln_calloc((size_t)S + 1, sizeof(int64_t));
    has = kiln_calloc((size_t)S + 1, 1);
    if (!dense || !keys || !has) {
        rc = KILN_ENOMEM;
        goto out;
    }
    KILN_CHECK_GOTO(data_builder_init(&bb, cr, D, S), rc, out);
    KILN_CHECK_GOTO(data_batch_init(&b, cr, D, S), rc, out);
    KILN_CHECK_GOTO(data_tsv_cursor_create(inputs, ninputs, &cur), rc, out);
    KILN_CHECK_GOTO(data_bin_writer_create(out_path, D, S, cr, &w), rc, out);
    for (;;) {
        const char *line;
        size_t len;
        int too_long, fi;
        int64_t lineno;
        char why[DATA_MESSAGE_LEN];
        rc = data_tsv_cursor_next(cur, &line, &len, &too_long, &fi, &lineno);
        if (rc < 0)
            goto out;
        if (rc == 0)
            break;
        if (too_long) {
            snprintf(why, sizeof why, "line longer than %d bytes", DATA_TSV_MAX_LINE);
            data_stats_malformed(&st, inputs[fi], lineno, why);
            continue;
        }
        float label;
        if (data_tsv_parse_line(line, len, D, S, &label, dense, keys, has, why, sizeof why) < 0) {
            data_stats_malformed(&st, inputs[fi], lineno, why);
            continue;
        }
        KILN_CHECK_GOTO(data_builder_add_row(&bb, &b, label, dense, keys, has), rc, out);
        st.rows++;
        if (bb.n == cr) {
            KILN_CHECK_GOTO(data_builder_finish(&bb, &b), rc, out);
            KILN_CHECK_GOTO(data_bin_writer_add(w, &b), rc, out);
            data_builder_reset(&bb);
        }
    }
    if (bb.n > 0) {
        KILN_CHECK_GOTO(data_builder_finish(&bb, &b), rc, out);
        KILN_CHECK_GOTO(data_bin_writer_add(w, &b), rc, out);
    }
    st.bytes = data_tsv_cursor_bytes(cur);
    rc = data_bin_writer_commit(w);
    w = NULL;
out:
    data_bin_writer_abort(w);
    data_tsv_cursor_destroy(cur);
    data_builder_fini(&bb);
    data_batch_fini(&b);
    KILN_FREE_ALL(dense, keys, has);
    if (stats)
        *stats = st;
    return rc < 0 ? rc : 0;
}

int data_convert_parquet_to_bin(const char *const *inputs, int ninputs, const data_columns_t *cols,
                              const char *out_path, const data_convert_opts_t *opts,
                              data_reader_stats_t *stats)
{
    const int D = opts && opts->ndense > 0 ? opts->ndense : DATA_CRITEO_NDENSE;
    const int S = opts && opts->nslots > 0 ? opts->nslots : DATA_CRITEO_NSLOTS;
    data_reader_t *r = NULL;
    data_bin_writer_t *w = NULL;
    data_batch_t *b;
    int rc;
    KILN_CHECK(data_reader_open_cols(inputs, ninputs, DATA_FMT_PARQUET, cols, 0, 1,
                                   DATA_BIN_CHUNK_ROWS, D, S, 2, &r));
    KILN_CHECK_GOTO(data_bin_writer_create(out_path, D, S, opts ? opts->chunk_rows : 0, &w), rc,
                    out);
    while ((rc = data_reader_next(r, &b)) == 1)
        KILN_CHECK_GOTO(data_bin_writer_add(w, b), rc, out);
    if (rc == 0) {
        rc = data_bin_writer_commit(w);
        w = NULL;
    }
out:
    if (stats)
        data_reader_stats(r, stats);
    data_bin_writer_abort(w);
    data_reader_close(r);
    return rc;
}
