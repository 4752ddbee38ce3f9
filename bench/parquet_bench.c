/*
 * bench/parquet_bench.c - rows/s of the batch reader (data/data_reader.c)
 * over the same rows held as Criteo TSV, kiln-bin and Parquet files: open,
 * then every batch of one rank (batch 4096, prefetch 4) taken as fast as the
 * consumer can, so the figure is the producer thread's decoding speed (for
 * TSV it includes the newline-count pre-pass at open, as training pays it).
 * The median of --repeat runs per file; files are read once first, so the
 * page cache is warm for all. With --prefetch 0 there is no producer
 * thread: each batch is made on the caller's OpenMP team (OMP_NUM_THREADS),
 * as kiln-train's data.reader: team does. bench/parquet_bench.sh makes the
 * files and runs it; results in docs/benchmarks.md.
 *
 *   parquet_bench [--repeat N] [--prefetch N] FILE...   (format from each file's magic)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "data.h"

/* Reads every batch of path once; the seconds it took and the rows. */
static double read_once(const char *path, int prefetch, int64_t *rows)
{
    data_reader_t *r = NULL;
    const char *paths[1] = {path};
    int64_t t0 = kiln_mono_ns();
    if (data_reader_open(paths, 1, DATA_FMT_AUTO, 0, 1, 4096, DATA_DIMS_AUTO, DATA_DIMS_AUTO, prefetch,
                         &r) < 0) {
        fprintf(stderr, "parquet_bench: %s\n", kiln_errmsg());
        exit(1);
    }
    data_batch_t *b;
    int rc;
    *rows = 0;
    while ((rc = data_reader_next(r, &b)) == 1)
        *rows += b->n;
    if (rc < 0) {
        fprintf(stderr, "parquet_bench: %s\n", kiln_errmsg());
        exit(1);
    }
    data_reader_close(r);
    return (double)(kiln_mono_ns() - t0) / 1e9;
}

int main(int argc, char **argv)
{
    int repeat = 5, prefetch = 4, first = 1;
    while (first + 1 < argc && argv[first][0] == '-') {
        if (strcmp(argv[first], "--repeat") == 0)
            repeat = atoi(argv[first + 1]);
        else if (strcmp(argv[first], "--prefetch") == 0)
            prefetch = atoi(argv[first + 1]);
        else
            break;
        first += 2;
    }
    if (first >= argc || argv[first][0] == '-' || repeat < 1 || repeat > 100 || prefetch < 0 ||
        prefetch > 64) {
        fprintf(stderr, "usage: parquet_bench [--repeat N] [--prefetch N] FILE...\n");
        return 2;
    }
    printf("%-44s %10s %12s %10s\n", "file", "rows", "rows/s", "seconds");
    for (int i = first; i < argc; i++) {
        double t[100];
        int64_t rows = 0;
        (void)read_once(argv[i], prefetch, &rows); /* warm the page cache */
        for (int k = 0; k < repeat; k++)
            t[k] = read_once(argv[i], prefetch, &rows);
        double med = bench_median(t, repeat);
        const char *name = strrchr(argv[i], '/');
        printf("%-44s %10lld %12.0f %10.3f\n", name ? name + 1 : argv[i], (long long)rows,
               (double)rows / med, med);
    }
    return 0;
}
