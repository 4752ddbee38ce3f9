/*
 * tests/test_train.c - kiln-train end to end under real mpirun: 1 rank vs 2
 * and 3 ranks on the same global batches agree (eval loss, AUC and the
 * training loss curve within 1e-4 relative) for lr, fm and dlrm; the same
 * seed gives the same result; bad specs, missing data and malformed lines
 * are reported with the exit codes of docs/trainer.md.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proc.h"

#ifndef KILN_BIN
#error "KILN_BIN and KILN_TRAIN_BIN must name the executables"
#endif

static char tmpdir[256];

typedef proc_result_t result_t;

static void run(result_t *r, const char *const *argv) { proc_run(r, tmpdir, argv); }

static void write_spec(const char *name, const char *model, int batch, const char *extra,
                       char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s.yaml", tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "name: %s\n"
            "data: {train: \"data/day=*.tsv\", eval: \"data/eval.tsv\"}\n"
            "model:\n  type: %s\n  embedding: {dim: 8, capacity: 200000}\n%s"
            "train: {batch_size: %d, seed: 7, log_every: 1, init_from: none}\n",
            name, model, strcmp(model, "dlrm") == 0 ? "  bottom_mlp: [16, 8]\n  top_mlp: [16, 1]\n"
                                                    : "",
            batch);
    if (extra)
        fputs(extra, f);
    fclose(f);
}

/* Runs kiln-train on np ranks and returns its result JSON (or NULL). */
static json_t *train(int np, const char *spec, const char *run_name, result_t *r)
{
    char run_dir[400], nps[16];
    snprintf(run_dir, sizeof run_dir, "%s/%s", tmpdir, run_name);
    snprintf(nps, sizeof nps, "%d", np);
    const char *argv[] = {"mpirun", "-np", nps, "--oversubscribe", KILN_TRAIN_BIN,
                          "--spec", spec, "--run-dir", run_dir, "--quiet", "--threads", "1",
                          NULL};
    run(r, argv);
    if (r->code != 0)
        return NULL;
    json_error_t e;
    json_t *v = json_loads(r->out, 0, &e);
    if (v == NULL)
        fail_msg("kiln-train printed no JSON: %s / %s", r->out, r->err);
    return v;
}

static double num(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    assert_non_null(v);
    return json_number_value(v);
}

static void assert_close(double a, double b, double rel, const char *what)
{
    double scale = fmax(fabs(a), fabs(b));
    if (fabs(a - b) > rel * scale + 1e-12)
        fail_msg("%s: %.9g vs %.9g differ by more than %g relative", what, a, b, rel);
}

/* The training loss of each logged step, from progress.jsonl. */
static int losses(const char *run_name, double *out, int cap)
{
    char path[400], line[512];
    snprintf(path, sizeof path, "%s/%s/progress.jsonl", tmpdir, run_name);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int n = 0;
    while (n < cap && fgets(line, sizeof line, f)) {
        json_t *v = json_loads(line, 0, NULL);
        assert_non_null(v);
        out[n++] = json_number_value(json_object_get(v, "loss"));
        json_decref(v);
    }
    fclose(f);
    return n;
}

static int setup(void **state)
{
    (void)state;
    if (proc_tmpdir("train", tmpdir, sizeof tmpdir) < 0)
        return -1;
    char data[400], eval[400];
    snprintf(data, sizeof data, "%s/data/day=0.tsv", tmpdir);
    snprintf(eval, sizeof eval, "%s/data/eval.tsv", tmpdir);
    char dir[400];
    snprintf(dir, sizeof dir, "%s/data", tmpdir);
    if (mkdir(dir, 0755) < 0)
        return -1;
    result_t *r = malloc(sizeof *r);
    const char *g1[] = {KILN_BIN, "datagen", "--rows", "6000", "--out", data, "--seed", "3", NULL};
    run(r, g1);
    int rc = r->code;
    const char *g2[] = {KILN_BIN, "datagen", "--rows", "1500", "--out", eval, "--seed", "3",
                        "--day", "1", NULL};
    run(r, g2);
    rc |= r->code;
    free(r);
    return rc == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return proc_rmtree(tmpdir);
}

/* 1 rank with batch N*B and N ranks with batch B see the same global
 * batches, so they train the same model up to float summation order. */
static void check_ranks_agree(const char *model, int nranks)
{
    char spec1[400], specn[400], name1[64], namen[64];
    snprintf(name1, sizeof name1, "%s-1for%d", model, nranks);
    snprintf(namen, sizeof namen, "%s-%d", model, nranks);
    write_spec(name1, model, 240 * nranks, NULL, spec1, sizeof spec1);
    write_spec(namen, model, 240, NULL, specn, sizeof specn);
    result_t *r = malloc(sizeof *r);
    json_t *a = train(1, spec1, name1, r);
    if (a == NULL)
        fail_msg("1 rank failed (%d): %s", r->code, r->err);
    json_t *b = train(nranks, specn, namen, r);
    if (b == NULL)
        fail_msg("%d ranks failed (%d): %s", nranks, r->code, r->err);
    assert_int_equal((int)num(b, "ranks"), nranks);
    assert_int_equal((int)num(a, "rows"), 6000);
    assert_int_equal((int)num(b, "rows"), 6000);
    assert_int_equal((int)num(a, "steps"), (int)num(b, "steps"));
    assert_int_equal((int)num(a, "keys"), (int)num(b, "keys"));
    assert_int_equal((int)num(a, "eval_rows"), 1500);
    assert_close(num(a, "eval_logloss"), num(b, "eval_logloss"), 1e-4, "eval_logloss");
    assert_close(num(a, "eval_auc"), num(b, "eval_auc"), 1e-4, "eval_auc");
    double la[64], lb[64];
    int na = losses(name1, la, 64), nb = losses(namen, lb, 64);
    assert_int_equal(na, nb);
    assert_true(na >= 8);
    for (int i = 0; i < na; i++)
        assert_close(la[i], lb[i], 1e-4, "training loss");
    /* The model learned something: later losses are below the first. */
    assert_true(la[na - 1] < la[0]);
    json_decref(a);
    json_decref(b);
    free(r);
}

static void test_lr_1_vs_2(void **state)
{
    (void)state;
    check_ranks_agree("lr", 2);
}

static void test_fm_1_vs_2(void **state)
{
    (void)state;
    check_ranks_agree("fm", 2);
}

static void test_dlrm_1_vs_2(void **state)
{
    (void)state;
    check_ranks_agree("dlrm", 2);
}

static void test_dlrm_1_vs_3(void **state)
{
    (void)state;
    check_ranks_agree("dlrm", 3);
}

static void test_same_seed_same_result(void **state)
{
    (void)state;
    char spec[400];
    write_spec("det", "dlrm", 300, NULL, spec, sizeof spec);
    result_t *r = malloc(sizeof *r);
    json_t *a = train(2, spec, "det-a", r);
    assert_non_null(a);
    json_t *b = train(2, spec, "det-b", r);
    assert_non_null(b);
    assert_true(num(a, "eval_logloss") == num(b, "eval_logloss"));
    assert_true(num(a, "eval_auc") == num(b, "eval_auc"));
    double la[64], lb[64];
    int na = losses("det-a", la, 64), nb = losses("det-b", lb, 64);
    assert_int_equal(na, nb);
    assert_memory_equal(la, lb, sizeof(double) * (size_t)na);
    json_decref(a);
    json_decref(b);
    free(r);
}

static void test_bad_input(void **state)
{
    (void)state;
    result_t *r = malloc(sizeof *r);
    char spec[400], run_dir[400];
    snprintf(run_dir, sizeof run_dir, "%s/bad", tmpdir);
    /* A bad spec: exit 2, the file:line:col message. */
    snprintf(spec, sizeof spec, "%s/bad.yaml", tmpdir);
    FILE *f = fopen(spec, "w");
    fputs("name: bad\ndata: {train: x.tsv}\nmodel: {type: dlrn}\n", f);
    fclose(f);
    const char *a1[] = {"mpirun", "-np", "2", KILN_TRAIN_BIN, "--spec", spec, "--run-dir",
                        run_dir, NULL};
    run(r, a1);
    assert_int_equal(r->code, 2);
    assert_non_null(strstr(r->err, "bad.yaml:3:15: model.type: \"dlrn\" is not one of lr | fm | dlrm"));
    /* No data: exit 2 and the pattern in the message. */
    f = fopen(spec, "w");
    fputs("name: nodata\ndata: {train: \"nothing/*.tsv\"}\n", f);
    fclose(f);
    run(r, a1);
    assert_int_equal(r->code, 2);
    assert_non_null(strstr(r->err, "no file matches"));
    assert_non_null(strstr(r->err, "nothing/*.tsv"));
    /* Bad options: exit 2 before MPI starts. */
    const char *a2[] = {KILN_TRAIN_BIN, "--spec", spec, NULL};
    run(r, a2);
    assert_int_equal(r->code, 2);
    assert_non_null(strstr(r->err, "--run-dir"));
    free(r);
}

static void test_malformed_lines(void **state)
{
    (void)state;
    char path[400], spec[400];
    snprintf(path, sizeof path, "%s/mal.tsv", tmpdir);
    FILE *f = fopen(path, "w");
    /* Two good rows, then a short line, a bad label and a bad integer. */
    const char *good = "1\t1\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13"
                       "\ta\tb\tc\td\te\tf\tg\th\ti\tj\tk\tl\tm\tn\to\tp\tq\tr\ts\tt\tu\tv\tw\tx"
                       "\ty\tz\n";
    for (int i = 0; i < 40; i++)
        fputs(good, f);
    fputs("1\t2\t3\n", f);
    fprintf(f, "7%s", good + 1);
    fputs("0\tx1\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13"
          "\ta\tb\tc\td\te\tf\tg\th\ti\tj\tk\tl\tm\tn\to\tp\tq\tr\ts\tt\tu\tv\tw\tx\ty\tz\n",
          f);
    fclose(f);
    snprintf(spec, sizeof spec, "%s/mal.yaml", tmpdir);
    f = fopen(spec, "w");
    fputs("name: mal\ndata: {train: mal.tsv}\ntrain: {batch_size: 8}\n", f);
    fclose(f);
    result_t *r = malloc(sizeof *r);
    json_t *v = train(2, spec, "mal", r);
    if (v == NULL)
        fail_msg("exit %d: %s", r->code, r->err);
    assert_int_equal((int)num(v, "malformed"), 3);
    assert_int_equal((int)num(v, "rows"), 40);
    assert_non_null(strstr(r->err, "mal.tsv:41"));
    assert_non_null(strstr(r->err, "mal.tsv:42"));
    assert_non_null(strstr(r->err, "mal.tsv:43"));
    json_decref(v);
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lr_1_vs_2),   cmocka_unit_test(test_fm_1_vs_2),
        cmocka_unit_test(test_dlrm_1_vs_2), cmocka_unit_test(test_dlrm_1_vs_3),
        cmocka_unit_test(test_same_seed_same_result), cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_malformed_lines),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
