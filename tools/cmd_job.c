/*
 * tools/cmd_job.c - the job and run commands of `kiln`: submit, jobs, runs,
 * show, cancel, and pause, resume and delete. They validate with jobs/ and read and write the SQLite
 * store through state/; nothing here knows SQL or YAML.
 */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs.h"
#include "kiln.h"
#include "ops.h"
#include "state.h"

/* Reads a whole file into a NUL-terminated buffer. */
static int read_file(const char *path, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return kiln_errf(errno == ENOENT ? KILN_ENOENT : KILN_EIO, "cannot read %s: %s", path,
                         strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = kiln_malloc(cap);
    int rc = 0;
    for (;;) {
        if (buf == NULL) {
            rc = KILN_ENOMEM;
            break;
        }
        n += fread(buf + n, 1, cap - n - 1, f);
        if (ferror(f)) {
            rc = kiln_errf(KILN_EIO, "error reading %s: %s", path, strerror(errno));
            break;
        }
        if (feof(f))
            break;
        if (cap > (64u << 20)) {
            rc = kiln_errf(KILN_EINVAL, "%s is larger than 64 MiB; is it really a job spec?", path);
            break;
        }
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (nb == NULL)
            free(buf);
        buf = nb;
    }
    fclose(f);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

int cmd_submit(cli_t *cli)
{
    const char *path = cli->pos[0];
    char *text = NULL;
    size_t len = 0;
    job_diags_t diags;
    job_diags_init(&diags);
    state_t *st = NULL;
    ops_submitted_t sub;
    memset(&sub, 0, sizeof sub);
    int exit_code = CLI_EXIT_OK;
    bool dry_run = cli_opt(cli, "dry-run") != NULL;

    int rc = read_file(path, &text, &len);
    if (rc < 0)
        return cli_fail(rc, NULL);
    if (!dry_run && (rc = state_open(cli->db_path, &st)) < 0) {
        exit_code = cli_fail(rc, NULL);
        goto out;
    }
    ops_submit_t in = {text, len, path, NULL, dry_run};
    rc = ops_submit(st, &in, &diags, &sub);
    if (rc == KILN_ESPEC) {
        for (size_t i = 0; i < diags.n; i++)
            cli_problem(diags.items[i].message);
        exit_code = cli_fail(KILN_ESPEC, "%s: %zu problem%s; nothing was submitted", path,
                             diags.n, diags.n == 1 ? "" : "s");
        goto out;
    }
    if (rc < 0) {
        exit_code = cli_fail(rc, NULL);
        goto out;
    }
    const job_spec_t *spec = &sub.spec;
    char nbuf[KILN_ISO_LEN];
    if (dry_run) {
        if (cli->json) {
            json_t *o = json_pack(
                "{s:s, s:b, s:s, s:s, s:i, s:i, s:s?, s:s, s:o}", "job", spec->name, "valid", 1,
                "file", path, "model", job_model_type_name(spec->model.type), "tables",
                spec->model.ntables, "ranks", spec->resources.ranks, "schedule", spec->schedule,
                "timezone", spec->timezone, "next_fire", kiln_json_time(sub.next_fire));
            cli_print_json(o);
        } else {
            printf("ok: %s is a valid spec for job %s\n", path, spec->name);
            printf("  model %s, %d table%s, %d rank%s, launcher %s\n",
                   job_model_type_name(spec->model.type), spec->model.ntables,
                   spec->model.ntables == 1 ? "" : "s", spec->resources.ranks,
                   spec->resources.ranks == 1 ? "" : "s",
                   job_launcher_name(spec->resources.launcher));
            if (spec->schedule)
                printf("  schedule \"%s\" (%s), next fire %s\n", spec->schedule, spec->timezone,
                       cli_time(sub.next_fire, nbuf, sizeof nbuf));
            else
                printf("  one-off: submitting queues one run\n");
            printf("dry run: nothing was submitted\n");
        }
        goto out;
    }
    if (cli->json) {
        json_t *o =
            json_pack("{s:s, s:I, s:i, s:b, s:o, s:s?, s:o}", "job", spec->name, "job_id",
                      (json_int_t)sub.r.job_id, "version", sub.r.version, "created", sub.r.created,
                      "run_id", sub.r.run_id ? json_integer(sub.r.run_id) : json_null(), "schedule",
                      spec->schedule, "next_fire", kiln_json_time(sub.next_fire));
        cli_print_json(o);
    } else if (spec->schedule) {
        printf("%s job %s (version %d): schedule \"%s\" (%s), next run %s\n",
               sub.r.created ? "registered" : "updated", spec->name, sub.r.version, spec->schedule,
               spec->timezone, cli_time(sub.next_fire, nbuf, sizeof nbuf));
    } else {
        printf("%s job %s (version %d); queued run %" PRId64 "\n",
               sub.r.created ? "submitted" : "resubmitted", spec->name, sub.r.version,
               sub.r.run_id);
    }
out:
    ops_submitted_fini(&sub);
    state_close(st);
    job_diags_fini(&diags);
    free(text);
    return exit_code;
}

/* The pushes of a run's checkpoints, newest first (a run's export reaches
 * serving through them; pending or failed ones say why). */
static json_t *pushes_json(state_t *st, int64_t run_id)
{
    state_push_filter_t f = {.run_id = run_id};
    state_push_t *ps = NULL;
    size_t n = 0;
    json_t *arr = json_array();
    if (state_push_list(st, &f, 100, &ps, &n) < 0)
        return arr;
    ops_push_foresee(st, ps, n);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, cli_push_json(&ps[i]));
    state_pushes_free(ps, n);
    return arr;
}

/* "B ok, A pending (HTTP 503)": the newest push to each endpoint of a run. */
static void push_summary(state_t *st, int64_t run_id, char *buf, size_t cap)
{
    state_push_filter_t f = {.run_id = run_id};
    state_push_t *ps = NULL;
    size_t n = 0, len = 0;
    snprintf(buf, cap, "-");
    if (state_push_list(st, &f, 32, &ps, &n) < 0 || n == 0) {
        state_pushes_free(ps, n);
        return;
    }
    buf[0] = '\0';
    for (size_t i = 0; i < n && len < cap; i++) {
        bool newer = false; /* an endpoint is shown once, with its newest push */
        for (size_t k = 0; k < i; k++)
            newer |= ps[k].endpoint_id == ps[i].endpoint_id;
        if (newer)
            continue;
        char status[24] = "";
        if (ps[i].state != STATE_PUSH_SUCCEEDED && ps[i].http_status != 0)
            snprintf(status, sizeof status, " (HTTP %d)", ps[i].http_status);
        len += (size_t)snprintf(buf + len, cap - len, "%s%s %s%s", len ? ", " : "", ps[i].label,
                                ps[i].state == STATE_PUSH_SUCCEEDED
                                    ? "ok"
                                    : state_push_state_name(ps[i].state),
                                status);
    }
    state_pushes_free(ps, n);
}

static json_t *run_json(state_t *st, const state_run_t *r)
{
    json_t *o = json_pack(
        "{s:I, s:s, s:I, s:i, s:s, s:s, s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:s?, "
        "s:s?, s:b}",
        "id", (json_int_t)r->id, "job", r->job_name ? r->job_name : "", "job_id",
        (json_int_t)r->job_id, "job_version", r->job_version, "state",
        state_run_state_name(r->state), "trigger", state_trigger_name(r->trigger), "attempt",
        r->attempt, "scheduled_at", kiln_json_time(r->scheduled_at), "queued_at",
        kiln_json_time(r->queued_at), "started_at", kiln_json_time(r->started_at), "ended_at",
        kiln_json_time(r->ended_at), "exit_code",
        state_run_state_terminal(r->state) && r->exit_code >= 0 ? json_integer(r->exit_code)
                                                                : json_null(),
        "retry_of", r->retry_of ? json_integer(r->retry_of) : json_null(), "error", r->error,
        "run_dir", r->run_dir, "cancel_requested", r->cancel_requested);
    if (o != NULL)
        json_object_set_new(o, "pushes", pushes_json(st, r->id));
    return o;
}

static void format_duration_s(int64_t secs, char *buf, size_t bufsz)
{
    if (secs < 0)
        snprintf(buf, bufsz, "-");
    else
        kiln_duration_format(secs * 1000, buf, bufsz);
}

static void run_duration(const state_run_t *r, char *buf, size_t bufsz)
{
    if (r->started_at == 0) {
        snprintf(buf, bufsz, "-");
        return;
    }
    int64_t end = r->ended_at ? r->ended_at : kiln_now_s();
    format_duration_s(end - r->started_at, buf, bufsz);
    if (end == r->started_at)
        snprintf(buf, bufsz, "0s");
}

static void print_runs(cli_t *cli, state_t *st, state_run_t *runs, size_t n)
{
    if (cli->json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(arr, run_json(st, &runs[i]));
        cli_print_json(arr);
        return;
    }
    static const char *const hdr[] = {"RUN",     "JOB",     "ATTEMPT",  "TRIGGER", "STATE",
                                      "SCHEDULED", "STARTED", "DURATION", "EXIT", "PUSHES"};
    cli_table_t *t = cli_table_create(10, hdr);
    for (size_t i = 0; i < n; i++) {
        const state_run_t *r = &runs[i];
        char id[24], att[16], sched[KILN_ISO_LEN], started[KILN_ISO_LEN], dur[32], ex[16];
        char pushes[256];
        push_summary(st, r->id, pushes, sizeof pushes);
        snprintf(id, sizeof id, "%" PRId64, r->id);
        snprintf(att, sizeof att, "%d", r->attempt);
        run_duration(r, dur, sizeof dur);
        if (state_run_state_terminal(r->state) && r->exit_code >= 0)
            snprintf(ex, sizeof ex, "%d", r->exit_code);
        else
            snprintf(ex, sizeof ex, "-");
        const char *row[] = {id,
                             r->job_name,
                             att,
                             state_trigger_name(r->trigger),
                             state_run_state_name(r->state),
                             cli_time(r->scheduled_at, sched, sizeof sched),
                             cli_time(r->started_at, started, sizeof started),
                             dur,
                             ex,
                             pushes};
        cli_table_add(t, row);
    }
    cli_table_print(t);
    cli_table_destroy(t);
}

int cmd_jobs(cli_t *cli)
{
    state_t *st = NULL;
    state_job_t *jobs = NULL;
    size_t n = 0;
    int rc = state_open(cli->db_path, &st);
    if (rc < 0)
        return cli_fail(rc, NULL);
    rc = state_job_list(st, &jobs, &n);
    if (rc < 0) {
        int e = cli_fail(rc, NULL);
        state_close(st);
        return e;
    }
    int64_t now = kiln_now_s();
    json_t *arr = cli->json ? json_array() : NULL;
    static const char *const hdr[] = {"JOB", "VERSION", "SCHEDULE", "PRIORITY", "NEXT FIRE",
                                      "LAST RUN", "STATE", "SKIPPED"};
    cli_table_t *t = cli->json ? NULL : cli_table_create(8, hdr);
    for (size_t i = 0; i < n; i++) {
        const state_job_t *j = &jobs[i];
        int64_t next = j->paused ? 0 : job_next_fire(j->schedule, j->timezone, now);
        state_run_t *last = NULL;
        size_t nlast = 0;
        if (state_run_list(st, j->name, 1, &last, &nlast) < 0)
            nlast = 0;
        if (cli->json) {
            json_array_append_new(
                arr,
                json_pack("{s:I, s:s, s:i, s:s?, s:i, s:b, s:s, s:o, s:o, s:o, s:o, s:I, s:o, "
                          "s:s?}",
                          "id", (json_int_t)j->id, "name", j->name, "version", j->version,
                          "schedule", j->schedule, "priority", j->priority, "paused", j->paused,
                          "spec_hash", j->spec_hash, "next_fire", kiln_json_time(next),
                          "created_at", kiln_json_time(j->created_at), "last_run",
                          nlast ? json_integer(last[0].id) : json_null(), "last_state",
                          nlast ? json_string(state_run_state_name(last[0].state)) : json_null(),
                          "skipped_fires", (json_int_t)j->skipped_fires, "last_checked_at",
                          kiln_json_time(j->last_checked_at), "last_skip_reason",
                          j->last_skip_reason));
        } else {
            char ver[16], pri[16], nbuf[KILN_ISO_LEN], lr[24], sk[24];
            snprintf(ver, sizeof ver, "%d", j->version);
            snprintf(sk, sizeof sk, "%" PRId64, j->skipped_fires);
            snprintf(pri, sizeof pri, "%d", j->priority);
            snprintf(lr, sizeof lr, "%" PRId64, nlast ? last[0].id : 0);
            const char *row[] = {j->name,
                                 ver,
                                 j->schedule ? j->schedule : "(one-off)",
                                 pri,
                                 j->paused ? "paused" : cli_time(next, nbuf, sizeof nbuf),
                                 nlast ? lr : "-",
                                 nlast ? state_run_state_name(last[0].state) : "-",
                                 sk};
            cli_table_add(t, row);
        }
        state_runs_free(last, nlast);
    }
    if (cli->json)
        cli_print_json(arr);
    else if (n == 0)
        printf("no jobs yet: submit one with 'kiln submit FILE' (examples/ has some)\n");
    else
        cli_table_print(t);
    cli_table_destroy(t);
    state_jobs_free(jobs, n);
    state_close(st);
    return CLI_EXIT_OK;
}

static int parse_count(const char *s, const char *what, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end != '\0' || v < 0 || v > max)
        return kiln_errf(KILN_EINVAL, "%s: expected an integer from 0 to %ld, got \"%s\"", what,
                         max, s);
    *out = v;
    return 0;
}

int cmd_runs(cli_t *cli)
{
    const char *job = cli_opt(cli, "job"), *state_s = cli_opt(cli, "state");
    const char *limit_s = cli_opt(cli, "limit");
    long limit = 50;
    if (limit_s != NULL && parse_count(limit_s, "--limit", 1000000000L, &limit) < 0)
        return cli_fail(KILN_EINVAL, NULL);
    state_run_state_t want = STATE_RUN_QUEUED;
    if (state_s != NULL && state_run_state_parse(state_s, &want) < 0)
        return cli_fail(KILN_EINVAL, NULL);

    state_t *st = NULL;
    int rc = state_open(cli->db_path, &st);
    if (rc < 0)
        return cli_fail(rc, NULL);
    int exit_code = CLI_EXIT_OK;
    state_job_t j;
    if (job != NULL) {
        rc = state_job_get(st, job, &j);
        if (rc < 0) {
            exit_code = cli_fail(rc, "no job named '%s' (see 'kiln jobs')", job);
            goto out;
        }
        state_job_fini(&j);
    }
    state_run_t *runs = NULL;
    size_t n = 0;
    rc = state_run_list(st, job, state_s ? 0 : (int)limit, &runs, &n);
    if (rc < 0) {
        exit_code = cli_fail(rc, NULL);
        goto out;
    }
    if (state_s != NULL) { /* filter in place, keeping newest-first order */
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (runs[i].state == want && (limit == 0 || k < (size_t)limit)) {
                state_run_t tmp = runs[k];
                runs[k] = runs[i];
                runs[i] = tmp;
                k++;
            }
        }
        for (size_t i = k; i < n; i++)
            state_run_fini(&runs[i]);
        n = k;
    }
    if (n == 0 && !cli->json)
        printf("no runs%s%s\n", job ? " of job " : "", job ? job : "");
    else
        print_runs(cli, st, runs, n);
    state_runs_free(runs, n);
out:
    state_close(st);
    return exit_code;
}

/* The endpoints that pushes of run_id went to, each with its label's online
 * A/B figures read now from its kiln-serve (ops_online.c): appended to arr
 * as {url, model, label, online}, or printed when arr is NULL. */
static void show_online(state_t *st, int64_t run_id, json_t *arr)
{
    state_push_filter_t pf = {.run_id = run_id};
    state_push_t *ps = NULL;
    state_endpoint_info_t *es = NULL;
    size_t np = 0, n = 0, k = 0;
    if (state_push_list(st, &pf, 100, &ps, &np) == 0 && np > 0 &&
        state_endpoint_list(st, &es, &n) == 0) {
        for (size_t i = 0; i < n; i++) { /* the pushed endpoints first, in order */
            bool pushed = false;
            for (size_t j = 0; j < np && !pushed; j++)
                pushed = ps[j].endpoint_id == es[i].id;
            if (pushed) {
                state_endpoint_info_t t = es[k];
                es[k++] = es[i];
                es[i] = t;
            }
        }
    }
    ops_online_t *on = ops_online_read(es, k, OPS_ONLINE_TIMEOUT_MS);
    if (arr == NULL && k > 0)
        printf("online A/B (read now; every row each label served):\n");
    for (size_t i = 0; i < k; i++) {
        const ops_online_t *o = ops_online_at(on, i);
        char line[600];
        ops_online_describe(o, line, sizeof line);
        if (arr != NULL)
            json_array_append_new(arr, json_pack("{s:s, s:s, s:s, s:o}", "url", es[i].url, "model",
                                                 es[i].model, "label", es[i].label, "online",
                                                 ops_online_json(o)));
        else
            printf("  %s (%s/%s): %s\n", es[i].url, es[i].model, es[i].label, line);
    }
    free(on);
    state_endpoint_infos_free(es, n);
    state_pushes_free(ps, np);
}

static int show_run(cli_t *cli, state_t *st, int64_t id)
{
    state_run_t r;
    int rc = state_run_get(st, id, &r);
    if (rc == KILN_ENOENT)
        return cli_fail(rc, "no run %" PRId64 " (see 'kiln runs')", id);
    if (rc < 0)
        return cli_fail(rc, NULL);
    state_event_t *ev = NULL;
    size_t nev = 0;
    if (state_event_list(st, r.job_id, r.id, &ev, &nev) < 0)
        nev = 0;
    if (cli->json) {
        json_t *o = run_json(st, &r);
        json_t *arr = json_array();
        for (size_t i = 0; i < nev; i++)
            json_array_append_new(arr, json_pack("{s:o, s:s, s:s}", "at", kiln_json_time(ev[i].at),
                                                 "kind", ev[i].kind, "message", ev[i].message));
        json_object_set_new(o, "events", arr);
        json_t *online = json_array();
        show_online(st, r.id, online);
        json_object_set_new(o, "online", online);
        cli_print_json(o);
    } else {
        char b1[KILN_ISO_LEN], dur[32];
        run_duration(&r, dur, sizeof dur);
        printf("run %" PRId64 " of job %s (version %d)\n", r.id, r.job_name, r.job_version);
        printf("  state       %s%s\n", state_run_state_name(r.state),
               r.cancel_requested && !state_run_state_terminal(r.state) ? " (cancel requested)"
                                                                         : "");
        printf("  trigger     %s, attempt %d", state_trigger_name(r.trigger), r.attempt);
        if (r.retry_of)
            printf(" (retry of run %" PRId64 ")", r.retry_of);
        printf("\n");
        if (r.scheduled_at)
            printf("  scheduled   %s\n", cli_time(r.scheduled_at, b1, sizeof b1));
        printf("  queued      %s\n", cli_time(r.queued_at, b1, sizeof b1));
        printf("  started     %s\n", cli_time(r.started_at, b1, sizeof b1));
        printf("  ended       %s\n", cli_time(r.ended_at, b1, sizeof b1));
        printf("  duration    %s\n", dur);
        if (state_run_state_terminal(r.state) && r.exit_code >= 0)
            printf("  exit        %d\n", r.exit_code);
        if (r.error)
            printf("  error       %s\n", r.error);
        if (r.run_dir)
            printf("  run dir     %s\n", r.run_dir);
        if (r.host)
            printf("  host        %s (process group %" PRId64 ")\n", r.host, r.pgid);
        state_push_filter_t pf = {.run_id = r.id};
        state_push_t *ps = NULL;
        size_t np = 0;
        if (state_push_list(st, &pf, 100, &ps, &np) == 0 && np > 0) {
            ops_push_foresee(st, ps, np);
            printf("pushes:\n");
            for (size_t i = np; i-- > 0;) {
                char status[64] = "";
                if (ps[i].http_status != 0)
                    snprintf(status, sizeof status, ", HTTP %d", ps[i].http_status);
                printf("  push %" PRId64 " of %s to %s (%s/%s): %s%s, %s%s%s\n", ps[i].id,
                       ps[i].checkpoint_uid, ps[i].url, ps[i].model, ps[i].label,
                       state_push_state_name(ps[i].state), status,
                       state_push_mode_name(&ps[i]), ps[i].error ? ": " : "",
                       ps[i].error ? ps[i].error : "");
            }
        }
        state_pushes_free(ps, np);
        show_online(st, r.id, NULL);
        if (nev) {
            printf("events:\n");
            for (size_t i = 0; i < nev; i++)
                printf("  %s  %-8s %s\n", cli_time(ev[i].at, b1, sizeof b1), ev[i].kind,
                       ev[i].message);
        }
    }
    state_events_free(ev, nev);
    state_run_fini(&r);
    return CLI_EXIT_OK;
}

static int show_job(cli_t *cli, state_t *st, const char *name)
{
    state_job_t j;
    int rc = state_job_get(st, name, &j);
    if (rc == KILN_ENOENT)
        return cli_fail(rc, "no job named '%s' (see 'kiln jobs')", name);
    if (rc < 0)
        return cli_fail(rc, NULL);
    const char *tz = j.schedule ? j.timezone : NULL;
    int64_t next = j.paused ? 0 : job_next_fire(j.schedule, tz, kiln_now_s());
    state_run_t *runs = NULL;
    size_t n = 0;
    if (state_run_list(st, j.name, 10, &runs, &n) < 0)
        n = 0;
    if (cli->json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(arr, run_json(st, &runs[i]));
        json_t *o = json_pack(
            "{s:I, s:s, s:i, s:s?, s:s?, s:i, s:b, s:s, s:o, s:o, s:o, s:s, "
            "s:o, s:o, s:I, s:o, s:s?}",
            "id", (json_int_t)j.id, "name", j.name, "version", j.version, "schedule", j.schedule,
            "timezone", tz, "priority", j.priority, "paused", j.paused, "spec_hash", j.spec_hash,
            "next_fire", kiln_json_time(next), "created_at", kiln_json_time(j.created_at),
            "updated_at", kiln_json_time(j.updated_at), "spec", j.spec_yaml, "runs", arr,
            "deleted_at", kiln_json_time(j.deleted_at), "skipped_fires",
            (json_int_t)j.skipped_fires, "last_checked_at", kiln_json_time(j.last_checked_at),
            "last_skip_reason", j.last_skip_reason);
        cli_print_json(o);
    } else {
        char b1[KILN_ISO_LEN];
        printf("job %s (version %d, spec %s)\n", j.name, j.version, j.spec_hash);
        printf("  schedule    %s\n", j.schedule ? j.schedule : "(one-off)");
        if (j.schedule)
            printf("  next fire   %s%s\n", j.paused ? "paused" : cli_time(next, b1, sizeof b1),
                   tz && !j.paused ? (strcmp(tz, "UTC") ? " (UTC; schedule in zone)" : "") : "");
        printf("  priority    %d\n", j.priority);
        if (j.deleted_at > 0)
            printf("  deleted     %s\n", cli_time(j.deleted_at, b1, sizeof b1));
        else if (j.paused)
            printf("  state       paused ('kiln resume %s')\n", j.name);
        if (j.skipped_fires > 0)
            printf("  skipped     %" PRId64 " fires, the last at %s: %s\n", j.skipped_fires,
                   cli_time(j.last_checked_at, b1, sizeof b1),
                   j.last_skip_reason ? j.last_skip_reason : "-");
        printf("  created     %s\n", cli_time(j.created_at, b1, sizeof b1));
        printf("  updated     %s\n", cli_time(j.updated_at, b1, sizeof b1));
        printf("spec:\n");
        const char *p = j.spec_yaml;
        while (*p) {
            size_t l = strcspn(p, "\n");
            printf("  | %.*s\n", (int)l, p);
            p += l + (p[l] == '\n');
        }
        if (n) {
            printf("latest runs:\n");
            print_runs(cli, st, runs, n);
        } else {
            printf("no runs yet\n");
        }
    }
    state_runs_free(runs, n);
    state_job_fini(&j);
    return CLI_EXIT_OK;
}

int cmd_show(cli_t *cli)
{
    state_t *st = NULL;
    int rc = state_open(cli->db_path, &st);
    if (rc < 0)
        return cli_fail(rc, NULL);
    const char *what = cli->pos[0];
    int e = cli_is_run_number(what) ? show_run(cli, st, strtoll(what, NULL, 10))
                                    : show_job(cli, st, what);
    state_close(st);
    return e;
}

int cmd_cancel(cli_t *cli)
{
    int64_t id = 0;
    int e = cli_run_number(cli, "cancel", &id);
    if (e != CLI_EXIT_OK)
        return e;
    state_t *st = NULL;
    int rc = state_open(cli->db_path, &st);
    if (rc < 0)
        return cli_fail(rc, NULL);
    bool done = false;
    int exit_code = CLI_EXIT_OK;
    rc = ops_cancel(st, id, &done);
    if (rc == KILN_ENOENT) {
        exit_code = cli_fail(rc, "no run %" PRId64 " (see 'kiln runs')", id);
    } else if (rc < 0) {
        exit_code = cli_fail(rc, NULL);
    } else if (cli->json) {
        cli_print_json(json_pack("{s:I, s:s}", "run", (json_int_t)id, "result",
                                 done ? "canceled" : "cancel_requested"));
    } else if (done) {
        printf("canceled run %" PRId64 " (it had not started)\n", id);
    } else {
        printf("cancel requested for run %" PRId64 ": kilnd sends SIGTERM to its process group, "
               "then SIGKILL after the grace period\n",
               id);
    }
    state_close(st);
    return exit_code;
}

/* ---- pause, resume, delete ------------------------------------------------------------ */

typedef enum { CONTROL_PAUSE, CONTROL_RESUME, CONTROL_DELETE } control_t;

/* What the three commands share: the job by name (a deleted one is not
 * found), the operation, its report. */
static int job_control(cli_t *cli, control_t op)
{
    static const char *const verbs[] = {"paused", "resumed", "deleted"};
    const char *name = cli->pos[0];
    state_t *st = NULL;
    state_job_t j = {0};
    int rc = state_open(cli->db_path, &st);
    if (rc < 0)
        return cli_fail(rc, NULL);
    int exit_code = CLI_EXIT_OK, stopped = 0;
    bool changed = true;
    rc = state_job_get(st, name, &j);
    if (rc == 0 && j.deleted_at > 0)
        rc = KILN_ENOENT;
    if (rc == KILN_ENOENT) {
        exit_code = cli_fail(rc, "no job named '%s' (see 'kiln jobs')", name);
        goto out;
    }
    if (rc == 0)
        rc = op == CONTROL_DELETE ? ops_job_delete(st, j.id, cli_opt(cli, "cancel") != NULL, &stopped)
                                  : ops_job_pause(st, j.id, op == CONTROL_PAUSE, &changed);
    if (rc < 0) {
        exit_code = cli_fail(rc, NULL);
        goto out;
    }
    if (cli->json) {
        cli_print_json(json_pack("{s:s, s:I, s:s, s:b, s:i}", "job", j.name, "job_id",
                                 (json_int_t)j.id, "result", verbs[op], "changed", changed,
                                 "runs_stopped", stopped));
    } else if (!changed) {
        printf("job %s was %s already\n", j.name, verbs[op]);
    } else if (op == CONTROL_DELETE) {
        printf("deleted job %s", j.name);
        if (stopped > 0)
            printf(" (%d run%s canceled or asked to stop)", stopped, stopped == 1 ? "" : "s");
        printf("; its runs, checkpoints and lineage stay\n");
    } else {
        printf("%s job %s%s\n", verbs[op], j.name,
               op == CONTROL_PAUSE ? ": its fires are not run until 'kiln resume'"
                                   : ": missed fires follow its catchup policy");
    }
out:
    state_job_fini(&j);
    state_close(st);
    return exit_code;
}

int cmd_pause(cli_t *cli)
{
    return job_control(cli, CONTROL_PAUSE);
}

int cmd_resume(cli_t *cli)
{
    return job_control(cli, CONTROL_RESUME);
}

int cmd_delete(cli_t *cli)
{
    return job_control(cli, CONTROL_DELETE);
}
