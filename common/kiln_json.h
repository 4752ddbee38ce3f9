/*
 * common/kiln_json.h - the JSON values every JSON writer of Kiln (the web
 * API, lineage, the run records) spells the same way: times as ISO 8601 UTC
 * or null, numbers that may be NaN or infinite as null (JSON has neither),
 * strings that may be absent as null. Apart from kiln.h so that .cu files
 * and modules without jansson need not see jansson.h.
 */
#ifndef KILN_COMMON_KILN_JSON_H
#define KILN_COMMON_KILN_JSON_H

#include <stdint.h>

#include <jansson.h>

/* "2024-05-02T00:00:00Z", or null for t <= 0 (never). */
json_t *kiln_json_time(int64_t t);
/* A real, or null when v is not finite. */
json_t *kiln_json_num(double v);
/* A string, or null for NULL; bytes that are not UTF-8 read '?'
 * (kiln_utf8_scrub), so text is never dropped for a bad byte. */
json_t *kiln_json_str(const char *s);

#endif /* KILN_COMMON_KILN_JSON_H */
