/*
 * tools/cli_util.c - output helpers of the `kiln` command: aligned tables
 * for people, JSON for scripts, error lines and the exit-code mapping.
 */
#include "cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"
#include "kiln_json.h"
#include "state.h"

const char *cli_opt(const cli_t *cli, const char *name)
{
    for (int i = 0; cli->opts != NULL && cli->opts[i].name != NULL; i++)
        if (strcmp(cli->opts[i].name, name) == 0)
            return cli->values[i];
    return NULL;
}

static const struct {
    int rc;
    int exit;
} exit_map[] = {
    {KILN_EINVAL, CLI_EXIT_INPUT},     {KILN_ESPEC, CLI_EXIT_INPUT},
    {KILN_ECRON, CLI_EXIT_INPUT},      {KILN_ERANGE, CLI_EXIT_INPUT},
    {KILN_ENOENT, CLI_EXIT_NOTFOUND},  {KILN_ESTATE, CLI_EXIT_CONFLICT},
    {KILN_ECONFLICT, CLI_EXIT_CONFLICT}, {KILN_EEXIST, CLI_EXIT_CONFLICT},
    {KILN_EUSAGE, CLI_EXIT_USAGE},
};

int cli_exit_for(int rc)
{
    if (rc == 0)
        return CLI_EXIT_OK;
    for (size_t i = 0; i < sizeof exit_map / sizeof exit_map[0]; i++)
        if (exit_map[i].rc == rc)
            return exit_map[i].exit;
    return CLI_EXIT_FAIL;
}

/* --json's error document: what the command said went wrong, printed by
 * cli_finish when the command printed no JSON of its own. */
static struct {
    bool json;        /* --json was given */
    bool printed;     /* a JSON document went to stdout */
    char *error;      /* the last cli_fail message */
    json_t *problems; /* the lines that detail it (cli_problem) */
} err_doc;

void cli_json_errors(int argc, char *const *argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--json") == 0)
            err_doc.json = true;
}

int cli_fail(int rc, const char *fmt, ...)
{
    char *msg;
    if (fmt == NULL) {
        const char *m = kiln_errmsg();
        msg = kiln_strdup(m[0] ? m : kiln_strerror(rc));
    } else {
        char buf[2048];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        msg = kiln_strdup(buf);
    }
    fprintf(stderr, "kiln: %s\n", msg ? msg : kiln_strerror(rc));
    free(err_doc.error);
    err_doc.error = msg;
    return cli_exit_for(rc);
}

void cli_problem(const char *line)
{
    fprintf(stderr, "%s\n", line);
    if (!err_doc.json)
        return;
    if (err_doc.problems == NULL)
        err_doc.problems = json_array();
    json_array_append_new(err_doc.problems, kiln_json_str(line));
}

int cli_finish(int code)
{
    if (err_doc.json && code != CLI_EXIT_OK && !err_doc.printed) {
        json_t *o = json_pack("{s:b, s:s, s:i}", "ok", 0, "error",
                              err_doc.error ? err_doc.error : "failed", "code", code);
        if (err_doc.problems != NULL)
            json_object_set(o, "problems", err_doc.problems);
        cli_print_json(o);
    }
    json_decref(err_doc.problems);
    free(err_doc.error);
    memset(&err_doc, 0, sizeof err_doc);
    return code;
}

bool cli_is_run_number(const char *s)
{
    if (s == NULL || *s == '\0')
        return false;
    for (; *s; s++)
        if (*s < '0' || *s > '9')
            return false;
    return true;
}

int cli_run_number(const cli_t *cli, const char *cmd, int64_t *id)
{
    const char *what = cli->pos[0];
    if (!cli_is_run_number(what))
        return cli_fail(KILN_EUSAGE, "%s expects a run number (see 'kiln runs'), got '%s'", cmd,
                        what);
    *id = strtoll(what, NULL, 10);
    return CLI_EXIT_OK;
}

void cli_print_json(json_t *v)
{
    err_doc.printed = true;
    if (v == NULL) {
        fputs("null\n", stdout);
        return;
    }
    json_dumpf(v, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    fputc('\n', stdout);
    json_decref(v);
}

struct cli_table {
    int ncols;
    size_t nrows, cap;
    char **cells; /* (nrows + 1) x ncols, row 0 the header */
};

cli_table_t *cli_table_create(int ncols, const char *const *headers)
{
    cli_table_t *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    t->ncols = ncols;
    cli_table_add(t, headers);
    return t;
}

void cli_table_add(cli_table_t *t, const char *const *cells)
{
    if (t == NULL)
        return;
    if (t->nrows == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        char **c = kiln_reallocarray(t->cells, cap * (size_t)t->ncols, sizeof *c);
        if (c == NULL)
            return;
        t->cells = c;
        t->cap = cap;
    }
    for (int j = 0; j < t->ncols; j++)
        t->cells[t->nrows * (size_t)t->ncols + (size_t)j] =
            kiln_strdup(cells[j] ? cells[j] : "-");
    t->nrows++;
}

void cli_table_print(const cli_table_t *t)
{
    if (t == NULL)
        return;
    size_t width[32] = {0};
    for (size_t i = 0; i < t->nrows; i++)
        for (int j = 0; j < t->ncols && j < 32; j++) {
            const char *c = t->cells[i * (size_t)t->ncols + (size_t)j];
            size_t w = c ? strlen(c) : 0;
            if (w > width[j])
                width[j] = w;
        }
    for (size_t i = 0; i < t->nrows; i++) {
        for (int j = 0; j < t->ncols; j++) {
            const char *c = t->cells[i * (size_t)t->ncols + (size_t)j];
            if (j == t->ncols - 1)
                printf("%s\n", c ? c : "");
            else
                printf("%-*s  ", (int)width[j], c ? c : "");
        }
    }
}

void cli_table_destroy(cli_table_t *t)
{
    if (t == NULL)
        return;
    for (size_t i = 0; i < t->nrows * (size_t)t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
    free(t);
}

const char *cli_time(int64_t t, char *buf, size_t bufsz)
{
    if (t == 0)
        return "-";
    kiln_time_iso(t, buf, bufsz);
    return buf;
}

json_t *cli_push_json(const state_push_t *p)
{
    return json_pack(
        "{s:I, s:s, s:s, s:s, s:s, s:s, s:s, s:i, s:o, s:i, s:s, s:o, s:o, s:o}", "id",
        (json_int_t)p->id, "checkpoint", p->checkpoint_uid, "url", p->url, "model", p->model,
        "label", p->label, "state", state_push_state_name(p->state), "mode",
        state_push_mode_name(p), "http_status", p->http_status, "error", kiln_json_str(p->error),
        "attempts", p->attempts, "reason", p->reason != NULL ? p->reason : "", "created_at",
        kiln_json_time(p->created_at), "ended_at", kiln_json_time(p->ended_at), "not_before",
        p->state == STATE_PUSH_PENDING && p->not_before_ms > 0
            ? kiln_json_time(p->not_before_ms / 1000)
            : json_null());
}
