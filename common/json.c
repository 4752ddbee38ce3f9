/*
 * common/json.c - JSON values spelled one way (kiln_json.h).
 */
#include "kiln_json.h"

#include <math.h>
#include <stdlib.h>

#include "kiln.h"

json_t *kiln_json_time(int64_t t)
{
    if (t <= 0)
        return json_null();
    char buf[KILN_ISO_LEN];
    return json_string(kiln_time_iso(t, buf, sizeof buf));
}

json_t *kiln_json_num(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

json_t *kiln_json_str(const char *s)
{
    if (s == NULL)
        return json_null();
    json_t *j = json_string(s);
    if (j != NULL)
        return j;
    /* Not UTF-8 (a path's bytes, a quote cut mid-character): say it with
     * '?' for the bad bytes rather than drop the string. */
    char *copy = kiln_strdup(s);
    if (copy == NULL)
        return NULL;
    j = json_string(kiln_utf8_scrub(copy));
    free(copy);
    return j;
}
