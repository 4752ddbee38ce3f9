/*
 * model/model_metrics.c - eval metrics over a set of predictions: exact
 * ROC AUC by sorting (ties get their average rank, the Mann-Whitney U form)
 * and mean logloss.
 */
#define MODEL_IMPL
#include "model.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    float score;
    float pos; /* 1 positive, 0 negative */
} scored_t;

static int cmp_score(const void *a, const void *b)
{
    float x = ((const scored_t *)a)->score, y = ((const scored_t *)b)->score;
    return (x > y) - (x < y);
}

int model_metrics_auc(const float *scores, const float *labels, size_t n, double *auc /* OUT */)
{
    *auc = NAN;
    scored_t *v = kiln_calloc(n ? n : 1, sizeof *v);
    if (!v)
        return kiln_errf(KILN_ENOMEM, "auc: out of memory sorting %zu predictions", n);
    double npos = 0.0;
    for (size_t i = 0; i < n; i++) {
        v[i].score = scores[i];
        v[i].pos = labels[i] > 0.5f ? 1.0f : 0.0f;
        npos += v[i].pos;
    }
    double nneg = (double)n - npos;
    if (npos > 0.0 && nneg > 0.0) {
        qsort(v, n, sizeof *v, cmp_score);
        /* Sum of the positives' ranks (1-based), a tie group sharing the mean
         * of its ranks. */
        double rank_sum = 0.0;
        size_t i = 0;
        while (i < n) {
            size_t j = i + 1;
            double pos = v[i].pos;
            while (j < n && v[j].score == v[i].score)
                pos += v[j++].pos;
            double mean_rank = 0.5 * ((double)(i + 1) + (double)j);
            rank_sum += pos * mean_rank;
            i = j;
        }
        *auc = (rank_sum - npos * (npos + 1.0) / 2.0) / (npos * nneg);
    }
    free(v);
    return 0;
}

double model_metrics_logloss(const float *probs, const float *labels, size_t n)
{
    if (n == 0)
        return 0.0;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        double p = probs[i];
        p = p < 1e-7 ? 1e-7 : p > 1.0 - 1e-7 ? 1.0 - 1e-7 : p;
        double y = labels[i];
        sum -= y * log(p) + (1.0 - y) * log(1.0 - p);
    }
    return sum / (double)n;
}
