/*
 * ckpt/ckpt_mpi.c - the collective dump: every rank writes its shard files
 * into one temp directory, rank 0 gathers the file lists and commits the
 * manifest and the rename, and every rank learns the same outcome. Kept apart
 * from ckpt.c so that the readers and `kiln export` need no MPI.
 */
#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "ckpt_int.h"

/* Every rank learns the worst code and the lowest rank that had it. */
static int agree(MPI_Comm comm, int rank, int rc)
{
    int in[2] = {rc, rank}, out[2];
    if (MPI_Allreduce(in, out, 1, MPI_2INT, MPI_MINLOC, comm) != MPI_SUCCESS)
        return kiln_errf(KILN_EMPI, "MPI_Allreduce failed during a checkpoint");
    if (out[0] < 0 && rc == 0)
        return kiln_errf(out[0], "rank %d failed to write its part of the checkpoint", out[1]);
    return out[0];
}

/* Test hook (ckpt.h): KILN_TEST_DUMP_DELAY_MS slows every dump. */
static void test_delay(void)
{
    kiln_test_pause("KILN_TEST_DUMP_DELAY_MS");
}

int ckpt_dump(MPI_Comm comm, const char *root, int ntables, kern_table_t *const *tables,
                 const ckpt_array_t *dense, int ndense, ckpt_info_t *info)
{
    int rank = 0, nranks = 1, rc = 0;
    if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS || MPI_Comm_size(comm, &nranks) != MPI_SUCCESS)
        return kiln_errf(KILN_EMPI, "checkpoint dump: MPI_Comm_rank / MPI_Comm_size failed");
    ckpt_part_t *part = NULL;
    char *tmp = NULL, *text = NULL, *all = NULL;
    int *lens = NULL, *displs = NULL;
    bool made = false;

    if (rank == 0) {
        ckpt_new_uid(info->step, info->uid);
        rc = kiln_mkdir_p(root);
        if (rc == 0) {
            tmp = kiln_asprintf("%s/.tmp-%s", root, info->uid);
            if (tmp == NULL)
                rc = KILN_ENOMEM;
            else if (mkdir(tmp, 0755) < 0)
                rc = ckpt_io_err(errno, "creating", tmp);
            else
                made = true;
        }
    }
    if (MPI_Bcast(info->uid, CKPT_UID_MAX, MPI_CHAR, 0, comm) != MPI_SUCCESS)
        return kiln_errf(KILN_EMPI, "MPI_Bcast of the checkpoint uid failed");
    rc = agree(comm, rank, rc);
    if (rc < 0)
        goto out;
    if (tmp == NULL && (tmp = kiln_asprintf("%s/.tmp-%s", root, info->uid)) == NULL)
        rc = KILN_ENOMEM;
    if (rc == 0)
        rc = ckpt_part_create(&part);
    if (rc == 0)
        rc = ckpt_write_tables(tmp, rank, ntables, tables,
                                  info->kind == CKPT_FULL ? -1 : info->since,
                                  info->include_optimizer, part);
    if (rc == 0 && rank == 0)
        rc = ckpt_write_dense(tmp, dense, ndense, part);
    test_delay();
    rc = agree(comm, rank, rc);
    if (rc < 0)
        goto out;

    /* Rank 0 gathers every rank's file list. */
    text = ckpt_part_encode(part);
    int len = text ? (int)strlen(text) + 1 : 0;
    if (rank == 0) {
        lens = kiln_calloc((size_t)nranks, sizeof *lens);
        displs = kiln_calloc((size_t)nranks, sizeof *displs);
    }
    if (MPI_Gather(&len, 1, MPI_INT, lens, 1, MPI_INT, 0, comm) != MPI_SUCCESS) {
        rc = kiln_errf(KILN_EMPI, "MPI_Gather of checkpoint file lists failed");
        goto out;
    }
    int total = 0;
    if (rank == 0 && lens && displs) {
        for (int i = 0; i < nranks; i++) {
            displs[i] = total;
            total += lens[i];
        }
        all = kiln_malloc((size_t)total + 1);
    }
    if (MPI_Gatherv(text, len, MPI_CHAR, all, lens, displs, MPI_CHAR, 0, comm) != MPI_SUCCESS) {
        rc = kiln_errf(KILN_EMPI, "MPI_Gatherv of checkpoint file lists failed");
        goto out;
    }
    if (rank == 0) {
        ckpt_part_t *merged = NULL;
        rc = all && lens ? ckpt_part_create(&merged) : KILN_ENOMEM;
        for (int i = 0; rc == 0 && i < nranks; i++)
            rc = lens[i] > 0 ? ckpt_part_merge(merged, all + displs[i]) : KILN_ENOMEM;
        info->world_size = nranks;
        if (rc == 0)
            rc = ckpt_commit(root, tmp, info, merged);
        if (rc == 0)
            made = false;
        ckpt_part_destroy(merged);
    }
    rc = agree(comm, rank, rc);
    if (rc == 0)
        ckpt_mark_dumped(ntables, tables, info->step);
out:
    if (rank == 0 && made) {
        /* Every rank is past its writes (the agree above), so the temp dir
         * can go; a failure here is only worth a warning. */
        int save = kiln_errcode();
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", kiln_errmsg());
        if (ckpt_remove(tmp) < 0)
            KILN_WARN("could not remove %s: %s", tmp, kiln_errmsg());
        kiln_errf(save, "%s", msg);
    }
    KILN_FREE_ALL(tmp, text, all, lens, displs);
    ckpt_part_destroy(part);
    return rc;
}
