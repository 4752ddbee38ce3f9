/*
 * tools/cmd_data.c - the data commands of `kiln`: datagen (synthetic
 * Criteo-format data for tests, demos and benchmarks) and convert (TSV to
 * the compact kiln-bin format). The work is done by data/ (data.h).
 */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"
#include "data.h"
#include "jobs.h"

static int parse_i64(const char *s, const char *what, int64_t min, int64_t max, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end != '\0' || end == s || v < min || v > max)
        return kiln_errf(KILN_EINVAL, "%s: expected an integer from %" PRId64 " to %" PRId64
                                      ", got \"%s\"",
                         what, min, max, s);
    *out = v;
    return 0;
}

static int parse_num(const char *s, const char *what, double min, double max, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end != '\0' || end == s || !(v >= min && v <= max))
        return kiln_errf(KILN_EINVAL, "%s: expected a number from %g to %g, got \"%s\"", what,
                         min, max, s);
    *out = v;
    return 0;
}

int cmd_datagen(cli_t *cli)
{
    const char *rows_s = cli_opt(cli, "rows"), *out = cli_opt(cli, "out");
    const char *seed_s = cli_opt(cli, "seed"), *day_s = cli_opt(cli, "day");
    const char *zipf_s = cli_opt(cli, "zipf"), *vocab_s = cli_opt(cli, "vocab");
    const char *empty_s = cli_opt(cli, "empty"), *part_s = cli_opt(cli, "part");
    if (rows_s == NULL || out == NULL)
        return cli_fail(KILN_EUSAGE, "datagen needs --rows N and --out FILE");
    int64_t rows, seed = 42, day = 0, vocab = 0, part = 0;
    double zipf = 0.0, empty = 0.0, bayes = 0.0, ctr = 0.0;
    if (parse_i64(rows_s, "--rows", 0, INT64_C(1) << 40, &rows) < 0 ||
        (seed_s && parse_i64(seed_s, "--seed", 0, INT64_MAX, &seed) < 0) ||
        (day_s && parse_i64(day_s, "--day", 0, 1000000, &day) < 0) ||
        (zipf_s && parse_num(zipf_s, "--zipf", 0.0, 10.0, &zipf) < 0) ||
        (vocab_s && parse_i64(vocab_s, "--vocab", 1, 100000000, &vocab) < 0) ||
        (empty_s && parse_num(empty_s, "--empty", 0.0, 1.0, &empty) < 0) ||
        (part_s && parse_i64(part_s, "--part", 0, 1000000, &part) < 0))
        return cli_fail(KILN_EINVAL, NULL);
    if (kiln_mkdir_parent(out) < 0)
        return cli_fail(KILN_EIO, NULL);
    data_datagen_opts_t o = {.path = out,
                           .rows = rows,
                           .seed = (uint64_t)seed,
                           .day = (int)day,
                           .zipf_set = zipf_s != NULL,
                           .zipf = zipf,
                           .vocab = vocab,
                           .empty_set = empty_s != NULL,
                           .empty = empty,
                           .part = (int)part,
                           .bayes_logloss = &bayes,
                           .ctr = &ctr};
    int64_t t0 = kiln_mono_ns();
    int rc = data_datagen(&o);
    if (rc < 0)
        return cli_fail(rc, NULL);
    double secs = (double)(kiln_mono_ns() - t0) / 1e9;
    if (cli->json)
        cli_print_json(json_pack("{s:s, s:I, s:I, s:i, s:i, s:f, s:f, s:f}", "out", out, "rows",
                                 (json_int_t)rows, "seed", (json_int_t)seed, "day", (int)day,
                                 "part", (int)part, "ctr", ctr, "bayes_logloss", bayes,
                                 "seconds", secs));
    else
        printf("wrote %" PRId64 " rows to %s (seed %" PRId64 ", day %" PRId64 ", part %" PRId64
               ") in %.2f s; click rate %.4f, Bayes-optimal logloss %.5f\n",
               rows, out, seed, day, part, secs, ctr, bayes);
    return CLI_EXIT_OK;
}

/* convert --spec: the Parquet column mapping and dimensions of a job spec
 * (data.columns, data.dense_features, data.cat_slots) into cols / opts,
 * which borrow from spec. Returns 0 or a CLI exit code (told). */
static int convert_mapping(const char *path, job_spec_t *spec, data_columns_t *cols,
                           data_convert_opts_t *opts)
{
    job_diags_t diags;
    job_diags_init(&diags);
    int rc = job_spec_load(path, spec, &diags);
    size_t nprob = diags.n;
    for (size_t i = 0; i < diags.n; i++)
        cli_problem(diags.items[i].message); /* stderr, and --json's "problems" */
    job_diags_fini(&diags);
    if (rc == KILN_ESPEC)
        return cli_fail(rc, "%s: %zu problem%s; nothing was converted", path, nprob,
                        nprob == 1 ? "" : "s");
    if (rc < 0)
        return cli_fail(rc, NULL);
    if (spec->data.format != JOB_FMT_PARQUET)
        return cli_fail(KILN_EUSAGE, "--spec %s: data.format is %s; --spec gives the column "
                        "mapping of Parquet input (data.format: parquet)",
                        path, job_format_name(spec->data.format));
    static const data_dense_transform_t tfs[] = {[JOB_DENSE_AUTO] = DATA_DENSE_AUTO,
                                               [JOB_DENSE_LOG1P] = DATA_DENSE_LOG1P,
                                               [JOB_DENSE_NONE] = DATA_DENSE_NONE};
    const job_columns_t *m = &spec->data.columns;
    *cols = (data_columns_t){.label = m->label,
                           .dense = (const char *const *)m->dense,
                           .categorical = (const char *const *)m->categorical,
                           .dense_transform = tfs[m->dense_transform]};
    opts->ndense = spec->data.dense_features;
    opts->nslots = spec->data.cat_slots;
    return 0;
}

int cmd_convert(cli_t *cli)
{
    const char *out = cli_opt(cli, "out"), *spec_path = cli_opt(cli, "spec");
    if (out == NULL)
        return cli_fail(KILN_EUSAGE, "convert needs --out FILE");
    if (kiln_mkdir_parent(out) < 0)
        return cli_fail(KILN_EIO, NULL);
    data_reader_stats_t st;
    data_format_t fmt = DATA_FMT_TSV;
    int rc = data_format_detect(cli->pos[0], &fmt);
    if (rc < 0)
        return cli_fail(rc, NULL);
    job_spec_t spec;
    memset(&spec, 0, sizeof spec);
    data_columns_t cols = {0};
    data_convert_opts_t opts = {0};
    if (spec_path != NULL && (rc = convert_mapping(spec_path, &spec, &cols, &opts)) != 0)
        return rc;
    if (spec_path != NULL && fmt != DATA_FMT_PARQUET) {
        job_spec_fini(&spec);
        return cli_fail(KILN_EUSAGE, "--spec maps Parquet columns, but %s is not a Parquet file",
                        cli->pos[0]);
    }
    /* Parquet inputs (told by PAR1 at the start) are read with the spec's
     * data.columns, or Criteo's names (label, I1..I13, C1..C26):
     * docs/data-formats.md. */
    if (fmt == DATA_FMT_PARQUET)
        rc = data_convert_parquet_to_bin(cli->pos, cli->npos, spec_path ? &cols : NULL, out,
                                       &opts, &st);
    else
        rc = data_convert_tsv_to_bin(cli->pos, cli->npos, out, NULL, &st);
    job_spec_fini(&spec);
    if (rc < 0)
        return cli_fail(rc, NULL);
    for (int i = 0; i < st.nmessages; i++)
        fprintf(stderr, "kiln: skipped malformed line %s\n", st.messages[i]);
    if (st.malformed > st.nmessages)
        fprintf(stderr, "kiln: skipped %" PRId64 " more malformed lines\n",
                st.malformed - st.nmessages);
    if (cli->json)
        cli_print_json(json_pack("{s:s, s:I, s:I}", "out", out, "rows", (json_int_t)st.rows,
                                 "malformed", (json_int_t)st.malformed));
    else
        printf("wrote %" PRId64 " rows to %s (%" PRId64 " malformed lines skipped)\n", st.rows,
               out, st.malformed);
    return CLI_EXIT_OK;
}
