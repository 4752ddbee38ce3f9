/*
 * tests/support/web_fixture.c - the database the web tests look at, built
 * through state/'s public API the way kilnd and kiln-train write it: two
 * jobs; a succeeded run with a run directory (log, progress.jsonl,
 * result.json), inputs, metrics, a full and an incremental checkpoint,
 * exports, pushes to an A and a B endpoint (one failed); a running run; a
 * queued run; a failed run whose error and input path carry HTML; and
 * the web server over it. Part of kiln_testsupport, used by test_web and
 * test_web_browser (tests/support/web_fixture.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "web_fixture.h"

#include "kiln.h"
#include "proc.h"
#include "state.h"

#define TRY(x)                                                                                     \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_ < 0) {                                                                             \
            fprintf(stderr, "fixture: %s: %s\n", #x, kiln_errmsg());                               \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static int write_file(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "w");
    if (fp == NULL)
        return -1;
    fputs(text, fp);
    fclose(fp);
    return 0;
}

static const char cron_spec[] = "name: ctr\nschedule: \"@hourly\"\n";
static const char oneoff_spec[] = "name: oneoff\n";

int web_fixture_build(const char *db, const char *dir, web_fixture_t *f)
{
    state_t *st = NULL;
    int ok = -1;
    char run_dir[400];
    TRY(state_open(db, &st));
    TRY(state_job_put(st, "ctr", cron_spec, "00000000000000c1", "@hourly", 0, &f->job_cron, NULL));
    TRY(state_job_put(st, "oneoff", oneoff_spec, "00000000000000c2", NULL, 0, &f->job_oneoff,
                      NULL));

    /* A succeeded run with everything a real run leaves. */
    TRY(state_run_create(st, f->job_cron, STATE_TRIGGER_CRON, 1714600800, 1, 0, &f->run_ok));
    snprintf(run_dir, sizeof run_dir, "%s/runs/%lld", dir, (long long)f->run_ok);
    TRY(kiln_mkdir_p(run_dir));
    TRY(state_run_transition(st, f->run_ok, STATE_RUN_QUEUED, STATE_RUN_LAUNCHING, 0, NULL));
    TRY(state_run_set_launch(st, f->run_ok, run_dir, 4242, "testhost"));
    TRY(state_run_transition(st, f->run_ok, STATE_RUN_LAUNCHING, STATE_RUN_RUNNING, 0, NULL));
    TRY(state_run_transition(st, f->run_ok, STATE_RUN_RUNNING, STATE_RUN_SUCCEEDED, 0, NULL));
    char line[256];
    char *progress = kiln_calloc(1, 64 * 256);
    if (progress == NULL)
        goto out;
    for (int s = 1; s <= 60; s++) {
        snprintf(line, sizeof line,
                 "{\"step\": %d, \"samples\": %d, \"loss\": %.4f, \"samples_per_s\": 50000.0, "
                 "\"seconds\": %.3f, \"time\": %d}\n",
                 s * 10, s * 10240, 0.7 - 0.25 * (1.0 - 1.0 / s), s * 0.2, 1714600900 + s);
        strcat(progress, line);
    }
    int wrc = write_file(run_dir, "progress.jsonl", progress);
    free(progress);
    TRY(wrc);
    TRY(write_file(run_dir, "result.json",
                   "{\"steps\": 600, \"samples_per_s\": 51234.5, \"eval_logloss\": 0.46125,"
                   " \"eval_auc\": 0.7311}\n"));
    TRY(write_file(run_dir, "log",
                   "rank 0: starting\nrank 1: starting\nstep 600 loss 0.4512\n"
                   "kiln-train: done <ok> & \"quoted\"\n"));
    state_input_t in = {(char *)"/data/day=0/part-0.tsv", 1000, 1714600000,
                        (char *)"0123456789abcdef"};
    TRY(state_input_add(st, f->run_ok, &in));
    state_checkpoint_t c = {.uid = (char *)"ck-0001",
                            .run_id = f->run_ok,
                            .kind = (char *)"full",
                            .path = (char *)"/ck/ctr/ck-0001",
                            .step = 300,
                            .keys = 5000,
                            .bytes = 1 << 20,
                            .checksum = (char *)"aa",
                            .created_at = 1714601000};
    TRY(state_checkpoint_add(st, &c, &f->ckpt_full));
    c.uid = (char *)"ck-0002";
    c.kind = (char *)"incremental";
    c.parent_id = f->ckpt_full;
    c.path = (char *)"/ck/ctr/ck-0002";
    c.step = 600;
    c.keys = 700;
    c.created_at = 1714601100;
    TRY(state_checkpoint_add(st, &c, &f->ckpt_incr));
    int64_t push;
    TRY(state_endpoint_put(st, "http://127.0.0.1:9001", "ctr", "A", &f->ep_a));
    TRY(state_endpoint_put(st, "http://127.0.0.1:9002", "ctr", "B", &f->ep_b));
    /* Pushes as a deliverer records them: queued claimed, then ended. */
    const struct {
        int64_t ckpt;
        const char *url, *label;
        bool ok;
    } pushes[] = {{f->ckpt_full, "http://127.0.0.1:9001", "A", true},
                  {f->ckpt_incr, "http://127.0.0.1:9001", "A", true},
                  {f->ckpt_full, "http://127.0.0.1:9002", "B", false}};
    for (size_t i = 0; i < sizeof pushes / sizeof pushes[0]; i++) {
        state_push_req_t req = {
            pushes[i].url, "ctr", pushes[i].label, pushes[i].ckpt, i == 0, "fixture", NULL, false};
        state_push_outcome_t o = {.state = pushes[i].ok ? STATE_PUSH_SUCCEEDED : STATE_PUSH_FAILED,
                                  .http_status = pushes[i].ok ? 200 : 503,
                                  .attempts = pushes[i].ok ? 1 : 3,
                                  .error = pushes[i].ok ? NULL : "endpoint busy",
                                  .sent = true,
                                  .full = i == 0,
                                  .bytes = 4096};
        TRY(state_push_enqueue(st, f->job_cron, f->run_ok, &req, 1, "fixture", 60000, &push));
        TRY(state_push_end(st, push, "fixture", &o));
    }

    /* A running run, a queued one, and a failed one with hostile text. */
    TRY(state_run_create(st, f->job_cron, STATE_TRIGGER_CRON, 1714604400, 1, 0, &f->run_running));
    TRY(state_run_transition(st, f->run_running, STATE_RUN_QUEUED, STATE_RUN_LAUNCHING, 0, NULL));
    TRY(state_run_transition(st, f->run_running, STATE_RUN_LAUNCHING, STATE_RUN_RUNNING, 0, NULL));
    TRY(state_metric_add(st, f->run_running, 10, "loss", 0.69));
    TRY(state_metric_add(st, f->run_running, 20, "loss", 0.61));
    TRY(state_run_create(st, f->job_oneoff, STATE_TRIGGER_MANUAL, 0, 1, 0, &f->run_failed));
    TRY(state_run_transition(st, f->run_failed, STATE_RUN_QUEUED, STATE_RUN_LAUNCHING, 0, NULL));
    TRY(state_run_transition(st, f->run_failed, STATE_RUN_LAUNCHING, STATE_RUN_FAILED, 3,
                             "rank 1 on <script>alert(1)</script> died & \"quit\""));
    state_input_t evil = {(char *)"/data/<b>\"x\"&'y'.tsv", 1, 1, NULL};
    TRY(state_input_add(st, f->run_failed, &evil));
    TRY(state_run_create(st, f->job_oneoff, STATE_TRIGGER_MANUAL, 0, 1, 0, &f->run_queued));
    ok = 0;
out:
    state_close(st);
    return ok;
}

int web_fixture_start(web_fixture_t *f, const char *name, web_config_t *cfg)
{
    memset(f, 0, sizeof *f);
    if (proc_tmpdir(name, f->dir, sizeof f->dir) < 0)
        return -1;
    snprintf(f->db, sizeof f->db, "%s/kiln.db", f->dir);
    if (web_fixture_build(f->db, f->dir, f) < 0)
        return -1;
    cfg->db_path = f->db;
    cfg->listen = "127.0.0.1:0";
    if (web_start(cfg, &f->server) < 0) {
        fprintf(stderr, "web_start: %s\n", kiln_errmsg());
        return -1;
    }
    snprintf(f->base, sizeof f->base, "http://127.0.0.1:%u", (unsigned)web_port(f->server));
    return 0;
}

void web_fixture_stop(web_fixture_t *f)
{
    web_stop(f->server);
    f->server = NULL;
    proc_tmpdir_done(f->dir);
}
