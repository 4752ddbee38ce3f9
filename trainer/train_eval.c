/*
 * trainer/train_eval.c - the eval: every rank predicts its rows of data.eval and rank 0
 * computes logloss and AUC over all of them.
 */
#include "train_int.h"

/* Gathers every rank's row count on rank 0 and lays the rows out one rank
 * after another there: *counts, *displs (freed by the caller, also on
 * failure) and *total on rank 0, NULL and 0 elsewhere. Collective. Returns
 * 0 or KILN_EMPI. */
int train_gather_layout(const trainer_t *tr, int mine, int **counts, int **displs, int64_t *total)
{
    *counts = tr->rank == 0 ? kiln_calloc((size_t)tr->nranks, sizeof(int)) : NULL;
    *displs = tr->rank == 0 ? kiln_calloc((size_t)tr->nranks, sizeof(int)) : NULL;
    *total = 0;
    SHARD_MPI_CHECK(MPI_Gather(&mine, 1, MPI_INT, *counts, 1, MPI_INT, 0, MPI_COMM_WORLD),
                 "MPI_Gather of row counts");
    if (tr->rank == 0)
        for (int i = 0; i < tr->nranks; i++) {
            (*displs)[i] = (int)*total;
            *total += (*counts)[i];
        }
    return 0;
}

int train_predict_files(trainer_t *tr, char **files, int nfiles, const char *what, float **probs,
                        float **labels, int64_t **rows, int64_t *n)
{
    data_reader_t *r = NULL;
    int64_t capp = 0, capl = 0, capr = 0;
    *n = 0;
    int rc = agree(train_open_reader(tr, files, nfiles, &r));
    if (rc < 0)
        goto out;
    int64_t nsteps = data_reader_nsteps(r);
    for (int64_t k = 0; k < nsteps; k++) {
        data_batch_t *b = NULL;
        int got = data_reader_next(r, &b);
        rc = got < 0 ? got : got == 0 ? KILN_EINTERNAL : 0;
        if (rc == 0 && rows != NULL && b->nskipped > 0)
            rc = kiln_errf(KILN_ECORRUPT,
                           "--predict: rows near global row %" PRId64
                           " are malformed; predictions must keep the file's "
                           "row order, so fix or drop those lines",
                           b->first_row);
        rc = agree(rc);
        if (rc < 0)
            goto out;
        /* At the step after the last one trained: a table with rows on disk
         * keeps the rows a lookup uses in RAM for the rest of its step, and
         * the last step's rows need not stay (kern_table_unpin). */
        rc = agree(train_lookup_batch(tr, b, tr->steps + 1, false));
        if (rc < 0)
            goto out;
        const int64_t m = *n + b->n;
        if ((rc = kiln_grow_to((void **)probs, &capp, m, sizeof(float), 1024)) < 0 ||
            (labels && (rc = kiln_grow_to((void **)labels, &capl, m, sizeof(float), 1024)) < 0) ||
            (rows && (rc = kiln_grow_to((void **)rows, &capr, m, sizeof(int64_t), 1024)) < 0))
            goto out;
        if (b->n == 0) /* every line of the batch malformed: nothing allocated yet, maybe */
            continue;
        rc = model_predict(tr->model, b->n, tr->E, b->dense, *probs + *n);
        if (rc < 0)
            goto out;
        if (labels)
            memcpy(*labels + *n, b->labels, (size_t)b->n * sizeof(float));
        for (int i = 0; rows && i < b->n; i++)
            (*rows)[*n + i] = b->first_row + i;
        *n = m;
    }
    train_log_malformed(tr, r, what);
out:
    data_reader_close(r);
    return rc;
}

/* Predicts every eval row (lookups insert nothing) and computes logloss and
 * AUC on rank 0 over all ranks' predictions. */
int train_evaluate(trainer_t *tr, char **files, int nfiles, int64_t *rows, double *logloss,
                   double *auc)
{
    float *probs = NULL, *labels = NULL;
    int64_t n = 0;
    int rc = train_predict_files(tr, files, nfiles, "eval", &probs, &labels, NULL, &n);
    if (rc < 0)
        goto out;

    /* Gather every rank's predictions on rank 0. */
    int mine = (int)n;
    int *counts, *displs;
    int64_t total;
    float *all_p = NULL, *all_l = NULL;
    rc = train_gather_layout(tr, mine, &counts, &displs, &total);
    if (rc == 0) {
        /* No figures rather than a logloss of 0.0 over nothing, which the
         * quality gate would take for a perfect model. */
        int verdict = 0;
        if (tr->rank == 0 && total == 0) {
            char names[600] = "";
            for (int i = 0, off = 0; i < nfiles && i < 3 && off < (int)sizeof names; i++)
                off += snprintf(names + off, sizeof names - (size_t)off, "%s%s", i ? ", " : "",
                                files[i]);
            verdict = kiln_errf(KILN_EINVAL,
                                "the eval data (%d file%s: %s%s) holds no readable row (empty, "
                                "or every line malformed), so the model cannot be evaluated and "
                                "no eval figures are recorded: fix or replace data.eval",
                                nfiles, nfiles == 1 ? "" : "s", names, nfiles > 3 ? ", ..." : "");
        }
        rc = agree(verdict);
    }
    if (rc == 0 && tr->rank == 0) {
        all_p = kiln_calloc((size_t)total + 1, sizeof(float));
        all_l = kiln_calloc((size_t)total + 1, sizeof(float));
    }
    int mrc = MPI_SUCCESS;
    if (rc == 0)
        mrc = MPI_Gatherv(probs, mine, MPI_FLOAT, all_p, counts, displs, MPI_FLOAT, 0,
                          MPI_COMM_WORLD);
    if (rc == 0 && mrc == MPI_SUCCESS)
        mrc = MPI_Gatherv(labels, mine, MPI_FLOAT, all_l, counts, displs, MPI_FLOAT, 0,
                          MPI_COMM_WORLD);
    if (mrc != MPI_SUCCESS)
        rc = shard_mpi_fail(mrc, "MPI_Gatherv of the eval predictions");
    if (rc == 0 && tr->rank == 0) {
        *rows = total;
        *logloss = model_metrics_logloss(all_p, all_l, (size_t)total);
        rc = model_metrics_auc(all_p, all_l, (size_t)total, auc);
    }
    KILN_FREE_ALL(all_p, all_l, counts, displs);
out:
    free(probs);
    free(labels);
    return rc;
}
