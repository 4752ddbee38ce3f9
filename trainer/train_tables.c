/*
 * trainer/train_tables.c - the trainer's side of tables larger than memory,
 * admission and expiry (docs/models.md): rows expire before each dump, so
 * the dump carries their removal; a batch's keys warm the disk tiers before
 * its step looks them up; the run's table figures (rows in RAM and
 * on disk, RAM hit rate, disk bytes, rows expired, lookups of keys not
 * admitted yet) go to result.json.
 *
 * A ttl in steps compares a row's stamp (the step of its last change) with
 * the current step. A ttl as a duration needs to know when a step ran: the
 * trainer keeps (step, time) marks, one per checkpoint of the chain it
 * started from (the manifest's step and created_at) and one per dump of
 * this run, and a row expires once a mark at or after its stamp is older
 * than the ttl. Rows thus live up to one checkpoint interval past their ttl.
 */
#include "train_int.h"

void train_tables_mark_time(trainer_t *tr, int64_t step, int64_t unix_s)
{
    if (kiln_grow((void **)&tr->marks, &tr->capmarks, tr->nmarks, sizeof *tr->marks, 16) < 0)
        return; /* a missing mark only keeps rows longer */
    tr->marks[tr->nmarks][0] = step;
    tr->marks[tr->nmarks][1] = unix_s;
    tr->nmarks++;
}

/* The first step whose rows are still young for table e at step now: rows
 * with a stamp below it expire. 0: none expire. */
static int64_t expire_before(const trainer_t *tr, const job_embedding_t *e, int64_t now)
{
    if (e->ttl_steps > 0)
        return now - e->ttl_steps > 0 ? now - e->ttl_steps : 0;
    if (e->ttl_ms <= 0)
        return 0;
    int64_t cutoff = kiln_now_s() - e->ttl_ms / 1000, before = 0;
    for (size_t i = 0; i < tr->nmarks; i++)
        if (tr->marks[i][1] <= cutoff && tr->marks[i][0] + 1 > before)
            before = tr->marks[i][0] + 1;
    return before;
}

int train_tables_expire(trainer_t *tr)
{
    for (int t = 0; t < tr->T; t++) {
        int64_t before = expire_before(tr, &tr->spec.model.tables[t].emb, tr->steps), n = 0;
        if (before <= 0)
            continue;
        KILN_CHECK(kern_table_expire(tr->tables[t], before, tr->steps, &n));
        tr->rows_expired += n;
    }
    return 0;
}

int train_tables_report(trainer_t *tr, run_tables_t *out /* OUT: rank 0 */)
{
    /* ram, disk, ram hits, disk hits, bytes read, bytes written, expired,
     * rejected, reads, writes (transfers) */
    int64_t mine[10] = {0}, all[10] = {0};
    const char *io = "";
    for (int t = 0; t < tr->T; t++) {
        kern_table_stats_t st;
        kern_table_stats(tr->tables[t], &st);
        if (kern_table_tiered(tr->tables[t]) && !io[0])
            io = job_spill_io_name(st.disk_io);
        mine[0] += st.ram_size;
        mine[1] += st.disk_size;
        mine[2] += st.ram_hits;
        mine[3] += st.disk_hits;
        mine[4] += st.disk_read_bytes;
        mine[5] += st.disk_written_bytes;
        mine[7] += st.admit_rejected;
        mine[8] += st.disk_reads;
        mine[9] += st.disk_writes;
        out->tiered |= kern_table_tiered(tr->tables[t]);
    }
    mine[6] = tr->rows_expired;
    int mrc = MPI_Reduce(mine, all, 10, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    if (mrc != MPI_SUCCESS)
        return shard_mpi_fail(mrc, "MPI_Reduce of the table figures");
    int tiered = out->tiered, any = 0;
    mrc = MPI_Reduce(&tiered, &any, 1, MPI_INT, MPI_MAX, 0, MPI_COMM_WORLD);
    if (mrc != MPI_SUCCESS)
        return shard_mpi_fail(mrc, "MPI_Reduce of the table figures");
    *out = (run_tables_t){.tiered = any != 0,
                          .rows_ram = all[0],
                          .rows_disk = all[1],
                          .ram_hit_rate = all[2] + all[3] > 0
                                              ? (double)all[2] / (double)(all[2] + all[3])
                                              : NAN,
                          .disk_read_bytes = all[4],
                          .disk_written_bytes = all[5],
                          .disk_reads = all[8],
                          .disk_writes = all[9],
                          .rows_expired = all[6],
                          .admit_rejected = all[7]};
    snprintf(out->disk_io, sizeof out->disk_io, "%s", io);
    return 0;
}

void train_tables_prefetch(trainer_t *tr, const data_batch_t *b)
{
    int64_t *mine = NULL, cap = 0;
    for (int s = 0; s < tr->S; s++) {
        kern_table_t *t = tr->tables[tr->slot_table[s]];
        if (!kern_table_prefetching(t))
            continue; /* no tier, or its reads come from the page cache */
        const int64_t *off = b->offsets + (int64_t)s * (b->n + 1);
        int64_t m = 0;
        if (kiln_grow_to((void **)&mine, &cap, off[b->n] - off[0], sizeof *mine, 1024) < 0)
            break;
        for (int64_t i = off[0]; i < off[b->n]; i++)
            if (shard_owner(b->keys[i], tr->nranks) == tr->rank)
                mine[m++] = b->keys[i];
        if (kern_table_prefetch(t, m, mine) < 0)
            break;
    }
    free(mine);
}
