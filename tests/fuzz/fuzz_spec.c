/*
 * tests/fuzz/fuzz_spec.c - libFuzzer harness for the job-spec parser: any
 * bytes in, either a valid spec or diagnostics that each name the file,
 * line and column; never a crash, a leak or an unbounded loop.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jobs.h"
#include "kiln.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    job_spec_t spec;
    job_diags_t diags;
    job_diags_init(&diags);
    int rc = job_spec_parse((const char *)data, size, "fuzz.yaml", &spec, &diags);
    if (rc == 0) {
        if (diags.n != 0 || spec.name == NULL || spec.model.ntables < 1)
            abort();
        job_spec_fini(&spec);
    } else if (rc == KILN_ESPEC) {
        if (diags.n == 0)
            abort();
        for (size_t i = 0; i < diags.n; i++)
            if (strncmp(diags.items[i].message, "fuzz.yaml:", 10) != 0)
                abort();
    }
    job_diags_fini(&diags);
    return 0;
}
