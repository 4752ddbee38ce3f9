/*
 * tools/cmd_schedule.c - `kiln schedule next EXPR`: the next fire times of a
 * cron expression, so that a user can check a schedule before submitting it.
 */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs.h"
#include "kiln.h"

int cmd_schedule(cli_t *cli)
{
    if (strcmp(cli->pos[0], "next") != 0)
        return cli_fail(KILN_EUSAGE, "unknown schedule subcommand '%s' (expected: next)",
                        cli->pos[0]);
    const char *expr = cli->pos[1];
    const char *after_s = cli_opt(cli, "after"), *count_s = cli_opt(cli, "count");
    const char *tz = cli_opt(cli, "timezone");

    int64_t after = kiln_now_s();
    if (after_s != NULL && kiln_time_parse_iso(after_s, &after) < 0)
        return cli_fail(KILN_EINVAL, "--after: %s", kiln_errmsg());
    long count = 5;
    if (count_s != NULL) {
        char *end;
        errno = 0;
        count = strtol(count_s, &end, 10);
        if (errno || *end != '\0' || count < 1 || count > 10000)
            return cli_fail(KILN_EINVAL, "--count: expected an integer from 1 to 10000, got \"%s\"",
                            count_s);
    }
    job_cron_t c;
    if (job_cron_parse(expr, &c) < 0)
        return cli_fail(KILN_ECRON, "\"%s\": %s", expr, kiln_errmsg());
    if (tz != NULL && job_cron_set_timezone(&c, tz) < 0)
        return cli_fail(KILN_EINVAL, "--timezone: %s", kiln_errmsg());

    json_t *arr = cli->json ? json_array() : NULL;
    int64_t t = after;
    for (long i = 0; i < count; i++) {
        int64_t next;
        int rc = job_cron_next(&c, t, &next);
        if (rc < 0) {
            if (i == 0) {
                json_decref(arr);
                return cli_fail(rc, "\"%s\" never fires after the given time", expr);
            }
            break;
        }
        char buf[KILN_ISO_LEN];
        kiln_time_iso(next, buf, sizeof buf);
        if (arr)
            json_array_append_new(arr, json_string(buf));
        else
            printf("%s\n", buf);
        t = next;
    }
    if (arr)
        cli_print_json(arr);
    return CLI_EXIT_OK;
}
