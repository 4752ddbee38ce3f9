/*
 * tests/support/web_fixture.h - the database the web tests look at (two
 * jobs; runs succeeded, running, queued and failed with hostile text;
 * checkpoints, exports, pushes to an A and a B endpoint) and the web server
 * over it on an ephemeral loopback port. Part of kiln_testsupport, used by
 * test_web, test_web_browser and the HTTP fuzz harness.
 */
#ifndef KILN_TESTS_WEB_FIXTURE_H
#define KILN_TESTS_WEB_FIXTURE_H

#include <stdint.h>

#include "web.h"

typedef struct web_fixture {
    char dir[256], db[320]; /* the temp directory and its kiln.db */
    char base[64];          /* http://127.0.0.1:PORT of the server */
    web_t *server;
    /* The ids the tests refer to. */
    int64_t job_cron, job_oneoff;
    int64_t run_ok, run_running, run_queued, run_failed;
    int64_t ckpt_full, ckpt_incr;
    int64_t ep_a, ep_b;
} web_fixture_t;

/* Builds the fixture database at db, run directories under dir, into f's
 * ids (f's other fields are left alone). Returns 0 or -1 (the reason on
 * stderr). */
int web_fixture_build(const char *db, const char *dir, web_fixture_t *f);

/* Makes a temp directory /tmp/kiln-test-<name>-XXXXXX, builds the database
 * there and starts the web server on it with cfg (initialised by the caller;
 * its db_path and listen are set here). Returns 0 or -1. */
int web_fixture_start(web_fixture_t *f, const char *name, web_config_t *cfg);

/* Stops the server and removes the directory. */
void web_fixture_stop(web_fixture_t *f);

#endif /* KILN_TESTS_WEB_FIXTURE_H */
