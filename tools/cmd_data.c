/*
 * tools/cmd_data.c - the data commands of `kiln`: datagen (synthetic
 * Criteo-format data for tests, demos and benchmarks) and convert (TSV to
 * the compact kiln-bin format). The work is done by runtime/'s data library.
 */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"
#include "rt_data.h"

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

int cmd_datagen(cli_t *cli)
{
    const char *rows_s = cli_opt(cli, "rows"), *out = cli_opt(cli, "out");
    const char *seed_s = cli_opt(cli, "seed"), *day_s = cli_opt(cli, "day");
    if (rows_s == NULL || out == NULL)
        return cli_fail(KILN_EUSAGE, "datagen needs --rows N and --out FILE");
    int64_t rows, seed = 42, day = 0;
    if (parse_i64(rows_s, "--rows", 0, INT64_C(1) << 40, &rows) < 0 ||
        (seed_s && parse_i64(seed_s, "--seed", 0, INT64_MAX, &seed) < 0) ||
        (day_s && parse_i64(day_s, "--day", 0, 1000000, &day) < 0))
        return cli_fail(KILN_EINVAL, NULL);
    if (kiln_mkdir_parent(out) < 0)
        return cli_fail(KILN_EIO, NULL);
    rt_datagen_opts_t o = {.path = out, .rows = rows, .seed = (uint64_t)seed, .day = (int)day};
    int64_t t0 = kiln_mono_ns();
    int rc = rt_datagen(&o);
    if (rc < 0)
        return cli_fail(rc, NULL);
    double secs = (double)(kiln_mono_ns() - t0) / 1e9;
    if (cli->json)
        cli_print_json(json_pack("{s:s, s:I, s:I, s:i, s:f}", "out", out, "rows",
                                 (json_int_t)rows, "seed", (json_int_t)seed, "day", (int)day,
                                 "seconds", secs));
    else
        printf("wrote %" PRId64 " rows to %s (seed %" PRId64 ", day %" PRId64 ") in %.2f s\n",
               rows, out, seed, day, secs);
    return CLI_EXIT_OK;
}

int cmd_convert(cli_t *cli)
{
    const char *out = cli_opt(cli, "out");
    if (out == NULL)
        return cli_fail(KILN_EUSAGE, "convert needs --out FILE");
    if (kiln_mkdir_parent(out) < 0)
        return cli_fail(KILN_EIO, NULL);
    rt_reader_stats_t st;
    int rc = rt_convert_tsv_to_bin(cli->pos, cli->npos, out, NULL, &st);
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
