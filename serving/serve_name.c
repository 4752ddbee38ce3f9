/*
 * serving/serve_name.c - the one rule for model names and labels. kiln-serve
 * makes them directory names (<state-dir>/models/<model>/<label>), so it
 * refuses any other; the job-spec parser applies the same rule at submit, so
 * that a push that kiln-serve would refuse is never accepted in a spec. It
 * depends on nothing but the standard library (library kiln_serve_name).
 */
#include <stdio.h>
#include <string.h>

#include "serve.h"

int serve_name_check(const char *name, char *why, size_t cap)
{
    const char *problem = NULL;
    size_t n = name ? strlen(name) : 0;
    char bad = '\0';
    if (n == 0)
        problem = "is empty";
    else if (n >= SERVE_NAME_MAX)
        problem = "is longer than 63 characters";
    else if (name[0] == '.')
        problem = "starts with '.'";
    for (size_t i = 0; problem == NULL && i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.')) {
            bad = c;
            problem = "has a character outside [A-Za-z0-9_.-]";
        }
    }
    if (problem == NULL)
        return 0;
    if (why != NULL && cap > 0) {
        if (bad >= 0x21 && bad < 0x7f)
            snprintf(why, cap, "'%.63s' %s ('%c'); a model name or label is 1-63 characters of "
                               "[A-Za-z0-9_.-], not starting with '.'",
                     name, problem, bad);
        else
            snprintf(why, cap, "'%.63s' %s; a model name or label is 1-63 characters of "
                               "[A-Za-z0-9_.-], not starting with '.'",
                     name ? name : "", problem);
    }
    return KILN_EINVAL;
}
