/*
 * state/schema.c - Kiln's schema as a list of migrations. Migration i (1-based)
 * brings a database from PRAGMA user_version i-1 to i; state_open applies the
 * missing ones in order, each in its own BEGIN IMMEDIATE transaction, so a file
 * at any earlier version (an empty file is version 0) reaches
 * STATE_SCHEMA_VERSION. Each script ends by setting user_version itself, and
 * the runner checks it did.
 *
 * The policy (docs/state.md): append a migration, never edit one that shipped.
 * Times are Unix seconds; 0 means "not yet" where a column says so; optional
 * references are NULL, never 0.
 */
#include "state_int.h"

/* v1: the core - jobs, their runs and the audit log. */
static const char migration_1[] =
    "CREATE TABLE jobs ("
    "  id INTEGER PRIMARY KEY,"
    "  name TEXT NOT NULL UNIQUE,"
    "  spec_yaml TEXT NOT NULL,"
    "  spec_hash TEXT NOT NULL,"
    "  schedule TEXT,"
    "  priority INTEGER NOT NULL DEFAULT 0,"
    "  version INTEGER NOT NULL DEFAULT 1 CHECK (version >= 1),"
    "  paused INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),"
    "  created_at INTEGER NOT NULL,"
    "  updated_at INTEGER NOT NULL,"
    "  last_scheduled_at INTEGER NOT NULL DEFAULT 0"
    ");"
    "CREATE TABLE runs ("
    "  id INTEGER PRIMARY KEY,"
    "  job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  job_version INTEGER NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('queued', 'launching', 'running',"
    "    'succeeded', 'failed', 'canceled', 'timed_out', 'skipped')),"
    "  trigger TEXT NOT NULL CHECK (trigger IN ('manual', 'cron', 'retry', 'catchup')),"
    "  attempt INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),"
    "  retry_of INTEGER REFERENCES runs(id),"
    "  scheduled_at INTEGER NOT NULL DEFAULT 0,"
    "  queued_at INTEGER NOT NULL,"
    "  started_at INTEGER NOT NULL DEFAULT 0,"
    "  ended_at INTEGER NOT NULL DEFAULT 0,"
    "  not_before INTEGER NOT NULL DEFAULT 0,"
    "  exit_code INTEGER NOT NULL DEFAULT -1,"
    "  error TEXT,"
    "  run_dir TEXT,"
    "  pgid INTEGER NOT NULL DEFAULT 0,"
    "  host TEXT,"
    "  cancel_requested INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1))"
    ");"
    /* A scheduled time is served once: the first attempt of a cron or catch-up
     * run is unique per (job, time). Retries (attempt > 1, or trigger
     * 'retry') carry the same scheduled_at and are not in the index. */
    "CREATE UNIQUE INDEX runs_scheduled_once ON runs (job_id, scheduled_at)"
    "  WHERE scheduled_at > 0 AND trigger IN ('cron', 'catchup') AND attempt = 1;"
    "CREATE INDEX runs_by_job ON runs (job_id, id);"
    "CREATE INDEX runs_by_state ON runs (state, id);"
    "CREATE TABLE events ("
    "  id INTEGER PRIMARY KEY,"
    "  job_id INTEGER REFERENCES jobs(id) ON DELETE CASCADE,"
    "  run_id INTEGER REFERENCES runs(id) ON DELETE CASCADE,"
    "  at INTEGER NOT NULL,"
    "  kind TEXT NOT NULL,"
    "  message TEXT NOT NULL"
    ");"
    "CREATE INDEX events_by_run ON events (run_id, id);"
    "PRAGMA user_version = 1;";

/* v2: what runs consume and produce - inputs, metrics, checkpoints, exports,
 * endpoints and pushes - plus the spec history of jobs (backfilled from jobs)
 * and indexes for the job event log and retry chains. */
static const char migration_2[] =
    "CREATE TABLE job_versions ("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  version INTEGER NOT NULL,"
    "  spec_yaml TEXT NOT NULL,"
    "  spec_hash TEXT NOT NULL,"
    "  created_at INTEGER NOT NULL,"
    "  PRIMARY KEY (job_id, version)"
    ");"
    "INSERT INTO job_versions (job_id, version, spec_yaml, spec_hash, created_at)"
    "  SELECT id, version, spec_yaml, spec_hash, updated_at FROM jobs;"
    "CREATE INDEX events_by_job ON events (job_id, id);"
    "CREATE INDEX runs_by_retry_of ON runs (retry_of) WHERE retry_of IS NOT NULL;"
    "CREATE TABLE run_inputs ("
    "  id INTEGER PRIMARY KEY,"
    "  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,"
    "  path TEXT NOT NULL,"
    "  size INTEGER NOT NULL,"
    "  mtime INTEGER NOT NULL,"
    "  checksum TEXT"
    ");"
    "CREATE INDEX run_inputs_by_run ON run_inputs (run_id, id);"
    "CREATE INDEX run_inputs_by_path ON run_inputs (path, size, mtime);"
    "CREATE TABLE metrics ("
    "  id INTEGER PRIMARY KEY,"
    "  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,"
    "  step INTEGER NOT NULL,"
    "  name TEXT NOT NULL,"
    "  value REAL," /* NULL stores NaN (SQLite has no NaN) */
    "  at INTEGER NOT NULL"
    ");"
    "CREATE INDEX metrics_by_run ON metrics (run_id, name, step);"
    "CREATE TABLE checkpoints ("
    "  id INTEGER PRIMARY KEY,"
    "  uid TEXT NOT NULL UNIQUE,"
    "  run_id INTEGER REFERENCES runs(id) ON DELETE SET NULL,"
    "  parent_id INTEGER REFERENCES checkpoints(id),"
    "  kind TEXT NOT NULL CHECK (kind IN ('full', 'incremental')),"
    "  path TEXT NOT NULL,"
    "  step INTEGER NOT NULL DEFAULT 0,"
    "  keys INTEGER NOT NULL DEFAULT 0,"
    "  bytes INTEGER NOT NULL DEFAULT 0,"
    "  checksum TEXT,"
    "  created_at INTEGER NOT NULL"
    ");"
    "CREATE INDEX checkpoints_by_run ON checkpoints (run_id, created_at);"
    "CREATE INDEX checkpoints_by_parent ON checkpoints (parent_id);"
    "CREATE TABLE exports ("
    "  id INTEGER PRIMARY KEY,"
    "  checkpoint_id INTEGER NOT NULL REFERENCES checkpoints(id),"
    "  base_checkpoint_id INTEGER REFERENCES checkpoints(id),"
    "  format TEXT NOT NULL,"
    "  path TEXT NOT NULL,"
    "  bytes INTEGER NOT NULL DEFAULT 0,"
    "  created_at INTEGER NOT NULL"
    ");"
    "CREATE INDEX exports_by_checkpoint ON exports (checkpoint_id);"
    "CREATE TABLE endpoints ("
    "  id INTEGER PRIMARY KEY,"
    "  url TEXT NOT NULL,"
    "  model TEXT NOT NULL DEFAULT '',"
    "  label TEXT,"
    "  created_at INTEGER NOT NULL,"
    "  UNIQUE (url, model)"
    ");"
    "CREATE TABLE pushes ("
    "  id INTEGER PRIMARY KEY,"
    "  export_id INTEGER NOT NULL REFERENCES exports(id),"
    "  endpoint_id INTEGER NOT NULL REFERENCES endpoints(id),"
    "  state TEXT NOT NULL CHECK (state IN ('pending', 'succeeded', 'failed')),"
    "  http_status INTEGER NOT NULL DEFAULT 0,"
    "  error TEXT,"
    "  attempts INTEGER NOT NULL DEFAULT 0,"
    "  started_at INTEGER NOT NULL,"
    "  ended_at INTEGER NOT NULL DEFAULT 0"
    ");"
    "CREATE INDEX pushes_by_export ON pushes (export_id);"
    "CREATE INDEX pushes_by_endpoint ON pushes (endpoint_id, id);"
    /* One row per (endpoint, checkpoint held) span; until_at NULL is now. */
    "CREATE TABLE endpoint_holdings ("
    "  id INTEGER PRIMARY KEY,"
    "  endpoint_id INTEGER NOT NULL REFERENCES endpoints(id),"
    "  checkpoint_id INTEGER NOT NULL REFERENCES checkpoints(id),"
    "  push_id INTEGER REFERENCES pushes(id),"
    "  since INTEGER NOT NULL,"
    "  until_at INTEGER"
    ");"
    "CREATE UNIQUE INDEX endpoint_holdings_now ON endpoint_holdings (endpoint_id)"
    "  WHERE until_at IS NULL;"
    "CREATE INDEX endpoint_holdings_by_checkpoint ON endpoint_holdings (checkpoint_id);"
    "PRAGMA user_version = 2;";

/* v3: what the web page and /metrics read without scanning runs: run counts
 * per (job, state) and a histogram of run durations per job, both kept by
 * triggers and backfilled here; an index for paging a job's runs by state.
 * The bucket bounds are STATE_DURATION_BOUNDS (seconds) and +Inf. */
static const char migration_3[] =
    "CREATE INDEX runs_by_job_state ON runs (job_id, state, id);"
    "CREATE TABLE run_counts ("
    "  job_id INTEGER NOT NULL,"
    "  state TEXT NOT NULL,"
    "  n INTEGER NOT NULL,"
    "  PRIMARY KEY (job_id, state)"
    ") WITHOUT ROWID;"
    "INSERT INTO run_counts (job_id, state, n)"
    "  SELECT job_id, state, count(*) FROM runs GROUP BY job_id, state;"
    "CREATE TRIGGER run_counts_insert AFTER INSERT ON runs BEGIN"
    "  INSERT INTO run_counts (job_id, state, n) VALUES (new.job_id, new.state, 1)"
    "    ON CONFLICT (job_id, state) DO UPDATE SET n = n + 1;"
    "END;"
    "CREATE TRIGGER run_counts_update AFTER UPDATE OF state ON runs"
    "  WHEN old.state IS NOT new.state BEGIN"
    "  UPDATE run_counts SET n = n - 1 WHERE job_id = old.job_id AND state = old.state;"
    "  INSERT INTO run_counts (job_id, state, n) VALUES (new.job_id, new.state, 1)"
    "    ON CONFLICT (job_id, state) DO UPDATE SET n = n + 1;"
    "END;"
    "CREATE TRIGGER run_counts_delete AFTER DELETE ON runs BEGIN"
    "  UPDATE run_counts SET n = n - 1 WHERE job_id = old.job_id AND state = old.state;"
    "END;"
    "CREATE TABLE run_duration_bounds (le INTEGER PRIMARY KEY);"
    "INSERT INTO run_duration_bounds (le) VALUES (1), (5), (15), (60), (300), (900),"
    "  (3600), (10800), (43200), (86400), (9223372036854775807);"
    "CREATE TABLE run_durations ("
    "  job_id INTEGER NOT NULL,"
    "  le INTEGER NOT NULL,"
    "  n INTEGER NOT NULL,"
    "  sum_s INTEGER NOT NULL,"
    "  PRIMARY KEY (job_id, le)"
    ") WITHOUT ROWID;"
    "INSERT INTO run_durations (job_id, le, n, sum_s)"
    "  SELECT job_id, b, count(*), sum(d) FROM (SELECT job_id,"
    "    max(ended_at - started_at, 0) AS d, (SELECT min(le) FROM run_duration_bounds"
    "    WHERE le >= max(ended_at - started_at, 0)) AS b FROM runs"
    "    WHERE ended_at > 0 AND started_at > 0) GROUP BY job_id, b;"
    "CREATE TRIGGER run_durations_end AFTER UPDATE OF ended_at ON runs"
    "  WHEN old.ended_at = 0 AND new.ended_at > 0 AND new.started_at > 0 BEGIN"
    "  INSERT INTO run_durations (job_id, le, n, sum_s) VALUES (new.job_id,"
    "    (SELECT min(le) FROM run_duration_bounds"
    "     WHERE le >= max(new.ended_at - new.started_at, 0)),"
    "    1, max(new.ended_at - new.started_at, 0))"
    "    ON CONFLICT (job_id, le) DO UPDATE SET n = n + 1, sum_s = sum_s + excluded.sum_s;"
    "END;"
    "CREATE TRIGGER run_durations_delete AFTER DELETE ON runs"
    "  WHEN old.ended_at > 0 AND old.started_at > 0 BEGIN"
    "  UPDATE run_durations SET n = n - 1, sum_s = sum_s - max(old.ended_at - old.started_at, 0)"
    "    WHERE job_id = old.job_id AND le = (SELECT min(le) FROM run_duration_bounds"
    "    WHERE le >= max(old.ended_at - old.started_at, 0));"
    "END;"
    "PRAGMA user_version = 3;";

/* v4: the job's newest event of a kind (kilnd reads the newest "submit" event
 * for the spec's directory before every launch) in one index step; with the
 * (job_id, id) index it walked every event of the job: 35-45 ms of
 * submit-to-launch at 100k runs (docs/benchmarks.md, "Scheduler"). */
static const char migration_4[] =
    "CREATE INDEX events_by_job_kind ON events (job_id, kind, id);"
    "PRAGMA user_version = 4;";


/* v5: the loop closes (docs/operations.md, "After a run").
 * - jobs, job_versions and runs get spec_dir: the directory the spec's
 *   relative paths resolve against, written with the job and copied onto
 *   each run in the transaction that queues it (kilnd no longer reads it out
 *   of the text of a "submit" event).
 * - runs.start_checkpoint_id: the checkpoint a run started from (resume or
 *   warm start), so that lineage reaches the checkpoints derived from a run
 *   across full dumps.
 * - checkpoints get the eval figures measured on them (the quality gate and
 *   the endpoints page read them) and whether it was an online export.
 * - run_inputs.covered_by: an online run's input once a checkpoint holds
 *   what was learnt from it (the data watermark of online jobs).
 * - endpoints are keyed by (url, model, label): one kiln-serve holds several
 *   labels. The table is rebuilt (SQLite cannot drop a UNIQUE constraint),
 *   keeping every id; it also keeps the last numbers read from the
 *   endpoint's /v1/stats.
 * - pushes become the push queue: a row is the intent to make an endpoint
 *   hold a checkpoint (full or as a delta), pending until kilnd (or the CLI
 *   that made it) delivers it, retried with backoff, superseded by a newer
 *   push to the same endpoint, held back by the quality gate. Rebuilt with
 *   every id kept; the old rows become ended pushes of their export's
 *   checkpoint.
 * Runs with foreign keys off (state.c turns them off around a migration that
 * rebuilds tables, and checks every reference before it commits). */
static const char migration_5[] =
    "ALTER TABLE jobs ADD COLUMN spec_dir TEXT;"
    "ALTER TABLE job_versions ADD COLUMN spec_dir TEXT;"
    "ALTER TABLE runs ADD COLUMN spec_dir TEXT;"
    "ALTER TABLE runs ADD COLUMN start_checkpoint_id INTEGER REFERENCES checkpoints(id);"
    "CREATE INDEX runs_by_start_checkpoint ON runs (start_checkpoint_id)"
    "  WHERE start_checkpoint_id IS NOT NULL;"
    "ALTER TABLE checkpoints ADD COLUMN eval_logloss REAL;"
    "ALTER TABLE checkpoints ADD COLUMN eval_auc REAL;"
    "ALTER TABLE checkpoints ADD COLUMN online INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE run_inputs ADD COLUMN covered_by INTEGER REFERENCES checkpoints(id);"
    "CREATE TABLE endpoints_v5 ("
    "  id INTEGER PRIMARY KEY,"
    "  url TEXT NOT NULL,"
    "  model TEXT NOT NULL DEFAULT '',"
    "  label TEXT NOT NULL DEFAULT '',"
    "  created_at INTEGER NOT NULL,"
    "  stats_at INTEGER NOT NULL DEFAULT 0,"
    "  predict_requests INTEGER NOT NULL DEFAULT 0,"
    "  predict_rows INTEGER NOT NULL DEFAULT 0,"
    "  request_rate REAL,"
    "  stats_error TEXT,"
    "  UNIQUE (url, model, label)"
    ");"
    "INSERT INTO endpoints_v5 (id, url, model, label, created_at)"
    "  SELECT id, url, model, coalesce(label, ''), created_at FROM endpoints;"
    "DROP TABLE endpoints;"
    "ALTER TABLE endpoints_v5 RENAME TO endpoints;"
    "CREATE TABLE pushes_v5 ("
    "  id INTEGER PRIMARY KEY,"
    "  job_id INTEGER REFERENCES jobs(id),"
    "  run_id INTEGER REFERENCES runs(id),"
    "  checkpoint_id INTEGER NOT NULL REFERENCES checkpoints(id),"
    "  endpoint_id INTEGER NOT NULL REFERENCES endpoints(id),"
    "  export_id INTEGER REFERENCES exports(id),"
    "  mode TEXT NOT NULL CHECK (mode IN ('full', 'incremental')),"
    "  reason TEXT NOT NULL DEFAULT '',"
    "  state TEXT NOT NULL CHECK (state IN ('pending', 'sending', 'succeeded', 'failed',"
    "    'superseded', 'held')),"
    "  http_status INTEGER NOT NULL DEFAULT 0,"
    "  error TEXT,"
    "  attempts INTEGER NOT NULL DEFAULT 0,"
    "  rounds INTEGER NOT NULL DEFAULT 0,"
    "  not_before_ms INTEGER NOT NULL DEFAULT 0,"
    "  claimed_by TEXT,"
    "  lease_until_ms INTEGER NOT NULL DEFAULT 0,"
    "  token_env TEXT,"
    "  gated INTEGER NOT NULL DEFAULT 1 CHECK (gated IN (0, 1)),"
    "  created_at INTEGER NOT NULL,"
    "  started_at INTEGER NOT NULL DEFAULT 0,"
    "  ended_at INTEGER NOT NULL DEFAULT 0"
    ");"
    "INSERT INTO pushes_v5 (id, checkpoint_id, endpoint_id, export_id, mode, reason, state,"
    "  http_status, error, attempts, rounds, created_at, started_at, ended_at)"
    "  SELECT p.id, e.checkpoint_id, p.endpoint_id, p.export_id,"
    "    CASE WHEN e.format = 'push-full' THEN 'full' ELSE 'incremental' END, 'push', p.state,"
    "    p.http_status, p.error, p.attempts, 1, p.started_at, p.started_at, p.ended_at"
    "  FROM pushes p JOIN exports e ON e.id = p.export_id;"
    "UPDATE pushes_v5 SET job_id = (SELECT r.job_id FROM checkpoints c JOIN runs r"
    "  ON r.id = c.run_id WHERE c.id = pushes_v5.checkpoint_id),"
    "  run_id = (SELECT c.run_id FROM checkpoints c WHERE c.id = pushes_v5.checkpoint_id);"
    "DROP TABLE pushes;"
    "ALTER TABLE pushes_v5 RENAME TO pushes;"
    "CREATE INDEX pushes_by_export ON pushes (export_id) WHERE export_id IS NOT NULL;"
    "CREATE INDEX pushes_by_endpoint ON pushes (endpoint_id, id);"
    "CREATE INDEX pushes_by_checkpoint ON pushes (checkpoint_id, id);"
    "CREATE INDEX pushes_by_run ON pushes (run_id, id) WHERE run_id IS NOT NULL;"
    "CREATE INDEX pushes_open ON pushes (state, not_before_ms)"
    "  WHERE state IN ('pending', 'sending');"
    "PRAGMA user_version = 5;";

/* v6: the Slurm job of each run of launcher: slurm (its id, state and nodes,
 * as kilnd last saw them), for the run page and for finding the job again. */
static const char migration_6[] =
    "CREATE TABLE slurm_jobs ("
    "  run_id INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,"
    "  job_id INTEGER NOT NULL,"
    "  state TEXT NOT NULL,"
    "  nodes TEXT,"
    "  partition TEXT,"
    "  updated_at INTEGER NOT NULL"
    ");"
    "PRAGMA user_version = 6;";

/* v7: job control and retention (docs/operations.md, "Job control", "Retention").
 * - jobs.deleted_at: `kiln delete` hides a job from the lists and the
 *   scheduler but keeps the row, so its runs, checkpoints and lineage stay
 *   readable; submitting the name again brings it back.
 * - jobs.last_checked_at, skipped_fires, last_skip_reason: a cron fire that
 *   is skipped (no new data, missed, concurrency: forbid) is counted on the
 *   job instead of being recorded as a run.
 * - runs_by_ended: the retention pass finds old ended runs by index. */
static const char migration_7[] =
    "ALTER TABLE jobs ADD COLUMN deleted_at INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE jobs ADD COLUMN last_checked_at INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE jobs ADD COLUMN skipped_fires INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE jobs ADD COLUMN last_skip_reason TEXT;"
    "CREATE INDEX runs_by_ended ON runs (ended_at) WHERE ended_at > 0;"
    "PRAGMA user_version = 7;";

/* v8: jobs.timezone, the zone a job's schedule fires in (the spec's
 * `timezone`, "UTC" by default), so that the job lists and the web page read
 * it instead of parsing every job's YAML for every row. Written with the job
 * on every submit; the rows of an older file are filled from their stored
 * specs by the migration's backfill (state.c) after the script (NULL, read as UTC, where a
 * stored spec no longer parses). */
static const char migration_8[] = "ALTER TABLE jobs ADD COLUMN timezone TEXT;"
                                  "PRAGMA user_version = 8;";

/* v9: retention compacts (docs/operations.md, "Retention").
 * - runs.compacted_at: when retention dropped the run's events, loss
 *   points, Slurm record and log, keeping what correctness needs (its
 *   consumed inputs, checkpoints a chain or lineage needs); 0: whole.
 * - runs_to_compact: the pass finds the old runs not compacted yet by index,
 *   without walking the compacted ones.
 * - run_inputs_by_cover: removing a checkpoint checks the inputs it covers
 *   by index rather than by a scan (the foreign key's lookup). */
static const char migration_9[] =
    "ALTER TABLE runs ADD COLUMN compacted_at INTEGER NOT NULL DEFAULT 0;"
    "CREATE INDEX runs_to_compact ON runs (ended_at) WHERE ended_at > 0 AND compacted_at = 0;"
    "CREATE INDEX run_inputs_by_cover ON run_inputs (covered_by);"
    "PRAGMA user_version = 9;";

const state_migration_t state_migrations[STATE_SCHEMA_VERSION] = {
    {"v1: jobs, runs, events", migration_1, STATE_BACKFILL_NONE, false},
    {"v2: job_versions, run_inputs, metrics, checkpoints, exports, endpoints, "
     "endpoint_holdings, pushes",
     migration_2, STATE_BACKFILL_NONE, false},
    {"v3: run_counts, run_durations (kept by triggers), runs_by_job_state", migration_3,
     STATE_BACKFILL_NONE, false},
    {"v4: events_by_job_kind", migration_4, STATE_BACKFILL_NONE, false},
    {"v5: spec_dir, start checkpoints, checkpoint eval figures, endpoints by label, the push "
     "queue",
     migration_5, STATE_BACKFILL_NONE, true},
    {"v6: slurm_jobs", migration_6, STATE_BACKFILL_NONE, false},
    {"v7: deleted jobs, skipped fires counted on the job, runs_by_ended", migration_7,
     STATE_BACKFILL_NONE, false},
    {"v8: jobs.timezone", migration_8, STATE_BACKFILL_TIMEZONES, false},
    {"v9: compacted runs, runs_to_compact, run_inputs_by_cover", migration_9, STATE_BACKFILL_NONE,
     false},
};
