/*
 * data/data_batch.c - batches and the batch builder: rows appended one at a
 * time (TSV) or a chunk at a time (kiln-bin) become the CSR layout that all
 * formats share (data.h, data_batch_t). Both readers use it, data_reader.c
 * for TSV (rows parsed into slot-major arrays, then moved a slot at a time) and
 * data_bin.c for kiln-bin; it uses neither. With `team` set, the moves
 * run a slot per OpenMP thread.
 */
#include "data_int.h"

#include <stdlib.h>
#include <string.h>

int data_batch_init(data_batch_t *b, int cap_rows, int ndense, int nslots)
{
    memset(b, 0, sizeof *b);
    b->ndense = ndense;
    b->nslots = nslots;
    b->cap_rows = cap_rows;
    b->labels = kiln_calloc((size_t)cap_rows + 1, sizeof(float));
    b->dense = kiln_calloc(((size_t)cap_rows + 1) * (size_t)(ndense ? ndense : 1), sizeof(float));
    b->offsets = kiln_calloc((size_t)(nslots ? nslots : 1) * ((size_t)cap_rows + 1),
                             sizeof(int64_t));
    b->keys_cap = (int64_t)(cap_rows + 1) * (nslots ? nslots : 1);
    b->keys = kiln_calloc((size_t)b->keys_cap, sizeof(int64_t));
    if (!b->labels || !b->dense || !b->offsets || !b->keys) {
        data_batch_fini(b);
        return KILN_ENOMEM;
    }
    return 0;
}

void data_batch_fini(data_batch_t *b)
{
    KILN_FREE_ALL(b->labels, b->dense, b->offsets, b->keys);
    memset(b, 0, sizeof *b);
}

int data_builder_init(data_batch_builder_t *bb, int cap_rows, int ndense, int nslots)
{
    size_t ns = (size_t)(nslots ? nslots : 1);
    memset(bb, 0, sizeof *bb);
    bb->cap_rows = cap_rows;
    bb->ndense = ndense;
    bb->nslots = nslots;
    bb->slot_len = kiln_calloc(ns, sizeof(int64_t));
    bb->slot_cap = kiln_calloc(ns, sizeof(int64_t));
    bb->slot_keys = kiln_calloc(ns, sizeof(int64_t *));
    bb->counts = kiln_calloc(ns * ((size_t)cap_rows + 1), sizeof(uint32_t));
    if (!bb->slot_len || !bb->slot_cap || !bb->slot_keys || !bb->counts) {
        data_builder_fini(bb);
        return KILN_ENOMEM;
    }
    for (int s = 0; s < nslots; s++) {
        int rc = data_builder_reserve(bb, s, cap_rows + 1);
        if (rc < 0) {
            data_builder_fini(bb);
            return rc;
        }
    }
    return 0;
}

void data_builder_fini(data_batch_builder_t *bb)
{
    for (int s = 0; bb->slot_keys && s < bb->nslots; s++)
        free(bb->slot_keys[s]);
    KILN_FREE_ALL(bb->slot_keys, bb->slot_len, bb->slot_cap, bb->counts);
    memset(bb, 0, sizeof *bb);
}

void data_builder_reset(data_batch_builder_t *bb)
{
    bb->n = 0;
    for (int s = 0; s < bb->nslots; s++)
        bb->slot_len[s] = 0;
}

int data_builder_reserve(data_batch_builder_t *bb, int s, int64_t more)
{
    return kiln_grow_to((void **)&bb->slot_keys[s], &bb->slot_cap[s], bb->slot_len[s] + more,
                        sizeof(int64_t), 1024);
}

int data_builder_add_row(data_batch_builder_t *bb, data_batch_t *b, float label, const float *dense,
                       const int64_t *keys, const unsigned char *has_key)
{
    const int i = bb->n, D = bb->ndense;
    b->labels[i] = label;
    memcpy(b->dense + (size_t)i * (size_t)D, dense, (size_t)D * sizeof(float));
    for (int s = 0; s < bb->nslots; s++) {
        uint32_t c = has_key[s] ? 1 : 0;
        bb->counts[(size_t)s * (size_t)bb->cap_rows + (size_t)i] = c;
        if (c) {
            if (bb->slot_len[s] == bb->slot_cap[s] && data_builder_reserve(bb, s, 1) < 0)
                return KILN_ENOMEM;
            bb->slot_keys[s][bb->slot_len[s]++] = keys[s];
        }
    }
    bb->n++;
    return 0;
}

/* Slot s's keys and counts of the rows not skipped: one run of each read,
 * one run written. */
static int add_slot(data_batch_builder_t *bb, const data_rows_t *rows, int s, int kept)
{
    const int i0 = bb->n;
    KILN_CHECK(data_builder_reserve(bb, s, kept));
    uint32_t *counts = bb->counts + (size_t)s * (size_t)bb->cap_rows + (size_t)i0;
    int64_t *dst = bb->slot_keys[s] + bb->slot_len[s];
    const int64_t *keys = rows->keys + (size_t)s * rows->stride;
    const unsigned char *has = rows->has + (size_t)s * rows->stride;
    int64_t len = 0;
    for (int i = 0, j = 0; i < rows->n; i++) {
        if (rows->skip[i])
            continue;
        const unsigned char h = has[i] != 0;
        counts[j++] = h;
        dst[len] = keys[i];
        len += h;
    }
    bb->slot_len[s] += len;
    return 0;
}

int data_builder_add_rows(data_batch_builder_t *bb, data_batch_t *b, const data_rows_t *rows)
{
    const int D = bb->ndense, S = bb->nslots, i0 = bb->n;
    int kept = 0;
    for (int i = 0; i < rows->n; i++) {
        if (rows->skip[i])
            continue;
        b->labels[i0 + kept] = rows->labels[i];
        memcpy(b->dense + (size_t)(i0 + kept) * (size_t)D, rows->dense + (size_t)i * (size_t)D,
               (size_t)D * sizeof(float));
        kept++;
    }
    int rc = 0;
#pragma omp parallel for schedule(dynamic, 1) if (bb->team) reduction(min : rc)
    for (int s = 0; s < S; s++) {
        int src = add_slot(bb, rows, s, kept);
        rc = src < rc ? src : rc;
    }
    if (rc < 0)
        return KILN_ENOMEM;
    bb->n += kept;
    return 0;
}

int data_builder_finish(data_batch_builder_t *bb, data_batch_t *b)
{
    const int n = bb->n, S = bb->nslots;
    int64_t total = 0;
    for (int s = 0; s < S; s++)
        total += bb->slot_len[s];
    if (total > b->keys_cap) {
        int64_t nc = b->keys_cap ? b->keys_cap : 1024;
        int64_t *nk;
        while (nc < total)
            nc *= 2;
        nk = kiln_reallocarray(b->keys, (size_t)nc, sizeof(int64_t));
        if (!nk)
            return KILN_ENOMEM;
        b->keys = nk;
        b->keys_cap = nc;
    }
    /* Slot s's keys start where the slots before it end. */
#pragma omp parallel for schedule(static) if (bb->team && S > 1)
    for (int s = 0; s < S; s++) {
        int64_t pos = 0;
        for (int q = 0; q < s; q++)
            pos += bb->slot_len[q];
        int64_t *o = b->offsets + (size_t)s * (size_t)(n + 1);
        const uint32_t *c = bb->counts + (size_t)s * (size_t)bb->cap_rows;
        o[0] = pos;
        for (int i = 0; i < n; i++)
            o[i + 1] = o[i] + c[i];
        memcpy(b->keys + pos, bb->slot_keys[s], (size_t)bb->slot_len[s] * sizeof(int64_t));
    }
    b->n = n;
    b->nkeys = total;
    return 0;
}

