/*
 * state/state_test.h - raw SQL against a Kiln database, for tests and
 * benchmarks only: building histories of a given shape in bulk (100k runs
 * for the web and scheduler benches), shifting times, filling the disk,
 * counting rows. Kiln's own code never uses it: everything it does goes
 * through state.h's typed calls and their one statement table.
 */
#ifndef KILN_STATE_STATE_TEST_H
#define KILN_STATE_STATE_TEST_H

#include <stdint.h>

#include "state.h"

/* Runs a fixed SQL script (no parameters). 0 or KILN_EDB. */
int state_test_exec(state_t *st, const char *sql);
/* Runs a fixed query and returns the first column of its first row (0 when
 * no row). 0 or KILN_EDB. */
int state_test_scalar(state_t *st, const char *sql, int64_t *out /* OUT */);

#endif /* KILN_STATE_STATE_TEST_H */
