/*
 * scheduler/kilnd.c - the `kilnd` program: parse the options, run the
 * scheduler until SIGTERM. `kiln daemon` runs the same sched_run().
 */
#include <stdio.h>
#include <stdlib.h>

#include "kiln.h"
#include "scheduler.h"

int main(int argc, char **argv)
{
    const char *level = getenv("KILN_LOG");
    kiln_log_level_t lv;
    if (level != NULL && kiln_log_level_parse(level, &lv) == 0)
        kiln_log_set_level(lv);
    if (kiln_version_flag(argc, argv, "kilnd"))
        return 0;
    sched_options_t o;
    sched_options_init(&o);
    int rc = sched_options_parse(argc, argv, 1, &o);
    if (rc == 1) {
        sched_usage(stdout, "kilnd");
        return 0;
    }
    if (rc < 0) {
        fprintf(stderr, "kilnd: %s\n", kiln_errmsg());
        return 2;
    }
    rc = sched_run(&o);
    if (rc < 0) {
        fprintf(stderr, "kilnd: %s\n", kiln_errmsg());
        return 1;
    }
    return 0;
}
