/*
 * bench/retain_bench.c - the database size of a month of `@every 1m`, with
 * and without what issue 26 changed (skipped fires counted on the job, not
 * recorded as runs; kilnd --keep-runs).
 *
 *   retain_bench [--days N] [--keep DAYS] [--dir DIR]
 *
 * One job fires every minute for N days (default 30), through the same state
 * calls kilnd makes: a partition lands once an hour, so the fire after it is
 * a real run (launching, running, succeeded: its input, 20 loss points and
 * an incremental checkpoint chained on the previous one), one fire an hour
 * fails (20 loss points, an error) and the other 58 find no new data. Each
 * simulated day's rows are shifted back in time so that the month ends now.
 * Three databases:
 *   old      a fire with no new data is a 'skipped' run (the code before
 *            issue 26), no retention;
 *   skips    the fire is dropped and counted on the job, no retention;
 *   keep     the same and, at the end of each day, the retention passes of
 *            kilnd --keep-runs DAYS (default 7) until a pass finds no full
 *            batch, with the partitions and checkpoint files of that age gone
 *            (data rotated away, checkpoint.keep) and a full checkpoint
 *            every 24 (checkpoint.full_every's default).
 * Prints, after days 1, 7, 14 and the last, each file's size (after a WAL
 * checkpoint; SQLite reuses the pages that deleted rows free, so the file
 * does not shrink but stops growing) and its row counts, as a Markdown
 * table (docs/benchmarks.md, "Retention").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln.h"
#include "state_test.h" /* state_test_exec / state_test_scalar: time shifts, counts */

typedef enum { MODE_OLD, MODE_SKIPS, MODE_KEEP } mode_t_;
static const char *const mode_names[] = {"old", "skips", "keep"};

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if ((x) < 0) {                                                                             \
            fprintf(stderr, "retain_bench: %s:%d: %s\n", __FILE__, __LINE__, kiln_errmsg());      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int64_t scalar(state_t *st, const char *sql)
{
    int64_t v = 0;
    CHECK(state_test_scalar(st, sql, &v));
    return v;
}

/* Moves the rows written since the marks back by shift seconds. */
static void shift_day(state_t *st, const int64_t *mark, int64_t shift)
{
    char sql[1024];
    snprintf(sql, sizeof sql,
             "UPDATE runs SET queued_at = queued_at - %1$lld, "
             "started_at = max(started_at - %1$lld, 0), ended_at = max(ended_at - %1$lld, 0) "
             "WHERE id > %2$lld;"
             "UPDATE events SET at = at - %1$lld WHERE id > %3$lld;"
             "UPDATE metrics SET at = at - %1$lld WHERE id > %4$lld;"
             "UPDATE checkpoints SET created_at = created_at - %1$lld WHERE id > %5$lld;",
             (long long)shift, (long long)mark[0], (long long)mark[1], (long long)mark[2],
             (long long)mark[3]);
    CHECK(state_test_exec(st, sql));
}

static void marks(state_t *st, int64_t *mark)
{
    mark[0] = scalar(st, "SELECT coalesce(max(id), 0) FROM runs");
    mark[1] = scalar(st, "SELECT coalesce(max(id), 0) FROM events");
    mark[2] = scalar(st, "SELECT coalesce(max(id), 0) FROM metrics");
    mark[3] = scalar(st, "SELECT coalesce(max(id), 0) FROM checkpoints");
}

/* The partitions and checkpoint files of the runs retention reaches are gone
 * (rotated away, removed by checkpoint.keep). */
static bool all_gone(const char *path, void *ctx)
{
    (void)path;
    (void)ctx;
    return true;
}

/* One fire at scheduled time t: minute m of the hour decides what it is. */
static void fire(state_t *st, mode_t_ mode, int64_t job, int64_t t, int m, int64_t *parent,
                 int64_t *seq)
{
    int64_t run;
    CHECK(state_run_create(st, job, STATE_TRIGGER_CRON, t, 1, 0, &run));
    if (m != 0 && m != 30) {
        const char *why = "no new data: every file matching /data/*.parquet was consumed by an "
                          "earlier successful run";
        if (mode == MODE_OLD)
            CHECK(state_run_transition(st, run, STATE_RUN_QUEUED, STATE_RUN_SKIPPED, -1, why));
        else
            CHECK(state_run_drop_skipped(st, run, why));
        return;
    }
    char path[96];
    snprintf(path, sizeof path, "/data/part-%06lld.parquet", (long long)++*seq);
    state_input_t in = {path, 1 << 20, t, (char *)"0123456789abcdef"};
    CHECK(state_run_transition(st, run, STATE_RUN_QUEUED, STATE_RUN_LAUNCHING, -1, NULL));
    CHECK(state_run_set_launch(st, run, "/var/lib/kiln/runs/x", 4242, "node1"));
    CHECK(state_input_add(st, run, &in));
    CHECK(state_run_transition(st, run, STATE_RUN_LAUNCHING, STATE_RUN_RUNNING, -1, NULL));
    for (int s = 1; s <= 20; s++)
        CHECK(state_metric_add(st, run, s * 50, "loss", 0.5 - s * 0.001));
    if (m == 30) {
        CHECK(state_run_transition(st, run, STATE_RUN_RUNNING, STATE_RUN_FAILED, 1,
                                   "rank 1 exited with status 1 (see the run's log)"));
        return;
    }
    char uid[64];
    snprintf(uid, sizeof uid, "ck-%06lld", (long long)*seq);
    state_checkpoint_t c = {0};
    c.uid = uid;
    c.run_id = run;
    c.parent_id = *parent;
    c.kind = (char *)(*seq % 24 == 1 ? "full" : "incremental"); /* checkpoint.full_every */
    c.path = uid;
    c.step = 1000;
    c.keys = 100000;
    c.bytes = 1 << 20;
    c.checksum = (char *)"0123456789abcdef";
    c.created_at = t;
    c.has_eval = true;
    c.eval_logloss = 0.45;
    c.eval_auc = 0.75;
    CHECK(state_checkpoint_add(st, &c, parent));
    CHECK(state_run_succeed(st, run, STATE_RUN_RUNNING, 0, 0, NULL, 0, NULL));
}

static void report(state_t *st, const char *path, mode_t_ mode, int day)
{
    struct stat sb;
    CHECK(state_test_exec(st, "PRAGMA wal_checkpoint(TRUNCATE)"));
    if (stat(path, &sb) < 0)
        sb.st_size = 0;
    printf("| %s | %d | %.2f MB | %lld | %lld | %lld | %lld |\n", mode_names[mode], day,
           (double)sb.st_size / 1e6, (long long)scalar(st, "SELECT count(*) FROM runs"),
           (long long)scalar(st, "SELECT count(*) FROM events"),
           (long long)scalar(st, "SELECT count(*) FROM metrics"),
           (long long)scalar(st, "SELECT skipped_fires FROM jobs"));
    fflush(stdout);
}

static void simulate(const char *dir, mode_t_ mode, int days, int keep)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.db", dir, mode_names[mode]);
    unlink(path);
    state_t *st = NULL;
    CHECK(state_open(path, &st));
    CHECK(state_test_exec(st, "PRAGMA synchronous = OFF")); /* speed only: sizes are the same */
    int64_t job, parent = 0, seq = 0, mark[4];
    CHECK(state_job_put(st, "every-minute", "name: every-minute\n", "00000000000000aa",
                        "@every 1m", 0, &job, NULL));
    int64_t now = kiln_now_s(), start = now - (int64_t)days * 86400;
    start -= start % 86400;
    for (int d = 0; d < days; d++) {
        marks(st, mark);
        int64_t day0 = start + (int64_t)d * 86400;
        for (int min = 0; min < 1440; min++)
            fire(st, mode, job, day0 + min * 60, min % 60, &parent, &seq);
        /* What was written "now" happened on day d: shift it back. */
        shift_day(st, mark, now - (day0 + 86400));
        if (mode == MODE_KEEP) {
            int64_t before = day0 + 86400 - (int64_t)keep * 86400;
            state_retain_t p = {.before = before, .limit = 500, .gone = all_gone};
            bool more;
            do {
                CHECK(state_retain_pass(st, &p));
                more = p.more;
                state_retain_fini(&p);
            } while (more);
        }
        if (d == 0 || d == 6 || d == 13 || d == days - 1)
            report(st, path, mode, d + 1);
    }
    state_close(st);
}

int main(int argc, char **argv)
{
    int days = 30, keep = 7;
    const char *dir = "/tmp";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--days") == 0)
            days = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--keep") == 0)
            keep = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--dir") == 0)
            dir = argv[i + 1];
    }
    if (days < 1 || keep < 1) {
        fprintf(stderr, "usage: retain_bench [--days N] [--keep DAYS] [--dir DIR]\n");
        return 2;
    }
    kiln_log_set_level(KILN_LOG_WARN);
    printf("@every 1m for %d days; a real run and a failed run an hour; keep: --keep-runs %d\n\n",
           days, keep);
    printf("| database | day | file size | runs | events | metrics | skipped fires on the job |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (int m = MODE_OLD; m <= MODE_KEEP; m++)
        simulate(dir, (mode_t_)m, days, keep);
    return 0;
}
