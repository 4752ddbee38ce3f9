/*
 * common/json.c - JSON values spelled one way (kiln_json.h).
 */
#include "kiln_json.h"

#include <math.h>

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
    return s != NULL ? json_string(s) : json_null();
}
