/*
 * tests/support/serve_fixture.h - in-process pieces of kiln-serve's tests:
 * a tiny lr model version as a memory source, and a source that injects a
 * fault (kills the endpoint, say) part way through a push. Part of
 * kiln_testsupport.
 */
#ifndef KILN_TESTS_SERVE_FIXTURE_H
#define KILN_TESTS_SERVE_FIXTURE_H

#include <stdint.h>

#include "serve.h"

/* An lr model over 2 slots (one table "t0" of dim 1) as version uid: rows
 * keys[i] -> vals[i] for i < n, dense params all 0 but the first, dense0.
 * Returns 0 and the source in out, or a negative KILN_E* code. */
int fx_lr_version(const char *uid, int64_t n, const int64_t *keys, const float *vals,
                  float dense0, serve_memsrc_t **out /* OUT */);

/* Wraps inner (taken) so that fault(ud) runs just before the after-th
 * item is read: a fault injected in the middle of a push. Returns 0 or
 * KILN_ENOMEM (inner is then destroyed). */
int fx_fault_source(serve_source_t *inner, int after, void (*fault)(void *ud), void *ud,
                    serve_source_t **out /* OUT */);

#endif /* KILN_TESTS_SERVE_FIXTURE_H */
