/*
 * trainer/train_loop.c - the training loop over epochs of the reader's batches, the
 * progress records, the checks on data and loss (data.max_malformed,
 * non-finite loss) and the hooks kilnd gives (run/run.h).
 */
#include "train_int.h"

/* ---- training and evaluation ------------------------------------------------------- */

/* A progress record of the rows since the last one (collective: the loss is
 * summed over the ranks); `human` also prints the line on stderr, which
 * kilnd's run log (and `kiln logs --follow`) shows. Returns 0 or KILN_EMPI. */
static int report_progress(trainer_t *tr, int64_t step, int64_t end_step, double loss_sum,
                           int64_t rows, double seconds, bool human, bool last)
{
    double in[2] = {loss_sum, (double)rows}, out[2];
    SHARD_MPI_CHECK(MPI_Reduce(in, out, 2, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD),
                 "MPI_Reduce of the loss");
    if (tr->rank != 0)
        return 0;
    double loss = out[1] > 0 ? out[0] / out[1] : NAN;
    double sps = seconds > 0 ? (double)tr->samples / seconds : 0.0;
    if (tr->progress) {
        run_progress_t rec = {.kind = RUN_REC_STEP, .step = step, .time = kiln_now_s(),
                              .samples = tr->samples, .loss = loss, .samples_per_s = sps,
                              .seconds = seconds};
        if (run_progress_write(tr->progress, &rec) < 0)
            KILN_WARN("%s", kiln_errmsg());
    }
    if (human && !tr->opt.quiet) {
        bool tty = isatty(STDERR_FILENO);
        fprintf(stderr, "%sstep %" PRId64 "/%" PRId64 "  samples %" PRId64 "  loss %.4f  "
                        "samples/s %.0f%s",
                tty ? "\r" : "", step, end_step, tr->samples, loss, sps,
                tty && !last ? "   " : "\n");
        fflush(stderr);
    }
    return 0;
}

/* ---- kilnd hooks (the contract is run/run.h) ------------------------------------------ */

/* The directory a spec's relative paths resolve against. kilnd runs a copy of
 * the spec in the run directory and names the submitted file's directory in
 * RUN_ENV_SPEC_DIR; otherwise it is the directory of the spec file itself, with
 * symlinks resolved: `kiln submit` records the real path too, so a spec
 * reached through a link reads the same data whether kilnd or a person
 * starts the trainer (docs/job-spec.md, "Paths"). */
char *train_spec_base_dir(const char *spec_path)
{
    const char *env = getenv(RUN_ENV_SPEC_DIR);
    if (env != NULL && env[0] != '\0')
        return kiln_strdup(env);
    char *real = realpath(spec_path, NULL);
    char *dup = real != NULL ? real : kiln_strdup(spec_path);
    char *dir = kiln_strdup(dup ? dirname(dup) : ".");
    free(dup);
    return dir;
}

/* Test-only fault injection for tests/test_sched.c: KILN_TEST_KILL_RANK=R and
 * KILN_TEST_KILL_STEP=S make rank R kill itself with SIGKILL at step S, on a
 * run's first attempt only (KILN_ATTEMPT unset or 1), so that the retry can
 * succeed. Without those variables it does nothing. */
static void test_kill_hook(int rank, int64_t step)
{
    const char *r = getenv("KILN_TEST_KILL_RANK"), *s = getenv("KILN_TEST_KILL_STEP");
    const char *attempt = getenv(RUN_ENV_ATTEMPT);
    if (r == NULL || s == NULL || (attempt != NULL && atoi(attempt) > 1))
        return;
    if (atoi(r) == rank && atoll(s) == step)
        raise(SIGKILL);
}

/* Before a checkpoint other than the last, data.max_malformed is checked
 * only once this many lines were read: one bad line among the first few
 * (a header) should not fail a run whose data is good. */
#define MALFORMED_MIN_LINES 10000

/* data.max_malformed, and a run that read lines but no good row: every
 * rank agrees on the counts (they come from the per-step allreduce), so
 * every rank returns the same code; rank 0 tells. final: the end of the
 * run. Returns 0, or KILN_ECORRUPT / KILN_EINVAL (exit 2: the same files fail
 * again). */
static int check_data(trainer_t *tr, bool final)
{
    const int64_t bad = tr->run_malformed, lines = tr->run_rows + bad;
    const double max = tr->spec.data.max_malformed;
    if (lines == 0 || (!final && lines < MALFORMED_MIN_LINES))
        return 0;
    if ((double)bad > max * (double)lines) {
        tr->error_told = tr->rank != 0;
        tr->data_verdict = true;
        return kiln_errf(KILN_ECORRUPT,
                         "%" PRId64 " of the %" PRId64 " training lines read (%.2f%%) are "
                         "malformed, more than data.max_malformed (%g%%) allows, so no "
                         "checkpoint is written; the first are logged above (FILE:LINE: "
                         "reason). Check data.format, data.dense_features (%d) and "
                         "data.cat_slots (%d) against the files, or raise data.max_malformed",
                         bad, lines, 100.0 * (double)bad / (double)lines, 100.0 * max, tr->F,
                         tr->S);
    }
    if (final && tr->run_rows == 0) {
        tr->error_told = tr->rank != 0;
        tr->data_verdict = true;
        return kiln_errf(KILN_EINVAL,
                         "the %" PRId64 " training lines read hold no good row (all "
                         "malformed): nothing was trained and no checkpoint is "
                         "written",
                         lines);
    }
    return 0;
}

/* A run that diverged stops at the step it diverged, before anything of it
 * reaches a checkpoint: a loss that is not finite on any rank, or dense
 * weights that are not (they are the same on every rank). Embedding rows
 * that blew up show in the loss of the step that reads them, and the
 * checkpoint writer refuses any that is not finite. Collective. */
static int check_finite(trainer_t *tr, double loss_sum, int64_t step)
{
    int bad = isfinite(loss_sum) ? 0 : 1;
    if (bad == 0) {
        const float *p = model_params_read(tr->model);
        const size_t np = model_nparams(tr->model);
        for (size_t i = 0; i < np && bad == 0; i++)
            if (!isfinite(p[i]))
                bad = 2;
    }
    int worst = bad;
    if (tr->nranks > 1 &&
        MPI_Allreduce(&bad, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
        return kiln_errf(KILN_EMPI, "MPI_Allreduce of the divergence check failed");
    if (worst == 0)
        return 0;
    tr->error_told = tr->rank != 0;
    const job_optimizer_t *so = &tr->spec.train.sparse, *d = &tr->spec.train.dense;
    return kiln_errf(KILN_ERANGE,
                     "step %" PRId64 ": training diverged: the %s not finite (NaN or "
                     "infinite), so the run stops and writes no checkpoint of it. Lower the "
                     "learning rates (train.optimizer.sparse.lr %g, train.optimizer.dense.lr "
                     "%g) or check the data",
                     step, worst == 1 ? "loss is" : "dense model's weights are", so->lr, d->lr);
}

/* The step at which training stops (0: none): a resumed run counts steps
 * from the start of its lineage; a warm start (init_from) counts its own. */
int64_t train_step_limit(const trainer_t *tr)
{
    int64_t max_steps = tr->opt.max_steps > 0 ? tr->opt.max_steps : tr->spec.train.max_steps;
    return max_steps <= 0 ? 0 : tr->resumed ? max_steps : tr->steps0 + max_steps;
}

/* The next batch, read during the step before it (dev_step). */
typedef struct {
    bool held; /* got and b are the next batch's */
    int got;   /* data_reader_next's return */
    data_batch_t *b;
} ahead_t;

/* The device step for batch b: its front, then (when more is to come) the
 * next batch read and staged into the device step's other slot, so its copy
 * to the device overlaps this step's update exchange and dense step, then
 * the back. A failed read waits in ahead for the next step's agreement on
 * it, as it would have failed there. */
static int dev_step(trainer_t *tr, data_reader_t *r, const data_batch_t *b, bool more, int64_t global_n,
                    ahead_t *ahead, double *loss_sum)
{
    const int64_t step = tr->steps + 1;
    KILN_CHECK(train_dev_front(tr, b, step, global_n, loss_sum));
    if (more) {
        ahead->got = data_reader_next(r, &ahead->b); /* b is invalid from here */
        ahead->held = true;
        if (ahead->got == 1)
            KILN_CHECK(train_dev_stage(tr, ahead->b));
    }
    return train_dev_back(tr, step);
}

/* Trains `epochs` passes over files (continuing a resumed run's position
 * within them). The loop's time adds to tr->train_ns. */
int train_loop(trainer_t *tr, char **files, int nfiles, int64_t epochs)
{
    const job_spec_t *sp = &tr->spec;
    int64_t limit = train_step_limit(tr);
    int64_t log_every = sp->train.log_every > 0 ? sp->train.log_every : 100;
    int64_t every_steps = sp->checkpoint.every_steps;
    int64_t t0 = kiln_mono_ns();
    int rc = 0;
    for (int64_t epoch = tr->start_epoch; epoch < epochs && rc == 0; epoch++) {
        if (limit > 0 && tr->steps >= limit)
            break;
        data_reader_t *r = NULL;
        rc = agree(train_open_reader(tr, files, nfiles, &r));
        if (rc < 0) {
            tr->data_verdict = train_data_fault(rc); /* the same code on every rank */
            data_reader_close(r);
            break;
        }
        if (data_reader_total_rows(r) == 0) {
            /* Every rank counted the same files. */
            tr->error_told = tr->rank != 0;
            tr->data_verdict = true;
            rc = kiln_errf(KILN_EINVAL,
                           "the %d training file%s (%s%s) hold%s no lines: nothing "
                           "to train on; check data.train",
                           nfiles, nfiles == 1 ? "" : "s", files[0], nfiles > 1 ? ", ..." : "",
                           nfiles == 1 ? "s" : "");
            data_reader_close(r);
            break;
        }
        int64_t nsteps = data_reader_nsteps(r);
        /* The loss curve: a record every few steps, at most ~256 over the
         * run, every step of a short one. */
        if (tr->rec_every <= 0)
            tr->rec_every = (nsteps * (epochs - tr->start_epoch) + 255) / 256;
        if (tr->rec_every <= 0)
            tr->rec_every = 1;
        int64_t k0 = epoch == tr->start_epoch ? tr->start_k : 0;
        if (k0 > nsteps)
            k0 = nsteps;
        /* Continue a resumed run where it stopped: skip the batches it took. */
        for (int64_t k = 0; k < k0; k++) {
            data_batch_t *b = NULL;
            int got = data_reader_next(r, &b);
            rc = agree(got < 0 ? got : got == 0 ? kiln_errf(KILN_EINTERNAL, "rank %d ran out of "
                                                                             "batches skipping "
                                                                             "to step %" PRId64,
                                                             tr->rank, k0)
                                                : 0);
            if (rc < 0)
                break;
        }
        int64_t per_epoch = nsteps;
        if (limit > 0 && nsteps - k0 > limit - tr->steps)
            nsteps = k0 + (limit - tr->steps);
        /* The step the run ends at, for the progress lines: the counter
         * counts from the start of the lineage (a warm start or a resume
         * begins where its checkpoint was), nsteps only this epoch's. */
        int64_t end_step = tr->steps + (nsteps - k0) + per_epoch * (epochs - epoch - 1);
        if (limit > 0 && end_step > limit)
            end_step = limit;
        tr->pos_epoch = epoch;
        tr->pos_k = k0;
        double loss_acc = 0.0;
        int64_t rows_acc = 0;
        ahead_t ahead = {0};
        for (int64_t k = k0; k < nsteps && rc == 0; k++) {
            data_batch_t *b = ahead.held ? ahead.b : NULL;
            int got = ahead.held ? ahead.got : data_reader_next(r, &b);
            ahead.held = false;
            /* Agree on the rows of this step, whether any rank failed (and
             * whether on its file's own fault), and the malformed lines it
             * skipped (data.max_malformed). */
            int64_t in[4] = {got == 1 ? b->n : 0, got == 1 ? 0 : 1, got == 1 ? b->nskipped : 0,
                             got < 0 && train_data_fault(got)};
            int64_t out[4];
            if (MPI_Allreduce(in, out, 4, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS) {
                rc = kiln_errf(KILN_EMPI, "MPI_Allreduce of batch sizes failed");
                break;
            }
            if (out[1] != 0) {
                rc = got < 0 ? got
                             : kiln_errf(KILN_EIO, "another rank could not read its part of "
                                                   "step %" PRId64, k);
                if (got == 0)
                    rc = kiln_errf(KILN_EINTERNAL, "rank %d ran out of batches at step %" PRId64,
                                   tr->rank, k);
                tr->data_verdict = out[3] == out[1]; /* every rank that failed, on its file */
                break;
            }
            tr->pos_k = k + 1;
            tr->run_rows += out[0];
            tr->run_malformed += out[2];
            if (out[0] == 0)
                continue;
            double loss_sum = 0.0;
            const int64_t nrows = b->n; /* b is gone once the next batch is read */
            if (!tr->dev) /* tables larger than memory: warm the rows b needs */
                train_tables_prefetch(tr, b);
            rc = tr->dev ? dev_step(tr, r, b, k + 1 < nsteps, out[0], &ahead, &loss_sum)
                         : train_step(tr, b, tr->steps + 1, out[0], &loss_sum);
            if (rc < 0) {
                /* The other ranks may be waiting in a collective of this
                 * step: only MPI_Abort can stop them (see main). */
                tr->abort_needed = true;
                break;
            }
            rc = check_finite(tr, loss_sum, tr->steps + 1);
            if (rc < 0)
                break;
            tr->steps++;
            test_kill_hook(tr->rank, tr->steps);
            tr->samples += out[0];
            loss_acc += loss_sum;
            rows_acc += nrows;
            bool last = k + 1 == nsteps && epoch + 1 == epochs;
            bool human = tr->steps % log_every == 0 || last;
            if (human || tr->steps % tr->rec_every == 0) {
                rc = report_progress(tr, tr->steps, end_step, loss_acc, rows_acc,
                                     (double)(tr->train_ns + kiln_mono_ns() - t0) / 1e9, human,
                                     last);
                loss_acc = 0.0;
                rows_acc = 0;
                if (rc < 0) {
                    tr->abort_needed = true; /* a collective failed: ranks may be apart */
                    break;
                }
            }
            /* Step boundary: periodic checkpoints and online exports. */
            bool want = false;
            rc = train_export_requested(tr, &want);
            /* An online run judges each partition as it reads it: a bad
             * one stops at 10,000 lines, not at its end. */
            if (rc == 0 && (want || sp->train.mode == JOB_MODE_ONLINE ||
                            (every_steps > 0 && tr->steps % every_steps == 0)))
                rc = check_data(tr, false);
            if (rc == 0 && want) {
                rc = train_checkpoint(tr, true);
                /* export.every_ms counts from the end of an export, so a
                 * slow disk gets training time between exports. */
                tr->last_export_ms = kiln_mono_ns() / 1000000;
                tr->export_step = tr->steps;
            }
            if (rc == 0 && every_steps > 0 && tr->steps % every_steps == 0)
                rc = train_checkpoint(tr, false);
        }
        train_log_malformed(tr, r, "training");
        data_reader_close(r);
        if (limit > 0 && tr->steps >= limit)
            break;
    }
    tr->train_ns += kiln_mono_ns() - t0;
    if (rc == 0)
        rc = check_data(tr, true);
    return rc;
}
