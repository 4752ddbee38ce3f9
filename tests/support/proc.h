/*
 * tests/support/proc.h - what the tests share for running processes: a temp
 * directory per test executable, running a command with its stdout, stderr
 * and exit status captured, Open MPI's settings for running ranks here,
 * reading files whole, free loopback ports, and raw TCP connections from a
 * chosen loopback address (the slow clients of the server tests). Part of
 * the kiln_testsupport library (tests/support/proc.c).
 */
#ifndef KILN_TESTS_PROC_H
#define KILN_TESTS_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* A finished command: exit code (128 + signal when killed) and its output. */
typedef struct proc_result {
    int code;
    char out[65536];
    char err[65536];
} proc_result_t;

/* Sleeps ms milliseconds. */
void proc_sleep_ms(int ms);

/* Reads a file into buf (NUL-terminated, cut at cap - 1 bytes); "" when it
 * cannot be read. */
void proc_slurp(const char *path, char *buf, size_t cap);
/* Reads the file at path whole into a malloc'd buffer (one byte more than
 * *len, for a NUL); the test fails when it cannot. */
unsigned char *proc_read_file(const char *path, size_t *len /* OUT */);

/* Makes a fresh directory /tmp/kiln-test-<name>-XXXXXX into dir. Returns 0
 * or -1. */
int proc_tmpdir(const char *name, char *dir, size_t cap);

/* A process's line of /proc/PID/stat: its name (in parentheses, as the
 * kernel writes it, cut to cap), state letter, parent and process group.
 * Returns 0, or -1 when the process is gone or the line cannot be read. */
int proc_stat(int pid, char *name, size_t cap, char *state, int *ppid, int *pgid);

/* Removes a directory tree made by proc_tmpdir. Returns 0 or -1. */
int proc_rmtree(const char *dir);

/* A test's temp directory at its end: removed (proc_rmtree) after every
 * session with a process working in it is killed (the runs of a test's
 * kilnd outlive kilnd, and one still writing fails the removal), or kept
 * and named on stderr when $KILN_TEST_KEEP is set, for a look after a
 * failure. Returns 0 or -1. */
int proc_tmpdir_done(const char *dir);

/* A group teardown for PROC_TEST_MAIN: proc_tmpdir_done on the directory
 * the group's setup left in *state (nothing when it left NULL). */
int proc_tmpdir_teardown(void **state);

/* The next number of the xorshift64 sequence in *state (nonzero): seeded,
 * repeatable test data. */
uint64_t proc_xorshift(uint64_t *state);

/* Sets, in this process (its children inherit them), Open MPI's permission
 * to run as root and to oversubscribe the cores; with leaks_off, also turns
 * LeakSanitizer off (ASAN_OPTIONS gains detect_leaks=0): Open MPI's runtime
 * and its dlopen'ed components leave allocations at exit that LeakSanitizer
 * cannot name, so they cannot be suppressed. */
void proc_mpi_env(bool leaks_off);

/* Starts argv (argv[0] looked up in PATH) with stdout and stderr appended to
 * log, after setting, in the child, Open MPI's settings (proc_mpi_env, leak
 * checking kept) and each "NAME=VALUE" of env (NULL-ended, may be NULL).
 * Returns the pid (-1 when fork failed); the caller reaps it. */
pid_t proc_spawn(const char *log, const char *const *env, const char *const *argv);

/* Runs argv (argv[0] looked up in PATH) with stdout and stderr captured via
 * files in scratch_dir, after setting each "NAME=VALUE" of env (NULL-ended,
 * may be NULL) in the child. The child gets proc_mpi_env; under ASan (when
 * ASAN_OPTIONS is set) with leak checking off, every other ASan/UBSan check
 * stays on, and the unit tests keep leak checking. */
void proc_run_env(proc_result_t *r, const char *scratch_dir, const char *const *env,
                  const char *const *argv);

/* proc_run_env with no extra environment. */
void proc_run(proc_result_t *r, const char *scratch_dir, const char *const *argv);

/* Runs the shell command made from fmt with /bin/sh -c into r (captured in
 * scratch_dir). Returns its exit code. */
int proc_sh(proc_result_t *r, const char *scratch_dir, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A loopback TCP port that was free a moment ago (bound and released), for a
 * server that takes a fixed --listen address. */
int proc_free_port(void);

/* A TCP connection from source address src (any 127.x.y.z: all of 127/8 is
 * loopback on Linux, so one test can play several clients) to 127.0.0.1:port,
 * with `first` sent on it when not NULL. Returns the socket or -1. Sends
 * time out after 5 s, so a server that stopped reading cannot hang a test. */
int proc_connect_from(const char *src, int port, const char *first);

/* The slow clients of the server tests: PROC_SLOW_IDLE connections from
 * 127.0.0.2 that send nothing, then PROC_SLOW_TRICKLE from 127.0.0.3 that
 * sent the start of a request (first) and add a header byte at each
 * proc_slow_trickle. */
enum { PROC_SLOW_IDLE = 300, PROC_SLOW_TRICKLE = 40, PROC_SLOW_ALL = 340 };
typedef struct proc_slow {
    int fds[PROC_SLOW_ALL]; /* -1 where the connection failed */
} proc_slow_t;

void proc_slow_open(proc_slow_t *s, int port, const char *first);
/* The same from the addresses given: 127.0.0.1 for both is a flood from the
 * address every client of a loopback deployment shares. */
void proc_slow_open_from(proc_slow_t *s, int port, const char *first, const char *idle_src,
                         const char *trickle_src);
void proc_slow_trickle(const proc_slow_t *s);
void proc_slow_close(proc_slow_t *s);

/* Sends sig to every process of program prog (the base name of argv[0])
 * that has arg among its arguments, e.g. the ranks of one run (kiln-train
 * with the run directory); returns how many it signalled. Processes of
 * every host of the test cluster are here too (one process table). */
int proc_signal_matching(const char *prog, const char *arg, int sig);

/* Narrows the tests of the group to those matching $KILN_TEST_FILTER (a
 * cmocka glob, e.g. KILN_TEST_FILTER='test_push_*') when it is set. */
void proc_test_filter(void);

/* The main() of a test executable: the tests (cmocka_unit_test entries) run
 * as one group with setup and teardown (each may be NULL), narrowed by
 * proc_test_filter. The file includes <cmocka.h>. */
#define PROC_TEST_MAIN(setup, teardown, ...)                                                      \
    int main(void)                                                                                \
    {                                                                                             \
        const struct CMUnitTest tests[] = {__VA_ARGS__};                                          \
        proc_test_filter();                                                                       \
        return cmocka_run_group_tests(tests, setup, teardown);                                    \
    }

/* A cmocka test, fixture and group fixture, as proc_test_run takes them. */
typedef void (*proc_test_fn)(void **state);
typedef int (*proc_fixture_fn)(void **state);

/* Runs the n tests fns, named by names (their names as the source lists
 * them, separated by commas), as PROC_TEST_MAIN does, each with each_setup
 * and each_teardown (either may be NULL). Returns what cmocka returns. */
int proc_test_run(const char *names, const proc_test_fn *fns, size_t n, proc_fixture_fn setup,
                  proc_fixture_fn teardown, proc_fixture_fn each_setup,
                  proc_fixture_fn each_teardown);

/* Runs the tests named in the list (test functions) as one group with setup
 * and teardown, every test with each_setup and each_teardown (any may be
 * NULL), narrowed by proc_test_filter; the value is main()'s status. */
#define PROC_TESTS(setup, teardown, each_setup, each_teardown, ...)                               \
    proc_test_run(#__VA_ARGS__, (const proc_test_fn[]){__VA_ARGS__},                              \
                  sizeof((const proc_test_fn[]){__VA_ARGS__}) / sizeof(proc_test_fn), setup,      \
                  teardown, each_setup, each_teardown)

/* The main() of a test executable whose tests all have the same fixture
 * (PROC_TESTS). */
#define PROC_TEST_MAIN_EACH(setup, teardown, each_setup, each_teardown, ...)                      \
    int main(void)                                                                                \
    {                                                                                             \
        return PROC_TESTS(setup, teardown, each_setup, each_teardown, __VA_ARGS__);               \
    }

#endif /* KILN_TESTS_PROC_H */
