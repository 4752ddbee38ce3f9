/*
 * bench/tier_floor.c - the kernel's floor under the disk tier (issue 25):
 * what one record's transfer costs the CPU when the page cache holds the
 * tier file, whatever Kiln does around it. A tiered step of kiln-train
 * makes disk_reads / steps reads and disk_writes / steps writes
 * (result.json), so no tier that moves records this way can run a step
 * in less than the all-in-RAM step plus their floor (tools/tier_bench.sh
 * prints that bound beside each tiered line).
 *
 *   tier_floor --rec 160 --file-mb 200 [--dir /var/tmp] [--ops 100000]
 *
 * On a sparse file of file-mb MB (as kern_tier_open makes it) in dir, each
 * page written once first (so a first write's zeroing of its block is left
 * out), medians of 5 blocks of ops transfers each, ns per record:
 *   pread   a record at a random record offset (the page cache answers);
 *   uring   the same through io_uring, 256 reads a submission (what
 *           spill_io: auto uses; "-" when Kiln is built without liburing);
 *   pwrite  a record at a random record offset (the tier's demotions: a
 *           record each, into its page);
 *   append  records copied into a 1 MiB buffer written with one pwrite at
 *           the file's end (what a tier that logs its writes would make).
 * One line: "floor: rec R B, file F MB: pread X, uring Y, pwrite Z, append
 * W ns a record".
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef KILN_HAVE_URING
#include <liburing.h>
#endif

#include "bench.h"

#define BLOCKS 5
#define APPEND_BYTES (1 << 20)
#define RING 256

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* A random record offset of the file: a record never straddles a page. */
static off_t rec_off(int64_t pages, int64_t per_page, int64_t rec)
{
    int64_t p = (int64_t)(bench_rnd() % (uint64_t)pages);
    int64_t i = (int64_t)(bench_rnd() % (uint64_t)per_page);
    return (off_t)(p * 4096 + i * rec);
}

int main(int argc, char **argv)
{
    int64_t rec = 160, file_mb = 200, ops = 100000;
    const char *dir = "/var/tmp";
    const bench_opt_t opts[] = {{"--rec", BENCH_I64, &rec},
                                {"--file-mb", BENCH_I64, &file_mb},
                                {"--ops", BENCH_I64, &ops},
                                {"--dir", BENCH_STR, &dir}};
    bench_options(argc, argv, opts, sizeof opts / sizeof opts[0]);
    if (rec < 8 || rec > 4096 || file_mb < 1 || ops < RING) {
        fprintf(stderr, "tier_floor: --rec 8..4096, --file-mb >= 1, --ops >= %d\n", RING);
        return 2;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/tier_floor.%ld", dir, (long)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    uint8_t *buf = malloc(APPEND_BYTES);
    if (fd < 0 || !buf) {
        fprintf(stderr, "tier_floor: cannot create %s (or no memory)\n", path);
        return 1;
    }
    unlink(path); /* gone when the process ends, however it ends */
    memset(buf, 0x5a, APPEND_BYTES);
    const int64_t pages = file_mb * (1 << 20) / 4096, per_page = 4096 / rec;
    int rc = ftruncate(fd, (off_t)pages * 4096) == 0 ? 0 : 1;
    for (int64_t p = 0; p < pages && rc == 0; p++)
        rc = pwrite(fd, buf, (size_t)rec, (off_t)(p * 4096)) == (ssize_t)rec ? 0 : 1;
    double t[4][BLOCKS];
    for (int b = 0; b < BLOCKS && rc == 0; b++) {
        double t0 = now_ns();
        for (int64_t i = 0; i < ops && rc == 0; i++)
            rc = pread(fd, buf, (size_t)rec, rec_off(pages, per_page, rec)) == (ssize_t)rec ? 0 : 1;
        t[0][b] = (now_ns() - t0) / (double)ops;
        t0 = now_ns();
        for (int64_t i = 0; i < ops && rc == 0; i++)
            rc = pwrite(fd, buf, (size_t)rec, rec_off(pages, per_page, rec)) == (ssize_t)rec ? 0
                                                                                            : 1;
        t[2][b] = (now_ns() - t0) / (double)ops;
        /* appends: the copy into the buffer and one write a MiB */
        t0 = now_ns();
        off_t end = (off_t)pages * 4096;
        int64_t per_buf = APPEND_BYTES / rec, used = 0;
        for (int64_t i = 0; i < ops && rc == 0; i++) {
            memcpy(buf + used * rec, buf + ((i * 7) % per_buf) * rec, (size_t)rec);
            if (++used == per_buf || i == ops - 1) {
                size_t len = (size_t)(used * rec);
                rc = pwrite(fd, buf, len, end) == (ssize_t)len ? 0 : 1;
                end += (off_t)len;
                used = 0;
            }
        }
        t[3][b] = (now_ns() - t0) / (double)ops;
        rc = rc == 0 && ftruncate(fd, (off_t)pages * 4096) == 0 ? 0 : 1;
    }
    int have_uring = 0;
#ifdef KILN_HAVE_URING
    struct io_uring ring;
    if (rc == 0 && io_uring_queue_init(RING, &ring, 0) == 0) {
        have_uring = 1;
        for (int b = 0; b < BLOCKS && rc == 0; b++) {
            double t0 = now_ns();
            for (int64_t i = 0; i + RING <= ops && rc == 0; i += RING) {
                for (int j = 0; j < RING; j++)
                    io_uring_prep_read(io_uring_get_sqe(&ring), fd, buf + (size_t)j * (size_t)rec,
                                       (unsigned)rec, (uint64_t)rec_off(pages, per_page, rec));
                rc = io_uring_submit_and_wait(&ring, RING) == RING ? 0 : 1;
                struct io_uring_cqe *cqe;
                unsigned head, seen = 0;
                io_uring_for_each_cqe(&ring, head, cqe)
                {
                    rc |= cqe->res != (int)rec;
                    seen++;
                }
                io_uring_cq_advance(&ring, seen);
            }
            t[1][b] = (now_ns() - t0) / (double)(ops / RING * RING);
        }
        io_uring_queue_exit(&ring);
    }
#endif
    close(fd);
    free(buf);
    if (rc != 0) {
        fprintf(stderr, "tier_floor: a transfer on %s failed (disk full?)\n", path);
        return 1;
    }
    char uring[32] = "-";
    if (have_uring)
        snprintf(uring, sizeof uring, "%.0f", bench_median(t[1], BLOCKS));
    printf("floor: rec %lld B, file %lld MB: pread %.0f, uring %s, pwrite %.0f, append %.1f ns a "
           "record\n",
           (long long)rec, (long long)file_mb, bench_median(t[0], BLOCKS), uring,
           bench_median(t[2], BLOCKS), bench_median(t[3], BLOCKS));
    return 0;
}
