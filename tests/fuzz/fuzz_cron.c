/*
 * tests/fuzz/fuzz_cron.c - libFuzzer harness for cron expressions: parsing
 * never crashes, and an accepted expression yields strictly increasing fire
 * times (or says there is none).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jobs.h"
#include "kiln.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char expr[256];
    if (size >= sizeof expr)
        size = sizeof expr - 1;
    memcpy(expr, data, size);
    expr[size] = '\0';
    job_cron_t c;
    if (job_cron_parse(expr, &c) != 0)
        return 0;
    int64_t t = 1714608000; /* 2024-05-02T00:00:00Z */
    for (int i = 0; i < 8; i++) {
        int64_t next;
        if (job_cron_next(&c, t, &next) != 0)
            break;
        if (next <= t)
            abort();
        t = next;
    }
    return 0;
}
