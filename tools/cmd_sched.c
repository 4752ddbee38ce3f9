/*
 * tools/cmd_sched.c - the `kiln` commands that go with the scheduler: daemon
 * (kilnd in the foreground: the same sched_run()), retry (queue a new attempt
 * of an ended run), logs (print or follow a run's combined log) and lineage
 * (a checkpoint, run or endpoint traced back to its input files and forward
 * to the endpoints that serve it).
 */
#include "cli.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kiln.h"
#include "ops.h"
#include "run.h"
#include "scheduler.h"
#include "state.h"

/* ---- daemon ------------------------------------------------------------------------ */

int cmd_daemon(cli_t *cli)
{
    /* Hand the command's options to kilnd's own parser, so both read alike. */
    static const char *const names[] = {"home",  "listen",  "max-ranks",   "grace",
                                        "poll",  "drain",   "trainer",     "mpirun",
                                        "log",   "stats-every", "slurm-poll", "keep-runs"};
    char *argv[2 * (sizeof names / sizeof names[0]) + 4];
    int argc = 0;
    argv[argc++] = (char *)"kiln daemon";
    char dbopt[] = "--db";
    argv[argc++] = dbopt;
    argv[argc++] = (char *)cli->db_path;
    char flags[sizeof names / sizeof names[0]][32];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = cli_opt(cli, names[i]);
        if (v == NULL)
            continue;
        snprintf(flags[i], sizeof flags[i], "--%s", names[i]);
        argv[argc++] = flags[i];
        if (strcmp(names[i], "drain") != 0)
            argv[argc++] = (char *)v;
    }
    sched_options_t o;
    sched_options_init(&o);
    int rc = sched_options_parse(argc, argv, 1, &o);
    if (rc < 0)
        return cli_fail(rc, NULL);
    o.log_json = cli->json; /* --json: the daemon's log lines as JSON */
    if (getenv("KILN_LOG") == NULL)
        kiln_log_set_level(KILN_LOG_INFO); /* a daemon says what it does */
    rc = sched_run(&o);
    return rc < 0 ? cli_fail(rc, NULL) : CLI_EXIT_OK;
}

/* ---- retry ------------------------------------------------------------------------- */

int cmd_retry(cli_t *cli)
{
    int64_t id = 0, new_id = 0;
    int e = cli_run_number(cli, "retry", &id);
    if (e != CLI_EXIT_OK)
        return e;
    int attempt = 0;
    state_t *st = NULL;
    int rc = state_open(cli->db_path, &st);
    if (rc == 0)
        rc = ops_retry(st, id, "kiln retry", &new_id, &attempt);
    state_close(st);
    if (rc < 0)
        return cli_fail(rc, NULL);
    if (cli->json)
        cli_print_json(json_pack("{s:I, s:I, s:i}", "run", (json_int_t)new_id, "retry_of",
                                 (json_int_t)id, "attempt", attempt));
    else
        printf("queued run %" PRId64 " (retry of run %" PRId64 ", attempt %d)\n", new_id, id,
               attempt);
    return CLI_EXIT_OK;
}

/* ---- logs -------------------------------------------------------------------------- */

/* What f has from *off on: to stdout, or with --json as one JSON line per
 * piece ({"run", "text"}). */
static void copy_from(const cli_t *cli, int64_t run, FILE *f, long *off)
{
    char buf[8192];
    size_t n;
    fseek(f, *off, SEEK_SET);
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        if (cli->json) {
            json_t *o = json_pack("{s:I, s:s%}", "run", (json_int_t)run, "text", buf, n);
            char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
            if (line != NULL)
                printf("%s\n", line);
            free(line);
            json_decref(o);
        } else {
            fwrite(buf, 1, n, stdout);
        }
        *off += (long)n;
    }
    clearerr(f);
    fflush(stdout);
}

int cmd_logs(cli_t *cli)
{
    int64_t id = 0;
    int e = cli_run_number(cli, "logs", &id);
    if (e != CLI_EXIT_OK)
        return e;
    bool follow = cli_opt(cli, "follow") != NULL;
    state_t *st = NULL;
    state_run_t r = {0};
    FILE *f = NULL;
    int exit_code = CLI_EXIT_OK;
    int rc = state_open(cli->db_path, &st);
    if (rc == 0)
        rc = state_run_get(st, id, &r);
    if (rc < 0) {
        exit_code = cli_fail(rc, NULL);
        goto out;
    }
    long off = 0;
    for (;;) {
        if (f == NULL && r.run_dir != NULL) {
            char *path = run_path(r.run_dir, RUN_FILE_LOG);
            f = path != NULL ? fopen(path, "r") : NULL;
            free(path);
        }
        if (f != NULL)
            copy_from(cli, id, f, &off);
        if (!follow || state_run_state_terminal(r.state))
            break;
        struct timespec ts = {0, 250 * 1000000L};
        nanosleep(&ts, NULL);
        state_run_fini(&r);
        if (state_run_get(st, id, &r) < 0)
            break;
    }
    if (f != NULL)
        copy_from(cli, id, f, &off);
    else if (!follow)
        exit_code = cli_fail(KILN_ENOENT, "run %" PRId64 " has no log yet (it is %s)", id,
                             state_run_state_name(r.state));
    if (exit_code == CLI_EXIT_OK && cli->json) {
        /* The last line says how the run stands. */
        json_t *o = json_pack("{s:I, s:s, s:b}", "run", (json_int_t)id, "state",
                              state_run_state_name(r.state), "ended",
                              state_run_state_terminal(r.state));
        char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
        if (line != NULL)
            printf("%s\n", line);
        free(line);
        json_decref(o);
    }
out:
    if (f != NULL)
        fclose(f);
    state_run_fini(&r);
    state_close(st);
    return exit_code;
}

/* ---- lineage ------------------------------------------------------------------------- */

static const char *jstr(const json_t *o, const char *key)
{
    const char *v = json_string_value(json_object_get(o, key));
    return v != NULL ? v : "-";
}

static void print_pushes(const json_t *c, const char *indent)
{
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(c, "pushes"), i, p)
    {
        int status = (int)json_integer_value(json_object_get(p, "http_status"));
        printf("%s-> push %lld (%s) %s %s to %s (%s/%s)", indent,
               (long long)json_integer_value(json_object_get(p, "id")), jstr(p, "reason"),
               jstr(p, "state"), jstr(p, "mode"),
               jstr(p, "url"), jstr(p, "model"), jstr(p, "label"));
        if (status != 0)
            printf(", HTTP %d", status);
        if (json_is_string(json_object_get(p, "error")))
            printf(": %s", jstr(p, "error"));
        printf("\n");
    }
}

static void print_checkpoint(const json_t *c, const char *indent)
{
    json_t *run = json_object_get(c, "run_id");
    printf("%scheckpoint %s (%s, step %lld, %lld keys", indent, jstr(c, "uid"), jstr(c, "kind"),
           (long long)json_integer_value(json_object_get(c, "step")),
           (long long)json_integer_value(json_object_get(c, "keys")));
    if (json_is_integer(run))
        printf(", run %lld", (long long)json_integer_value(run));
    if (json_is_string(json_object_get(c, "parent")))
        printf(", on %s", jstr(c, "parent"));
    if (json_is_number(json_object_get(c, "eval_logloss")))
        printf(", eval logloss %.5f", json_number_value(json_object_get(c, "eval_logloss")));
    printf(")\n");
}

/* The lineage document as text: back, forward, and the endpoints. */
static void print_lineage(const json_t *doc)
{
    const json_t *from = json_object_get(doc, "from");
    printf("lineage of %s %s\n", jstr(from, "kind"), jstr(from, "ref"));
    size_t i;
    json_t *v;
    printf("back:\n");
    json_array_foreach(json_object_get(doc, "runs"), i, v)
    {
        printf("  run %lld of job %s (version %lld): %s, %s, attempt %lld, started %s\n",
               (long long)json_integer_value(json_object_get(v, "id")), jstr(v, "job"),
               (long long)json_integer_value(json_object_get(v, "job_version")), jstr(v, "state"),
               jstr(v, "trigger"), (long long)json_integer_value(json_object_get(v, "attempt")),
               jstr(v, "started_at"));
        if (json_is_integer(json_object_get(v, "retry_of")))
            printf("    retry of run %lld\n",
                   (long long)json_integer_value(json_object_get(v, "retry_of")));
        if (json_is_string(json_object_get(v, "started_from")))
            printf("    started from checkpoint %s\n", jstr(v, "started_from"));
        size_t k;
        json_t *path;
        json_array_foreach(json_object_get(v, "inputs"), k, path)
        {
            const json_t *in = NULL;
            size_t m;
            json_t *x;
            json_array_foreach(json_object_get(doc, "inputs"), m, x)
            if (strcmp(jstr(x, "path"), json_string_value(path)) == 0)
                in = x;
            printf("    input %s", json_string_value(path));
            if (in != NULL)
                printf(" (%lld bytes, mtime %s, xxh64 %s)",
                       (long long)json_integer_value(json_object_get(in, "size")),
                       jstr(in, "mtime"), jstr(in, "checksum"));
            printf("\n");
        }
        if (json_array_size(json_object_get(v, "inputs")) == 0)
            printf("    inputs: not recorded\n");
    }
    json_array_foreach(json_object_get(doc, "earlier_checkpoints"), i, v)
        print_checkpoint(v, "  ");
    printf("forward:\n");
    json_array_foreach(json_object_get(doc, "checkpoints"), i, v)
    {
        print_checkpoint(v, "  ");
        print_pushes(v, "    ");
    }
    if (json_array_size(json_object_get(doc, "checkpoints")) == 0)
        printf("  (no checkpoints recorded)\n");
    printf("endpoints:\n");
    json_array_foreach(json_object_get(doc, "endpoints"), i, v)
        printf("  %s (%s/%s) holds %s since %s%s\n", jstr(v, "url"), jstr(v, "model"),
               jstr(v, "label"), jstr(v, "holds"), jstr(v, "since"),
               json_is_true(json_object_get(v, "serves_this_lineage"))
                   ? " [serving this lineage now]"
                   : "");
    if (json_array_size(json_object_get(doc, "endpoints")) == 0)
        printf("  (none reached yet)\n");
}

int cmd_lineage(cli_t *cli)
{
    state_t *st = NULL;
    json_t *doc = NULL;
    int rc = state_open(cli->db_path, &st);
    if (rc == 0)
        rc = ops_lineage(st, cli->pos[0], &doc);
    state_close(st);
    if (rc < 0)
        return cli_fail(rc, NULL);
    if (cli->json)
        cli_print_json(doc);
    else {
        print_lineage(doc);
        json_decref(doc);
    }
    return CLI_EXIT_OK;
}
