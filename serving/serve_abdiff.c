/*
 * serving/serve_abdiff.c - the comparison of two labels' online loglosses,
 * alone so that kiln-serve (serve_online.c, its /online comparisons) and
 * ops/ (push.promote_when, the endpoints page) compute the same figures.
 */
#include <math.h>

#include "serve.h"

void serve_logloss_diff(double ll, double var, int64_t n, double base_ll, double base_var,
                        int64_t base_n, double *diff, double *lo, double *hi)
{
    *diff = ll - base_ll;
    double se = sqrt(var / (double)n + base_var / (double)base_n);
    *lo = *diff - 1.959964 * se;
    *hi = *diff + 1.959964 * se;
}
