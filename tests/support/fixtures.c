/*
 * tests/support/fixtures.c - the real programs as test fixtures: kilnd,
 * kiln-serve, `kiln` commands, HTTP reads and landed data
 * (tests/support/fixtures.h).
 */
#include "fixtures.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <signal.h>
#include <stddef.h>
#include <strings.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln.h"
#include "ckpt.h"

#ifndef KILN_BIN
#error "KILN_BIN, KILND_BIN, KILN_TRAIN_BIN and KILN_SERVE_BIN must name the executables"
#endif

/* Every process a fixture started, for fx_stop_all. */
static pid_t fx_procs[FX_MAX_PROCS];

static void fx_track(pid_t pid)
{
    for (int i = 0; i < FX_MAX_PROCS; i++)
        if (fx_procs[i] == 0) {
            fx_procs[i] = pid;
            return;
        }
}

static void fx_untrack(pid_t pid)
{
    for (int i = 0; i < FX_MAX_PROCS; i++)
        if (fx_procs[i] == pid)
            fx_procs[i] = 0;
}

void fx_stop(pid_t pid, int sig)
{
    if (pid <= 0)
        return;
    kill(pid, sig);
    int st;
    for (int i = 0; i < 100; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid) {
            fx_untrack(pid);
            return;
        }
        proc_sleep_ms(100);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    fx_untrack(pid);
}

void fx_stop_all(void)
{
    for (int i = 0; i < FX_MAX_PROCS; i++)
        if (fx_procs[i] > 0)
            fx_stop(fx_procs[i], SIGKILL);
}

pid_t fx_spawn(const char *log, const char *const *env, const char *const *argv)
{
    pid_t pid = proc_spawn(log, env, argv);
    fx_track(pid);
    return pid;
}

/* ---- kilnd ------------------------------------------------------------------------- */

void fx_kilnd_start(fx_kilnd_t *k, const char *home, const char *const *env)
{
    char listen[64] = "";
    snprintf(k->home, sizeof k->home, "%s", home);
    snprintf(k->db, sizeof k->db, "%s/kiln.db", home);
    snprintf(k->log, sizeof k->log, "%s/kilnd.log", home);
    if (k->web_port > 0)
        snprintf(listen, sizeof listen, "127.0.0.1:%d", k->web_port);
    const char *argv[] = {KILND_BIN,   "--db",          k->db,     "--home",      k->home,
                          "--trainer", KILN_TRAIN_BIN,  "--grace", "1s",          "--poll",
                          "200ms",     "--stats-every", "1s",      "--max-ranks", "4",
                          "--listen",  listen,          NULL};
    const char *base[16] = {"KILN_TEST_TOKEN=" FX_TOKEN};
    size_t n = 1;
    for (size_t i = 0; env != NULL && env[i] != NULL && n + 1 < 16; i++)
        base[n++] = env[i];
    base[n] = NULL;
    k->pid = fx_spawn(k->log, base, argv);
}

void fx_kilnd_stop(fx_kilnd_t *k, int sig)
{
    fx_stop(k->pid, sig);
    k->pid = 0;
}

void fx_kiln(const fx_kilnd_t *k, proc_result_t *r, const char *const *args)
{
    const char *argv[32] = {KILN_BIN, "--db", k->db};
    size_t n = 3;
    for (size_t i = 0; args[i] != NULL && n + 1 < 32; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    const char *env[] = {"KILN_TEST_TOKEN=" FX_TOKEN, NULL};
    proc_run_env(r, k->home, env, argv);
}

void fx_kiln_ok(const fx_kilnd_t *k, const char *const *args)
{
    proc_result_t *r = calloc(1, sizeof *r);
    assert_non_null(r);
    fx_kiln(k, r, args);
    if (r->code != 0)
        fail_msg("kiln %s %s exited %d: %s%s", args[0], args[1] ? args[1] : "", r->code, r->err,
                 r->out);
    free(r);
}

state_t *fx_kilnd_db(const fx_kilnd_t *k)
{
    state_t *st = NULL;
    if (state_open(k->db, &st) < 0)
        fail_msg("cannot open %s: %s", k->db, kiln_errmsg());
    return st;
}

int fx_loop_data(const char *dir)
{
    static const struct {
        const char *name;
        int rows, day;
    } files[] = {{"day0.tsv", 1200, 0}, {"day1.tsv", 1200, 1}, {"eval.tsv", 400, 2}};
    char p[600];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i].name);
        if (fx_datagen(p, files[i].rows, 5, files[i].day) != 0)
            return -1;
    }
    return 0;
}

void fx_kill_leftovers(const char *tag)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "pkill -KILL -f 'kiln-test-%s-' >/dev/null 2>&1", tag);
    if (system(cmd) < 0) {
    }
}

fx_loop_t fx_loop;

int fx_loop_suite_setup(const char *tag)
{
    char name[64];
    fx_loop.tag = tag;
    snprintf(name, sizeof name, "%s-data", tag);
    if (proc_tmpdir(name, fx_loop.data_dir, sizeof fx_loop.data_dir) < 0)
        return -1;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    /* Open MPI's runtime leaves allocations LeakSanitizer cannot name. */
    proc_mpi_env(true);
    return fx_loop_data(fx_loop.data_dir);
}

int fx_loop_suite_teardown(void **state)
{
    (void)state;
    curl_global_cleanup();
    return proc_tmpdir_done(fx_loop.data_dir);
}

int fx_loop_test_setup(void **state)
{
    (void)state;
    memset(&fx_loop.kd, 0, sizeof fx_loop.kd);
    return proc_tmpdir(fx_loop.tag, fx_loop.home, sizeof fx_loop.home);
}

int fx_loop_test_teardown(void **state)
{
    (void)state;
    fx_stop_all();
    /* Runs still going (a test that failed half way) go with their session. */
    fx_kill_leftovers(fx_loop.tag);
    return proc_tmpdir_done(fx_loop.home);
}

void fx_loop_kiln_ok(const char *const *args)
{
    fx_kiln_ok(&fx_loop.kd, args);
}

state_t *fx_loop_db(void)
{
    return fx_kilnd_db(&fx_loop.kd);
}

int64_t fx_loop_newest_run(const char *job)
{
    state_t *st = fx_loop_db();
    state_run_t *rs = NULL;
    size_t n = 0;
    int64_t id = 0;
    if (state_run_list(st, job, 1, &rs, &n) == 0 && n > 0)
        id = rs[0].id;
    state_runs_free(rs, n);
    state_close(st);
    return id;
}

/* ---- kiln-serve ---------------------------------------------------------------------- */

bool fx_serve_start(fx_serve_t *s, const char *dir)
{
    return fx_serve_start_with(s, dir, NULL);
}

bool fx_serve_start_with(fx_serve_t *s, const char *dir, const char *const *extra)
{
    char portfile[480], listen[64], log[480], buf[32] = "";
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    snprintf(portfile, sizeof portfile, "%s.port", dir);
    snprintf(log, sizeof log, "%s.log", dir);
    unlink(portfile);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", s->port);
    const char *argv[24] = {KILN_SERVE_BIN, "--listen",        listen,        "--state-dir", dir,
                            "--token-env",  "KILN_TEST_TOKEN", "--port-file", portfile};
    size_t n = 9;
    for (size_t i = 0; extra != NULL && extra[i] != NULL && n + 1 < 24; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    const char *env[] = {"KILN_TEST_TOKEN=" FX_TOKEN, NULL};
    s->pid = fx_spawn(log, env, argv);
    for (int i = 0; i < 1000 && buf[0] == '\0'; i++) {
        proc_slurp(portfile, buf, sizeof buf);
        if (buf[0] == '\0')
            proc_sleep_ms(10);
    }
    if (buf[0] == '\0')
        return false;
    s->port = atoi(buf);
    snprintf(s->url, sizeof s->url, "http://127.0.0.1:%d", s->port);
    return true;
}

void fx_serve_stop(fx_serve_t *s, int sig)
{
    fx_stop(s->pid, sig);
    s->pid = 0;
}

/* ---- HTTP ------------------------------------------------------------------------------- */

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    fx_reply_t *r = ud;
    size_t add = size * n;
    char *nb = realloc(r->body, r->len + add + 1);
    if (nb == NULL)
        return 0;
    memcpy(nb + r->len, p, add);
    r->body = nb;
    r->len += add;
    r->body[r->len] = '\0';
    return add;
}

/* Keeps the headers the tests look at: Content-Type and Location. */
static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
    fx_reply_t *r = ud;
    size_t len = size * n;
    static const struct {
        const char *name;
        size_t off;
    } keep[] = {{"content-type:", offsetof(fx_reply_t, ctype)},
                {"location:", offsetof(fx_reply_t, location)}};
    for (size_t k = 0; k < sizeof keep / sizeof keep[0]; k++) {
        size_t kl = strlen(keep[k].name);
        if (len > kl && strncasecmp(p, keep[k].name, kl) == 0) {
            char *dst = (char *)r + keep[k].off;
            size_t vl = len - kl;
            const char *v = p + kl;
            while (vl > 0 && *v == ' ')
                v++, vl--;
            while (vl > 0 && (v[vl - 1] == '\r' || v[vl - 1] == '\n'))
                vl--;
            if (vl > 127)
                vl = 127;
            memcpy(dst, v, vl);
            dst[vl] = '\0';
        }
    }
    return len;
}

long fx_http(fx_reply_t *r, const char *method, const char *url, const char *const *headers,
             const void *body, size_t len, long timeout_s)
{
    memset(r, 0, sizeof *r);
    CURL *c = curl_easy_init();
    struct curl_slist *hs = NULL;
    for (int i = 0; headers != NULL && headers[i] != NULL; i++)
        hs = curl_slist_append(hs, headers[i]);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (strcmp(method, "HEAD") == 0)
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    if (body != NULL) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hs);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, timeout_s);
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    curl_slist_free_all(hs);
    curl_easy_cleanup(c);
    if (r->body == NULL)
        r->body = calloc(1, 1);
    return r->status;
}

void fx_reply_fini(fx_reply_t *r)
{
    free(r->body);
    r->body = NULL;
}

char *fx_get(const char *url)
{
    fx_reply_t r;
    if (fx_http(&r, "GET", url, NULL, NULL, 0, 10) != 200) {
        fx_reply_fini(&r);
        return NULL;
    }
    return r.body;
}

double fx_metric(const char *url, const char *prefix)
{
    char *b = fx_get(url);
    double v = -1;
    for (char *p = b; p != NULL && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, prefix, strlen(prefix)) == 0) {
            v = atof(p + strlen(prefix));
            break;
        }
    free(b);
    return v;
}

/* GET url as JSON (NULL when it does not answer 200 with JSON). */
json_t *fx_get_json(const char *url)
{
    char *body = fx_get(url);
    json_t *v = body != NULL ? json_loads(body, 0, NULL) : NULL;
    free(body);
    return v;
}

json_t *fx_train_result(const proc_result_t *r)
{
    if (r->code != 0)
        return NULL;
    json_t *v = json_loads(r->out, 0, NULL);
    if (v == NULL)
        fail_msg("kiln-train printed no JSON: %s / %s", r->out, r->err);
    return v;
}

void fx_holds(const fx_serve_t *s, const char *model, const char *label, char *out, size_t cap)
{
    char url[256];
    snprintf(url, sizeof url, "%s/v1/models/%s/versions/%s", s->url, model, label);
    json_t *v = fx_get_json(url);
    const char *uid = json_string_value(json_object_get(v, "checkpoint"));
    snprintf(out, cap, "%s", uid != NULL ? uid : "");
    json_decref(v);
}

int64_t fx_pushes_applied(const fx_serve_t *s)
{
    char url[256];
    snprintf(url, sizeof url, "%s/v1/stats", s->url);
    json_t *v = fx_get_json(url);
    int64_t n = json_integer_value(json_object_get(v, "pushes_applied"));
    json_decref(v);
    return n;
}

state_run_state_t fx_wait_run(state_t *st, int64_t id, state_run_state_t want, int timeout_s)
{
    state_run_state_t got = STATE_RUN_NSTATES;
    for (int i = 0; i < timeout_s * 10; i++) {
        state_run_t r;
        if (state_run_get(st, id, &r) == 0) {
            got = r.state;
            state_run_fini(&r);
            if (got == want || (want == STATE_RUN_NSTATES && state_run_state_terminal(got)))
                break;
        }
        proc_sleep_ms(100);
    }
    return got;
}

/* ---- files and data --------------------------------------------------------------- */

void fx_write(const char *path, const char *fmt, ...)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        fail_msg("cannot write %s", path);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    assert_int_equal(fclose(f), 0);
}

int fx_datagen(const char *path, int rows, int seed, int day)
{
    char r[32], s[32], d[32];
    snprintf(r, sizeof r, "%d", rows);
    snprintf(s, sizeof s, "%d", seed);
    snprintf(d, sizeof d, "%d", day);
    const char *argv[] = {KILN_BIN, "datagen", "--rows", r, "--out", path,
                          "--seed", s,         "--day",  d, NULL};
    proc_result_t *res = calloc(1, sizeof *res);
    char dir[480];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash != NULL)
        *slash = '\0';
    proc_run(res, dir, argv);
    int code = res->code;
    free(res);
    return code;
}

int fx_train_data(const char *dir, int rows, int eval_rows, int seed)
{
    char train[700], eval[700];
    snprintf(train, sizeof train, "%s/day=0.tsv", dir);
    snprintf(eval, sizeof eval, "%s/eval.tsv", dir);
    if (kiln_mkdir_p(dir) < 0)
        return -1;
    if (fx_datagen(train, rows, seed, 0) != 0 || fx_datagen(eval, eval_rows, seed, 1) != 0)
        return -1;
    return 0;
}

int fx_train_tmpdir(const char *name, char *dir, size_t cap, int rows, int eval_rows, int seed)
{
    char data[700];
    if (proc_tmpdir(name, dir, cap) < 0)
        return -1;
    snprintf(data, sizeof data, "%s/data", dir);
    return fx_train_data(data, rows, eval_rows, seed);
}

int fx_land(const char *src, const char *dst)
{
    char tmp[700], dir[600];
    snprintf(dir, sizeof dir, "%s", dst);
    char *slash = strrchr(dir, '/');
    if (slash != NULL) {
        *slash = '\0';
        char cmd[700];
        snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
        if (system(cmd) != 0)
            return -1;
    }
    snprintf(tmp, sizeof tmp, "%s/.landing-%d", dir, (int)getpid());
    FILE *in = fopen(src, "r"), *out = fopen(tmp, "w");
    char buf[1 << 16];
    size_t n;
    while (in && out && (n = fread(buf, 1, sizeof buf, in)) > 0)
        fwrite(buf, 1, n, out);
    int ok = in != NULL && out != NULL;
    if (in)
        fclose(in);
    if (out)
        fclose(out);
    return ok && rename(tmp, dst) == 0 ? 0 : -1;
}

int fx_losses(const char *run_dir, double *out, int cap)
{
    char path[700], line[512];
    snprintf(path, sizeof path, "%s/progress.jsonl", run_dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        fail_msg("cannot read %s", path);
    int n = 0;
    while (n < cap && fgets(line, sizeof line, f)) {
        json_t *v = json_loads(line, 0, NULL);
        assert_non_null(v);
        if (json_object_get(v, "loss") != NULL)
            out[n++] = json_number_value(json_object_get(v, "loss"));
        json_decref(v);
    }
    fclose(f);
    return n;
}

void fx_open_latest(const char *root, ckpt_chain_t *ch)
{
    char uid[CKPT_UID_MAX], dir[1200];
    if (ckpt_latest(root, uid) != 0)
        fail_msg("no checkpoint under %s: %s", root, kiln_errmsg());
    snprintf(dir, sizeof dir, "%s/%s", root, uid);
    if (ckpt_chain_open(dir, true, ch) != 0)
        fail_msg("cannot open checkpoint %s: %s", dir, kiln_errmsg());
}

void fx_ckpt_walk(const ckpt_chain_t *a, const ckpt_chain_t *b, fx_floats_fn cmp, void *ud,
                  int *ntables, int *narrays)
{
    const ckpt_info_t *ia = ckpt_info(a->items[a->n - 1]);
    const ckpt_info_t *ib = ckpt_info(b->items[b->n - 1]);
    assert_int_equal(ia->step, ib->step);
    assert_int_equal(ia->ntables, ib->ntables);
    for (int t = 0; t < ia->ntables; t++) {
        ckpt_rows_t x, y;
        const char *name = ia->tables[t].name;
        if (ckpt_read_table(a, name, &x) != 0 || ckpt_read_table(b, name, &y) != 0)
            fail_msg("table %s: %s", name, kiln_errmsg());
        /* Both resolved tables are sorted by key: the same key set means
         * the same arrays row for row. */
        assert_int_equal(x.n, y.n);
        assert_int_equal(x.dim, y.dim);
        assert_int_equal(x.nstate, y.nstate);
        assert_memory_equal(x.keys, y.keys, sizeof(int64_t) * (size_t)x.n);
        char what[160];
        size_t nv = (size_t)x.n * (size_t)x.dim;
        snprintf(what, sizeof what, "%s.values", name);
        cmp(ud, FX_ROWS, what, x.values, y.values, nv);
        if (x.nstate > 0) {
            assert_non_null(x.opt);
            assert_non_null(y.opt);
            snprintf(what, sizeof what, "%s.opt", name);
            cmp(ud, FX_ROWS_OPT, what, x.opt, y.opt, nv * (size_t)x.nstate);
        }
        assert_int_equal(x.opt_steps == NULL, y.opt_steps == NULL);
        if (x.opt_steps)
            assert_memory_equal(x.opt_steps, y.opt_steps, sizeof(uint32_t) * (size_t)x.n);
        ckpt_rows_fini(&x);
        ckpt_rows_fini(&y);
    }
    ckpt_array_t *da, *db;
    int na, nb;
    assert_int_equal(ckpt_read_dense(a->items[a->n - 1], &da, &na), 0);
    assert_int_equal(ckpt_read_dense(b->items[b->n - 1], &db, &nb), 0);
    assert_int_equal(na, nb);
    for (int i = 0; i < na; i++) {
        assert_string_equal(da[i].name, db[i].name);
        assert_int_equal(da[i].count, db[i].count);
        cmp(ud, FX_DENSE, da[i].name, da[i].data, db[i].data, da[i].count);
    }
    ckpt_arrays_free(da, na);
    ckpt_arrays_free(db, nb);
    if (ntables != NULL)
        *ntables = ia->ntables;
    if (narrays != NULL)
        *narrays = na;
}

bool fx_promtool_check(const char *dir, const char *name, const char *text, size_t len)
{
    char path[600], cmd[1400], out[4096];
    snprintf(path, sizeof path, "%s/%s.txt", dir, name);
    FILE *fp = fopen(path, "w");
    if (fp == NULL)
        fail_msg("cannot write %s", path);
    fwrite(text, 1, len, fp);
    fclose(fp);
    if (access("/usr/bin/promtool", X_OK) != 0) {
        fprintf(stderr, "promtool not installed (apt-get install prometheus); not parsed\n");
        return false;
    }
    snprintf(cmd, sizeof cmd, "/usr/bin/promtool check metrics < '%s' > '%s.out' 2>&1", path,
             path);
    int rc = system(cmd);
    snprintf(cmd, sizeof cmd, "%s.out", path);
    proc_slurp(cmd, out, sizeof out);
    if (rc != 0)
        fail_msg("promtool check metrics failed (%d) on %s:\n%s", rc, path, out);
    return true;
}
