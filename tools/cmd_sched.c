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
#include "sched.h"
#include "state.h"

static bool digits(const char *s)
{
    if (s == NULL || *s == '\0')
        return false;
    for (; *s; s++)
        if (*s < '0' || *s > '9')
            return false;
    return true;
}

/* ---- daemon ------------------------------------------------------------------------ */

int cmd_daemon(cli_t *cli)
{
    /* Hand the command's options to kilnd's own parser, so both read alike. */
    static const char *const names[] = {"home",  "listen",  "max-ranks", "grace", "poll",
                                        "drain", "trainer", "mpirun",    "log"};
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
    rc = sched_run(&o);
    return rc < 0 ? cli_fail(rc, NULL) : CLI_EXIT_OK;
}

/* ---- retry ------------------------------------------------------------------------- */

int cmd_retry(cli_t *cli)
{
    const char *what = cli->pos[0];
    if (!digits(what))
        return cli_fail(KILN_EUSAGE, "retry expects a run number (see 'kiln runs'), got '%s'",
                        what);
    int64_t id = strtoll(what, NULL, 10), new_id = 0;
    state_t *st = NULL;
    state_run_t r = {0};
    int exit_code = CLI_EXIT_OK;
    int rc = state_open(cli->db_path, &st);
    if (rc == 0)
        rc = state_run_get(st, id, &r);
    if (rc < 0) {
        exit_code = cli_fail(rc, NULL);
        goto out;
    }
    if (!state_run_state_terminal(r.state) || r.state == STATE_RUN_SUCCEEDED) {
        exit_code = cli_fail(KILN_ESTATE, "run %" PRId64 " is %s; only a failed, canceled, "
                                          "timed-out or skipped run can be retried",
                             id, state_run_state_name(r.state));
        goto out;
    }
    rc = state_run_create(st, r.job_id, STATE_TRIGGER_RETRY, r.scheduled_at, r.attempt + 1, r.id,
                          &new_id);
    if (rc == 0)
        state_event_add(st, 0, new_id, "retry", "retry asked with kiln retry");
    if (rc < 0) {
        exit_code = cli_fail(rc, NULL);
    } else if (cli->json) {
        cli_print_json(json_pack("{s:I, s:I, s:i}", "run", (json_int_t)new_id, "retry_of",
                                 (json_int_t)id, "attempt", r.attempt + 1));
    } else {
        printf("queued run %" PRId64 " (retry of run %" PRId64 ", attempt %d)\n", new_id, id,
               r.attempt + 1);
    }
out:
    state_run_fini(&r);
    state_close(st);
    return exit_code;
}

/* ---- logs -------------------------------------------------------------------------- */

/* Copies what f has from *off on to stdout. */
static void copy_from(FILE *f, long *off)
{
    char buf[8192];
    size_t n;
    fseek(f, *off, SEEK_SET);
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        fwrite(buf, 1, n, stdout);
        *off += (long)n;
    }
    clearerr(f);
    fflush(stdout);
}

int cmd_logs(cli_t *cli)
{
    const char *what = cli->pos[0];
    if (!digits(what))
        return cli_fail(KILN_EUSAGE, "logs expects a run number (see 'kiln runs'), got '%s'",
                        what);
    int64_t id = strtoll(what, NULL, 10);
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
            char path[4096];
            snprintf(path, sizeof path, "%s/log", r.run_dir);
            f = fopen(path, "r");
        }
        if (f != NULL)
            copy_from(f, &off);
        if (!follow || state_run_state_terminal(r.state))
            break;
        struct timespec ts = {0, 250 * 1000000L};
        nanosleep(&ts, NULL);
        state_run_fini(&r);
        if (state_run_get(st, id, &r) < 0)
            break;
    }
    if (f != NULL)
        copy_from(f, &off);
    else if (!follow)
        exit_code = cli_fail(KILN_ENOENT, "run %" PRId64 " has no log yet (it is %s)", id,
                             state_run_state_name(r.state));
out:
    if (f != NULL)
        fclose(f);
    state_run_fini(&r);
    state_close(st);
    return exit_code;
}

/* ---- lineage ------------------------------------------------------------------------- */

static void print_inputs(state_t *st, int64_t run_id, const char *indent)
{
    state_input_t *ins = NULL;
    size_t n = 0;
    if (state_input_list(st, run_id, &ins, &n) < 0)
        return;
    if (n == 0)
        printf("%sinputs: (not recorded: the run read data.train as it was)\n", indent);
    for (size_t i = 0; i < n; i++)
        printf("%sinput %s (%" PRId64 " bytes, mtime %" PRId64 ", xxh64 %s)\n", indent,
               ins[i].path, ins[i].size, ins[i].mtime, ins[i].checksum ? ins[i].checksum : "-");
    state_inputs_free(ins, n);
}

/* The run, its retry chain and its inputs. */
static void print_run_back(state_t *st, int64_t run_id, const char *indent)
{
    state_run_t r;
    char t[KILN_ISO_LEN];
    if (state_run_get(st, run_id, &r) < 0) {
        printf("%srun %" PRId64 " (no longer recorded)\n", indent, run_id);
        return;
    }
    printf("%srun %" PRId64 " of job %s (version %d): %s, %s, attempt %d, %s\n", indent, r.id,
           r.job_name, r.job_version, state_run_state_name(r.state), state_trigger_name(r.trigger),
           r.attempt, cli_time(r.started_at, t, sizeof t));
    print_inputs(st, r.id, indent);
    if (r.retry_of != 0) {
        printf("%s  retry of:\n", indent);
        char deeper[64];
        snprintf(deeper, sizeof deeper, "%s    ", indent);
        print_run_back(st, r.retry_of, deeper);
    }
    state_run_fini(&r);
}

static void print_served(state_t *st, int64_t ckpt_id, const char *indent)
{
    state_served_t *sv = NULL;
    size_t n = 0;
    if (state_lineage_served(st, ckpt_id, &sv, &n) < 0)
        return;
    for (size_t i = 0; i < n; i++) {
        printf("%s-> export %" PRId64 " (%s) %s\n", indent, sv[i].export_id,
               sv[i].format ? sv[i].format : "?", sv[i].export_path ? sv[i].export_path : "");
        if (sv[i].push_id != 0)
            printf("%s   -> push %" PRId64 " %s (HTTP %d) to %s model %s label %s%s\n", indent,
                   sv[i].push_id, sv[i].push_state ? sv[i].push_state : "?", sv[i].http_status,
                   sv[i].url ? sv[i].url : "?", sv[i].model ? sv[i].model : "-",
                   sv[i].label ? sv[i].label : "-", sv[i].holding ? " [serving it now]" : "");
    }
    if (n == 0)
        printf("%s-> (not exported or pushed yet)\n", indent);
    state_served_free(sv, n);
}

/* A checkpoint: the run that wrote it (and its inputs), its parent chain
 * back to a full dump, and what serves it. */
static int lineage_checkpoint(state_t *st, state_checkpoint_t *c)
{
    printf("checkpoint %s (%s, step %" PRId64 ", %" PRId64 " keys) at %s\n", c->uid, c->kind,
           c->step, c->keys, c->path);
    printf("  serves:\n");
    print_served(st, c->id, "    ");
    printf("  made by:\n");
    if (c->run_id != 0)
        print_run_back(st, c->run_id, "    ");
    int64_t parent = c->parent_id;
    for (int depth = 0; parent != 0 && depth < 1000; depth++) {
        state_checkpoint_t p;
        if (state_checkpoint_get_by_id(st, parent, &p) < 0)
            break;
        printf("  based on checkpoint %s (%s, step %" PRId64 ")\n", p.uid, p.kind, p.step);
        if (p.run_id != 0 && p.run_id != c->run_id)
            print_run_back(st, p.run_id, "    ");
        parent = p.parent_id;
        state_checkpoint_fini(&p);
    }
    return 0;
}

int cmd_lineage(cli_t *cli)
{
    const char *what = cli->pos[0];
    state_t *st = NULL;
    int rc = state_open(cli->db_path, &st);
    if (rc < 0)
        return cli_fail(rc, NULL);
    state_checkpoint_t c = {0};
    if (digits(what)) {
        int64_t run_id = strtoll(what, NULL, 10);
        state_run_t r;
        rc = state_run_get(st, run_id, &r);
        if (rc == 0) {
            state_run_fini(&r);
            print_run_back(st, run_id, "");
            state_checkpoint_t *cs = NULL;
            size_t n = 0;
            rc = state_checkpoint_list_by_run(st, run_id, &cs, &n);
            if (rc == 0 && n == 0)
                printf("  -> (no checkpoints recorded)\n");
            for (size_t i = 0; rc == 0 && i < n; i++) {
                printf("  -> checkpoint %s (%s, step %" PRId64 ")\n", cs[i].uid, cs[i].kind,
                       cs[i].step);
                print_served(st, cs[i].id, "       ");
            }
            state_checkpoints_free(cs, n);
        }
    } else if (strncmp(what, "http://", 7) == 0 || strncmp(what, "https://", 8) == 0) {
        int64_t ep = 0, ckpt = 0, since = 0;
        rc = state_endpoint_find(st, what, NULL, &ep);
        if (rc == 0)
            rc = state_endpoint_holding(st, ep, &ckpt, &since);
        if (rc == 0)
            rc = state_checkpoint_get_by_id(st, ckpt, &c);
        if (rc == 0) {
            char t[KILN_ISO_LEN];
            printf("endpoint %s holds since %s:\n", what, cli_time(since, t, sizeof t));
            rc = lineage_checkpoint(st, &c);
        }
    } else {
        rc = state_checkpoint_get(st, what, &c);
        if (rc == 0)
            rc = lineage_checkpoint(st, &c);
    }
    int exit_code = rc < 0 ? cli_fail(rc, NULL) : CLI_EXIT_OK;
    state_checkpoint_fini(&c);
    state_close(st);
    return exit_code;
}
