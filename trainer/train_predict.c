/*
 * trainer/train_predict.c - prediction mode (--predict): load a checkpoint, predict every
 * row of the files, rank 0 writes one probability per row in file order.
 */
#include "train_int.h"

/* ---- prediction mode ------------------------------------------------------------------- */

/* Predicts every row of files with the loaded state, as train_evaluate() does, and
 * gathers the probabilities on rank 0 in file order: the reader deals rows
 * block-cyclically, so each rank tags its rows with their global index
 * (batch first_row + i) and rank 0 places them. probs_out (rank 0):
 * malloc'd (nrows). */
static int predict_rows(trainer_t *tr, char **files, int nfiles, float **probs_out,
                        int64_t *nrows)
{
    float *probs = NULL, *all_p = NULL;
    int64_t *idx = NULL, *all_i = NULL;
    int *counts = NULL, *displs = NULL;
    int64_t n = 0;
    int rc = train_predict_files(tr, files, nfiles, "predict", &probs, NULL, &idx, &n);
    if (rc < 0)
        goto out;

    int mine = (int)n;
    int64_t total;
    if ((rc = train_gather_layout(tr, mine, &counts, &displs, &total)) < 0)
        goto out;
    if (tr->rank == 0) {
        all_p = kiln_calloc((size_t)total + 1, sizeof(float));
        all_i = kiln_calloc((size_t)total + 1, sizeof(int64_t));
    }
    int mrc = MPI_Gatherv(probs, mine, MPI_FLOAT, all_p, counts, displs, MPI_FLOAT, 0,
                          MPI_COMM_WORLD);
    if (mrc == MPI_SUCCESS)
        mrc = MPI_Gatherv(idx, mine, MPI_INT64_T, all_i, counts, displs, MPI_INT64_T, 0,
                          MPI_COMM_WORLD);
    if (mrc != MPI_SUCCESS) {
        rc = shard_mpi_fail(mrc, "MPI_Gatherv of the predictions");
        goto out;
    }
    if (tr->rank == 0) {
        float *ordered = kiln_calloc((size_t)total + 1, sizeof(float));
        if (ordered == NULL || all_p == NULL || all_i == NULL) {
            free(ordered);
            rc = KILN_ENOMEM;
            goto out;
        }
        for (int64_t i = 0; i < total; i++) {
            if (all_i[i] < 0 || all_i[i] >= total) {
                free(ordered);
                rc = kiln_errf(KILN_EINTERNAL, "--predict: row index %" PRId64
                                               " outside the %" PRId64 " rows read",
                               all_i[i], total);
                goto out;
            }
            ordered[all_i[i]] = all_p[i];
        }
        *probs_out = ordered;
        *nrows = total;
    }
out:
    KILN_FREE_ALL(probs, idx, all_p, all_i, counts, displs);
    return rc;
}

/* kiln-train --predict GLOB --resume DIR --out FILE: loads the checkpoint,
 * predicts the rows, and rank 0 writes one "%.9g" probability per line
 * (kiln_atomic_*: a temporary file renamed into place) and a JSON line on stdout. */
int train_predict_mode(trainer_t *tr)
{
    char **files = NULL;
    int nfiles = 0;
    float *probs = NULL;
    int64_t nrows = 0;
    kiln_atomic_t out = {0};
    int rc = train_expand(tr->opt.predict, "--predict", &files, &nfiles);
    if (rc == 0)
        rc = train_setup_run(tr);
    rc = agree(rc);
    if (rc == 0)
        rc = agree(train_load_start(tr));
    if (rc == 0)
        rc = predict_rows(tr, files, nfiles, &probs, &nrows);
    if (rc < 0 || tr->rank != 0)
        goto out;
    if ((rc = kiln_atomic_open(tr->opt.out, &out)) < 0)
        goto out;
    FILE *f = out.f;
    for (int64_t i = 0; i < nrows; i++)
        fprintf(f, "%.9g\n", (double)probs[i]);
    rc = kiln_atomic_commit(&out); /* fprintf's errors stay in f: the commit sees them */
    if (rc < 0)
        goto out;
    printf("{\"predict\": \"%s\", \"rows\": %" PRId64 ", \"checkpoint\": \"%s\"}\n",
           tr->opt.out, nrows, tr->last_uid);
    fflush(stdout);
out:
    kiln_atomic_abort(&out);
    free(probs);
    kiln_strv_free(files, (size_t)nfiles);
    return rc;
}
