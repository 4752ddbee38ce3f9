/*
 * web/web_req.c - what every handler (pages, API, metrics) reads from its
 * request and writes as its answer, beside the server (web.c) so that the
 * handlers never call back into the router.
 */
#include "web_int.h"

#include <errno.h>
#include <microhttpd.h>
#include <stdlib.h>

const char *web_arg(web_req_t *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
}

int web_arg_i64(web_req_t *r, const char *name, int64_t def, int64_t lo, int64_t hi,
                int64_t *out)
{
    const char *v = web_arg(r, name);
    *out = def;
    if (v == NULL || *v == '\0')
        return 0;
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi)
        return kiln_errf(KILN_EINVAL, "query argument %s must be a number from %lld to %lld", name,
                         (long long)lo, (long long)hi);
    *out = x;
    return 0;
}

int web_run_rc(const web_req_t *r, int rc)
{
    if (rc == KILN_ENOENT)
        return kiln_errf(KILN_ENOENT, "no run %lld", (long long)r->id);
    return rc;
}

int web_req_run(web_req_t *r, state_run_t *run)
{
    return web_run_rc(r, state_run_get(r->st, r->id, run));
}

int web_json_reply(web_req_t *r, json_t *doc)
{
    if (doc == NULL)
        return kiln_errf(KILN_ENOMEM, "out of memory building JSON");
    char *s = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    if (s == NULL)
        return kiln_errf(KILN_ENOMEM, "out of memory writing JSON");
    web_buf_puts(&r->out, s);
    web_buf_puts(&r->out, "\n");
    free(s);
    return 0;
}
