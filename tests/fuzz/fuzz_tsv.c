/*
 * tests/fuzz/fuzz_tsv.c - libFuzzer harness for the Criteo TSV line parser:
 * any bytes are either a parsed row (label 0/1, finite non-negative dense
 * values, non-negative keys) or a reason; never a crash.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    float label, dense[DATA_CRITEO_NDENSE];
    int64_t keys[DATA_CRITEO_NSLOTS];
    unsigned char has[DATA_CRITEO_NSLOTS];
    char why[256];
    if (data_tsv_parse_line((const char *)data, size, DATA_CRITEO_NDENSE, DATA_CRITEO_NSLOTS, &label,
                          dense, keys, has, why, sizeof why) != 0)
        return 0;
    if (label != 0.0f && label != 1.0f)
        abort();
    for (int i = 0; i < DATA_CRITEO_NDENSE; i++)
        if (!(dense[i] >= 0.0f) || isinf(dense[i]))
            abort();
    for (int s = 0; s < DATA_CRITEO_NSLOTS; s++)
        if (has[s] && keys[s] < 0)
            abort();
    return 0;
}
