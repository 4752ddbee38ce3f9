/*
 * tests/test_cli.c - the `kiln` command end to end: the real binary, run as a
 * child process against a real SQLite file in a temp directory. Checks
 * output (tables and --json), exit codes, --help on every command and round
 * trips: submit -> jobs/runs/show -> cancel.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <glob.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixtures.h"
#include "proc.h"

#ifndef KILN_BIN
#error "KILN_BIN must name the kiln executable"
#endif

static char tmpdir[256];
static char dbpath[320];

typedef proc_result_t result_t;

/* Runs kiln with args (NULL-terminated, without argv[0]); env_home non-NULL
 * sets KILN_HOME for the child. */
static void run_env(result_t *r, const char *env_home, const char *const *args)
{
    const char *argv[32] = {KILN_BIN};
    int n = 1;
    for (; args[n - 1] != NULL && n < 31; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    char home[400];
    snprintf(home, sizeof home, "KILN_HOME=%s", env_home ? env_home : "");
    const char *env[] = {home, NULL};
    proc_run_env(r, tmpdir, env_home ? env : NULL, argv);
}

#define KILN(r, ...)                                                                  \
    do {                                                                             \
        const char *a_[] = {__VA_ARGS__, NULL};                                       \
        run_env((r), NULL, a_);                                                      \
    } while (0)

static void write_file(const char *name, const char *text, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", tmpdir, name);
    fx_write(path, "%s", text);
}

static int setup(void **state)
{
    (void)state;
    if (proc_tmpdir("cli", tmpdir, sizeof tmpdir) < 0)
        return -1;
    snprintf(dbpath, sizeof dbpath, "%s/db/kiln.db", tmpdir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return proc_rmtree(tmpdir);
}

static json_t *parse_json(const char *text)
{
    json_error_t e;
    json_t *v = json_loads(text, 0, &e);
    if (v == NULL)
        fail_msg("not JSON (%s): %s", e.text, text);
    return v;
}

/* The command printed a JSON array of n items. */
static void assert_json_count(const char *text, size_t n)
{
    json_t *v = parse_json(text);
    assert_int_equal(json_array_size(v), n);
    json_decref(v);
}

static const char oneoff_spec[] = "name: oneoff-lr\n"
                                  "data:\n"
                                  "  train: \"data/day=*/part-*.tsv\"\n"
                                  "model: {type: lr}\n"
                                  "resources: {ranks: 2}\n";

static const char hourly_spec[] = "name: hourly\n"
                                  "schedule: \"15 * * * *\"\n"
                                  "data: {train: \"data/*.tsv\", incremental: true}\n";

static void test_help(void **state)
{
    (void)state;
    result_t r;
    KILN(&r, "--help");
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "usage: kiln"));
    static const char *const cmds[] = {"submit", "jobs", "runs", "show", "cancel", "schedule"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        KILN(&r, cmds[i], "--help");
        assert_int_equal(r.code, 0);
        char want[64];
        snprintf(want, sizeof want, "usage: kiln %s", cmds[i]);
        assert_non_null(strstr(r.out, want));
        assert_non_null(strstr(r.out, "--db PATH"));
    }
    KILN(&r, "help", "runs");
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "--limit N"));
}

/* Each program prints "PROGRAM VERSION" for --version, the version being
 * CMake's project version; kiln takes it among the global options too. */
static void test_version(void **state)
{
    (void)state;
    static const char *const progs[][2] = {
        {KILN_BIN, "kiln"}, {KILND_BIN, "kilnd"}, {KILN_SERVE_BIN, "kiln-serve"},
        {KILN_TRAIN_BIN, "kiln-train"}};
    char want[64];
    for (size_t i = 0; i < sizeof progs / sizeof progs[0]; i++) {
        const char *argv[] = {progs[i][0], "--version", NULL};
        result_t r;
        proc_run_env(&r, tmpdir, NULL, argv);
        snprintf(want, sizeof want, "%s %s\n", progs[i][1], KILN_PROJECT_VERSION);
        if (r.code != 0 || strcmp(r.out, want) != 0)
            fail_msg("%s --version: exit %d, out '%s', err '%s'", progs[i][1], r.code, r.out,
                     r.err);
    }
    result_t r;
    KILN(&r, "--db", dbpath, "--version");
    assert_int_equal(r.code, 0);
    assert_string_equal(r.out, "kiln " KILN_PROJECT_VERSION "\n");
    KILN(&r, "--help");
    assert_non_null(strstr(r.out, "--version"));
}

static void test_usage_errors(void **state)
{
    (void)state;
    result_t r;
    const char *none[] = {NULL};
    run_env(&r, NULL, none);
    assert_int_equal(r.code, 2);
    KILN(&r, "sumbit", "x.yaml");
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "did you mean 'submit'"));
    KILN(&r, "jbos"); /* two letters swapped: one edit (Damerau), not two */
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "did you mean 'jobs'"));
    KILN(&r, "--db", dbpath, "runs", "--limt", "3");
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "did you mean --limit"));
    KILN(&r, "--db", dbpath, "show");
    assert_int_equal(r.code, 2);
    KILN(&r, "--db", dbpath, "runs", "--limit");
    assert_int_equal(r.code, 2);
    KILN(&r, "--db", dbpath, "runs", "--limit", "many");
    assert_int_equal(r.code, 3);
    KILN(&r, "--db", dbpath, "runs", "--state", "sleeping");
    assert_int_equal(r.code, 3);
    /* A format Kiln does not write is a bad option value (3), as docs/cli.md
     * says, not a bad command line (2). */
    KILN(&r, "export", tmpdir, "--format", "onnx", "--out", tmpdir);
    assert_int_equal(r.code, 3);
    assert_non_null(strstr(r.err, "onnx"));
}

static void test_dry_run_examples(void **state)
{
    (void)state;
    glob_t g;
    assert_int_equal(glob(KILN_SOURCE_DIR "/examples/*.yaml", 0, NULL, &g), 0);
    assert_true(g.gl_pathc >= 3);
    char nodb[400];
    snprintf(nodb, sizeof nodb, "%s/never/kiln.db", tmpdir);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        result_t r;
        KILN(&r, "--db", nodb, "submit", g.gl_pathv[i], "--dry-run");
        if (r.code != 0)
            fail_msg("%s: %s", g.gl_pathv[i], r.err);
        assert_non_null(strstr(r.out, "valid spec"));
        assert_non_null(strstr(r.out, "nothing was submitted"));
    }
    globfree(&g);
    struct stat sb;
    assert_int_not_equal(stat(nodb, &sb), 0); /* a dry run touches no database */
}

static void test_bad_spec(void **state)
{
    (void)state;
    char path[400];
    write_file("typo.yaml",
               "name: typo\n"
               "schedule: \"@hourly\"\n"
               "concurency: forbid\n"
               "data: {train: x.tsv}\n"
               "model:\n"
               "  embedding: {dim: sixteen}\n"
               "trian: {epochs: 1}\n"
               "mdoel: {type: lr}\n",
               path, sizeof path);
    result_t r;
    KILN(&r, "--db", dbpath, "submit", path);
    assert_int_equal(r.code, 3);
    char want[512];
    snprintf(want, sizeof want, "%s:3:1: concurency: unknown field (did you mean \"concurrency\"?)",
             path);
    assert_non_null(strstr(r.err, want));
    snprintf(want, sizeof want, "%s:6:20: model.embedding.dim: expected a positive integer, "
                                "got \"sixteen\"",
             path);
    assert_non_null(strstr(r.err, want));
    /* Two swapped letters are one typo (Damerau), two Levenshtein edits. */
    snprintf(want, sizeof want, "%s:7:1: trian: unknown field (did you mean \"train\"?)", path);
    assert_non_null(strstr(r.err, want));
    snprintf(want, sizeof want, "%s:8:1: mdoel: unknown field (did you mean \"model\"?)", path);
    assert_non_null(strstr(r.err, want));
    assert_non_null(strstr(r.err, "nothing was submitted"));
    KILN(&r, "--db", dbpath, "submit", "/nonexistent/spec.yaml");
    assert_int_equal(r.code, 4);
    assert_non_null(strstr(r.err, "/nonexistent/spec.yaml"));
}

/* With --json every failing command prints one JSON object on stdout, the
 * shape push and promote use for theirs ("ok": false, "error"), with the
 * exit code as "code" and a spec's problems listed; the exit code is the
 * same as without --json. */
static void test_json_errors(void **state)
{
    (void)state;
    char path[400];
    write_file("bad-json.yaml", "name: bad\ndata: {train: x.tsv}\nmdoel: {type: lr}\n", path,
               sizeof path);
    static const struct {
        const char *args[8];
        int code;
        const char *error; /* a part of "error" */
    } cases[] = {
        {{"--json", "submit", "SPEC"}, 3, "1 problem; nothing was submitted"},
        {{"submit", "SPEC", "--json"}, 3, "1 problem; nothing was submitted"},
        {{"--json", "convert", "--spec", "SPEC", "SPEC", "--out", "x.bin"},
         3,
         "1 problem; nothing was converted"},
        {{"--json", "show", "99999"}, 4, "99999"},
        {{"--json", "jbos"}, 2, "unknown command 'jbos'"},
        {{"--json", "runs", "--limt", "3"}, 2, "unknown option '--limt'"},
        {{"--json", "push"}, 2, "--job is required"},
        {{"--json", "schedule", "next", "0 0 32 * *"}, 3, "day-of-month"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *args[12] = {"--db", dbpath};
        size_t n = 2;
        for (size_t k = 0; k < 8 && cases[i].args[k] != NULL; k++)
            args[n++] = strcmp(cases[i].args[k], "SPEC") == 0 ? path : cases[i].args[k];
        args[n] = NULL;
        result_t r;
        run_env(&r, NULL, args);
        json_error_t e;
        json_t *o = json_loads(r.out, 0, &e);
        if (r.code != cases[i].code || o == NULL || !json_is_object(o))
            fail_msg("case %zu: exit %d (want %d), stdout '%s', stderr '%s'", i, r.code,
                     cases[i].code, r.out, r.err);
        assert_true(json_is_false(json_object_get(o, "ok")));
        assert_int_equal(json_integer_value(json_object_get(o, "code")), cases[i].code);
        const char *msg = json_string_value(json_object_get(o, "error"));
        if (msg == NULL || strstr(msg, cases[i].error) == NULL)
            fail_msg("case %zu: error '%s' lacks '%s'", i, msg ? msg : "(none)", cases[i].error);
        if (i < 3) { /* the spec's problems, each file:line:col: field: message */
            json_t *p = json_object_get(o, "problems");
            assert_int_equal(json_array_size(p), 1);
            assert_non_null(strstr(json_string_value(json_array_get(p, 0)),
                                   ":3:1: mdoel: unknown field (did you mean \"model\"?)"));
        }
        json_decref(o);
    }
}

static void test_submit_round_trip(void **state)
{
    (void)state;
    char path[400], path2[400];
    write_file("oneoff.yaml", oneoff_spec, path, sizeof path);
    result_t r;
    KILN(&r, "--db", dbpath, "submit", path);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "submitted job oneoff-lr (version 1); queued run"));

    KILN(&r, "--db", dbpath, "--json", "runs");
    assert_int_equal(r.code, 0);
    json_t *runs = parse_json(r.out);
    assert_int_equal(json_array_size(runs), 1);
    json_t *run = json_array_get(runs, 0);
    assert_string_equal(json_string_value(json_object_get(run, "job")), "oneoff-lr");
    assert_string_equal(json_string_value(json_object_get(run, "state")), "queued");
    assert_string_equal(json_string_value(json_object_get(run, "trigger")), "manual");
    json_int_t run_id = json_integer_value(json_object_get(run, "id"));
    assert_true(run_id > 0);
    json_decref(runs);

    /* The same spec again keeps the version; a changed spec bumps it. */
    KILN(&r, "--db", dbpath, "--json", "submit", path);
    assert_int_equal(r.code, 0);
    json_t *o = parse_json(r.out);
    assert_int_equal(json_integer_value(json_object_get(o, "version")), 1);
    assert_false(json_boolean_value(json_object_get(o, "created")));
    json_decref(o);
    char changed[sizeof oneoff_spec + 64];
    snprintf(changed, sizeof changed, "%spriority: 5\n", oneoff_spec);
    write_file("oneoff2.yaml", changed, path2, sizeof path2);
    KILN(&r, "--db", dbpath, "--json", "submit", path2);
    assert_int_equal(r.code, 0);
    o = parse_json(r.out);
    assert_int_equal(json_integer_value(json_object_get(o, "version")), 2);
    json_decref(o);

    /* A scheduled job registers its schedule and queues nothing. */
    write_file("hourly.yaml", hourly_spec, path, sizeof path);
    KILN(&r, "--db", dbpath, "submit", path);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "registered job hourly"));
    assert_non_null(strstr(r.out, "next run 20"));
    KILN(&r, "--db", dbpath, "--json", "runs", "--job", "hourly");
    assert_int_equal(r.code, 0);
    assert_json_count(r.out, 0);

    KILN(&r, "--db", dbpath, "--json", "jobs");
    assert_int_equal(r.code, 0);
    json_t *jobs = parse_json(r.out);
    assert_int_equal(json_array_size(jobs), 2);
    json_t *hourly = json_array_get(jobs, 0); /* ordered by name */
    assert_string_equal(json_string_value(json_object_get(hourly, "name")), "hourly");
    assert_string_equal(json_string_value(json_object_get(hourly, "schedule")), "15 * * * *");
    const char *next = json_string_value(json_object_get(hourly, "next_fire"));
    assert_non_null(next);
    assert_non_null(strstr(next, ":15:00Z"));
    json_decref(jobs);

    /* The table for people is aligned: every line starts its columns at
     * the header's offsets. */
    KILN(&r, "--db", dbpath, "jobs");
    assert_int_equal(r.code, 0);
    char *second = strchr(r.out, '\n') + 1;
    size_t vcol = (size_t)(strstr(r.out, "VERSION") - r.out);
    size_t scol = (size_t)(strstr(r.out, "SCHEDULE") - r.out);
    assert_memory_equal(second, "hourly ", 7);
    assert_int_equal(second[vcol], '1'); /* hourly is version 1 */
    assert_int_equal(second[vcol - 1], ' ');
    assert_memory_equal(second + scol, "15 * * * *", 10);

    /* show: a run and a job; unknown ones are "not found" (4). */
    char id[32];
    snprintf(id, sizeof id, "%lld", (long long)run_id);
    KILN(&r, "--db", dbpath, "show", id);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "of job oneoff-lr"));
    assert_non_null(strstr(r.out, "queued"));
    KILN(&r, "--db", dbpath, "show", "oneoff-lr");
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "priority: 5"));
    KILN(&r, "--db", dbpath, "show", "99999");
    assert_int_equal(r.code, 4);
    KILN(&r, "--db", dbpath, "show", "no-such-job");
    assert_int_equal(r.code, 4);
    KILN(&r, "--db", dbpath, "runs", "--job", "no-such-job");
    assert_int_equal(r.code, 4);

    /* cancel: a queued run ends at once; a second cancel is refused (5). */
    KILN(&r, "--db", dbpath, "cancel", id);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "canceled run"));
    KILN(&r, "--db", dbpath, "--json", "show", id);
    o = parse_json(r.out);
    assert_string_equal(json_string_value(json_object_get(o, "state")), "canceled");
    assert_true(json_array_size(json_object_get(o, "events")) >= 1);
    json_decref(o);
    KILN(&r, "--db", dbpath, "cancel", id);
    assert_int_equal(r.code, 5);
    KILN(&r, "--db", dbpath, "--json", "runs", "--state", "canceled");
    assert_json_count(r.out, 1);
}

/* kiln pause / resume / delete: a paused job shows as paused; delete is
 * refused (5) while a run is queued, cancels it with --cancel, and leaves the
 * run readable; a deleted job is not found (4) by the control commands and
 * comes back when submitted again. */
static void test_job_control(void **state)
{
    (void)state;
    char db[400], path[512];
    snprintf(db, sizeof db, "%s/control.db", tmpdir);
    result_t r;
    write_file("hourly.yaml", hourly_spec, path, sizeof path);
    KILN(&r, "--db", db, "submit", path);
    assert_int_equal(r.code, 0);
    KILN(&r, "--db", db, "pause", "hourly");
    assert_int_equal(r.code, 0);
    KILN(&r, "--db", db, "jobs");
    assert_non_null(strstr(r.out, "paused"));
    KILN(&r, "--db", db, "--json", "pause", "hourly");
    json_t *o = parse_json(r.out);
    assert_false(json_boolean_value(json_object_get(o, "changed"))); /* paused already */
    json_decref(o);
    KILN(&r, "--db", db, "resume", "hourly");
    assert_int_equal(r.code, 0);
    KILN(&r, "--db", db, "--json", "jobs");
    o = parse_json(r.out);
    assert_false(json_boolean_value(json_object_get(json_array_get(o, 0), "paused")));
    assert_int_equal(json_integer_value(json_object_get(json_array_get(o, 0), "skipped_fires")),
                     0);
    json_decref(o);

    write_file("oneoff.yaml", oneoff_spec, path, sizeof path);
    KILN(&r, "--db", db, "submit", path); /* run 1, queued */
    KILN(&r, "--db", db, "delete", "oneoff-lr");
    assert_int_equal(r.code, 5);
    assert_non_null(strstr(r.err, "--cancel"));
    KILN(&r, "--db", db, "delete", "oneoff-lr", "--cancel");
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "1 run canceled"));
    KILN(&r, "--db", db, "--json", "jobs");
    assert_json_count(r.out, 1); /* hourly only */
    KILN(&r, "--db", db, "--json", "show", "1");
    assert_int_equal(r.code, 0);
    o = parse_json(r.out);
    assert_string_equal(json_string_value(json_object_get(o, "state")), "canceled");
    json_decref(o);
    KILN(&r, "--db", db, "pause", "oneoff-lr");
    assert_int_equal(r.code, 4);
    KILN(&r, "--db", db, "delete", "nope");
    assert_int_equal(r.code, 4);
    KILN(&r, "--db", db, "submit", path);
    assert_int_equal(r.code, 0);
    KILN(&r, "--db", db, "--json", "jobs");
    assert_json_count(r.out, 2);
}

/* A job's zone is read from its column (schema v8), written by the submit:
 * 09:15 at UTC+02:00 is 07:15Z, in the list and in the job's own view. */
static void test_job_timezone(void **state)
{
    (void)state;
    char db[400], path[400];
    snprintf(db, sizeof db, "%s/tz.db", tmpdir);
    write_file("zoned.yaml",
               "name: zoned\nschedule: \"15 9 * * *\"\ntimezone: \"UTC+02:00\"\n"
               "data: {train: \"data/*.tsv\", incremental: true}\n",
               path, sizeof path);
    result_t r;
    KILN(&r, "--db", db, "submit", path);
    assert_int_equal(r.code, 0);
    KILN(&r, "--db", db, "--json", "jobs");
    assert_int_equal(r.code, 0);
    json_t *jobs = parse_json(r.out);
    const char *next = json_string_value(json_object_get(json_array_get(jobs, 0), "next_fire"));
    assert_non_null(next);
    assert_non_null(strstr(next, "T07:15:00Z"));
    json_decref(jobs);
    KILN(&r, "--db", db, "--json", "show", "zoned");
    assert_int_equal(r.code, 0);
    json_t *o = parse_json(r.out);
    assert_string_equal(json_string_value(json_object_get(o, "timezone")), "UTC+02:00");
    assert_non_null(strstr(json_string_value(json_object_get(o, "next_fire")), "T07:15:00Z"));
    json_decref(o);
}

static void test_kiln_home(void **state)
{
    (void)state;
    char home[400], db[450];
    snprintf(home, sizeof home, "%s/home", tmpdir);
    snprintf(db, sizeof db, "%s/kiln.db", home);
    result_t r;
    const char *args[] = {"jobs", NULL};
    run_env(&r, home, args);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "no jobs yet"));
    struct stat sb;
    assert_int_equal(stat(db, &sb), 0);
}

static void test_schedule_next(void **state)
{
    (void)state;
    result_t r;
    KILN(&r, "schedule", "next", "15 * * * *", "--after", "2024-05-02T00:00:00Z", "--count", "3");
    assert_int_equal(r.code, 0);
    assert_string_equal(r.out, "2024-05-02T00:15:00Z\n2024-05-02T01:15:00Z\n2024-05-02T02:15:00Z\n");
    /* Strictly after: an instant that is itself a fire time is not printed. */
    KILN(&r, "schedule", "next", "@daily", "--after", "2024-02-28T00:00:00Z", "--count", "2");
    assert_int_equal(r.code, 0);
    assert_string_equal(r.out, "2024-02-29T00:00:00Z\n2024-03-01T00:00:00Z\n");
    KILN(&r, "--json", "schedule", "next", "@every 30s", "--after", "2024-05-02T00:00:10Z",
         "--count", "2");
    assert_int_equal(r.code, 0);
    json_t *a = parse_json(r.out);
    assert_string_equal(json_string_value(json_array_get(a, 0)), "2024-05-02T00:00:30Z");
    assert_string_equal(json_string_value(json_array_get(a, 1)), "2024-05-02T00:01:00Z");
    json_decref(a);
    KILN(&r, "schedule", "next", "0 0 30 2 *");
    assert_int_equal(r.code, 3);
    assert_non_null(strstr(r.err, "day-of-month"));
    KILN(&r, "schedule", "next", "0 0 32 * *");
    assert_int_equal(r.code, 3);
    assert_non_null(strstr(r.err, "day-of-month"));
    KILN(&r, "schedule", "next", "* * *", "--after", "2024-05-02T00:00:00Z");
    assert_int_equal(r.code, 3);
    KILN(&r, "schedule", "next", "@hourly", "--after", "tomorrow");
    assert_int_equal(r.code, 3);
    assert_non_null(strstr(r.err, "ISO 8601"));
    KILN(&r, "schedule", "later", "@hourly");
    assert_int_equal(r.code, 2);
}

/* Two jobs may not share a checkpoint directory (the second would resume
 * from the first's model): refused at submit (exit 5, nothing stored), however
 * the second spells the directory (relative from elsewhere, through a
 * symlink, absolute); a resubmit of the same job and a job with its own
 * directory are fine. */
static void test_submit_shared_checkpoint_dir(void **state)
{
    (void)state;
    char db[400], a[400], path[400], cmd[1200];
    snprintf(db, sizeof db, "%s/ckdb/kiln.db", tmpdir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%1$s/jobs/sub' && ln -sfn shared '%1$s/jobs/alias'",
             tmpdir);
    assert_int_equal(system(cmd), 0);
    write_file("jobs/a.yaml", "name: a\ndata: {train: d.tsv}\ncheckpoint: {dir: shared}\n", a,
               sizeof a);
    result_t r;
    KILN(&r, "--db", db, "submit", a);
    if (r.code != 0)
        fail_msg("first submit: %d %s", r.code, r.err);
    char abs_spec[1024];
    snprintf(abs_spec, sizeof abs_spec,
             "name: b4\ndata: {train: d.tsv}\ncheckpoint: {dir: "
             "%s/jobs/./shared/}\n",
             tmpdir);
    const struct {
        const char *file, *text;
    } clash[] = {
        {"jobs/b1.yaml", "name: b1\ndata: {train: d.tsv}\ncheckpoint: {dir: shared}\n"},
        {"jobs/sub/b2.yaml", "name: b2\ndata: {train: d.tsv}\ncheckpoint: {dir: ../shared}\n"},
        {"jobs/b3.yaml", "name: b3\ndata: {train: d.tsv}\ncheckpoint: {dir: alias}\n"},
        {"jobs/b4.yaml", abs_spec},
    };
    for (size_t i = 0; i < sizeof clash / sizeof clash[0]; i++) {
        write_file(clash[i].file, clash[i].text, path, sizeof path);
        KILN(&r, "--db", db, "submit", path);
        if (r.code != 5 || strstr(r.err, "is already the checkpoint directory of job a") == NULL)
            fail_msg("%s: exit %d (want 5): %s", clash[i].file, r.code, r.err);
        assert_non_null(strstr(r.err, "/jobs/shared"));
    }
    KILN(&r, "--db", db, "--json", "jobs");
    assert_int_equal(r.code, 0);
    assert_json_count(r.out, 1); /* none of them was stored */
    KILN(&r, "--db", db, "submit", a); /* the same job again */
    assert_int_equal(r.code, 0);
    write_file("jobs/c.yaml", "name: c\ndata: {train: d.tsv}\n", path, sizeof path);
    KILN(&r, "--db", db, "submit", path); /* ckpt/c */
    assert_int_equal(r.code, 0);
}

/* kiln datagen's skew flags reach the generator (a skewed file repeats its
 * head id, a uniform one does not) and the JSON reports the Bayes-optimal
 * logloss; out-of-range values are input errors naming the flag. */
static void test_datagen_skew_flags(void **state)
{
    (void)state;
    result_t r;
    char out[400];
    snprintf(out, sizeof out, "%s/skew.tsv", tmpdir);
    KILN(&r, "--json", "datagen", "--rows", "3000", "--out", out, "--zipf", "1.15", "--vocab",
         "100000", "--empty", "0.04");
    assert_int_equal(r.code, 0);
    json_t *o = parse_json(r.out);
    double bayes = json_number_value(json_object_get(o, "bayes_logloss"));
    double ctr = json_number_value(json_object_get(o, "ctr"));
    assert_true(ctr > 0.1 && ctr < 0.4);
    assert_true(bayes > 0.05 && bayes < -(ctr * log(ctr) + (1 - ctr) * log(1 - ctr)));
    json_decref(o);
    /* The head id of the first slot (field 15) is in ~10% of 3000 rows. */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cut -f15 '%s' | grep . | sort | uniq -c | sort -rn | head -1", out);
    FILE *p = popen(cmd, "r");
    int top = 0;
    assert_int_equal(fscanf(p, "%d", &top), 1);
    pclose(p);
    if (top < 150 || top > 500)
        fail_msg("head id in %d of 3000 rows, expected about 300", top);
    KILN(&r, "datagen", "--rows", "3000", "--out", out, "--zipf", "0", "--vocab", "100000");
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "Bayes-optimal logloss"));
    p = popen(cmd, "r");
    assert_int_equal(fscanf(p, "%d", &top), 1);
    pclose(p);
    assert_true(top < 10);
    KILN(&r, "datagen", "--rows", "10", "--out", out, "--zipf", "-1");
    assert_int_equal(r.code, 3);
    assert_non_null(strstr(r.err, "--zipf: expected a number from 0 to 10, got \"-1\""));
    KILN(&r, "datagen", "--rows", "10", "--out", out, "--empty", "5%");
    assert_int_equal(r.code, 3);
    assert_non_null(strstr(r.err, "--empty"));
    KILN(&r, "datagen", "--rows", "10", "--out", out, "--vocab", "0");
    assert_int_equal(r.code, 3);
    assert_non_null(strstr(r.err, "--vocab"));
}

PROC_TEST_MAIN(setup, teardown,
    cmocka_unit_test(test_help),
    cmocka_unit_test(test_version),
    cmocka_unit_test(test_usage_errors),
    cmocka_unit_test(test_dry_run_examples),
    cmocka_unit_test(test_bad_spec),
    cmocka_unit_test(test_json_errors),
    cmocka_unit_test(test_submit_round_trip),
    cmocka_unit_test(test_job_control),
    cmocka_unit_test(test_job_timezone),
    cmocka_unit_test(test_kiln_home),
    cmocka_unit_test(test_schedule_next),
    cmocka_unit_test(test_submit_shared_checkpoint_dir),
    cmocka_unit_test(test_datagen_skew_flags))
