/*
 * tests/support/fixtures.h - the real programs as test fixtures: a kilnd on
 * a database and home of the test's own, kiln-serve endpoints on ephemeral
 * loopback ports (or a port given back to a restarted one), `kiln` commands
 * with their output captured, small HTTP reads (libcurl), generated and
 * landed data, and the newest checkpoint of a run. Every process a fixture
 * starts is stopped by fx_stop_all() even when a test fails half way. Part
 * of the kiln_testsupport library, built on proc.h.
 */
#ifndef KILN_TESTS_FIXTURES_H
#define KILN_TESTS_FIXTURES_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "proc.h"
#include "ckpt.h"
#include "state.h"

#define FX_TOKEN "kiln-test-token"
#define FX_MAX_PROCS 16

/* Sends sig to pid and reaps it (SIGKILL after 10 s). */
void fx_stop(pid_t pid, int sig);

/* SIGKILLs and reaps every process a fixture started and did not stop. */
void fx_stop_all(void);

/* proc_spawn (stdout and stderr appended to log, env set, Open MPI's
 * settings); the pid it returns is tracked for fx_stop_all. */
pid_t fx_spawn(const char *log, const char *const *env, const char *const *argv);

/* Pipes text (len bytes, a Prometheus exposition) through `promtool check
 * metrics`, keeping the text and promtool's words as dir/NAME.txt and
 * dir/NAME.txt.out; fails the test with those words when promtool objects.
 * Returns false, having run nothing, when promtool is not installed
 * (tools/deps.sh installs it: package prometheus). */
bool fx_promtool_check(const char *dir, const char *name, const char *text, size_t len);

/* ---- kilnd ------------------------------------------------------------------------- */

typedef struct fx_kilnd {
    char home[400], db[480], log[480];
    pid_t pid;
    int web_port; /* set before fx_kilnd_start: serve the status page on 127.0.0.1:port */
} fx_kilnd_t;

/* Starts kilnd on home/kiln.db (runs in home/runs), fast polls, endpoint
 * stats every second, the status page only when k->web_port is set; env is
 * added to its environment. */
void fx_kilnd_start(fx_kilnd_t *k, const char *home, const char *const *env);

void fx_kilnd_stop(fx_kilnd_t *k, int sig);

/* Runs `kiln --db DB args...` into r (proc_run's capture in home). */
void fx_kiln(const fx_kilnd_t *k, proc_result_t *r, const char *const *args);
/* fx_kiln that fails the test, with kiln's words, unless kiln exits 0. */
void fx_kiln_ok(const fx_kilnd_t *k, const char *const *args);
/* A connection to k's database (close it with state_close). */
state_t *fx_kilnd_db(const fx_kilnd_t *k);
/* The loop tests' shared data in dir: day0.tsv and day1.tsv (1200 rows
 * each, seed 5, days 0 and 1) and eval.tsv (400 rows, day 2). 0 or -1. */
int fx_loop_data(const char *dir);
/* Kills (SIGKILL) what a failed test left running from its proc_tmpdir
 * tag: every process whose command line holds kiln-test-<tag>-. */
void fx_kill_leftovers(const char *tag);

/* What the loop suites (test_loop, test_online) share, one per executable:
 * the suite's tag (its temporary directories are "<tag>-data" and "<tag>"),
 * the data directory with fx_loop_data's files, this test's home and the
 * test's kilnd. */
typedef struct fx_loop {
    const char *tag;
    char data_dir[256];
    char home[256];
    fx_kilnd_t kd;
} fx_loop_t;
extern fx_loop_t fx_loop;

/* The loop suites' set-up: once, fx_loop_suite_setup names the suite and
 * makes its data directory, starts libcurl and sets the MPI environment
 * (0 or -1); per test, a fresh home and a zeroed kd; after each, every
 * fixture process stopped and leftovers killed. The last three are cmocka
 * fixtures. */
int fx_loop_suite_setup(const char *tag);
int fx_loop_suite_teardown(void **state);
int fx_loop_test_setup(void **state);
int fx_loop_test_teardown(void **state);
/* `kiln args` against the suite's kilnd; fails the test unless it exits 0. */
void fx_loop_kiln_ok(const char *const *args);
/* A connection to the suite's kilnd's database (close it with state_close). */
state_t *fx_loop_db(void);
/* The newest run of job (0: none yet). */
int64_t fx_loop_newest_run(const char *job);

/* ---- kiln-serve ---------------------------------------------------------------------- */

typedef struct fx_serve {
    char dir[400];
    int port; /* 0 until started; kept for a restart on the same port */
    char url[64];
    pid_t pid;
} fx_serve_t;

/* Starts kiln-serve with its state in dir, on s->port (0: any free port,
 * read back from its port file). Waits until it answers; false when it
 * does not. */
bool fx_serve_start(fx_serve_t *s, const char *dir);
/* The same with more options for kiln-serve (NULL-terminated; may be NULL),
 * e.g. --impressions-dir DIR. */
bool fx_serve_start_with(fx_serve_t *s, const char *dir, const char *const *extra);

void fx_serve_stop(fx_serve_t *s, int sig);

/* ---- HTTP ------------------------------------------------------------------------------- */

/* One HTTP exchange's answer: the status (0: none came), the Content-Type
 * and Location headers, and the body (NUL-terminated; fx_reply_fini frees
 * it). */
typedef struct fx_reply {
    long status;
    char ctype[128];
    char location[128];
    char *body; /* "" when the answer had none */
    size_t len;
} fx_reply_t;

/* Sends method url with headers ("Name: value", NULL-ended, may be NULL)
 * and len bytes of body (may be NULL), within timeout_s seconds, into r.
 * Returns r->status. */
long fx_http(fx_reply_t *r, const char *method, const char *url, const char *const *headers,
             const void *body, size_t len, long timeout_s);

void fx_reply_fini(fx_reply_t *r);

/* GET url: the body (malloc'd) when the status is 200, else NULL. */
char *fx_get(const char *url);

/* The value of the sample of the Prometheus text at url whose line starts
 * with prefix (name and labels, then a space); -1 when there is none or
 * url does not answer. */
double fx_metric(const char *url, const char *prefix);

/* GET url as JSON (NULL when it does not answer 200 with JSON). */
json_t *fx_get_json(const char *url);

/* The checkpoint model/label holds on s ("" when none). */
void fx_holds(const fx_serve_t *s, const char *model, const char *label, char *out, size_t cap);

/* kiln-serve's count of pushes it applied since it started. */
int64_t fx_pushes_applied(const fx_serve_t *s);

/* Polls run id in the database st every 100 ms until it is in state want
 * (any terminal state when want is STATE_RUN_NSTATES), for at most
 * timeout_s. Returns the last state seen (STATE_RUN_NSTATES when the run
 * was never found); the caller judges it. */
state_run_state_t fx_wait_run(state_t *st, int64_t id, state_run_state_t want, int timeout_s);

/* ---- files, data and checkpoints ----------------------------------------------------- */

/* Writes the text made from fmt to path (created or truncated); the test
 * fails when it cannot. */
void fx_write(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* `kiln datagen` of rows rows (seed, day) into path. Returns its exit code. */
int fx_datagen(const char *path, int rows, int seed, int day);

/* Makes dir (and its parents) and generates dir/day=0.tsv of rows rows
 * (day 0) and dir/eval.tsv of eval_rows rows (day 1), both with seed: a
 * job's training and evaluation data. Returns 0 or -1. */
int fx_train_data(const char *dir, int rows, int eval_rows, int seed);

/* kiln-train's result JSON from its finished run r (--quiet prints it):
 * NULL when it exited non-zero (r->err says why); a run that exited 0
 * without printing JSON fails the test. The caller json_decref()s it. */
json_t *fx_train_result(const proc_result_t *r);

/* A test executable's temp directory (proc_tmpdir(name), into dir) holding
 * fx_train_data's files in dir/data. Returns 0 or -1. */
int fx_train_tmpdir(const char *name, char *dir, size_t cap, int rows, int eval_rows, int seed);

/* Lands a copy of src at dst the way data should land: written under a
 * hidden name in the same directory, then renamed into place. Returns 0 or
 * -1. */
int fx_land(const char *src, const char *dst);

/* The training loss of each logged step of the run in run_dir, from its
 * progress.jsonl (lines without a loss skipped), at most cap into out.
 * Returns how many; the test fails when the file is missing or a line is
 * not JSON. */
int fx_losses(const char *run_dir, double *out, int cap);

/* Opens the newest checkpoint under root into ch, every file verified; the
 * test fails when there is none or it does not open. */
void fx_open_latest(const char *root, ckpt_chain_t *ch);

/* Which of a checkpoint's float arrays fx_ckpt_walk hands over. */
typedef enum {
    FX_ROWS,     /* a table's values, (n, dim) */
    FX_ROWS_OPT, /* a table's optimizer state, (n, nstate*dim) */
    FX_DENSE,    /* a dense array ("dense.params", then the dense optimizer's state) */
} fx_array_kind_t;

/* Judges one pair of float arrays of n elements: ref from the reference
 * checkpoint, x from the other; what names it ("users.values", "users.opt",
 * "dense.params"). */
typedef void (*fx_floats_fn)(void *ud, fx_array_kind_t kind, const char *what, const float *ref,
                             const float *x, size_t n);

/* Walks two resolved checkpoint chains side by side, a the reference:
 * asserts the same step, the same tables (the same sorted keys, dim,
 * optimizer state width and adam step counts) and the same dense arrays by
 * name and length, and hands each pair of float arrays to cmp. The counts
 * of tables and dense arrays go to ntables and narrays (each may be NULL). */
void fx_ckpt_walk(const ckpt_chain_t *a, const ckpt_chain_t *b, fx_floats_fn cmp, void *ud,
                  int *ntables /* OUT */, int *narrays /* OUT */);

#endif /* KILN_TESTS_FIXTURES_H */
