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
#include "rt_ckpt.h"

#define FX_TOKEN "kiln-test-token"
#define FX_MAX_PROCS 16

/* Sends sig to pid and reaps it (SIGKILL after 10 s). */
void fx_stop(pid_t pid, int sig);

/* SIGKILLs and reaps every process a fixture started and did not stop. */
void fx_stop_all(void);

/* Forks argv with stdout and stderr appended to log and env ("NAME=VALUE",
 * NULL-ended, may be NULL) set; the child gets Open MPI's root and
 * oversubscribe settings. Returns the pid, tracked for fx_stop_all. */
pid_t fx_spawn(const char *log, const char *const *env, const char *const *argv);

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

void fx_serve_stop(fx_serve_t *s, int sig);

/* ---- HTTP ------------------------------------------------------------------------------- */

/* GET url: the body (malloc'd; NULL when none) unless the status is not 200. */
char *fx_get(const char *url);

/* GET url as JSON (NULL when it does not answer 200 with JSON). */
json_t *fx_get_json(const char *url);

/* The checkpoint model/label holds on s ("" when none). */
void fx_holds(const fx_serve_t *s, const char *model, const char *label, char *out, size_t cap);

/* kiln-serve's count of pushes it applied since it started. */
int64_t fx_pushes_applied(const fx_serve_t *s);

/* ---- data and checkpoints ----------------------------------------------------------------- */

/* `kiln datagen` of rows rows (seed, day) into path. Returns its exit code. */
int fx_datagen(const char *path, int rows, int seed, int day);

/* Lands a copy of src at dst the way data should land: written under a
 * hidden name in the same directory, then renamed into place. Returns 0 or
 * -1. */
int fx_land(const char *src, const char *dst);

/* Opens the newest checkpoint under root into ch, every file verified; the
 * test fails when there is none or it does not open. */
void fx_open_latest(const char *root, rt_ckpt_chain_t *ch);

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
void fx_ckpt_walk(const rt_ckpt_chain_t *a, const rt_ckpt_chain_t *b, fx_floats_fn cmp, void *ud,
                  int *ntables /* OUT */, int *narrays /* OUT */);

#endif /* KILN_TESTS_FIXTURES_H */
