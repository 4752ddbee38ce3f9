/*
 * tools/cli.h - what the `kiln` command's files share: the parsed command
 * line, the documented exit codes, and the people/script output helpers
 * (aligned tables, --json). Internal to tools/.
 */
#ifndef KILN_TOOLS_CLI_H
#define KILN_TOOLS_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "kiln_json.h"

/* Exit codes, documented in docs/cli.md. */
enum {
    CLI_EXIT_OK = 0,       /* it worked */
    CLI_EXIT_FAIL = 1,     /* a runtime failure: database, I/O, ... */
    CLI_EXIT_USAGE = 2,    /* bad command line */
    CLI_EXIT_INPUT = 3,    /* bad input: an invalid spec, cron expression, time */
    CLI_EXIT_NOTFOUND = 4, /* no such job or run */
    CLI_EXIT_CONFLICT = 5, /* refused by state: e.g. cancel of a run that ended */
};

typedef struct cli_opt {
    const char *name; /* without the leading "--" */
    const char *arg;  /* NULL for a flag, else the metavar shown in help ("PATH") */
    const char *help;
} cli_opt_t;

#define CLI_MAX_OPTS 16
#define CLI_MAX_POS 8

typedef struct cli {
    /* global options */
    const char *db_path; /* resolved: --db, else $KILN_HOME/kiln.db */
    bool json;
    /* the command's own options, by index into its cli_opt_t table */
    const cli_opt_t *opts;
    const char *values[CLI_MAX_OPTS]; /* NULL: not given; "" for a given flag */
    const char *pos[CLI_MAX_POS];
    int npos;
} cli_t;

typedef struct cli_cmd {
    const char *name;
    const char *args;    /* positional synopsis, e.g. "FILE" */
    const char *summary; /* one line */
    const char *details; /* a paragraph for --help, may be NULL */
    const cli_opt_t *opts; /* ends with {NULL} */
    int min_pos, max_pos;
    bool needs_db;
    int (*run)(cli_t *cli); /* returns a CLI_EXIT_* code */
} cli_cmd_t;

/* The commands (one table in cli_main.c walks them). */
int cmd_submit(cli_t *cli);
int cmd_jobs(cli_t *cli);
int cmd_runs(cli_t *cli);
int cmd_show(cli_t *cli);
int cmd_cancel(cli_t *cli);
int cmd_pause(cli_t *cli);
int cmd_resume(cli_t *cli);
int cmd_delete(cli_t *cli);
int cmd_schedule(cli_t *cli);
int cmd_datagen(cli_t *cli);
int cmd_convert(cli_t *cli);

/* The value of the command's option `name` ("" for a given flag), or NULL
 * when it was not given. */
const char *cli_opt(const cli_t *cli, const char *name);
/* Maps a KILN_E* code to an exit code. */
int cli_exit_for(int kiln_rc);
/* Prints "kiln: <message>" to stderr, message from kiln_errmsg() when fmt is
 * NULL, and returns cli_exit_for(rc). Under --json the message is also the
 * "error" of the document cli_finish prints. */
int cli_fail(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints one line that details a failure (a spec's file:line:col problem)
 * to stderr; under --json it is also listed in the error's "problems". */
void cli_problem(const char *line);
/* Notes whether argv (before any "--") asks for --json, before the command
 * line is parsed, so that its own errors are JSON too. */
void cli_json_errors(int argc, char *const *argv);
/* The end of every `kiln` command: with --json, a failing command (code is
 * not CLI_EXIT_OK) that printed no JSON document prints
 * {"ok": false, "error": MESSAGE, "code": CODE, "problems": [LINE...]} on
 * stdout: the shape of push and promote's reports. Returns code. */
int cli_finish(int code);
/* Whether s names a run: a run number is decimal digits only. */
bool cli_is_run_number(const char *s);
/* The run number of the command's first argument into *id: CLI_EXIT_OK, or
 * the usage failure "<cmd> expects a run number (see 'kiln runs'), got ..."
 * printed and its exit code returned. */
int cli_run_number(const cli_t *cli, const char *cmd, int64_t *id /* OUT */);
/* Prints a JSON value on stdout (pretty, one document) and drops a reference. */
void cli_print_json(json_t *v);

/* Aligned text tables: add a header, then rows of exactly ncols strings. */
typedef struct cli_table cli_table_t;
cli_table_t *cli_table_create(int ncols, const char *const *headers);
void cli_table_add(cli_table_t *t, const char *const *cells);
void cli_table_print(const cli_table_t *t);
void cli_table_destroy(cli_table_t *t);

struct state_push;
/* One push as JSON: id, endpoint, state, mode, HTTP status, error, reason, times. */
json_t *cli_push_json(const struct state_push *p);

/* "2024-05-02T00:00:00Z" or "-" for 0. */
const char *cli_time(int64_t t, char *buf, size_t bufsz);

#endif /* KILN_TOOLS_CLI_H */
