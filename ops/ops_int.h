/*
 * ops/ops_int.h - what ops/ shares between its own files and no other
 * module uses.
 */
#ifndef KILN_OPS_OPS_INT_H
#define KILN_OPS_OPS_INT_H

#include "ops.h"

/* ops_deliver (ops_deliver.c) for pushes all of one job whose current spec,
 * of version `version`, the caller has parsed already (spec, borrowed): the
 * spec is not parsed again, and when the pushes' runs trained with that
 * version it also describes their model (ops_push.c's kiln push). */
int ops_deliver_spec(state_t *st, const char *claimer, state_push_t *ps, size_t n,
                     const job_spec_t *spec, int version);

#endif
