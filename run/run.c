/*
 * run/run.c - the writers and readers of run/run.h: JSON records (jansson)
 * for progress lines, the result and the status, small text files for the
 * stop reason and pid files, all written atomically where a reader may look
 * at any moment (kiln_write_atomic), except progress.jsonl, which only
 * grows and whose reader skips a line that is not finished yet.
 */
#include "run.h"
#include "kiln_json.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln.h"

char *run_path(const char *run_dir, const char *name)
{
    return kiln_asprintf("%s/%s", run_dir, name);
}

bool run_exit_retryable(int exit_code, int signal)
{
    return exit_code == RUN_EXIT_RETRY || exit_code > 128 || signal != 0;
}

static double num_of(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static int64_t int_of(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v)
           : json_is_number(v) ? (int64_t)json_number_value(v)
                               : 0;
}

static void str_of(const json_t *o, const char *key, char *out, size_t cap)
{
    const char *v = json_string_value(json_object_get(o, key));
    snprintf(out, cap, "%s", v != NULL ? v : "");
}

/* Writes a JSON document atomically to run_dir/name. */
static int write_json(const char *run_dir, const char *name, json_t *doc)
{
    char *text = doc != NULL ? json_dumps(doc, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10))
                             : NULL;
    char *path = run_path(run_dir, name);
    int rc = text == NULL || path == NULL ? KILN_ENOMEM : 0;
    if (rc == 0) {
        size_t len = strlen(text);
        text[len] = '\n';
        rc = kiln_write_atomic(path, text, len + 1);
        text[len] = '\0';
    }
    free(text);
    free(path);
    json_decref(doc);
    return rc;
}

static int read_json(const char *run_dir, const char *name, json_t **out)
{
    char *path = run_path(run_dir, name);
    if (path == NULL)
        return KILN_ENOMEM;
    json_error_t e;
    *out = json_load_file(path, 0, &e);
    int rc = 0;
    if (*out == NULL)
        rc = access(path, F_OK) != 0 ? kiln_errf(KILN_ENOENT, "no %s", path)
                                     : kiln_errf(KILN_ECORRUPT, "%s: %s", path, e.text);
    else if (!json_is_object(*out))
        rc = kiln_errf(KILN_ECORRUPT, "%s is not a JSON object", path);
    free(path);
    if (rc < 0) {
        json_decref(*out);
        *out = NULL;
    }
    return rc;
}

/* ---- progress --------------------------------------------------------------------- */

int run_progress_write(FILE *f, const run_progress_t *p)
{
    json_t *o;
    if (p->kind == RUN_REC_STEP)
        o = json_pack("{s:I, s:I, s:o, s:o, s:f, s:I}", "step", (json_int_t)p->step, "samples",
                      (json_int_t)p->samples, RUN_FIG_LOSS, kiln_json_num(p->loss),
                      RUN_FIG_SAMPLES_PER_S, kiln_json_num(p->samples_per_s), "seconds", p->seconds,
                      "time", (json_int_t)p->time);
    else
        o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:f, s:b, s:I}", "checkpoint", p->checkpoint,
                      "kind", p->ckpt_kind, "step", (json_int_t)p->step, "keys",
                      (json_int_t)p->keys, "bytes", (json_int_t)p->bytes, "seconds",
                      p->ckpt_seconds, "online", p->online, "time", (json_int_t)p->time);
    char *text = o != NULL ? json_dumps(o, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(8)) : NULL;
    json_decref(o);
    if (text == NULL)
        return KILN_ENOMEM;
    int ok = fprintf(f, "%s\n", text) > 0 && fflush(f) == 0;
    free(text);
    return ok ? 0 : kiln_errf(KILN_EIO, "cannot append a progress record: %s", strerror(errno));
}

int run_progress_parse(const char *line, run_progress_t *out)
{
    memset(out, 0, sizeof *out);
    json_t *o = json_loads(line, JSON_DISABLE_EOF_CHECK, NULL);
    if (!json_is_object(o)) {
        json_decref(o);
        return kiln_errf(KILN_EINVAL, "not a progress record");
    }
    out->step = int_of(o, "step");
    out->time = int_of(o, "time");
    if (json_is_string(json_object_get(o, "checkpoint"))) {
        out->kind = RUN_REC_CHECKPOINT;
        str_of(o, "checkpoint", out->checkpoint, sizeof out->checkpoint);
        str_of(o, "kind", out->ckpt_kind, sizeof out->ckpt_kind);
        out->keys = int_of(o, "keys");
        out->bytes = int_of(o, "bytes");
        out->ckpt_seconds = num_of(o, "seconds");
        out->online = json_is_true(json_object_get(o, "online"));
    } else {
        out->kind = RUN_REC_STEP;
        out->samples = int_of(o, "samples");
        out->loss = num_of(o, RUN_FIG_LOSS);
        out->samples_per_s = num_of(o, RUN_FIG_SAMPLES_PER_S);
        out->seconds = num_of(o, "seconds");
    }
    json_decref(o);
    return 0;
}

/* ---- result -------------------------------------------------------------------------- */

int run_result_write(const char *run_dir, const run_result_t *r, FILE *out)
{
    json_t *o =
        json_pack("{s:s, s:s, s:I, s:i, s:i, s:I, s:f, s:f, s:I, s:o, s:o, s:I, s:I, s:o, s:s, "
                  "s:s, s:s, s:s}",
                  "job",
                  r->job, "model", r->model, "rows", (json_int_t)r->rows, "ranks", r->ranks,
                  "threads", r->threads, "steps", (json_int_t)r->steps, RUN_FIG_TRAIN_SECONDS,
                  r->train_seconds, RUN_FIG_SAMPLES_PER_S, r->samples_per_s, "eval_rows",
                  (json_int_t)r->eval_rows, RUN_FIG_EVAL_LOGLOSS, kiln_json_num(r->eval_logloss),
                  RUN_FIG_EVAL_AUC, kiln_json_num(r->eval_auc), "keys", (json_int_t)r->keys,
                  "malformed", (json_int_t)r->malformed, "checkpoint",
                  r->checkpoint[0] ? kiln_json_str(r->checkpoint) : json_null(), "dense_kernels",
                  r->dense_kernels, "dense_precision",
                  r->dense_precision[0] ? r->dense_precision : "fp32", "reader",
                  r->reader[0] ? r->reader : "thread", "openmp_wait",
                  r->openmp_wait[0] ? r->openmp_wait : "libgomp's default");
    const run_tables_t *t = &r->tables;
    json_t *tab = json_pack("{s:b, s:o, s:I, s:I, s:o, s:I, s:I, s:I, s:I, s:I, s:I}",
                            "tiered", t->tiered,
                            "disk_io", t->disk_io[0] ? json_string(t->disk_io) : json_null(),
                            "rows_ram", (json_int_t)t->rows_ram, "rows_disk",
                            (json_int_t)t->rows_disk, "ram_hit_rate", kiln_json_num(t->ram_hit_rate),
                            "disk_read_bytes", (json_int_t)t->disk_read_bytes,
                            "disk_written_bytes", (json_int_t)t->disk_written_bytes,
                            "disk_reads", (json_int_t)t->disk_reads,
                            "disk_writes", (json_int_t)t->disk_writes,
                            "rows_expired", (json_int_t)t->rows_expired,
                            "admit_rejected", (json_int_t)t->admit_rejected);
    if (o != NULL && (tab == NULL || json_object_set_new(o, "tables", tab) < 0)) {
        json_decref(o);
        o = NULL;
    }
    if (o == NULL)
        return KILN_ENOMEM;
    if (out != NULL) {
        char *text = json_dumps(o, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(8));
        if (text != NULL) {
            fprintf(out, "%s\n", text);
            fflush(out);
        }
        free(text);
    }
    return write_json(run_dir, RUN_FILE_RESULT, o);
}

int run_result_read(const char *run_dir, run_result_t *out)
{
    memset(out, 0, sizeof *out);
    json_t *o = NULL;
    KILN_CHECK(read_json(run_dir, RUN_FILE_RESULT, &o));
    str_of(o, "job", out->job, sizeof out->job);
    str_of(o, "model", out->model, sizeof out->model);
    str_of(o, "checkpoint", out->checkpoint, sizeof out->checkpoint);
    str_of(o, "dense_kernels", out->dense_kernels, sizeof out->dense_kernels);
    str_of(o, "dense_precision", out->dense_precision, sizeof out->dense_precision);
    str_of(o, "reader", out->reader, sizeof out->reader);
    str_of(o, "openmp_wait", out->openmp_wait, sizeof out->openmp_wait);
    out->rows = int_of(o, "rows");
    out->ranks = (int)int_of(o, "ranks");
    out->threads = (int)int_of(o, "threads");
    out->steps = int_of(o, "steps");
    out->train_seconds = num_of(o, RUN_FIG_TRAIN_SECONDS);
    out->samples_per_s = num_of(o, RUN_FIG_SAMPLES_PER_S);
    out->eval_rows = int_of(o, "eval_rows");
    out->eval_logloss = num_of(o, RUN_FIG_EVAL_LOGLOSS);
    out->eval_auc = num_of(o, RUN_FIG_EVAL_AUC);
    out->keys = int_of(o, "keys");
    out->malformed = int_of(o, "malformed");
    json_t *tab = json_object_get(o, "tables");
    out->tables = (run_tables_t){.tiered = json_is_true(json_object_get(tab, "tiered")),
                                 .rows_ram = int_of(tab, "rows_ram"),
                                 .rows_disk = int_of(tab, "rows_disk"),
                                 .ram_hit_rate = num_of(tab, "ram_hit_rate"),
                                 .disk_read_bytes = int_of(tab, "disk_read_bytes"),
                                 .disk_written_bytes = int_of(tab, "disk_written_bytes"),
                                 .disk_reads = int_of(tab, "disk_reads"),
                                 .disk_writes = int_of(tab, "disk_writes"),
                                 .rows_expired = int_of(tab, "rows_expired"),
                                 .admit_rejected = int_of(tab, "admit_rejected")};
    str_of(tab, "disk_io", out->tables.disk_io, sizeof out->tables.disk_io);
    json_decref(o);
    return 0;
}

/* ---- status ------------------------------------------------------------------------------ */

int run_status_write(const char *run_dir, const run_status_t *s)
{
    json_t *o = json_pack("{s:i, s:i, s:s, s:I, s:I}", "exit_code", s->exit_code, "signal",
                          s->signal, "stop", s->stop, "started_at", (json_int_t)s->started_at,
                          "ended_at", (json_int_t)s->ended_at);
    if (o != NULL && s->job_state[0] != '\0') {
        json_object_set_new(o, "job_id", json_integer(s->job_id));
        json_object_set_new(o, "job_state", json_string(s->job_state));
        json_object_set_new(o, "job_nodes", json_string(s->job_nodes));
        json_object_set_new(o, "job_reason", json_string(s->job_reason));
    }
    return write_json(run_dir, RUN_FILE_STATUS, o);
}

int run_status_read(const char *run_dir, run_status_t *out)
{
    memset(out, 0, sizeof *out);
    json_t *o = NULL;
    KILN_CHECK(read_json(run_dir, RUN_FILE_STATUS, &o));
    out->exit_code = (int)int_of(o, "exit_code");
    out->signal = (int)int_of(o, "signal");
    out->started_at = int_of(o, "started_at");
    out->ended_at = int_of(o, "ended_at");
    str_of(o, "stop", out->stop, sizeof out->stop);
    out->job_id = int_of(o, "job_id");
    str_of(o, "job_state", out->job_state, sizeof out->job_state);
    str_of(o, "job_nodes", out->job_nodes, sizeof out->job_nodes);
    str_of(o, "job_reason", out->job_reason, sizeof out->job_reason);
    json_decref(o);
    return 0;
}

/* ---- small text files ---------------------------------------------------------------------- */

int run_write_text(const char *run_dir, const char *name, const char *text)
{
    char *path = run_path(run_dir, name);
    int rc = path != NULL ? kiln_write_atomic(path, text, strlen(text)) : KILN_ENOMEM;
    free(path);
    return rc;
}

/* The first line of run_dir/name into out ("" when there is none). */
static int read_line(const char *run_dir, const char *name, char *out, size_t cap)
{
    char *path = run_path(run_dir, name);
    out[0] = '\0';
    if (path == NULL)
        return KILN_ENOMEM;
    FILE *f = fopen(path, "r");
    int rc = 0;
    if (f == NULL)
        rc = kiln_errf(KILN_ENOENT, "no %s", path);
    else if (fgets(out, (int)cap, f) == NULL)
        out[0] = '\0';
    if (f != NULL)
        fclose(f);
    out[strcspn(out, "\r\n")] = '\0';
    free(path);
    return rc;
}

int run_stop_write(const char *run_dir, const char *reason)
{
    return run_write_text(run_dir, RUN_FILE_STOP, reason);
}

void run_stop_read(const char *run_dir, char *out, size_t cap)
{
    if (read_line(run_dir, RUN_FILE_STOP, out, cap) < 0)
        out[0] = '\0';
}

int run_pidfile_write(const char *run_dir, const char *name, pid_t pid, uint64_t start_ticks)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%d %llu\n", (int)pid, (unsigned long long)start_ticks);
    return run_write_text(run_dir, name, buf);
}

int run_pidfile_read(const char *run_dir, const char *name, pid_t *pid, uint64_t *start_ticks)
{
    char line[64];
    KILN_CHECK(read_line(run_dir, name, line, sizeof line));
    int p = 0;
    unsigned long long s = 0;
    int got = sscanf(line, "%d %llu", &p, &s);
    if (got < 1 || p <= 0)
        return kiln_errf(KILN_ECORRUPT, "%s/%s does not hold 'PID START'", run_dir, name);
    *pid = p;
    *start_ticks = got == 2 ? s : 0;
    return 0;
}

/* ---- online exports ---------------------------------------------------------------------- */

int run_export_request(const char *run_dir)
{
    return run_write_text(run_dir, RUN_FILE_EXPORT_REQUEST, "export\n");
}

bool run_export_take_request(const char *run_dir)
{
    char *path = run_path(run_dir, RUN_FILE_EXPORT_REQUEST);
    bool yes = path != NULL && unlink(path) == 0;
    free(path);
    return yes;
}

int run_export_last_write(const char *run_dir, const run_export_t *e)
{
    return write_json(run_dir, RUN_FILE_EXPORT_LAST,
                      json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I}", "checkpoint",
                                e->checkpoint, "kind", e->kind, "parent", e->parent, "path",
                                e->path, "step", (json_int_t)e->step, "keys",
                                (json_int_t)e->keys, "bytes", (json_int_t)e->bytes, "time",
                                (json_int_t)e->time));
}
