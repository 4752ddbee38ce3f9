/*
 * tests/fuzz/fuzz_tsv.c - libFuzzer harness for the Criteo TSV line parser:
 * any bytes are either a parsed row (label 0/1, finite non-negative dense
 * values, non-negative keys) or a reason; never a crash. The parser's paths
 * (data_tsv_paths: the byte loop, the portable vector path, AVX-512 where
 * the CPU has it) give the same row or the same reason.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data_int.h"

typedef struct {
    int rc;
    float label, dense[DATA_CRITEO_NDENSE];
    int64_t keys[DATA_CRITEO_NSLOTS];
    unsigned char has[DATA_CRITEO_NSLOTS];
    char why[256];
} parsed_t;

static void parse(const uint8_t *data, size_t size, int level, parsed_t *p)
{
    memset(p, 0, sizeof *p);
    data_tsv_paths(level);
    p->rc = data_tsv_parse_line((const char *)data, size, DATA_CRITEO_NDENSE, DATA_CRITEO_NSLOTS,
                                &p->label, p->dense, p->keys, p->has, p->why, sizeof p->why);
    data_tsv_paths(2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    parsed_t ref, other;
    parse(data, size, 0, &ref);
    for (int level = 1; level <= 2; level++) {
        parse(data, size, level, &other);
        if (other.rc != ref.rc || strcmp(other.why, ref.why) != 0)
            abort();
        if (ref.rc != 0)
            continue;
        if (other.label != ref.label || memcmp(other.dense, ref.dense, sizeof ref.dense) != 0 ||
            memcmp(other.has, ref.has, sizeof ref.has) != 0)
            abort();
        for (int s = 0; s < DATA_CRITEO_NSLOTS; s++)
            if (ref.has[s] && other.keys[s] != ref.keys[s])
                abort();
    }
    if (ref.rc != 0)
        return 0;
    if (ref.label != 0.0f && ref.label != 1.0f)
        abort();
    for (int i = 0; i < DATA_CRITEO_NDENSE; i++)
        if (!(ref.dense[i] >= 0.0f) || isinf(ref.dense[i]))
            abort();
    for (int s = 0; s < DATA_CRITEO_NSLOTS; s++)
        if (ref.has[s] && ref.keys[s] < 0)
            abort();
    return 0;
}
