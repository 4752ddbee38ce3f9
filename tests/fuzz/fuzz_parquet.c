/*
 * tests/fuzz/fuzz_parquet.c - libFuzzer harness for Kiln's Parquet reader
 * (data/data_parquet.c): the footer's Thrift, the schema, the page headers,
 * the codecs, levels and encodings. The bytes are a file (a memfd, read
 * through the same data_reader_open_cols as training) mapped as label, one
 * dense column I1 and two categorical ones (C1, and C2, a list in the seeds):
 * any bytes either read as rows (labels 0 / 1, finite dense values,
 * non-negative keys, offsets that add up) or are refused with a reason;
 * never a crash, a leak or an allocation the file does not justify.
 * Seeds: tests/fuzz/corpus/parquet/ (tests/parquet/fuzz_seeds.mjs).
 */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "data.h"

static void check_batch(const data_batch_t *b)
{
    for (int i = 0; i < b->n; i++) {
        if (b->labels[i] != 0.0f && b->labels[i] != 1.0f)
            abort();
        if (!isfinite(b->dense[i]))
            abort();
    }
    for (int s = 0; s < b->nslots; s++) {
        const int64_t *o = b->offsets + (size_t)s * (size_t)(b->n + 1);
        for (int i = 0; i < b->n; i++)
            if (o[i + 1] < o[i])
                abort();
    }
    for (int64_t k = 0; k < b->nkeys; k++)
        if (b->keys[k] < 0)
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const dense[] = {"I1"}, *const cat[] = {"C1", "C2"};
    const data_columns_t cols = {.label = "label", .dense = dense, .categorical = cat};
    char path[64];
    int fd = memfd_create("fuzz.parquet", MFD_CLOEXEC);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size)
        abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    const char *paths[1] = {path};
    data_reader_t *r = NULL;
    int rc = data_reader_open_cols(paths, 1, DATA_FMT_PARQUET, &cols, 0, 1, 64, 1, 2, 1, &r);
    int64_t rows = 0;
    if (rc == 0) {
        data_batch_t *b;
        while ((rc = data_reader_next(r, &b)) == 1) {
            check_batch(b);
            rows += b->n;
        }
        data_reader_close(r);
    }
    /* KILN_FUZZ_VERBOSE=1 says what each input gave (to see that the
     * seeds read whole): `fuzz_parquet tests/fuzz/corpus/parquet/x`. */
    if (getenv("KILN_FUZZ_VERBOSE") != NULL)
        fprintf(stderr, "%lld rows%s%s\n", (long long)rows, rc < 0 ? "; " : "",
                rc < 0 ? kiln_errmsg() : "");
    close(fd);
    return 0;
}
