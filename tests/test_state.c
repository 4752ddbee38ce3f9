/*
 * tests/test_state.c - unit tests of state/, Kiln's SQLite store: opening and
 * creating the file, migration from an empty file and from every earlier
 * schema version (databases built with the first k migrations and filled with
 * rows as that version wrote them), refusing a newer file, jobs, runs and the
 * run state machine, cancel, cron uniqueness vs retries, inputs, metrics,
 * checkpoints, endpoints and pushes, events, and several processes writing the
 * same file at once without losing a write.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>

#include "kiln.h"
#include "ops.h"
#include "state.h"
#include "state_int.h"

#define OK(call)                                                                                   \
    do {                                                                                           \
        int ok_rc_ = (call);                                                                       \
        if (ok_rc_ != 0)                                                                           \
            fail_msg("%s -> %s: %s", #call, kiln_errname(ok_rc_), kiln_errmsg());                  \
    } while (0)

#define HASH_A "00000000000000aa"
#define HASH_B "00000000000000bb"

typedef struct {
    char dir[64];
    char path[160];
    state_t *st;
} fixture_t;

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(p);
}

static void rm_rf(const char *dir)
{
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A temp dir and a database path two directories below it (state_open makes
 * them). The state is opened unless the test opens it itself. */
static int setup_dir(void **state)
{
    fixture_t *f = calloc(1, sizeof *f);
    if (f == NULL)
        return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/kiln-state-XXXXXX");
    if (mkdtemp(f->dir) == NULL) {
        free(f);
        return -1;
    }
    snprintf(f->path, sizeof f->path, "%s/var/lib/kiln.db", f->dir);
    *state = f;
    return 0;
}

static int setup_open(void **state)
{
    if (setup_dir(state) != 0)
        return -1;
    fixture_t *f = *state;
    return state_open(f->path, &f->st) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    state_close(f->st);
    rm_rf(f->dir);
    free(f);
    return 0;
}

static int64_t scalar(state_t *st, const char *sql)
{
    int64_t v = -1;
    OK(state_test_scalar(st, sql, &v));
    return v;
}

static int64_t new_job(state_t *st, const char *name)
{
    int64_t id = 0;
    OK(state_job_put(st, name, "name: x\n", HASH_A, NULL, 0, &id, NULL));
    return id;
}

/* A claimer is dead when its name starts with "dead" (state_push_reclaim). */
static bool dead_if_named_dead(const char *claimer, void *ctx)
{
    (void)ctx;
    return strncmp(claimer, "dead", 4) == 0;
}

static int64_t new_run(state_t *st, int64_t job_id)
{
    int64_t id = 0;
    OK(state_run_create(st, job_id, STATE_TRIGGER_MANUAL, 0, 1, 0, &id));
    return id;
}

/* Moves a run through queued -> launching -> running -> to. */
static void finish_run(state_t *st, int64_t run_id, state_run_state_t to, int exit_code)
{
    OK(state_run_transition(st, run_id, STATE_RUN_QUEUED, STATE_RUN_LAUNCHING, 0, NULL));
    OK(state_run_transition(st, run_id, STATE_RUN_LAUNCHING, STATE_RUN_RUNNING, 0, NULL));
    OK(state_run_transition(st, run_id, STATE_RUN_RUNNING, to, exit_code, NULL));
}

/* Writes the file f->dir/name at schema `version` with the rows of `seed_sql`,
 * then opens it as kilnd does (migrating it to the current version). */
static state_t *open_migrated(const fixture_t *f, const char *name, int version,
                              const char *seed_sql)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", f->dir, name);
    state_t *st = NULL;
    OK(state_open_at_version(path, version, &st));
    OK(state_test_exec(st, seed_sql));
    state_close(st);
    st = NULL;
    OK(state_open(path, &st));
    return st;
}

/* ---- open ------------------------------------------------------------------------ */

static void test_open_creates(void **state)
{
    fixture_t *f = *state;
    struct stat sb;
    int v = -1;
    OK(state_open(f->path, &f->st));
    assert_int_equal(stat(f->path, &sb), 0);
    OK(state_schema_version(f->st, &v));
    assert_int_equal(v, STATE_SCHEMA_VERSION);
    assert_int_equal(scalar(f->st, "SELECT count(*) FROM pragma_journal_mode "
                                   "WHERE journal_mode = 'wal'"),
                     1);
    assert_int_equal(scalar(f->st, "SELECT foreign_keys FROM pragma_foreign_keys"), 1);
    /* Reopening an up-to-date file changes nothing. */
    state_close(f->st);
    f->st = NULL;
    OK(state_open(f->path, &f->st));
    OK(state_schema_version(f->st, &v));
    assert_int_equal(v, STATE_SCHEMA_VERSION);
}

static void test_open_errors(void **state)
{
    fixture_t *f = *state;
    state_t *st = NULL;
    char path[256];

    /* A parent that is a file, not a directory. */
    snprintf(path, sizeof path, "%s/plain", f->dir);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs("this is not a database, it is a text file of some length\n", fp);
    fclose(fp);
    snprintf(path, sizeof path, "%s/plain/kiln.db", f->dir);
    assert_int_equal(state_open(path, &st), KILN_EDB);
    assert_null(st);
    assert_non_null(strstr(kiln_errmsg(), "cannot open database"));
    assert_non_null(strstr(kiln_errmsg(), "--db"));

    /* A file that is not a database. */
    snprintf(path, sizeof path, "%s/plain", f->dir);
    assert_int_equal(state_open(path, &st), KILN_EDB);
    assert_non_null(strstr(kiln_errmsg(), path));
    assert_non_null(strstr(kiln_errmsg(), "not a database"));

    assert_int_equal(state_open("", &st), KILN_EINVAL);
}

/* Runs sql on a plain SQLite connection to path (no Kiln involved). */
static void sqlite_exec_file(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK)
        fail_msg("%s: %s", sql, err ? err : "?");
    sqlite3_close(db);
}

/* The integer sql's first row has on a plain SQLite connection to path. */
static int64_t sqlite_int_file(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

/* Another application's SQLite file is refused and left exactly as it was;
 * Kiln's own files carry its application_id (issue 27: kilnd added its
 * tables to such a file, switched it to WAL and set user_version). */
static void test_open_foreign(void **state)
{
    fixture_t *f = *state;
    state_t *st = NULL;
    char other[256], marked[256];
    snprintf(other, sizeof other, "%s/other.db", f->dir);
    snprintf(marked, sizeof marked, "%s/marked.db", f->dir);
    sqlite_exec_file(other, "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);"
                            "PRAGMA user_version = 3;");
    assert_int_equal(state_open(other, &st), KILN_EDB);
    assert_null(st);
    if (strstr(kiln_errmsg(), "is not a Kiln database (it holds 1 table, such as 'notes', and "
                              "user_version 3") == NULL)
        fail_msg("%s", kiln_errmsg());
    sqlite_exec_file(marked, "PRAGMA application_id = 42;");
    assert_int_equal(state_open(marked, &st), KILN_EDB);
    assert_non_null(strstr(kiln_errmsg(), "belongs to another application (its application_id "
                                          "is 42"));
    /* The file as it was: no Kiln table, not WAL, the same user_version. */
    assert_int_equal(sqlite_int_file(other, "SELECT count(*) FROM sqlite_master WHERE name = "
                                            "'jobs'"),
                     0);
    assert_int_equal(sqlite_int_file(other, "PRAGMA user_version"), 3);
    assert_int_equal(sqlite_int_file(other, "SELECT journal_mode = 'wal' FROM "
                                            "pragma_journal_mode"),
                     0);
    /* A new file is marked as Kiln's, and opens again. */
    OK(state_open(f->path, &f->st));
    assert_int_equal(scalar(f->st, "SELECT application_id FROM pragma_application_id"),
                     STATE_APPLICATION_ID);
    state_close(f->st);
    f->st = NULL;
    OK(state_open(f->path, &f->st));
}

/* ---- migrations ---------------------------------------------------------------------
 * seeds[v-1] writes rows the way schema version v knew them; checks[v-1] finds
 * them again through the current API after migration. Add a pair with each
 * new migration. */
static const char *const seeds[STATE_SCHEMA_VERSION] = {
    "INSERT INTO jobs (id, name, spec_yaml, spec_hash, schedule, priority, version, paused,"
    "  created_at, updated_at, last_scheduled_at)"
    "  VALUES (1, 'old', 'name: old\n', '00000000000000aa', '@daily', 5, 3, 1, 1000, 2000, 1500);"
    "INSERT INTO runs (id, job_id, job_version, state, trigger, attempt, scheduled_at,"
    "  queued_at, started_at, ended_at, exit_code, run_dir, pgid, host)"
    "  VALUES (1, 1, 3, 'succeeded', 'cron', 1, 1500, 1500, 1501, 1600, 0, '/runs/1', 77, 'h1');"
    "INSERT INTO runs (id, job_id, job_version, state, trigger, attempt, scheduled_at, queued_at)"
    "  VALUES (2, 1, 3, 'queued', 'manual', 1, 0, 1700);"
    "INSERT INTO events (job_id, run_id, at, kind, message)"
    "  VALUES (1, 1, 1600, 'state', 'running -> succeeded (exit 0)');",

    "INSERT INTO run_inputs (run_id, path, size, mtime, checksum)"
    "  VALUES (1, '/data/p1', 10, 20, '0123456789abcdef');"
    "INSERT INTO metrics (run_id, step, name, value, at) VALUES (1, 1, 'loss', 0.5, 1550);"
    "INSERT INTO metrics (run_id, step, name, value, at) VALUES (1, 2, 'loss', 0.25, 1560);"
    "INSERT INTO checkpoints (uid, run_id, parent_id, kind, path, step, keys, bytes, checksum,"
    "  created_at) VALUES ('ck-old', 1, NULL, 'full', '/ck/old', 100, 10, 1000, 'ff', 1590);",

    "INSERT INTO runs (id, job_id, job_version, state, trigger, attempt, scheduled_at,"
    "  queued_at, started_at, ended_at, exit_code, error)"
    "  VALUES (3, 1, 3, 'failed', 'manual', 1, 0, 1800, 1801, 1900, 3, 'disk full');",

    "INSERT INTO events (job_id, run_id, at, kind, message)"
    "  VALUES (1, NULL, 1950, 'submit', 'submitted from /specs/old.yaml (version 3)');"
    "INSERT INTO events (job_id, run_id, at, kind, message)"
    "  VALUES (1, 3, 1960, 'state', 'queued -> failed');",

    "UPDATE jobs SET spec_dir = '/specs' WHERE id = 1;"
    "INSERT INTO runs (id, job_id, job_version, state, trigger, attempt, scheduled_at,"
    "  queued_at, spec_dir) VALUES (4, 1, 3, 'queued', 'manual', 1, 0, 2000, '/specs');"
    "INSERT INTO checkpoints (id, uid, run_id, kind, path, created_at, eval_logloss, online)"
    "  VALUES (20, 'ck-v5', 4, 'full', '/ck/v5', 1000, 0.5, 1);"
    "INSERT INTO endpoints (id, url, model, label, created_at)"
    "  VALUES (30, 'http://h:9', 'old', 'B', 2000);"
    "INSERT INTO pushes (id, job_id, run_id, checkpoint_id, endpoint_id, mode, reason, state,"
    "  created_at) VALUES (40, 1, 4, 20, 30, 'incremental', 'run 4 succeeded', 'pending', 2002);",
    "INSERT INTO slurm_jobs (run_id, job_id, state, nodes, partition, updated_at)"
    "  VALUES (3, 4242, 'FAILED', 'kn[1-2]', 'kiln', 1900);",
    "UPDATE jobs SET skipped_fires = 7, last_checked_at = 2100, last_skip_reason = 'no new data'"
    "  WHERE id = 1;",
    "UPDATE jobs SET timezone = 'UTC+02:00' WHERE id = 1;",
    "UPDATE runs SET compacted_at = 5000 WHERE id = 3;",
};

static void check_v1(state_t *st)
{
    state_job_t j;
    state_run_t r;
    state_event_t *es;
    size_t n;
    OK(state_job_get(st, "old", &j));
    assert_int_equal(j.id, 1);
    assert_int_equal(j.version, 3);
    assert_string_equal(j.spec_yaml, "name: old\n");
    assert_string_equal(j.schedule, "@daily");
    assert_int_equal(j.priority, 5);
    assert_true(j.paused);
    assert_int_equal(j.last_scheduled_at, 1500);
    state_job_fini(&j);
    OK(state_run_get(st, 1, &r));
    assert_int_equal(r.state, STATE_RUN_SUCCEEDED);
    assert_int_equal(r.trigger, STATE_TRIGGER_CRON);
    assert_string_equal(r.job_name, "old");
    assert_string_equal(r.host, "h1");
    assert_int_equal(r.pgid, 77);
    assert_int_equal(r.exit_code, 0);
    assert_null(r.error);
    state_run_fini(&r);
    OK(state_event_list(st, 0, 1, &es, &n));
    assert_int_equal(n, 1);
    assert_string_equal(es[0].message, "running -> succeeded (exit 0)");
    state_events_free(es, n);
}

static void check_v2(state_t *st)
{
    state_metric_t *ms;
    size_t n;
    bool consumed = false;
    state_checkpoint_t c;
    state_input_t in = {(char *)"/data/p1", 10, 20, (char *)"0123456789abcdef"};
    OK(state_metric_series(st, 1, "loss", &ms, &n));
    assert_int_equal(n, 2);
    assert_true(ms[1].value == 0.25);
    free(ms);
    OK(state_input_consumed(st, 1, &in, &consumed));
    assert_true(consumed);
    OK(state_checkpoint_latest(st, 1, &c));
    assert_string_equal(c.uid, "ck-old");
    assert_int_equal(c.keys, 10);
    state_checkpoint_fini(&c);
}

/* v3 keeps run counts per (job, state) by triggers and backfills them: they
 * must match the runs table whatever version the file came from. */
static void check_v3(state_t *st)
{
    state_run_t r;
    OK(state_run_get(st, 3, &r));
    assert_int_equal(r.state, STATE_RUN_FAILED);
    assert_string_equal(r.error, "disk full");
    state_run_fini(&r);
}

static void check_counts(state_t *st)
{
    assert_int_equal(scalar(st, "SELECT count(*) FROM (SELECT job_id, state, count(*) AS c "
                                "FROM runs GROUP BY job_id, state) r LEFT JOIN run_counts rc "
                                "USING (job_id, state) WHERE rc.n IS NOT r.c"),
                     0);
}

/* v4 indexes events by (job, kind); the events survive the migration. */
static void check_v4(state_t *st)
{
    assert_int_equal(scalar(st, "SELECT count(*) FROM events WHERE job_id = 1 AND kind = "
                                "'submit' AND message = 'submitted from /specs/old.yaml "
                                "(version 3)'"),
                     1);
    assert_int_equal(scalar(st, "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND "
                                "name = 'events_by_job_kind'"),
                     1);
}

/* v5: spec directories, checkpoint eval figures, endpoints by label, the
 * push queue. */
static void check_v5(state_t *st)
{
    state_run_t r;
    OK(state_run_get(st, 4, &r));
    assert_string_equal(r.spec_dir, "/specs");
    state_run_fini(&r);
    state_checkpoint_t c;
    OK(state_checkpoint_get(st, "ck-v5", &c));
    assert_true(c.eval_logloss == 0.5);
    assert_true(c.online);
    state_checkpoint_fini(&c);
    state_push_t p;
    OK(state_push_get(st, 40, &p));
    assert_int_equal(p.state, STATE_PUSH_PENDING);
    assert_string_equal(p.label, "B");
    state_push_fini(&p);
}

/* v6 records the Slurm job of a run: read back, updated (an event says what
 * changed), and gone with its run. */
static void check_v6(state_t *st)
{
    state_slurm_job_t j;
    OK(state_slurm_job_get(st, 3, &j));
    assert_int_equal(j.job_id, 4242);
    assert_string_equal(j.state, "FAILED");
    assert_string_equal(j.nodes, "kn[1-2]");
    assert_string_equal(j.partition, "kiln");
    state_slurm_job_fini(&j);
    assert_int_equal(state_slurm_job_get(st, 1, &j), KILN_ENOENT);
    state_slurm_job_t put = {1, 77, (char *)"PENDING", NULL, (char *)"kiln", 0};
    OK(state_slurm_job_put(st, &put));
    put.state = (char *)"RUNNING";
    put.nodes = (char *)"kn1";
    OK(state_slurm_job_put(st, &put));
    OK(state_slurm_job_put(st, &put)); /* unchanged: no event */
    OK(state_slurm_job_get(st, 1, &j));
    assert_string_equal(j.state, "RUNNING");
    assert_string_equal(j.nodes, "kn1");
    state_slurm_job_fini(&j);
    assert_int_equal(scalar(st, "SELECT count(*) FROM events WHERE run_id = 1 AND kind = 'slurm'"),
                     2);
}

/* v7: a job's skipped fires are counted on it; an older job has none and
 * is not deleted. */
static void check_v7(state_t *st)
{
    state_job_t j;
    OK(state_job_get(st, "old", &j));
    assert_int_equal(j.deleted_at, 0);
    assert_int_equal(j.skipped_fires, 7);
    assert_int_equal(j.last_checked_at, 2100);
    assert_string_equal(j.last_skip_reason, "no new data");
    state_job_fini(&j);
}

/* v8: a job's time zone is a column. */
static void check_v8(state_t *st)
{
    assert_int_equal(scalar(st, "SELECT count(*) FROM jobs WHERE id = 1 AND "
                                "timezone = 'UTC+02:00'"),
                     1);
}

/* v9: a compacted run says when it was compacted; others are whole. */
static void check_v9(state_t *st)
{
    assert_int_equal(scalar(st, "SELECT compacted_at FROM runs WHERE id = 3"), 5000);
    assert_int_equal(scalar(st, "SELECT count(*) FROM runs WHERE compacted_at != 0"), 1);
}

static void (*const checks[STATE_SCHEMA_VERSION])(state_t *) = {
    check_v1, check_v2, check_v3, check_v4, check_v5, check_v6, check_v7, check_v8, check_v9};

static void test_migrate_every_version(void **state)
{
    fixture_t *f = *state;
    for (int k = 0; k <= STATE_SCHEMA_VERSION; k++) {
        char path[256];
        state_t *st = NULL;
        int v = -1;
        snprintf(path, sizeof path, "%s/v%d/kiln.db", f->dir, k);
        if (k == 0) {
            /* An empty file, as `touch` leaves it. */
            snprintf(path, sizeof path, "%s/v0.db", f->dir);
            FILE *fp = fopen(path, "w");
            assert_non_null(fp);
            fclose(fp);
        } else {
            OK(state_open_at_version(path, k, &st));
            OK(state_schema_version(st, &v));
            assert_int_equal(v, k);
            for (int s = 0; s < k; s++)
                OK(state_test_exec(st, seeds[s]));
            state_close(st);
            st = NULL;
        }
        OK(state_open(path, &st));
        OK(state_schema_version(st, &v));
        assert_int_equal(v, STATE_SCHEMA_VERSION);
        for (int s = 0; s < k; s++)
            checks[s](st);
        check_counts(st);
        if (k >= 1) {
            /* v2 backfills job_versions from jobs; later writes keep using it. */
            if (k < 2)
                assert_int_equal(scalar(st, "SELECT count(*) FROM job_versions "
                                            "WHERE job_id = 1 AND version = 3"),
                                 1);
            int64_t id = 0, run = 0;
            bool created = true;
            OK(state_job_put(st, "old", "name: old\nx: 1\n", HASH_B, "@daily", 5, &id, &created));
            assert_false(created);
            assert_int_equal(scalar(st, "SELECT version FROM jobs WHERE id = 1"), 4);
            /* The cron run migrated from version k still owns its time. */
            assert_int_equal(state_run_create(st, 1, STATE_TRIGGER_CRON, 1500, 1, 0, &run),
                             KILN_EEXIST);
        } else {
            assert_int_equal(scalar(st, "SELECT count(*) FROM jobs"), 0);
        }
        state_close(st);
    }
}

static void test_open_at_version_zero(void **state)
{
    fixture_t *f = *state;
    state_t *st = NULL;
    int v = -1;
    OK(state_open_at_version(f->path, 0, &st));
    OK(state_schema_version(st, &v));
    assert_int_equal(v, 0);
    assert_int_equal(scalar(st, "SELECT count(*) FROM sqlite_master"), 0);
    state_close(st);
    OK(state_open_at_version(f->path, 1, &st));
    assert_int_equal(scalar(st, "SELECT count(*) FROM sqlite_master WHERE name = 'runs'"), 1);
    assert_int_equal(scalar(st, "SELECT count(*) FROM sqlite_master WHERE name = 'metrics'"), 0);
    state_close(st);
}

static void test_refuse_newer(void **state)
{
    fixture_t *f = *state;
    state_t *st = NULL;
    char want[64];
    OK(state_open(f->path, &st));
    OK(state_test_exec(st, "PRAGMA user_version = 99"));
    state_close(st);
    st = NULL;
    assert_int_equal(state_open(f->path, &st), KILN_EVERSION);
    assert_null(st);
    assert_non_null(strstr(kiln_errmsg(), "version 99"));
    snprintf(want, sizeof want, "up to %d", STATE_SCHEMA_VERSION);
    assert_non_null(strstr(kiln_errmsg(), want));
    assert_non_null(strstr(kiln_errmsg(), f->path));
}

/* ---- jobs ----------------------------------------------------------------------------- */

static void test_jobs(void **state)
{
    fixture_t *f = *state;
    state_t *st = f->st;
    int64_t id = 0, id2 = 0, other = 0;
    bool created = false;
    state_job_t j;
    state_job_t *js;
    size_t n;

    OK(state_job_put(st, "ctr", "spec: 1\n", HASH_A, "0 * * * *", 3, &id, &created));
    assert_true(created);
    OK(state_job_get(st, "ctr", &j));
    assert_int_equal(j.id, id);
    assert_int_equal(j.version, 1);
    assert_string_equal(j.spec_hash, HASH_A);
    assert_string_equal(j.schedule, "0 * * * *");
    assert_int_equal(j.priority, 3);
    assert_false(j.paused);
    assert_true(j.created_at > 0 && j.updated_at == j.created_at);
    state_job_fini(&j);

    /* Same hash: no new version. */
    OK(state_job_put(st, "ctr", "spec: 1\n", HASH_A, "0 * * * *", 3, &id2, &created));
    assert_false(created);
    assert_int_equal(id2, id);
    OK(state_job_get_by_id(st, id, &j));
    assert_int_equal(j.version, 1);
    state_job_fini(&j);

    /* A different spec: version 2 and the new text. */
    OK(state_job_put(st, "ctr", "spec: 2\n", HASH_B, NULL, 1, &id2, NULL));
    assert_int_equal(id2, id);
    OK(state_job_get(st, "ctr", &j));
    assert_int_equal(j.version, 2);
    assert_string_equal(j.spec_yaml, "spec: 2\n");
    assert_null(j.schedule);
    assert_int_equal(j.priority, 1);
    state_job_fini(&j);
    assert_int_equal(scalar(st, "SELECT count(*) FROM job_versions"), 2);

    assert_int_equal(state_job_get(st, "nope", &j), KILN_ENOENT);
    assert_non_null(strstr(kiln_errmsg(), "nope"));
    assert_int_equal(state_job_get_by_id(st, 999, &j), KILN_ENOENT);
    assert_int_equal(state_job_put(st, "", "x", HASH_A, NULL, 0, &other, NULL), KILN_EINVAL);

    OK(state_job_put(st, "abc", "a: 1\n", HASH_A, NULL, 0, &other, NULL));
    OK(state_job_list(st, &js, &n));
    assert_int_equal(n, 2);
    assert_string_equal(js[0].name, "abc");
    assert_string_equal(js[1].name, "ctr");
    state_jobs_free(js, n);

    OK(state_job_set_paused(st, id, true));
    OK(state_job_get(st, "ctr", &j));
    assert_true(j.paused);
    state_job_fini(&j);
    OK(state_job_set_paused(st, id, false));
    assert_int_equal(state_job_set_paused(st, 999, true), KILN_ENOENT);

    OK(state_job_set_last_scheduled(st, id, 100));
    OK(state_job_set_last_scheduled(st, id, 50)); /* never moves back */
    OK(state_job_get(st, "ctr", &j));
    assert_int_equal(j.last_scheduled_at, 100);
    state_job_fini(&j);
    assert_int_equal(state_job_set_last_scheduled(st, 999, 1), KILN_ENOENT);
}

/* ---- runs ----------------------------------------------------------------------------- */

static void test_runs_create_list(void **state)
{
    fixture_t *f = *state;
    state_t *st = f->st;
    int64_t a = new_job(st, "a"), b = new_job(st, "b");
    int64_t r1 = new_run(st, a), r2 = new_run(st, b), r3 = new_run(st, a);
    state_run_t r;
    state_run_t *rs;
    size_t n;

    OK(state_run_get(st, r1, &r));
    assert_int_equal(r.job_id, a);
    assert_string_equal(r.job_name, "a");
    assert_int_equal(r.job_version, 1);
    assert_int_equal(r.state, STATE_RUN_QUEUED);
    assert_int_equal(r.trigger, STATE_TRIGGER_MANUAL);
    assert_int_equal(r.attempt, 1);
    assert_int_equal(r.retry_of, 0);
    assert_int_equal(r.exit_code, -1);
    assert_true(r.queued_at > 0);
    assert_int_equal(r.started_at, 0);
    assert_null(r.run_dir);
    assert_false(r.cancel_requested);
    state_run_fini(&r);
    assert_int_equal(state_run_get(st, 999, &r), KILN_ENOENT);

    OK(state_run_list(st, NULL, 0, &rs, &n));
    assert_int_equal(n, 3);
    assert_int_equal(rs[0].id, r3);
    assert_int_equal(rs[1].id, r2);
    assert_int_equal(rs[2].id, r1);
    state_runs_free(rs, n);

    OK(state_run_list(st, "a", 0, &rs, &n));
    assert_int_equal(n, 2);
    assert_int_equal(rs[0].id, r3);
    assert_int_equal(rs[1].id, r1);
    state_runs_free(rs, n);

    OK(state_run_list(st, NULL, 1, &rs, &n));
    assert_int_equal(n, 1);
    assert_int_equal(rs[0].id, r3);
    state_runs_free(rs, n);

    assert_int_equal(state_run_list(st, "zzz", 0, &rs, &n), KILN_ENOENT);

    OK(state_run_transition(st, r2, STATE_RUN_QUEUED, STATE_RUN_LAUNCHING, 0, NULL));
    OK(state_run_list_in_state(st, STATE_RUN_QUEUED, &rs, &n));
    assert_int_equal(n, 2);
    assert_int_equal(rs[0].id, r1); /* oldest first */
    assert_int_equal(rs[1].id, r3);
    state_runs_free(rs, n);

    /* kilnd records the directory first (process group 0), then the launch:
     * one "launch" event, naming the process group. */
    OK(state_run_set_launch(st, r2, "/runs/2", 0, "node1"));
    OK(state_run_set_launch(st, r2, "/runs/2", 4242, "node1"));
    {
        state_event_t *ev = NULL;
        size_t nev = 0, launches = 0;
        OK(state_event_list(st, 0, r2, &ev, &nev));
        for (size_t i = 0; i < nev; i++)
            if (strcmp(ev[i].kind, "launch") == 0) {
                launches++;
                assert_non_null(strstr(ev[i].message, "process group 4242"));
            }
        assert_int_equal(launches, 1);
        state_events_free(ev, nev);
    }
    OK(state_run_set_not_before(st, r1, 12345));
    OK(state_run_get(st, r2, &r));
    assert_string_equal(r.run_dir, "/runs/2");
    assert_int_equal(r.pgid, 4242);
    assert_string_equal(r.host, "node1");
    state_run_fini(&r);
    OK(state_run_get(st, r1, &r));
    assert_int_equal(r.not_before, 12345);
    state_run_fini(&r);
    assert_int_equal(state_run_set_launch(st, 999, "/x", 1, "h"), KILN_ENOENT);

    int64_t bad;
    assert_int_equal(state_run_create(st, 999, STATE_TRIGGER_MANUAL, 0, 1, 0, &bad), KILN_ENOENT);
    assert_int_equal(state_run_create(st, a, STATE_TRIGGER_MANUAL, 0, 0, 0, &bad), KILN_EINVAL);
    assert_int_equal(state_run_create(st, a, STATE_TRIGGER_RETRY, 0, 2, 999, &bad), KILN_ENOENT);
}

static void test_run_transitions(void **state)
{
    fixture_t *f = *state;
    state_t *st = f->st;
    int64_t job = new_job(st, "j"), id = new_run(st, job);
    state_run_t r;
    state_event_t *es;
    size_t n;

    /* No edge queued -> running: launching comes first. */
    assert_int_equal(state_run_transition(st, id, STATE_RUN_QUEUED, STATE_RUN_RUNNING, 0, NULL),
                     KILN_ESTATE);
    assert_non_null(strstr(kiln_errmsg(), "cannot go from queued to running"));
    OK(state_run_transition(st, id, STATE_RUN_QUEUED, STATE_RUN_LAUNCHING, 0, NULL));
    /* Compare-and-set: the run is not queued any more. */
    assert_int_equal(state_run_transition(st, id, STATE_RUN_QUEUED, STATE_RUN_LAUNCHING, 0, NULL),
                     KILN_ESTATE);
    assert_non_null(strstr(kiln_errmsg(), "is launching, not queued"));
    OK(state_run_transition(st, id, STATE_RUN_LAUNCHING, STATE_RUN_RUNNING, 0, NULL));
    OK(state_run_get(st, id, &r));
    assert_int_equal(r.state, STATE_RUN_RUNNING);
    assert_true(r.started_at > 0);
    assert_int_equal(r.ended_at, 0);
    state_run_fini(&r);
    /* Backwards is not an edge. */
    assert_int_equal(state_run_transition(st, id, STATE_RUN_RUNNING, STATE_RUN_QUEUED, 0, NULL),
                     KILN_ESTATE);
    OK(state_run_transition(st, id, STATE_RUN_RUNNING, STATE_RUN_FAILED, 3, "rank 2 died on n2"));
    OK(state_run_get(st, id, &r));
    assert_int_equal(r.state, STATE_RUN_FAILED);
    assert_int_equal(r.exit_code, 3);
    assert_string_equal(r.error, "rank 2 died on n2");
    assert_true(r.ended_at >= r.started_at);
    state_run_fini(&r);
    /* A terminal state never changes. */
    assert_int_equal(state_run_transition(st, id, STATE_RUN_FAILED, STATE_RUN_RUNNING, 0, NULL),
                     KILN_ESTATE);
    assert_non_null(strstr(kiln_errmsg(), "already failed"));
    assert_int_equal(state_run_transition(st, id, STATE_RUN_RUNNING, STATE_RUN_SUCCEEDED, 0, NULL),
                     KILN_ESTATE);
    assert_int_equal(state_run_transition(st, 999, STATE_RUN_QUEUED, STATE_RUN_LAUNCHING, 0, NULL),
                     KILN_ENOENT);

    /* queued, 3 transitions; each an event of kind "state". */
    OK(state_event_list(st, 0, id, &es, &n));
    assert_int_equal(n, 4);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(es[i].kind, "state");
    assert_non_null(strstr(es[3].message, "running -> failed (exit 3): rank 2 died"));
    state_events_free(es, n);

    /* Names and parsing. */
    state_run_state_t s;
    for (int i = 0; i < STATE_RUN_NSTATES; i++) {
        OK(state_run_state_parse(state_run_state_name((state_run_state_t)i), &s));
        assert_int_equal(s, i);
    }
    assert_int_equal(state_run_state_parse("runing", &s), KILN_EINVAL);
    assert_non_null(strstr(kiln_errmsg(), "running"));
    assert_true(state_run_state_terminal(STATE_RUN_SKIPPED));
    assert_false(state_run_state_terminal(STATE_RUN_LAUNCHING));
    assert_string_equal(state_trigger_name(STATE_TRIGGER_CATCHUP), "catchup");
}

static void test_run_cancel(void **state)
{
    fixture_t *f = *state;
    state_t *st = f->st;
    int64_t job = new_job(st, "j");
    int64_t q = new_run(st, job), run = new_run(st, job), done_run = new_run(st, job);
    bool done = false;
    state_run_t r;
    state_event_t *es;
    size_t n;

    OK(state_run_request_cancel(st, q, &done));
    assert_true(done);
    OK(state_run_get(st, q, &r));
    assert_int_equal(r.state, STATE_RUN_CANCELED);
    assert_true(r.ended_at > 0);
    state_run_fini(&r);

    OK(state_run_transition(st, run, STATE_RUN_QUEUED, STATE_RUN_LAUNCHING, 0, NULL));
    OK(state_run_transition(st, run, STATE_RUN_LAUNCHING, STATE_RUN_RUNNING, 0, NULL));
    OK(state_run_request_cancel(st, run, &done));
    assert_false(done);
    OK(state_run_get(st, run, &r));
    assert_int_equal(r.state, STATE_RUN_RUNNING);
    assert_true(r.cancel_requested);
    state_run_fini(&r);
    OK(state_run_request_cancel(st, run, &done)); /* asking twice is fine */
    assert_false(done);
    OK(state_run_transition(st, run, STATE_RUN_RUNNING, STATE_RUN_CANCELED, 143, NULL));

    finish_run(st, done_run, STATE_RUN_SUCCEEDED, 0);
    assert_int_equal(state_run_request_cancel(st, done_run, &done), KILN_ESTATE);
    char want[64];
    snprintf(want, sizeof want, "run %lld already succeeded", (long long)done_run);
    assert_string_equal(kiln_errmsg(), want);
    assert_int_equal(state_run_request_cancel(st, q, &done), KILN_ESTATE);
    assert_non_null(strstr(kiln_errmsg(), "already canceled"));
    assert_int_equal(state_run_request_cancel(st, 999, &done), KILN_ENOENT);

    OK(state_event_list(st, 0, run, &es, &n));
    size_t cancels = 0;
    for (size_t i = 0; i < n; i++)
        cancels += strcmp(es[i].kind, "cancel") == 0;
    assert_int_equal(cancels, 1);
    state_events_free(es, n);
    OK(state_event_list(st, 0, q, &es, &n));
    assert_int_equal(n, 3); /* queued, cancel, queued -> canceled */
    assert_string_equal(es[1].kind, "cancel");
    assert_string_equal(es[2].message, "queued -> canceled");
    state_events_free(es, n);
}

static void test_cron_unique(void **state)
{
    fixture_t *f = *state;
    state_t *st = f->st;
    int64_t job = new_job(st, "cron"), other = new_job(st, "other");
    const int64_t t = 1714608000; /* 2024-05-02T00:00:00Z */
    int64_t first = 0, id = 0;

    OK(state_run_create(st, job, STATE_TRIGGER_CRON, t, 1, 0, &first));
    assert_int_equal(state_run_create(st, job, STATE_TRIGGER_CRON, t, 1, 0, &id), KILN_EEXIST);
    assert_non_null(strstr(kiln_errmsg(), "2024-05-02T00:00:00Z"));
    /* A catch-up run of a time already served is the same time. */
    assert_int_equal(state_run_create(st, job, STATE_TRIGGER_CATCHUP, t, 1, 0, &id), KILN_EEXIST);
    /* Retries carry the time on: allowed, as trigger retry or as a later
     * attempt of the cron trigger, and a user may retry the same run twice. */
    finish_run(st, first, STATE_RUN_FAILED, 1);
    OK(state_run_create(st, job, STATE_TRIGGER_RETRY, t, 2, first, &id));
    OK(state_run_create(st, job, STATE_TRIGGER_RETRY, t, 2, first, &id));
    OK(state_run_create(st, job, STATE_TRIGGER_CRON, t, 3, id, &id));
    /* Other times and other jobs are free; manual runs are never unique. */
    OK(state_run_create(st, job, STATE_TRIGGER_CRON, t + 3600, 1, 0, &id));
    OK(state_run_create(st, other, STATE_TRIGGER_CRON, t, 1, 0, &id));
    OK(state_run_create(st, job, STATE_TRIGGER_MANUAL, 0, 1, 0, &id));
    OK(state_run_create(st, job, STATE_TRIGGER_MANUAL, 0, 1, 0, &id));
    assert_int_equal(scalar(st, "SELECT count(*) FROM runs"), 8);

    state_run_t r;
    OK(state_run_get(st, first + 1, &r));
    assert_int_equal(r.trigger, STATE_TRIGGER_RETRY);
    assert_int_equal(r.retry_of, first);
    assert_int_equal(r.scheduled_at, t);
    assert_int_equal(r.attempt, 2);
    state_run_fini(&r);
}

/* ---- inputs, metrics, checkpoints, pushes, events ----------------------------------- */

static void test_inputs(void **state)
{
    fixture_t *f = *state;
    state_t *st = f->st;
    int64_t job = new_job(st, "j"), other = new_job(st, "k");
    int64_t run = new_run(st, job), failed = new_run(st, job);
    state_input_t p1 = {(char *)"/data/2024-05-01/part-0", 1000, 1714521600,
                        (char *)"0123456789abcdef"};
    state_input_t p2 = {(char *)"/data/2024-05-02/part-0", 2000, 1714608000, NULL};
    state_input_t *ins;
    size_t n;
    bool consumed = true;

    OK(state_input_add(st, run, &p1));
    OK(state_input_add(st, run, &p2));
    OK(state_input_add(st, failed, &p2));
    assert_int_equal(state_input_add(st, 999, &p1), KILN_ENOENT);
    OK(state_input_list(st, run, &ins, &n));
    assert_int_equal(n, 2);
    assert_string_equal(ins[0].path, p1.path);
    assert_int_equal(ins[0].size, 1000);
    assert_int_equal(ins[0].mtime, 1714521600);
    assert_string_equal(ins[0].checksum, p1.checksum);
    assert_null(ins[1].checksum);
    state_inputs_free(ins, n);

    /* Only succeeded runs count. */
    OK(state_input_consumed(st, job, &p1, &consumed));
    assert_false(consumed);
    finish_run(st, failed, STATE_RUN_FAILED, 1);
    finish_run(st, run, STATE_RUN_SUCCEEDED, 0);
    OK(state_input_consumed(st, job, &p1, &consumed));
    assert_true(consumed);
    OK(state_input_consumed(st, job, &p2, &consumed)); /* NULL checksum matches NULL */
    assert_true(consumed);
    /* Same path, changed file: new input. Another job: its own watermark. */
    state_input_t changed = p1;
    changed.mtime++;
    OK(state_input_consumed(st, job, &changed, &consumed));
    assert_false(consumed);
    changed = p1;
    changed.checksum = (char *)"fedcba9876543210";
    OK(state_input_consumed(st, job, &changed, &consumed));
    assert_false(consumed);
    OK(state_input_consumed(st, other, &p1, &consumed));
    assert_false(consumed);
}

static void test_metrics(void **state)
{
    fixture_t *f = *state;
    state_t *st = f->st;
    int64_t run = new_run(st, new_job(st, "j"));
    state_metric_t *ms;
    size_t n;

    OK(state_metric_add(st, run, 3, "loss", 0.3));
    OK(state_metric_add(st, run, 1, "loss", 0.9));
    OK(state_metric_add(st, run, 2, "loss", NAN));
    OK(state_metric_add(st, run, 1, "auc", 0.7));
    assert_int_equal(state_metric_add(st, 999, 1, "loss", 1.0), KILN_ENOENT);
    OK(state_metric_series(st, run, "loss", &ms, &n));
    assert_int_equal(n, 3);
    assert_int_equal(ms[0].step, 1);
    assert_true(ms[0].value == 0.9);
    assert_int_equal(ms[1].step, 2);
    assert_true(isnan(ms[1].value));
    assert_int_equal(ms[2].step, 3);
    assert_true(ms[2].value == 0.3);
    assert_true(ms[0].at > 0);
    free(ms);
    OK(state_metric_series(st, run, "nothing", &ms, &n));
    assert_int_equal(n, 0);
    free(ms);
}

static void test_checkpoints(void **state)
{
    fixture_t *f = *state;
    state_t *st = f->st;
    int64_t job = new_job(st, "j"), empty = new_job(st, "empty");
    int64_t run = new_run(st, job), full = 0, inc = 0, id = 0;
    state_checkpoint_t c = {.uid = (char *)"ck-1",
                            .run_id = run,
                            .kind = (char *)"full",
                            .path = (char *)"/ck/1",
                            .step = 100,
                            .keys = 5000,
                            .bytes = 1 << 20,
                            .checksum = (char *)"00000000000000ff",
                            .created_at = 1000};
    state_checkpoint_t got;

    OK(state_checkpoint_add(st, &c, &full));
    c.uid = (char *)"ck-2";
    c.kind = (char *)"incremental";
    c.parent_id = full;
    c.path = (char *)"/ck/2";
    c.step = 200;
    c.created_at = 2000;
    OK(state_checkpoint_add(st, &c, &inc));
    assert_true(inc > full);

    OK(state_checkpoint_get(st, "ck-2", &got));
    assert_int_equal(got.id, inc);
    assert_int_equal(got.parent_id, full);
    assert_int_equal(got.run_id, run);
    assert_string_equal(got.kind, "incremental");
    assert_int_equal(got.step, 200);
    assert_int_equal(got.keys, 5000);
    assert_int_equal(got.bytes, 1 << 20);
    state_checkpoint_fini(&got);
    OK(state_checkpoint_get(st, "ck-1", &got));
    assert_int_equal(got.parent_id, 0);
    state_checkpoint_fini(&got);
    OK(state_checkpoint_latest(st, job, &got));
    assert_string_equal(got.uid, "ck-2");
    state_checkpoint_fini(&got);

    assert_int_equal(state_checkpoint_latest(st, empty, &got), KILN_ENOENT);
    assert_int_equal(state_checkpoint_get(st, "ck-9", &got), KILN_ENOENT);
    assert_int_equal(state_checkpoint_add(st, &c, &id), KILN_EEXIST);
    c.uid = (char *)"ck-3";
    c.kind = (char *)"delta";
    assert_int_equal(state_checkpoint_add(st, &c, &id), KILN_EINVAL);
    c.kind = (char *)"full";
    c.parent_id = 999;
    assert_int_equal(state_checkpoint_add(st, &c, &id), KILN_ENOENT);
}

/* A checkpoint of run `run` named uid (parent 0: full). */
static int64_t new_ckpt(state_t *st, int64_t run, const char *uid, int64_t parent)
{
    int64_t id = 0;
    state_checkpoint_t c = {.uid = (char *)uid,
                            .run_id = run,
                            .parent_id = parent,
                            .kind = (char *)(parent ? "incremental" : "full"),
                            .path = (char *)"/ck",
                            .step = 1,
                            .keys = 1,
                            .bytes = 1};
    OK(state_checkpoint_add(st, &c, &id));
    return id;
}

static state_push_outcome_t outcome(state_push_state_t s, int http, const char *error)
{
    state_push_outcome_t o = {.state = s, .http_status = http, .attempts = 1, .error = error,
                              .sent = http != 0, .bytes = 100, .event = "a push ended"};
    return o;
}

static void test_endpoints_by_label(void **state)
{
    fixture_t *f = *state;
    state_t *st = f->st;
    int64_t a = 0, b = 0, again = 0, other = 0;
    /* One kiln-serve holding A and B is two endpoints, each kept. */
    OK(state_endpoint_put(st, "http://127.0.0.1:8500", "ctr", "A", &a));
    OK(state_endpoint_put(st, "http://127.0.0.1:8500", "ctr", "B", &b));
    assert_true(a != b);
    OK(state_endpoint_put(st, "http://127.0.0.1:8500", "ctr", "A", &again));
    assert_int_equal(again, a);
    OK(state_endpoint_put(st, "http://127.0.0.1:8500", "other", "A", &other));
    assert_true(other != a && other != b);
    assert_int_equal(scalar(st, "SELECT count(*) FROM endpoints"), 3);
    int64_t id = 0;
    OK(state_endpoint_find(st, "http://127.0.0.1:8500", "ctr", "B", &id));
    assert_int_equal(id, b);
    assert_int_equal(state_endpoint_find(st, "http://127.0.0.1:8500", "ctr", "C", &id),
                     KILN_ENOENT);
    state_endpoint_stats_t x = {.at = 100, .predict_requests = 40, .predict_rows = 400,
                                .request_rate = 2.5};
    OK(state_endpoint_set_stats(st, b, &x));
    state_endpoint_info_t *es = NULL;
    size_t n = 0;
    OK(state_endpoint_list(st, &es, &n));
    assert_int_equal(n, 3);
    bool seen = false;
    for (size_t i = 0; i < n; i++)
        if (es[i].id == b) {
            seen = true;
            assert_int_equal(es[i].predict_requests, 40);
            assert_true(es[i].request_rate == 2.5);
            assert_null(es[i].stats_error);
        }
    assert_true(seen);
    state_endpoint_infos_free(es, n);
}

static void test_push_queue(void **state)
{
    fixture_t *f = *state;
    state_t *st = f->st;
    int64_t job = new_job(st, "j"), run = new_run(st, job);
    int64_t ck1 = new_ckpt(st, run, "ck-1", 0), ck2 = new_ckpt(st, run, "ck-2", ck1);
    int64_t ids[2] = {0}, held = 0, since = 0, ep = 0;
    state_push_req_t reqs[2] = {
        {"http://127.0.0.1:8500", "ctr", "A", ck1, false, "test", NULL, false},
        {"http://127.0.0.1:8500", "ctr", "B", ck1, true, "test", "VAR", true},
    };
    state_push_t *ps = NULL;
    size_t n = 0;

    OK(state_push_enqueue(st, job, run, reqs, 2, NULL, 0, ids));
    OK(state_endpoint_find(st, "http://127.0.0.1:8500", "ctr", "A", &ep));
    assert_int_equal(state_endpoint_holding(st, ep, &held, &since), KILN_ENOENT);
    int64_t due = 0;
    OK(state_push_next_due(st, &due));
    assert_true(due >= 0);

    /* Both are due and go to different endpoints: one claim takes both. */
    OK(state_push_claim(st, "kilnd@h:1:1", kiln_now_ms(), 60000, 10, &ps, &n));
    assert_int_equal(n, 2);
    assert_int_equal(ps[0].state, STATE_PUSH_SENDING);
    assert_string_equal(ps[0].claimed_by, "kilnd@h:1:1");
    assert_string_equal(ps[0].checkpoint_uid, "ck-1");
    assert_true(ps[1].full);
    assert_false(ps[1].gated);
    assert_string_equal(ps[1].token_env, "VAR");
    state_pushes_free(ps, n);
    /* Nothing is claimed twice while the lease holds. */
    OK(state_push_claim(st, "other@h:2:2", kiln_now_ms(), 60000, 10, &ps, &n));
    assert_int_equal(n, 0);
    state_pushes_free(ps, n);

    /* Only the claimer ends it. */
    state_push_outcome_t ok = outcome(STATE_PUSH_SUCCEEDED, 200, NULL);
    assert_int_equal(state_push_end(st, ids[0], "other@h:2:2", &ok), KILN_ESTATE);
    OK(state_push_end(st, ids[0], "kilnd@h:1:1", &ok));
    OK(state_endpoint_holding(st, ep, &held, &since));
    assert_int_equal(held, ck1);
    assert_int_equal(scalar(st, "SELECT count(*) FROM exports WHERE format = 'push-delta'"), 1);
    assert_int_equal(state_push_end(st, ids[0], "kilnd@h:1:1", &ok), KILN_ESTATE);

    /* A failure a retry may help goes back to the queue, due later; the
     * endpoint's holding does not move. */
    state_push_outcome_t again = outcome(STATE_PUSH_PENDING, 503, "HTTP 503");
    again.not_before_ms = kiln_now_ms() + 3600000;
    OK(state_push_end(st, ids[1], "kilnd@h:1:1", &again));
    state_push_t p;
    OK(state_push_get(st, ids[1], &p));
    assert_int_equal(p.state, STATE_PUSH_PENDING);
    assert_int_equal(p.http_status, 503);
    assert_int_equal(p.rounds, 1);
    assert_null(p.claimed_by);
    state_push_fini(&p);
    OK(state_push_claim(st, "kilnd@h:1:1", kiln_now_ms(), 60000, 10, &ps, &n));
    assert_int_equal(n, 0); /* not due yet */
    state_pushes_free(ps, n);
    OK(state_push_next_due(st, &due));
    assert_true(due > kiln_now_ms());

    /* A newer push to the same endpoint supersedes the pending one. */
    reqs[1].checkpoint_id = ck2;
    int64_t newer = 0;
    OK(state_push_enqueue(st, job, run, &reqs[1], 1, NULL, 0, &newer));
    OK(state_push_get(st, ids[1], &p));
    assert_int_equal(p.state, STATE_PUSH_SUPERSEDED);
    assert_non_null(strstr(p.error, "superseded by push"));
    state_push_fini(&p);

    /* Claimed by a deliverer that died: given back, then delivered once. */
    OK(state_push_claim(st, "dead@h:3:3", kiln_now_ms(), 3600000, 10, &ps, &n));
    assert_int_equal(n, 1);
    assert_int_equal(ps[0].id, newer);
    state_pushes_free(ps, n);
    int back = 0;
    OK(state_push_reclaim(st, dead_if_named_dead, NULL, &back));
    assert_int_equal(back, 1);
    OK(state_push_claim(st, "kilnd@h:1:1", kiln_now_ms(), 60000, 10, &ps, &n));
    assert_int_equal(n, 1);
    state_pushes_free(ps, n);
    state_push_outcome_t fail = outcome(STATE_PUSH_FAILED, 422, "the model cannot be built");
    OK(state_push_end(st, newer, "kilnd@h:1:1", &fail));
    OK(state_endpoint_find(st, "http://127.0.0.1:8500", "ctr", "B", &ep));
    assert_int_equal(state_endpoint_holding(st, ep, &held, NULL), KILN_ENOENT);

    /* Listing by run, newest first; open ones only. */
    state_push_filter_t pf = {.run_id = run};
    OK(state_push_list(st, &pf, 10, &ps, &n));
    assert_int_equal(n, 3);
    assert_int_equal(ps[0].id, newer);
    state_pushes_free(ps, n);
    pf.open_only = true;
    OK(state_push_list(st, &pf, 10, &ps, &n));
    assert_int_equal(n, 0);
    state_pushes_free(ps, n);

    /* Bad references. */
    state_push_req_t bad = {"http://127.0.0.1:8500", "ctr", "A", 999, false, "x", NULL, false};
    assert_int_equal(state_push_enqueue(st, job, run, &bad, 1, NULL, 0, NULL), KILN_ENOENT);
    assert_int_equal(state_push_end(st, 999, "kilnd@h:1:1", &ok), KILN_ENOENT);
}

/* A run's success and its pushes commit together. */
static void test_run_succeed_queues(void **state)
{
    fixture_t *f = *state;
    state_t *st = f->st;
    int64_t job = new_job(st, "j"), run = new_run(st, job), ck = new_ckpt(st, run, "ck", 0);
    OK(state_run_transition(st, run, STATE_RUN_QUEUED, STATE_RUN_LAUNCHING, -1, NULL));
    OK(state_run_transition(st, run, STATE_RUN_LAUNCHING, STATE_RUN_RUNNING, -1, NULL));
    state_push_req_t req = {"http://127.0.0.1:8500", "ctr", "B", ck, false, "run 1", NULL, false};
    int64_t id = 0;
    /* From the wrong state: nothing is queued. */
    assert_int_equal(state_run_succeed(st, run, STATE_RUN_QUEUED, 0, 0, &req, 1, &id), KILN_ESTATE);
    assert_int_equal(scalar(st, "SELECT count(*) FROM pushes"), 0);
    OK(state_run_succeed(st, run, STATE_RUN_RUNNING, 0, 1234, &req, 1, &id));
    state_push_t p;
    OK(state_push_get(st, id, &p));
    assert_int_equal(p.state, STATE_PUSH_PENDING);
    assert_int_equal(p.run_id, run);
    assert_int_equal(p.job_id, job);
    state_push_fini(&p);
    state_run_t r;
    OK(state_run_get(st, run, &r));
    assert_int_equal(r.state, STATE_RUN_SUCCEEDED);
    assert_int_equal(r.ended_at, 1234); /* when its status file says it ended */
    state_run_fini(&r);
}

/* Lineage forward: incrementals and the checkpoints of runs started from
 * one; back: the runs that read a file. */
static void test_lineage_queries(void **state)
{
    fixture_t *f = *state;
    state_t *st = f->st;
    int64_t job = new_job(st, "j"), r1 = new_run(st, job), r2 = new_run(st, job);
    int64_t c1 = new_ckpt(st, r1, "c1", 0), c2 = new_ckpt(st, r1, "c2", c1);
    int64_t c3 = new_ckpt(st, r2, "c3", 0); /* a full dump of a run warm-started from c2 */
    OK(state_run_set_start_checkpoint(st, r2, c2));
    state_checkpoint_t *cs = NULL;
    size_t n = 0;
    OK(state_checkpoint_descendants(st, c1, 10, &cs, &n));
    assert_int_equal(n, 2);
    assert_int_equal(cs[0].id, c2);
    assert_int_equal(cs[1].id, c3);
    state_checkpoints_free(cs, n);
    OK(state_checkpoint_descendants(st, c3, 10, &cs, &n));
    assert_int_equal(n, 0);
    state_checkpoints_free(cs, n);
    state_input_t in = {(char *)"/data/p", 1, 2, (char *)"00"};
    OK(state_input_add(st, r1, &in));
    OK(state_input_add(st, r2, &in));
    int64_t *rs = NULL;
    OK(state_input_runs(st, "/data/p", 10, &rs, &n));
    assert_int_equal(n, 2);
    assert_int_equal(rs[0], r2);
    free(rs);
    /* An online run's input counts as consumed once a checkpoint covers it. */
    bool consumed = true;
    OK(state_input_consumed(st, job, &in, &consumed));
    assert_false(consumed);
    OK(state_inputs_cover(st, r2, c3));
    OK(state_input_consumed(st, job, &in, &consumed));
    assert_true(consumed);
    /* Eval figures of a checkpoint. */
    state_checkpoint_t c;
    OK(state_checkpoint_set_eval(st, c3, 0.45, 0.8));
    OK(state_checkpoint_get_by_id(st, c3, &c));
    assert_true(c.eval_logloss == 0.45);
    assert_true(c.has_eval);
    state_checkpoint_fini(&c);
    OK(state_checkpoint_get_by_id(st, c1, &c));
    assert_true(isnan(c.eval_logloss));
    assert_false(c.has_eval);
    state_checkpoint_fini(&c);
}

/* v4 -> v5 rebuilds endpoints and pushes: every id and holding survives,
 * an old push becomes an ended push of its export's checkpoint. */
static void test_migrate_v5_pushes(void **state)
{
    fixture_t *f = *state;
    state_t *st = open_migrated(
        f, "v4p.db", 4,
        "INSERT INTO jobs (id, name, spec_yaml, spec_hash, version, created_at, updated_at)"
        "  VALUES (1, 'j', 'x', '00', 1, 1, 1);"
        "INSERT INTO runs (id, job_id, job_version, state, trigger, queued_at)"
        "  VALUES (1, 1, 1, 'succeeded', 'manual', 1);"
        "INSERT INTO checkpoints (id, uid, run_id, kind, path, created_at)"
        "  VALUES (7, 'ck-7', 1, 'full', '/ck/7', 1);"
        "INSERT INTO exports (id, checkpoint_id, format, path, bytes, created_at)"
        "  VALUES (3, 7, 'push-full', '/ck/7', 10, 1);"
        "INSERT INTO endpoints (id, url, model, label, created_at)"
        "  VALUES (5, 'http://h:1', 'ctr', 'A', 1);"
        "INSERT INTO endpoints (id, url, model, label, created_at)"
        "  VALUES (6, 'http://h:2', 'ctr', NULL, 1);"
        "INSERT INTO pushes (id, export_id, endpoint_id, state, http_status, attempts,"
        "  started_at, ended_at) VALUES (9, 3, 5, 'succeeded', 200, 1, 50, 51);"
        "INSERT INTO endpoint_holdings (endpoint_id, checkpoint_id, push_id, since)"
        "  VALUES (5, 7, 9, 51);");
    state_push_t p;
    OK(state_push_get(st, 9, &p));
    assert_int_equal(p.checkpoint_id, 7);
    assert_int_equal(p.endpoint_id, 5);
    assert_int_equal(p.export_id, 3);
    assert_int_equal(p.job_id, 1);
    assert_true(p.full);
    assert_int_equal(p.state, STATE_PUSH_SUCCEEDED);
    assert_string_equal(p.label, "A");
    state_push_fini(&p);
    int64_t held = 0;
    OK(state_endpoint_holding(st, 5, &held, NULL));
    assert_int_equal(held, 7);
    int64_t id = 0;
    OK(state_endpoint_find(st, "http://h:2", "ctr", "", &id));
    assert_int_equal(id, 6);
    assert_int_equal(scalar(st, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
    assert_int_equal(scalar(st, "PRAGMA foreign_keys"), 1);
    state_close(st);
}

static void test_events(void **state)
{
    fixture_t *f = *state;
    state_t *st = f->st;
    int64_t job = new_job(st, "j"), other = new_job(st, "k");
    int64_t run = new_run(st, job);
    state_event_t *es;
    size_t n, all;

    OK(state_event_list(st, 0, 0, &es, &all));
    state_events_free(es, all);
    OK(state_event_add(st, job, 0, "note", "spec reviewed"));
    OK(state_event_add(st, 0, run, "progress", "step 100, loss 0.3"));
    OK(state_event_add(st, other, 0, "note", "other job"));
    assert_int_equal(state_event_add(st, 0, 999, "x", "y"), KILN_ENOENT);
    assert_int_equal(state_event_add(st, 999, 0, "x", "y"), KILN_ENOENT);

    OK(state_event_list(st, 0, run, &es, &n));
    assert_int_equal(n, 2); /* queued, progress */
    assert_string_equal(es[1].kind, "progress");
    assert_string_equal(es[1].message, "step 100, loss 0.3");
    assert_int_equal(es[1].job_id, job); /* filed under the run's job */
    assert_int_equal(es[1].run_id, run);
    assert_true(es[1].at > 0 && es[1].id > es[0].id);
    state_events_free(es, n);

    /* The job's log: its spec event, its run's events and its own notes. */
    OK(state_event_list(st, job, 0, &es, &n));
    assert_int_equal(n, 4);
    assert_string_equal(es[0].kind, "spec");
    assert_string_equal(es[2].message, "spec reviewed");
    state_events_free(es, n);
    OK(state_event_list(st, 0, 0, &es, &n));
    assert_int_equal(n, all + 3);
    state_events_free(es, n);
}

/* ---- several processes at once ------------------------------------------------------ */

#define NPROC 4
#ifndef NITER
#define NITER 500
#endif
#define NCRON 40

/* One child: opens the file itself and writes as fast as it can. Each
 * iteration is 3 transactions (create, transition, event); then every child
 * races for the same NCRON cron times. Exit status 0 or 1. */
static int writer(const char *path, int64_t job, int me)
{
    state_t *st = NULL;
    int rc;
    int64_t id;
    char msg[64];
    KILN_CHECK_GOTO(state_open(path, &st), rc, out);
    for (int i = 0; i < NITER; i++) {
        KILN_CHECK_GOTO(state_run_create(st, job, STATE_TRIGGER_MANUAL, 0, 1, 0, &id), rc, out);
        KILN_CHECK_GOTO(
            state_run_transition(st, id, STATE_RUN_QUEUED, STATE_RUN_LAUNCHING, 0, NULL), rc, out);
        snprintf(msg, sizeof msg, "writer %d iteration %d", me, i);
        KILN_CHECK_GOTO(state_event_add(st, job, id, "test", msg), rc, out);
    }
    for (int t = 1; t <= NCRON; t++) {
        rc = state_run_create(st, job, STATE_TRIGGER_CRON, 1000 * t, 1, 0, &id);
        if (rc < 0 && rc != KILN_EEXIST)
            goto out;
    }
    rc = 0;
out:
    if (rc < 0)
        fprintf(stderr, "writer %d: %s: %s\n", me, kiln_errname(rc), kiln_errmsg());
    state_close(st);
    return rc < 0 ? 1 : 0;
}

static void run_children(const char *path, int64_t job)
{
    pid_t pids[NPROC];
    for (int i = 0; i < NPROC; i++) {
        fflush(NULL);
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0)
            _exit(writer(path, job, i));
    }
    for (int i = 0; i < NPROC; i++) {
        int status = 0;
        assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
}

static void test_concurrent_writers(void **state)
{
    fixture_t *f = *state;
    int64_t job;
    state_run_t *rs;
    size_t n;
    state_event_t *es;

    /* Create the file and the job, and hold no connection across fork(). */
    OK(state_open(f->path, &f->st));
    job = new_job(f->st, "busy");
    state_close(f->st);
    f->st = NULL;

    run_children(f->path, job);

    OK(state_open(f->path, &f->st));
    OK(state_run_list_in_state(f->st, STATE_RUN_LAUNCHING, &rs, &n));
    assert_int_equal(n, NPROC * NITER);
    state_runs_free(rs, n);
    OK(state_run_list(f->st, "busy", 0, &rs, &n));
    assert_int_equal(n, NPROC * NITER + NCRON); /* each cron time exactly once */
    state_runs_free(rs, n);
    OK(state_event_list(f->st, job, 0, &es, &n));
    /* spec + per run (queued, queued -> launching, test) + per cron run (queued). */
    assert_int_equal(n, 1 + 3 * NPROC * NITER + NCRON);
    state_events_free(es, n);
    assert_int_equal(scalar(f->st, "SELECT count(DISTINCT message) FROM events "
                                   "WHERE kind = 'test'"),
                     NPROC * NITER);
}

/* Several processes opening (and so creating and migrating) one new file. */
static int opener(const char *path, int me)
{
    state_t *st = NULL;
    char name[32];
    int64_t id;
    int rc;
    snprintf(name, sizeof name, "job-%d", me);
    KILN_CHECK_GOTO(state_open(path, &st), rc, out);
    KILN_CHECK_GOTO(state_job_put(st, name, "x: 1\n", HASH_A, NULL, 0, &id, NULL), rc, out);
out:
    if (rc < 0)
        fprintf(stderr, "opener %d: %s: %s\n", me, kiln_errname(rc), kiln_errmsg());
    state_close(st);
    return rc < 0 ? 1 : 0;
}

static void test_concurrent_open(void **state)
{
    fixture_t *f = *state;
    pid_t pids[4];
    int v = 0;
    for (int i = 0; i < 4; i++) {
        fflush(NULL);
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0)
            _exit(opener(f->path, i));
    }
    for (int i = 0; i < 4; i++) {
        int status = 0;
        assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    OK(state_open(f->path, &f->st));
    OK(state_schema_version(f->st, &v));
    assert_int_equal(v, STATE_SCHEMA_VERSION);
    assert_int_equal(scalar(f->st, "SELECT count(*) FROM jobs"), 4);
}

/* A child holds the write lock for hold_ms; the parent, with a busy timeout
 * of timeout_ms, then submits a job. Returns the parent's result and how long
 * it took. */
static int write_while_locked(const char *path, int hold_ms, int timeout_ms, int64_t *took_ms)
{
    int fds[2];
    char c = 0;
    state_t *st = NULL;
    int64_t id;
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        state_t *holder = NULL;
        int bad = state_open(path, &holder) != 0 || state_test_exec(holder, "BEGIN IMMEDIATE") != 0;
        if (write(fds[1], "x", 1) != 1 || bad)
            _exit(1);
        usleep((useconds_t)hold_ms * 1000);
        bad = state_test_exec(holder, "COMMIT") != 0;
        state_close(holder);
        _exit(bad);
    }
    close(fds[1]);
    assert_int_equal(read(fds[0], &c, 1), 1);
    close(fds[0]);
    OK(state_open(path, &st));
    state_test_set_busy_timeout(st, timeout_ms);
    int64_t t0 = kiln_mono_ns();
    int rc = state_job_put(st, "locked", "x: 1\n", HASH_A, NULL, 0, &id, NULL);
    *took_ms = (kiln_mono_ns() - t0) / 1000000;
    state_close(st);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return rc;
}

static void test_busy_retry(void **state)
{
    fixture_t *f = *state;
    int64_t took = 0;
    state_t *st = NULL;
    OK(state_open(f->path, &st));
    state_close(st);

    /* The lock outlives one busy timeout but not the retries: no write lost. */
    OK(write_while_locked(f->path, 300, 100, &took));
    assert_true(took >= 150);
    /* Held far longer than every try together: a bounded wait, then an
     * error that says what happened. */
    assert_int_equal(write_while_locked(f->path, 1500, 50, &took), KILN_EDB);
    assert_true(took < 1500);
    assert_non_null(strstr(kiln_errmsg(), "stayed locked by another process"));
    assert_non_null(strstr(kiln_errmsg(), f->path));
}

/* A job's endpoints are recorded in the submit's transaction (ops.h says
 * so): when recording one fails, the submit fails and stores nothing. Issue
 * 27 found them written after the commit, so a failure reported an error
 * for a job that was stored. */
static void test_submit_endpoints_atomic(void **state)
{
    fixture_t *f = *state;
    OK(state_test_exec(f->st, "CREATE TRIGGER no_b BEFORE INSERT ON endpoints WHEN NEW.label = "
                              "'B' BEGIN SELECT RAISE(ABORT, 'endpoint B refused'); END"));
    const char *spec = "name: ep-atomic\n"
                       "data: {train: /tmp/none.tsv}\n"
                       "model: {type: lr, embedding: {dim: 4, capacity: 1000}}\n"
                       "push:\n"
                       "  endpoints:\n"
                       "    - {url: \"http://127.0.0.1:8501\", model: ctr, label: A}\n"
                       "    - {url: \"http://127.0.0.1:8502\", model: ctr, label: B}\n";
    ops_submit_t in = {.text = spec, .len = strlen(spec), .source = "the test"};
    job_diags_t diags;
    job_diags_init(&diags);
    ops_submitted_t out;
    int rc = ops_submit(f->st, &in, &diags, &out);
    job_diags_fini(&diags);
    if (rc == 0)
        ops_submitted_fini(&out);
    assert_true(rc < 0);
    assert_int_equal(scalar(f->st, "SELECT count(*) FROM jobs"), 0);
    assert_int_equal(scalar(f->st, "SELECT count(*) FROM runs"), 0);
    assert_int_equal(scalar(f->st, "SELECT count(*) FROM endpoints"), 0);

    OK(state_test_exec(f->st, "DROP TRIGGER no_b"));
    job_diags_init(&diags);
    OK(ops_submit(f->st, &in, &diags, &out));
    job_diags_fini(&diags);
    ops_submitted_fini(&out);
    assert_int_equal(scalar(f->st, "SELECT count(*) FROM jobs"), 1);
    assert_int_equal(scalar(f->st, "SELECT count(*) FROM endpoints"), 2);
}

/* A skipped cron fire is no run: the queued run goes, the job counts it. A
 * delete is refused while runs are active, cancels them when asked, keeps the
 * row (runs stay readable), and a submit of the name brings the job back. */
static void test_job_skip_delete(void **state)
{
    fixture_t *f = *state;
    state_t *st = f->st;
    int64_t id = new_job(st, "ctr"), run = 0;
    OK(state_run_create(st, id, STATE_TRIGGER_CRON, 6000, 1, 0, &run));
    OK(state_run_drop_skipped(st, run, "no new data"));
    state_run_t r;
    assert_int_equal(state_run_get(st, run, &r), KILN_ENOENT);
    assert_int_equal(scalar(st, "SELECT count(*) FROM events WHERE run_id IS NOT NULL"), 0);
    check_counts(st);
    state_job_t j;
    OK(state_job_get(st, "ctr", &j));
    assert_int_equal(j.skipped_fires, 1);
    assert_true(j.last_checked_at > 0);
    assert_string_equal(j.last_skip_reason, "no new data");
    state_job_fini(&j);

    int64_t queued = new_run(st, id);
    int nstopped = -1;
    assert_int_equal(state_job_delete(st, id, false, &nstopped), KILN_ESTATE);
    assert_non_null(strstr(kiln_errmsg(), "--cancel"));
    OK(state_run_transition(st, queued, STATE_RUN_QUEUED, STATE_RUN_LAUNCHING, -1, NULL));
    OK(state_job_delete(st, id, true, &nstopped));
    assert_int_equal(nstopped, 1);
    OK(state_run_get(st, queued, &r));
    assert_true(r.cancel_requested); /* kilnd stops it */
    state_run_fini(&r);
    state_job_t *js;
    size_t n;
    OK(state_job_list(st, &js, &n));
    assert_int_equal(n, 0);
    state_jobs_free(js, n);
    OK(state_job_get(st, "ctr", &j)); /* still readable by name */
    assert_true(j.deleted_at > 0);
    state_job_fini(&j);
    assert_int_equal(state_job_delete(st, id, true, NULL), KILN_ENOENT);
    bool created = true;
    int64_t again = 0;
    OK(state_job_put(st, "ctr", "name: x\n", HASH_A, NULL, 0, &again, &created));
    assert_int_equal(again, id);
    assert_false(created);
    OK(state_job_get(st, "ctr", &j));
    assert_int_equal(j.deleted_at, 0);
    state_job_fini(&j);
}

/* A v7 file's jobs get their time zone from their stored specs when the file
 * is opened (migration 8's backfill); a submit writes it. */
static void test_migrate_timezone(void **state)
{
    fixture_t *f = *state;
    state_t *st =
        open_migrated(f, "v7tz.db", 7,
                      "INSERT INTO jobs (name, spec_yaml, spec_hash, schedule, created_at,"
                      "  updated_at) VALUES"
                      "  ('zoned', 'name: zoned\nschedule: \"0 9 * * *\"\n"
                      "timezone: \"UTC+02:00\"\ndata: {train: x.tsv}\n"
                      "model: {type: lr}\n', '01', '0 9 * * *', 1, 1),"
                      "  ('plain', 'name: plain\nschedule: \"@daily\"\n"
                      "data: {train: x.tsv}\nmodel: {type: lr}\n', '02', '@daily', 1, 1),"
                      "  ('broken', 'name: broken\nmodel: [', '03', '@daily', 1, 1);");
    const char *want[][2] = {{"zoned", "UTC+02:00"}, {"plain", "UTC"}, {"broken", NULL}};
    for (size_t i = 0; i < 3; i++) {
        state_job_t j;
        OK(state_job_get(st, want[i][0], &j));
        if (want[i][1] == NULL)
            assert_null(j.timezone);
        else
            assert_string_equal(j.timezone, want[i][1]);
        state_job_fini(&j);
    }
    state_submit_t sub = {.name = "zoned",
                          .spec_yaml = "name: zoned\n",
                          .spec_hash = "04",
                          .schedule = "0 9 * * *",
                          .timezone = "UTC-05:00",
                          .source = "test"};
    state_submitted_t done;
    OK(state_submit(st, &sub, &done));
    state_job_t j;
    OK(state_job_get(st, "zoned", &j));
    assert_string_equal(j.timezone, "UTC-05:00");
    state_job_fini(&j);
    state_close(st);
}

static bool always_gone(const char *path, void *ctx)
{
    (void)path;
    (void)ctx;
    return true;
}

static bool never_gone(const char *path, void *ctx)
{
    (void)path;
    (void)ctx;
    return false;
}

/* Retention compacts old ended runs (their events go, their directories are
 * handed back) and removes those nothing needs; it keeps a run with the
 * job's newest checkpoint, a succeeded run's consumed inputs while the file
 * is there, the newest run and success of a job, runs not ended, recent
 * runs. A retry of a removed run loses its link. */
static void test_runs_prune(void **state)
{
    fixture_t *f = *state;
    state_t *st = f->st;
    int64_t job = new_job(st, "ctr"), ids[7];
    for (int i = 0; i < 7; i++)
        ids[i] = new_run(st, job);
    /* 0 failed, 1 canceled, 2 succeeded with a checkpoint, 3 succeeded with an
     * input, 4 failed (retried later), 5 and 6 queued. */
    state_run_state_t ends[] = {STATE_RUN_FAILED, STATE_RUN_CANCELED, STATE_RUN_SUCCEEDED,
                                STATE_RUN_SUCCEEDED, STATE_RUN_FAILED};
    for (int i = 0; i < 5; i++) {
        if (ends[i] != STATE_RUN_CANCELED)
            OK(state_run_transition(st, ids[i], STATE_RUN_QUEUED, STATE_RUN_LAUNCHING, -1, NULL));
        OK(state_run_transition(st, ids[i],
                                ends[i] == STATE_RUN_CANCELED ? STATE_RUN_QUEUED
                                                              : STATE_RUN_LAUNCHING,
                                ends[i], 0, NULL));
    }
    OK(state_run_set_launch(st, ids[0], "/k/runs/1", 0, "h"));
    state_checkpoint_t c = {0};
    c.uid = (char *)"ck-1";
    c.run_id = ids[2];
    c.kind = (char *)"full";
    c.path = (char *)"/ck/1";
    c.eval_logloss = c.eval_auc = NAN;
    int64_t ck;
    OK(state_checkpoint_add(st, &c, &ck));
    state_input_t in = {(char *)"/d/p1", 1, 2, NULL};
    OK(state_input_add(st, ids[3], &in));
    int64_t retry = 0;
    OK(state_run_create(st, job, STATE_TRIGGER_RETRY, 0, 2, ids[4], &retry));
    OK(state_run_transition(st, retry, STATE_RUN_QUEUED, STATE_RUN_LAUNCHING, -1, NULL));
    OK(state_run_transition(st, retry, STATE_RUN_LAUNCHING, STATE_RUN_SUCCEEDED, 0, NULL));
    OK(state_event_add(st, job, 0, "push", "an old job event"));
    OK(state_test_exec(st, "UPDATE runs SET ended_at = 1000 WHERE ended_at > 0;"
                           "UPDATE events SET at = 1000;"));
    state_retain_t p = {.before = 500, .limit = 100};
    OK(state_retain_pass(st, &p)); /* nothing is that old */
    assert_int_equal(p.compacted + p.removed, 0);
    p.before = 2000;
    OK(state_retain_pass(st, &p));
    assert_int_equal(p.compacted, 5); /* all but the retry: the newest run and success */
    assert_int_equal(p.removed, 3);   /* 0, 1 and 4: nothing refers to them */
    assert_int_equal(p.events, 1);
    assert_int_equal(p.ndirs, 1);
    assert_string_equal(p.run_dirs[0], "/k/runs/1");
    state_retain_fini(&p);
    state_run_t r;
    assert_int_equal(state_run_get(st, ids[0], &r), KILN_ENOENT);
    assert_int_equal(state_run_get(st, ids[4], &r), KILN_ENOENT);
    int64_t kept[] = {ids[2], ids[3], ids[5], ids[6]};
    for (size_t k = 0; k < sizeof kept / sizeof kept[0]; k++) {
        OK(state_run_get(st, kept[k], &r));
        state_run_fini(&r);
    }
    OK(state_run_get(st, retry, &r));
    assert_int_equal(r.retry_of, 0);
    state_run_fini(&r);
    assert_int_equal(scalar(st, "SELECT count(*) FROM events WHERE kind = 'spec'"), 1);
    /* Once its file is gone, the input goes, and its run with it. */
    p.gone = always_gone;
    OK(state_retain_pass(st, &p));
    assert_int_equal(p.inputs, 1);
    assert_int_equal(p.removed, 1);
    state_retain_fini(&p);
    assert_int_equal(state_run_get(st, ids[3], &r), KILN_ENOENT);
    OK(state_run_get(st, ids[2], &r)); /* its checkpoint is the job's newest */
    state_run_fini(&r);
    check_counts(st);
    p.limit = 0;
    assert_int_equal(state_retain_pass(st, &p), KILN_EINVAL);
}

/* A run that succeeded (or whose inputs a checkpoint covers, online) keeps
 * its inputs through compaction while their files are there: the data is
 * still consumed and never trained again. Its events and loss points go. */
static void test_retain_keeps_consumed(void **state)
{
    fixture_t *f = *state;
    state_t *st = f->st;
    int64_t job = new_job(st, "inc"), ran = new_run(st, job), online = new_run(st, job);
    state_input_t in = {(char *)"/d/p1", 10, 20, (char *)"00000000000000c1"};
    state_input_t in2 = {(char *)"/d/p2", 10, 20, (char *)"00000000000000c2"};
    OK(state_input_add(st, ran, &in));
    finish_run(st, ran, STATE_RUN_SUCCEEDED, 0);
    OK(state_metric_add(st, ran, 1, "loss", 0.5));
    OK(state_input_add(st, online, &in2));
    state_checkpoint_t c = {.uid = (char *)"ck-on",
                            .run_id = online,
                            .kind = (char *)"full",
                            .path = (char *)"/ck/on",
                            .eval_logloss = NAN,
                            .eval_auc = NAN};
    int64_t ck = 0;
    OK(state_checkpoint_add(st, &c, &ck));
    OK(state_inputs_cover(st, online, ck));
    finish_run(st, online, STATE_RUN_FAILED, 1); /* failed after the export */
    for (int i = 0; i < 2; i++)
        finish_run(st, new_run(st, job), STATE_RUN_SUCCEEDED, 0);
    OK(state_test_exec(st, "UPDATE runs SET ended_at = 1000"));
    state_retain_t p = {.before = 2000, .limit = 100, .gone = never_gone};
    OK(state_retain_pass(st, &p));
    assert_int_equal(p.compacted, 3); /* the newest run (also the newest success) stays whole */
    state_retain_fini(&p);
    assert_int_equal(scalar(st, "SELECT count(*) FROM events WHERE run_id IS NOT NULL AND "
                                "run_id <= 3"),
                     0);
    assert_int_equal(scalar(st, "SELECT count(*) FROM metrics"), 0);
    assert_true(scalar(st, "SELECT compacted_at FROM runs WHERE id = 1") > 0);
    bool consumed = false;
    OK(state_input_consumed(st, job, &in, &consumed));
    assert_true(consumed);
    consumed = false;
    OK(state_input_consumed(st, job, &in2, &consumed));
    assert_true(consumed);
    /* The covering checkpoint is not the job's newest... */
    c.uid = (char *)"ck-new";
    c.run_id = 4;
    c.path = (char *)"/ck/new";
    OK(state_checkpoint_add(st, &c, &ck));
    /* ...but stays while it covers an input, whose file is there. */
    OK(state_retain_pass(st, &p));
    state_retain_fini(&p);
    state_checkpoint_t got;
    OK(state_checkpoint_get(st, "ck-on", &got));
    state_checkpoint_fini(&got);
    check_counts(st);
}

/* An incremental job pushing every run, thousands of runs: with the data
 * rotated away and checkpoint.keep removing old files, what retention keeps
 * stays bounded, however many runs went by. */
static void add_pushing_run(state_t *st, int64_t job, int64_t ep, int i, int64_t *parent)
{
    char path[64], uid[32], sql[512];
    int64_t run = new_run(st, job), ck = 0;
    snprintf(path, sizeof path, "/d/p-%06d", i);
    state_input_t in = {path, 100, 1, (char *)"00000000000000c1"};
    OK(state_input_add(st, run, &in));
    OK(state_event_add(st, 0, run, "info", "a line of the run"));
    OK(state_metric_add(st, run, 1, "loss", 0.5));
    finish_run(st, run, STATE_RUN_SUCCEEDED, 0);
    snprintf(uid, sizeof uid, "ck-%06d", i);
    snprintf(path, sizeof path, "/ck/%06d", i);
    bool full = i % 8 == 0; /* checkpoint.full_every: 8 */
    state_checkpoint_t c = {.uid = uid,
                            .run_id = run,
                            .parent_id = *parent,
                            .kind = (char *)(full ? "full" : "incremental"),
                            .path = path,
                            .eval_logloss = NAN,
                            .eval_auc = NAN};
    OK(state_checkpoint_add(st, &c, &ck));
    snprintf(sql, sizeof sql,
             "INSERT INTO exports (checkpoint_id, base_checkpoint_id, format, path, created_at) "
             "VALUES (%1$lld, NULL, 'kiln', '/x', 1);"
             "INSERT INTO pushes (job_id, run_id, checkpoint_id, endpoint_id, export_id, mode, "
             "state, created_at) VALUES (%2$lld, %3$lld, %1$lld, %4$lld, last_insert_rowid(), "
             "'incremental', 'succeeded', 1);"
             "UPDATE endpoint_holdings SET until_at = 1 WHERE endpoint_id = %4$lld "
             "AND until_at IS NULL;"
             "INSERT INTO endpoint_holdings (endpoint_id, checkpoint_id, push_id, since) "
             "VALUES (%4$lld, %1$lld, (SELECT max(id) FROM pushes), 1);",
             (long long)ck, (long long)job, (long long)run, (long long)ep);
    OK(state_test_exec(st, sql));
    *parent = ck;
}

/* Files /d/p-N and checkpoints /ck/N with N below the mark are gone. */
static bool gone_below(const char *path, void *ctx)
{
    const char *digits = strrchr(path, '-') ? strrchr(path, '-') + 1 : strrchr(path, '/') + 1;
    return atoi(digits) < *(const int *)ctx;
}

static void test_retain_bounded(void **state)
{
    fixture_t *f = *state;
    state_t *st = f->st;
    int64_t job = new_job(st, "soak"), ep = 0, parent = 0;
    OK(state_test_exec(st, "INSERT INTO endpoints (url, model, label, created_at) "
                           "VALUES ('http://a', 'ctr', 'A', 1)"));
    ep = scalar(st, "SELECT id FROM endpoints");
    int64_t rows[3];
    const char *count = "SELECT (SELECT count(*) FROM runs) + (SELECT count(*) FROM run_inputs) "
                        "+ (SELECT count(*) FROM checkpoints) + (SELECT count(*) FROM pushes) "
                        "+ (SELECT count(*) FROM endpoint_holdings) + (SELECT count(*) FROM "
                        "exports) + (SELECT count(*) FROM events) + (SELECT count(*) FROM metrics)";
    int n = 0;
    for (int round = 0; round < 3; round++) {
        for (int k = 0; k < 400; k++, n++)
            add_pushing_run(st, job, ep, n, &parent);
        /* All but the last 20 runs are old; files of all but the last 30 partitions were
         * rotated away; checkpoint.keep left the last 5 checkpoints' files. */
        char sql[160];
        snprintf(sql, sizeof sql, "UPDATE runs SET ended_at = 1000 WHERE id <= %d", n - 20);
        OK(state_test_exec(st, sql));
        int mark = n - 30;
        state_retain_t p = {.before = 2000, .limit = 64, .gone = gone_below, .ctx = &mark};
        /* kilnd's passes, until one finds nothing to do (a cursor may wrap first). */
        int passes = 0;
        bool busy;
        do {
            OK(state_retain_pass(st, &p));
            busy = p.more || p.compacted + p.inputs + p.checkpoints + p.removed > 0;
            state_retain_fini(&p);
        } while (++passes < 500 && busy);
        rows[round] = scalar(st, count);
        /* 20 whole runs, 30 with their partition's input, the chain of the newest checkpoint
         * (back to its full: at most 8) and the 5 checkpoints whose files are there. */
        assert_true(scalar(st, "SELECT count(*) FROM runs") <= 30 + 8);
        assert_true(scalar(st, "SELECT count(*) FROM checkpoints") <= 30 + 8);
        /* Only the whole runs' events are left. */
        assert_int_equal(scalar(st, "SELECT count(*) FROM events WHERE run_id IS NOT NULL"),
                         20 * scalar(st, "SELECT count(*) FROM events WHERE run_id = "
                                         "(SELECT max(id) FROM runs)"));
        check_counts(st);
    }
    assert_true(rows[2] <= rows[0]);
    /* The chain to the newest checkpoint is whole: a resume finds every link. */
    state_checkpoint_t c;
    OK(state_checkpoint_latest(st, job, &c));
    int links = 0;
    while (strcmp(c.kind, "incremental") == 0) {
        int64_t up = c.parent_id;
        state_checkpoint_fini(&c);
        OK(state_checkpoint_get_by_id(st, up, &c));
        links++;
    }
    state_checkpoint_fini(&c);
    assert_true(links < 8);
}

/* A newer full ends a chain: the deltas before it and their runs go, while
 * the newest chain (full, deltas) stays whole for a resume; a whole run's
 * start checkpoint keeps its chain. */
static void test_retain_chain_ends(void **state)
{
    fixture_t *f = *state;
    state_t *st = f->st;
    int64_t job = new_job(st, "chain"), parent = 0, ids[6], cks[6];
    /* runs 0..5: full, delta, delta, full, delta, delta */
    for (int i = 0; i < 6; i++) {
        char uid[16], path[16];
        snprintf(uid, sizeof uid, "ck-%d", i);
        snprintf(path, sizeof path, "/ck/%d", i);
        ids[i] = new_run(st, job);
        finish_run(st, ids[i], STATE_RUN_SUCCEEDED, 0);
        state_checkpoint_t c = {.uid = uid,
                                .run_id = ids[i],
                                .parent_id = parent,
                                .kind = (char *)(i % 3 == 0 ? "full" : "incremental"),
                                .path = path,
                                .eval_logloss = NAN,
                                .eval_auc = NAN};
        OK(state_checkpoint_add(st, &c, &cks[i]));
        if (i > 0)
            OK(state_run_set_start_checkpoint(st, ids[i], cks[i - 1]));
        parent = cks[i];
    }
    OK(state_test_exec(st, "UPDATE runs SET ended_at = 1000"));
    state_retain_t p = {.before = 2000, .limit = 100, .gone = always_gone};
    OK(state_retain_pass(st, &p));
    assert_int_equal(p.checkpoints, 3); /* ck-0, ck-1, ck-2 */
    assert_int_equal(p.removed, 3);
    state_retain_fini(&p);
    state_run_t r;
    for (int i = 0; i < 3; i++)
        assert_int_equal(state_run_get(st, ids[i], &r), KILN_ENOENT);
    /* The newest chain: ck-5 -> ck-4 -> ck-3 (full), every link there. */
    state_checkpoint_t c;
    OK(state_checkpoint_latest(st, job, &c));
    assert_string_equal(c.uid, "ck-5");
    for (int i = 4; i >= 3; i--) {
        int64_t up = c.parent_id;
        state_checkpoint_fini(&c);
        OK(state_checkpoint_get_by_id(st, up, &c));
        char uid[16];
        snprintf(uid, sizeof uid, "ck-%d", i);
        assert_string_equal(c.uid, uid);
    }
    assert_string_equal(c.kind, "full");
    assert_int_equal(c.parent_id, 0); /* the link to the removed delta is cut */
    state_checkpoint_fini(&c);
    OK(state_run_get(st, ids[3], &r));
    assert_int_equal(r.start_checkpoint_id, 0);
    state_run_fini(&r);
    check_counts(st);
}

int main(void)
{
    kiln_log_set_level(KILN_LOG_WARN);
    /* TEST_FILTER=test_concurrent* runs a subset (cmocka glob). */
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_open_creates, setup_dir, teardown),
        cmocka_unit_test_setup_teardown(test_open_errors, setup_dir, teardown),
        cmocka_unit_test_setup_teardown(test_migrate_every_version, setup_dir, teardown),
        cmocka_unit_test_setup_teardown(test_open_at_version_zero, setup_dir, teardown),
        cmocka_unit_test_setup_teardown(test_refuse_newer, setup_dir, teardown),
        cmocka_unit_test_setup_teardown(test_jobs, setup_open, teardown),
        cmocka_unit_test_setup_teardown(test_runs_create_list, setup_open, teardown),
        cmocka_unit_test_setup_teardown(test_run_transitions, setup_open, teardown),
        cmocka_unit_test_setup_teardown(test_run_cancel, setup_open, teardown),
        cmocka_unit_test_setup_teardown(test_cron_unique, setup_open, teardown),
        cmocka_unit_test_setup_teardown(test_inputs, setup_open, teardown),
        cmocka_unit_test_setup_teardown(test_metrics, setup_open, teardown),
        cmocka_unit_test_setup_teardown(test_checkpoints, setup_open, teardown),
        cmocka_unit_test_setup_teardown(test_endpoints_by_label, setup_open, teardown),
        cmocka_unit_test_setup_teardown(test_push_queue, setup_open, teardown),
        cmocka_unit_test_setup_teardown(test_run_succeed_queues, setup_open, teardown),
        cmocka_unit_test_setup_teardown(test_lineage_queries, setup_open, teardown),
        cmocka_unit_test_setup_teardown(test_migrate_v5_pushes, setup_dir, teardown),
        cmocka_unit_test_setup_teardown(test_events, setup_open, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_writers, setup_dir, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_open, setup_dir, teardown),
        cmocka_unit_test_setup_teardown(test_busy_retry, setup_dir, teardown),
        cmocka_unit_test_setup_teardown(test_submit_endpoints_atomic, setup_open, teardown),
        cmocka_unit_test_setup_teardown(test_open_foreign, setup_dir, teardown),
        cmocka_unit_test_setup_teardown(test_job_skip_delete, setup_open, teardown),
        cmocka_unit_test_setup_teardown(test_migrate_timezone, setup_dir, teardown),
        cmocka_unit_test_setup_teardown(test_runs_prune, setup_open, teardown),
        cmocka_unit_test_setup_teardown(test_retain_keeps_consumed, setup_open, teardown),
        cmocka_unit_test_setup_teardown(test_retain_bounded, setup_open, teardown),
        cmocka_unit_test_setup_teardown(test_retain_chain_ends, setup_open, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
