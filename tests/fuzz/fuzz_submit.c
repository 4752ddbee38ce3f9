/*
 * tests/fuzz/fuzz_submit.c - libFuzzer harness for the web API's spec POST
 * path: web_act_submit (web/web_api.c), the handler behind POST /api/jobs,
 * called with the input as the request body (NUL-terminated, as web.c hands
 * it over) on a real SQLite database made once in a temp directory.
 *
 * Checked besides "no crash, no leak": the handler either answers JSON (201
 * with the job's name and id, and the database then holds exactly the
 * submitted bytes as that job's spec; or 400 with a non-empty list of
 * problems, nothing stored), or fails with a code that has a message for
 * the dispatcher to show.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kiln.h"
#include "state.h"
#include "web_int.h"

static state_t *st;

static void open_db(void)
{
    char root[64] = "/tmp/kiln-fuzz-submit-XXXXXX", db[128];
    if (mkdtemp(root) == NULL)
        abort();
    snprintf(db, sizeof db, "%s/kiln.db", root);
    if (state_open(db, &st) != 0) {
        fprintf(stderr, "fuzz_submit: %s\n", kiln_errmsg());
        abort();
    }
    kiln_log_set_level(KILN_LOG_OFF);
    /* The database lives until the process exits. */
}

/* A 201: the job named in the answer holds exactly the submitted bytes. */
static void check_created(json_t *doc, const char *body, size_t len)
{
    const char *name = json_string_value(json_object_get(doc, "job"));
    json_int_t id = json_integer_value(json_object_get(doc, "job_id"));
    if (name == NULL || id <= 0 || json_integer_value(json_object_get(doc, "version")) < 1)
        abort();
    state_job_t job;
    memset(&job, 0, sizeof job);
    if (state_job_get_by_id(st, id, &job) != 0 || strcmp(job.name, name) != 0 ||
        job.spec_yaml == NULL || strlen(job.spec_yaml) != len ||
        memcmp(job.spec_yaml, body, len) != 0) {
        fprintf(stderr, "fuzz_submit: job %lld does not hold the submitted spec\n",
                (long long)id);
        abort();
    }
    state_job_fini(&job);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (st == NULL)
        open_db();
    char *body = malloc(size + 1);
    if (body == NULL)
        return 0;
    memcpy(body, data, size);
    body[size] = '\0';
    web_req_t r = {.st = st, .kind = WEB_JSON, .status = 200, .body = body, .body_len = size};
    kiln_errclear();
    int rc = web_act_submit(&r);
    if (rc < 0) {
        const char *m = kiln_errmsg();
        if (m == NULL || m[0] == '\0' || strcmp(kiln_errname(rc), "KILN_E?") == 0)
            abort();
    } else {
        json_error_t err;
        json_t *doc = json_loadb(r.out.p ? r.out.p : "", r.out.len, 0, &err);
        if (doc == NULL)
            abort();
        if (r.status == 201) {
            check_created(doc, body, size);
        } else if (r.status == 400) {
            json_t *probs = json_object_get(doc, "problems");
            if (json_array_size(probs) == 0)
                abort();
            for (size_t i = 0; i < json_array_size(probs); i++) {
                const char *p = json_string_value(json_array_get(probs, i));
                if (p == NULL || p[0] == '\0')
                    abort();
            }
        } else {
            abort();
        }
        json_decref(doc);
    }
    web_buf_free(&r.out);
    free(r.location);
    free(body);
    return 0;
}
