/*
 * state/state_int.h - what the files of state/ share and nothing outside the
 * module includes (tests/test_state.c excepted, for the hooks at the end):
 * the connection struct, the table of SQL statements, the helpers that bind,
 * step and read them, the transaction runner with its SQLITE_BUSY retry loop,
 * and the migration table.
 */
#ifndef KILN_STATE_STATE_INT_H
#define KILN_STATE_STATE_INT_H

#include "state.h"
#include "state_test.h" /* the raw-SQL hooks, defined in state.c */

#include <sqlite3.h>
#include <stdarg.h>
#include <stddef.h>

#include "kiln.h"

/* How long one statement waits for a lock before SQLite gives up, and how many
 * times a whole transaction is rerun after that (so a writer waits up to
 * STATE_BUSY_TIMEOUT_MS * STATE_BUSY_TRIES before reporting the file busy). */
#define STATE_BUSY_TIMEOUT_MS 10000
#define STATE_BUSY_TRIES 4

/* ---- the statement table ----------------------------------------------------
 * Every statement Kiln runs, with bound parameters only. Prepared on first use
 * and cached on the state_t (state_stmt). Column lists shared by several
 * SELECTs are macros so that one row reader serves them all. */
#define STATE_JOB_COLS                                                                             \
    "id, name, spec_yaml, spec_hash, schedule, priority, version, paused, "                        \
    "created_at, updated_at, last_scheduled_at, spec_dir, deleted_at, last_checked_at, "           \
    "skipped_fires, last_skip_reason, timezone"
#define STATE_RUN_COLS                                                          \
    "r.id, r.job_id, j.name, r.job_version, r.state, r.trigger, r.attempt, "    \
    "r.retry_of, r.scheduled_at, r.queued_at, r.started_at, r.ended_at, "       \
    "r.not_before, r.exit_code, r.error, r.run_dir, r.pgid, r.host, "           \
    "r.cancel_requested, r.spec_dir, r.start_checkpoint_id"
#define STATE_RUN_FROM " FROM runs r JOIN jobs j ON j.id = r.job_id "
#define STATE_CKPT_COLS                                                         \
    "c.id, c.uid, c.run_id, c.parent_id, c.kind, c.path, c.step, c.keys, "      \
    "c.bytes, c.checksum, c.created_at, c.eval_logloss, c.eval_auc, c.online"
#define STATE_PUSH_COLS                                                         \
    "p.id, p.job_id, p.run_id, p.checkpoint_id, p.endpoint_id, p.export_id, "   \
    "j.name, c.uid, c.path, n.url, n.model, n.label, p.mode, p.reason, "        \
    "p.state, p.http_status, p.error, p.attempts, p.rounds, p.not_before_ms, "  \
    "p.claimed_by, p.lease_until_ms, p.token_env, p.created_at, p.started_at, " \
    "p.ended_at, p.gated, x.format"
#define STATE_PUSH_FROM                                                         \
    " FROM pushes p JOIN checkpoints c ON c.id = p.checkpoint_id "              \
    "JOIN endpoints n ON n.id = p.endpoint_id LEFT JOIN jobs j ON j.id = p.job_id " \
    "LEFT JOIN exports x ON x.id = p.export_id "
#define STATE_EVENT_COLS "id, job_id, run_id, at, kind, message"

#define STATE_STMTS(X)                                                                             \
    X(USER_VERSION, "PRAGMA user_version")                                                         \
    X(APPLICATION_ID, "PRAGMA application_id")                                                     \
    /* the tables of the file (not SQLite's own), Kiln's first three first */                      \
    X(TABLES, "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "  \
              "ORDER BY name NOT IN ('jobs', 'runs', 'events'), name")                             \
    X(BEGIN, "BEGIN IMMEDIATE")                                                                    \
    X(COMMIT, "COMMIT")                                                                            \
    X(ROLLBACK, "ROLLBACK")                                                                        \
    /* jobs */                                                                                     \
    X(JOB_FIND, "SELECT id, spec_hash, version FROM jobs WHERE name = ?1")                         \
    X(JOB_INSERT, "INSERT INTO jobs (name, spec_yaml, spec_hash, schedule, priority, "             \
                  "version, paused, created_at, updated_at, last_scheduled_at, spec_dir, "         \
                  "timezone) VALUES (?1, ?2, ?3, ?4, ?5, 1, 0, ?6, ?6, 0, ?7, ?8)")                \
    /* ?7 NULL keeps the job's spec_dir (a spec with no file of its own). A deleted job that is    \
     * submitted again comes back with its schedule starting now (JOB_REVIVE). */                  \
    X(JOB_UPDATE_SPEC, "UPDATE jobs SET spec_yaml = ?2, spec_hash = ?3, schedule = ?4, "           \
                       "priority = ?5, version = version + 1, updated_at = ?6, "                   \
                       "spec_dir = coalesce(?7, spec_dir), timezone = ?8 WHERE id = ?1")           \
    X(JOB_UPDATE_SAME, "UPDATE jobs SET schedule = ?2, priority = ?3, "                            \
                       "spec_dir = coalesce(?4, spec_dir), timezone = ?5 WHERE id = ?1")           \
    /* migration 8's backfill (schema.c): the jobs whose zone is not known yet */                  \
    X(JOB_TZ_MISSING, "SELECT id, name, spec_yaml FROM jobs WHERE timezone IS NULL ORDER BY id")   \
    X(JOB_SET_TZ, "UPDATE jobs SET timezone = ?2 WHERE id = ?1")                                   \
    X(JOB_REVIVE, "UPDATE jobs SET deleted_at = 0, paused = 0, last_scheduled_at = ?2 "            \
                  "WHERE id = ?1 AND deleted_at > 0")                                              \
    X(JOB_DELETE, "UPDATE jobs SET deleted_at = ?2, updated_at = ?2 WHERE id = ?1")                \
    X(JOB_SKIP, "UPDATE jobs SET skipped_fires = skipped_fires + 1, last_checked_at = ?2, "        \
                "last_skip_reason = ?3 WHERE id = ?1")                                             \
    X(JOB_ACTIVE_RUNS, "SELECT id FROM runs WHERE job_id = ?1 "                                    \
                       "AND state IN ('queued', 'launching', 'running') ORDER BY id")              \
    X(JOB_VERSION_INSERT, "INSERT INTO job_versions (job_id, version, spec_yaml, spec_hash, "      \
                          "created_at, spec_dir) SELECT id, version, spec_yaml, spec_hash, "       \
                          "updated_at, spec_dir FROM jobs WHERE id = ?1")                          \
    X(JOB_GET_BY_NAME, "SELECT " STATE_JOB_COLS " FROM jobs WHERE name = ?1")                      \
    X(JOB_GET_BY_ID, "SELECT " STATE_JOB_COLS " FROM jobs WHERE id = ?1")                          \
    X(JOB_LIST, "SELECT " STATE_JOB_COLS " FROM jobs WHERE deleted_at = 0 ORDER BY name")          \
    X(JOB_SET_PAUSED, "UPDATE jobs SET paused = ?2, updated_at = ?3 WHERE id = ?1")                \
    X(JOB_SET_LAST_SCHEDULED, "UPDATE jobs SET last_scheduled_at = max(last_scheduled_at, ?2) "    \
                              "WHERE id = ?1")                                                     \
    X(JOB_VERSION_OF, "SELECT version FROM jobs WHERE id = ?1")                                    \
    X(JOB_VERSION_SPEC, "SELECT spec_yaml FROM job_versions WHERE job_id = ?1 AND version = ?2")   \
    /* runs */                                                                                     \
    X(RUN_INSERT, "INSERT INTO runs (job_id, job_version, state, trigger, attempt, "               \
                  "retry_of, scheduled_at, queued_at, spec_dir) "                                  \
                  "VALUES (?1, ?2, 'queued', ?3, ?4, ?5, ?6, ?7, "                                 \
                  "(SELECT spec_dir FROM jobs WHERE id = ?1))")                                    \
    X(RUN_FIND_SCHEDULED,                                                                          \
      "SELECT id FROM runs WHERE job_id = ?1 AND scheduled_at = ?2 "                               \
      "AND scheduled_at > 0 AND trigger IN ('cron', 'catchup') AND attempt = 1")                   \
    X(RUN_GET, "SELECT " STATE_RUN_COLS STATE_RUN_FROM "WHERE r.id = ?1")                          \
    X(RUN_LIST_ALL, "SELECT " STATE_RUN_COLS STATE_RUN_FROM "ORDER BY r.id DESC LIMIT ?1")         \
    X(RUN_LIST_JOB,                                                                                \
      "SELECT " STATE_RUN_COLS STATE_RUN_FROM "WHERE r.job_id = ?1 ORDER BY r.id DESC LIMIT ?2")   \
    X(RUN_LIST_STATE, "SELECT " STATE_RUN_COLS STATE_RUN_FROM "WHERE r.state = ?1 ORDER BY r.id")  \
    X(RUN_STATE_OF, "SELECT state, job_id, cancel_requested FROM runs WHERE id = ?1")              \
    X(RUN_SET_STATE, "UPDATE runs SET state = ?3 WHERE id = ?1 AND state = ?2")                    \
    X(RUN_SET_STARTED, "UPDATE runs SET started_at = ?2 WHERE id = ?1 AND started_at = 0")         \
    X(RUN_SET_ENDED, "UPDATE runs SET ended_at = ?2, exit_code = ?3, error = ?4 WHERE id = ?1")    \
    X(RUN_SET_LAUNCH, "UPDATE runs SET run_dir = ?2, pgid = ?3, host = ?4 WHERE id = ?1")          \
    X(RUN_CLEAR_LAUNCH, "UPDATE runs SET run_dir = NULL, pgid = 0, host = NULL WHERE id = ?1")     \
    X(RUN_SET_NOT_BEFORE, "UPDATE runs SET not_before = ?2 WHERE id = ?1")                         \
    X(RUN_SET_START_CKPT, "UPDATE runs SET start_checkpoint_id = ?2 WHERE id = ?1")                \
    X(RUN_SET_CANCEL, "UPDATE runs SET cancel_requested = 1 WHERE id = ?1")                        \
    X(RUN_JOB_OF, "SELECT job_id FROM runs WHERE id = ?1")                                         \
    X(RUN_DELETE, "DELETE FROM runs WHERE id = ?1")                                                \
    /* retention (retain.c): ended runs older than ?1 not compacted yet, but the newest run and    \
     * the newest success of their job (LAST RUN, last success). */                                \
    X(RETAIN_COMPACTABLE,                                                                          \
      "SELECT r.id, r.run_dir FROM runs r WHERE r.ended_at > 0 AND r.ended_at < ?1 "               \
      "AND r.compacted_at = 0 "                                                                    \
      "AND r.state IN ('succeeded', 'failed', 'canceled', 'timed_out', 'skipped') "                \
      "AND r.id != (SELECT max(x.id) FROM runs x WHERE x.job_id = r.job_id) "                      \
      "AND r.id IS NOT (SELECT max(x.id) FROM runs x WHERE x.job_id = r.job_id "                   \
      "  AND x.state = 'succeeded') ORDER BY r.ended_at LIMIT ?2")                                 \
    X(RETAIN_RUN_EVENTS, "DELETE FROM events WHERE run_id = ?1")                                   \
    X(RETAIN_RUN_METRICS, "DELETE FROM metrics WHERE run_id = ?1")                                 \
    X(RETAIN_RUN_SLURM, "DELETE FROM slurm_jobs WHERE run_id = ?1")                                \
    /* inputs that do not count as consumed: the run failed, no checkpoint covers them */          \
    X(RETAIN_RUN_UNCONSUMED,                                                                       \
      "DELETE FROM run_inputs WHERE run_id = ?1 AND covered_by IS NULL AND NOT EXISTS "            \
      "(SELECT 1 FROM runs r WHERE r.id = ?1 AND r.state = 'succeeded')")                          \
    X(RETAIN_RUN_MARK, "UPDATE runs SET compacted_at = ?2, run_dir = NULL WHERE id = ?1")          \
    /* the inputs compacted runs keep, below id ?1, newest first */                                \
    X(RETAIN_INPUTS_KEPT, "SELECT i.id, i.path FROM run_inputs i JOIN runs r ON r.id = i.run_id "  \
                          "WHERE i.id < ?1 AND r.compacted_at > 0 ORDER BY i.id DESC LIMIT ?2")    \
    X(RETAIN_INPUT_DROP, "DELETE FROM run_inputs WHERE id = ?1 AND run_id IN "                     \
                         "(SELECT id FROM runs WHERE compacted_at > 0)")                           \
    /* Checkpoints of compacted runs that nothing needs, below id ?1, newest first (a child        \
     * before its parent). Needed: a whole run's checkpoints and start checkpoint, what an         \
     * endpoint holds or an open or held push carries, what covers an input, each job's newest     \
     * checkpoint, and every link an incremental one stands on (a full ends the chain). */         \
    X(RETAIN_CKPT_UNNEEDED,                                                                        \
      "WITH RECURSIVE need(id) AS ("                                                               \
      "SELECT c.id FROM checkpoints c LEFT JOIN runs r ON r.id = c.run_id "                        \
      "  WHERE r.id IS NULL OR r.compacted_at = 0 "                                                \
      "UNION SELECT start_checkpoint_id FROM runs WHERE compacted_at = 0 "                         \
      "UNION SELECT checkpoint_id FROM endpoint_holdings WHERE until_at IS NULL "                  \
      "UNION SELECT checkpoint_id FROM pushes WHERE state IN ('pending', 'sending', 'held') "      \
      "UNION SELECT covered_by FROM run_inputs WHERE covered_by IS NOT NULL "                      \
      "UNION SELECT (SELECT c.id FROM checkpoints c JOIN runs r ON r.id = c.run_id "               \
      "  WHERE r.job_id = j.id ORDER BY c.created_at DESC, c.id DESC LIMIT 1) FROM jobs j "        \
      "UNION SELECT c.parent_id FROM checkpoints c JOIN need n ON n.id = c.id "                    \
      "  WHERE c.kind = 'incremental') "                                                           \
      "SELECT c.id, c.path FROM checkpoints c JOIN runs r ON r.id = c.run_id "                     \
      "WHERE r.compacted_at > 0 AND c.id < ?1 "                                                    \
      "AND c.id NOT IN (SELECT id FROM need WHERE id IS NOT NULL) ORDER BY c.id DESC LIMIT ?2")    \
    /* removing checkpoint ?1 with the ended pushes, closed holdings and exports of it */          \
    X(RETAIN_CKPT_UNHOLD, "UPDATE endpoint_holdings SET push_id = NULL WHERE push_id IN "          \
                          "(SELECT id FROM pushes WHERE checkpoint_id = ?1)")                      \
    X(RETAIN_CKPT_HOLDINGS,                                                                        \
      "DELETE FROM endpoint_holdings WHERE checkpoint_id = ?1 AND until_at IS NOT NULL")           \
    X(RETAIN_CKPT_UNEXPORT, "UPDATE pushes SET export_id = NULL WHERE export_id IN "               \
                            "(SELECT id FROM exports WHERE checkpoint_id = ?1)")                   \
    X(RETAIN_CKPT_PUSHES, "DELETE FROM pushes WHERE checkpoint_id = ?1 "                           \
                          "AND state IN ('succeeded', 'failed', 'superseded')")                    \
    X(RETAIN_CKPT_EXPORTS, "DELETE FROM exports WHERE checkpoint_id = ?1")                         \
    X(RETAIN_CKPT_UNBASE,                                                                          \
      "UPDATE exports SET base_checkpoint_id = NULL WHERE base_checkpoint_id = ?1")                \
    X(RETAIN_CKPT_UNSTART,                                                                         \
      "UPDATE runs SET start_checkpoint_id = NULL WHERE start_checkpoint_id = ?1")                 \
    /* a full's parent is lineage only: the full stands alone */                                   \
    X(RETAIN_CKPT_UNPARENT,                                                                        \
      "UPDATE checkpoints SET parent_id = NULL WHERE parent_id = ?1 AND kind = 'full'")            \
    X(RETAIN_CKPT_DELETE, "DELETE FROM checkpoints WHERE id = ?1 AND NOT EXISTS "                  \
                          "(SELECT 1 FROM checkpoints x WHERE x.parent_id = ?1)")                  \
    /* compacted runs nothing refers to any more: no checkpoint, input or push */                  \
    X(RETAIN_REMOVABLE, "SELECT r.id FROM runs r WHERE r.compacted_at > 0 "                        \
                        "AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.run_id = r.id) "      \
                        "AND NOT EXISTS (SELECT 1 FROM run_inputs i WHERE i.run_id = r.id) "       \
                        "AND NOT EXISTS (SELECT 1 FROM pushes p WHERE p.run_id = r.id) "           \
                        "AND r.id != (SELECT max(x.id) FROM runs x WHERE x.job_id = r.job_id) "    \
                        "AND r.id IS NOT (SELECT max(x.id) FROM runs x WHERE x.job_id = r.job_id " \
                        "  AND x.state = 'succeeded') ORDER BY r.id LIMIT ?1")                     \
    X(RUN_UNLINK_RETRIES, "UPDATE runs SET retry_of = NULL WHERE retry_of = ?1")                   \
    /* job events (run_id NULL) older than ?1, but the job's submits and spec versions */          \
    X(EVENT_PRUNE, "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE run_id IS NULL "   \
                   "AND at < ?1 AND kind NOT IN ('submit', 'spec') ORDER BY id LIMIT ?2)")         \
    /* events */                                                                                   \
    X(EVENT_INSERT, "INSERT INTO events (job_id, run_id, at, kind, message) "                      \
                    "VALUES (?1, ?2, ?3, ?4, ?5)")                                                 \
    X(EVENT_LIST_RUN, "SELECT " STATE_EVENT_COLS " FROM events WHERE run_id = ?1 ORDER BY id")     \
    X(EVENT_LIST_JOB, "SELECT " STATE_EVENT_COLS " FROM events WHERE job_id = ?1 ORDER BY id")     \
    X(EVENT_LIST_ALL, "SELECT " STATE_EVENT_COLS " FROM events ORDER BY id")                       \
    /* inputs */                                                                                   \
    X(INPUT_INSERT, "INSERT INTO run_inputs (run_id, path, size, mtime, checksum) "                \
                    "VALUES (?1, ?2, ?3, ?4, ?5)")                                                 \
    X(INPUT_DELETE_RUN, "DELETE FROM run_inputs WHERE run_id = ?1")                                \
    X(INPUT_LIST, "SELECT path, size, mtime, checksum FROM run_inputs WHERE run_id = ?1 "          \
                  "ORDER BY id")                                                                   \
    X(INPUT_CONSUMED,                                                                              \
      "SELECT 1 FROM run_inputs i JOIN runs r ON r.id = i.run_id "                                 \
      "WHERE r.job_id = ?1 AND (r.state = 'succeeded' OR i.covered_by IS NOT NULL) "               \
      "AND i.path = ?2 AND i.size = ?3 AND i.mtime = ?4 AND i.checksum IS ?5 LIMIT 1")             \
    X(INPUT_CONSUMED_RUN,                                                                          \
      "SELECT i.run_id FROM run_inputs i JOIN runs r ON r.id = i.run_id "                          \
      "WHERE r.job_id = ?1 AND (r.state = 'succeeded' OR i.covered_by IS NOT NULL) "               \
      "AND i.path = ?2 ORDER BY i.id DESC LIMIT 1")                                                \
    X(INPUT_COVER,                                                                                 \
      "UPDATE run_inputs SET covered_by = ?2 WHERE run_id = ?1 AND covered_by IS NULL")            \
    X(INPUT_RUNS, "SELECT DISTINCT run_id FROM run_inputs WHERE path = ?1 "                        \
                  "ORDER BY run_id DESC LIMIT ?2")                                                 \
    /* metrics */                                                                                  \
    X(METRIC_INSERT, "INSERT INTO metrics (run_id, step, name, value, at) "                        \
                     "VALUES (?1, ?2, ?3, ?4, ?5)")                                                \
    X(METRIC_SERIES, "SELECT step, value, at FROM metrics WHERE run_id = ?1 AND name = ?2 "        \
                     "ORDER BY step, id")                                                          \
    /* checkpoints, exports, endpoints, pushes */                                                  \
    X(CKPT_INSERT, "INSERT INTO checkpoints (uid, run_id, parent_id, kind, path, step, "           \
                   "keys, bytes, checksum, created_at, online, eval_logloss, eval_auc) "           \
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)")              \
    X(CKPT_GET, "SELECT " STATE_CKPT_COLS " FROM checkpoints c WHERE c.uid = ?1")                  \
    X(CKPT_LATEST, "SELECT " STATE_CKPT_COLS " FROM checkpoints c "                                \
                   "JOIN runs r ON r.id = c.run_id WHERE r.job_id = ?1 "                           \
                   "ORDER BY c.created_at DESC, c.id DESC LIMIT 1")                                \
    X(CKPT_NEWEST_RUN, "SELECT " STATE_CKPT_COLS " FROM checkpoints c WHERE c.run_id = ?1 "        \
                       "AND (?2 = 0 OR c.online = 1) ORDER BY c.id DESC LIMIT 1")                  \
    X(CKPT_SET_EVAL, "UPDATE checkpoints SET eval_logloss = ?2, eval_auc = ?3 WHERE id = ?1")      \
    X(CKPT_DESCENDANTS, "WITH RECURSIVE d(id) AS (SELECT ?1 UNION "                                \
                        "SELECT c.id FROM checkpoints c JOIN d ON c.parent_id = d.id UNION "       \
                        "SELECT c.id FROM runs r JOIN d ON r.start_checkpoint_id = d.id "          \
                        "JOIN checkpoints c ON c.run_id = r.id) "                                  \
                        "SELECT id FROM d WHERE id != ?1 ORDER BY id LIMIT ?2")                    \
    X(EXPORT_INSERT, "INSERT INTO exports (checkpoint_id, base_checkpoint_id, format, path, "      \
                     "bytes, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")                         \
    X(ENDPOINT_FIND, "SELECT id FROM endpoints WHERE url = ?1 AND model = ?2 AND label = ?3")      \
    X(ENDPOINT_INSERT, "INSERT INTO endpoints (url, model, label, created_at) "                    \
                       "VALUES (?1, ?2, ?3, ?4)")                                                  \
    /* ?6 NULL: a good read (numbers and time); else only the error and time. */                   \
    X(ENDPOINT_SET_STATS,                                                                          \
      "UPDATE endpoints SET stats_at = ?2, "                                                       \
      "predict_requests = CASE WHEN ?6 IS NULL THEN ?3 ELSE predict_requests END, "                \
      "predict_rows = CASE WHEN ?6 IS NULL THEN ?4 ELSE predict_rows END, "                        \
      "request_rate = CASE WHEN ?6 IS NULL THEN ?5 ELSE request_rate END, "                        \
      "stats_error = ?6 WHERE id = ?1")                                                            \
    /* the push queue (pushes.c) */                                                                \
    X(PUSH_INSERT, "INSERT INTO pushes (job_id, run_id, checkpoint_id, endpoint_id, mode, "        \
                   "reason, state, claimed_by, lease_until_ms, token_env, created_at, "            \
                   "started_at, gated) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, "     \
                   "?12, ?13)")                                                                    \
    X(PUSH_PENDING_TO, "SELECT id FROM pushes WHERE endpoint_id = ?1 AND state = 'pending' "       \
                       "AND id < ?2")                                                              \
    X(PUSH_SUPERSEDE, "UPDATE pushes SET state = 'superseded', ended_at = ?2, error = ?3, "        \
                      "claimed_by = NULL, lease_until_ms = 0 WHERE id = ?1")                       \
    X(PUSH_GET, "SELECT " STATE_PUSH_COLS STATE_PUSH_FROM "WHERE p.id = ?1")                       \
    /* ?2: open only (pending, sending); ?3: limit */                                              \
    X(PUSH_LIST_RUN, "SELECT " STATE_PUSH_COLS STATE_PUSH_FROM "WHERE p.run_id = ?1 AND "          \
                     "(?2 = 0 OR p.state IN ('pending', 'sending')) ORDER BY p.id DESC LIMIT ?3")  \
    X(PUSH_LIST_CKPT, "SELECT " STATE_PUSH_COLS STATE_PUSH_FROM "WHERE p.checkpoint_id = ?1 AND "  \
                      "(?2 = 0 OR p.state IN ('pending', 'sending')) ORDER BY p.id DESC LIMIT ?3") \
    X(PUSH_LIST_ENDPOINT,                                                                          \
      "SELECT " STATE_PUSH_COLS STATE_PUSH_FROM "WHERE p.endpoint_id = ?1 AND "                    \
      "(?2 = 0 OR p.state IN ('pending', 'sending')) ORDER BY p.id DESC LIMIT ?3")                 \
    X(PUSH_LIST_JOB, "SELECT " STATE_PUSH_COLS STATE_PUSH_FROM "WHERE p.job_id = ?1 AND "          \
                     "(?2 = 0 OR p.state IN ('pending', 'sending')) ORDER BY p.id DESC LIMIT ?3")  \
    X(PUSH_LIST_ALL, "SELECT " STATE_PUSH_COLS STATE_PUSH_FROM "WHERE ?1 = ?1 AND "                \
                     "(?2 = 0 OR p.state IN ('pending', 'sending')) ORDER BY p.id DESC LIMIT ?3")  \
    X(PUSH_DUE, "SELECT id, endpoint_id FROM pushes WHERE state IN ('pending', 'sending') "        \
                "AND ((state = 'pending' AND not_before_ms <= ?1) OR "                             \
                "(state = 'sending' AND lease_until_ms < ?1)) ORDER BY id LIMIT ?2")               \
    X(PUSH_ENDPOINT_BUSY, "SELECT 1 FROM pushes WHERE endpoint_id = ?1 AND state = 'sending' "     \
                          "AND lease_until_ms >= ?2 AND id != ?3 LIMIT 1")                         \
    X(PUSH_NEWER, "SELECT id FROM pushes WHERE endpoint_id = ?1 AND id > ?2 "                      \
                  "AND state IN ('pending', 'sending', 'succeeded') ORDER BY id LIMIT 1")          \
    X(PUSH_CLAIM, "UPDATE pushes SET state = 'sending', claimed_by = ?2, lease_until_ms = ?3, "    \
                  "started_at = CASE WHEN started_at = 0 THEN ?4 ELSE started_at END "             \
                  "WHERE id = ?1")                                                                 \
    X(PUSH_CLAIMED, "SELECT id, claimed_by FROM pushes WHERE state = 'sending'")                   \
    X(PUSH_UNCLAIM, "UPDATE pushes SET state = 'pending', claimed_by = NULL, "                     \
                    "lease_until_ms = 0 WHERE id = ?1 AND state = 'sending'")                      \
    X(PUSH_NEXT_DUE, "SELECT min(not_before_ms) FROM pushes WHERE state = 'pending'")              \
    X(PUSH_OWNER, "SELECT state, claimed_by, endpoint_id, checkpoint_id, job_id, run_id "          \
                  "FROM pushes WHERE id = ?1")                                                     \
    X(PUSH_END, "UPDATE pushes SET state = ?2, http_status = ?3, error = ?4, "                     \
                "attempts = attempts + ?5, rounds = rounds + 1, not_before_ms = ?6, "              \
                "export_id = coalesce(?7, export_id), claimed_by = NULL, "                         \
                "lease_until_ms = 0, ended_at = ?8 WHERE id = ?1")                                 \
    X(HOLDING_CURRENT, "SELECT checkpoint_id, since FROM endpoint_holdings "                       \
                       "WHERE endpoint_id = ?1 AND until_at IS NULL")                              \
    X(HOLDING_CLOSE, "UPDATE endpoint_holdings SET until_at = ?2 "                                 \
                     "WHERE endpoint_id = ?1 AND until_at IS NULL")                                \
    X(HOLDING_INSERT, "INSERT INTO endpoint_holdings (endpoint_id, checkpoint_id, push_id, "       \
                      "since) VALUES (?1, ?2, ?3, ?4)")                                            \
    /* the scheduler and lineage (sched.c) */                                                      \
    X(DATA_VERSION, "PRAGMA data_version")                                                         \
    X(RUN_RETRY_OF, "SELECT id FROM runs WHERE retry_of = ?1 LIMIT 1")                             \
    X(CKPT_GET_BY_ID, "SELECT " STATE_CKPT_COLS " FROM checkpoints c WHERE c.id = ?1")             \
    X(CKPT_LIST_RUN, "SELECT " STATE_CKPT_COLS " FROM checkpoints c WHERE c.run_id = ?1 "          \
                     "ORDER BY c.created_at, c.id")                                                \
    X(LINEAGE_SERVED, "SELECT x.id, x.format, x.path, p.id, p.state, p.http_status, n.id, "        \
                      "n.url, n.model, n.label, EXISTS (SELECT 1 FROM endpoint_holdings h "        \
                      "WHERE h.endpoint_id = n.id AND h.checkpoint_id = p.checkpoint_id "          \
                      "AND h.until_at IS NULL) FROM pushes p "                                     \
                      "JOIN endpoints n ON n.id = p.endpoint_id "                                  \
                      "LEFT JOIN exports x ON x.id = p.export_id WHERE p.checkpoint_id = ?1 "      \
                      "UNION ALL SELECT x.id, x.format, x.path, NULL, NULL, 0, NULL, NULL, "       \
                      "NULL, NULL, 0 FROM exports x WHERE x.checkpoint_id = ?1 AND NOT EXISTS "    \
                      "(SELECT 1 FROM pushes p WHERE p.export_id = x.id) ORDER BY 4, 1")           \
    X(ENDPOINT_BY_URL, "SELECT id FROM endpoints WHERE url = ?1 AND (?2 IS NULL OR model = ?2) "   \
                       "AND (?3 IS NULL OR label = ?3) ORDER BY id LIMIT 1")                       \
    /* the web page (queries_web.c); ?1 before id, ?2 limit, ?3 job, ?4 state */                   \
    X(WEB_RUN_PAGE_ALL, "SELECT id FROM runs WHERE id < ?1 ORDER BY id DESC LIMIT ?2")             \
    X(WEB_RUN_PAGE_JOB,                                                                            \
      "SELECT id FROM runs WHERE job_id = ?3 AND id < ?1 ORDER BY id DESC LIMIT ?2")               \
    X(WEB_RUN_PAGE_STATE,                                                                          \
      "SELECT id FROM runs WHERE state = ?4 AND id < ?1 ORDER BY id DESC LIMIT ?2")                \
    X(WEB_RUN_PAGE_JOB_STATE, "SELECT id FROM runs WHERE job_id = ?3 AND state = ?4 AND id < ?1 "  \
                              "ORDER BY id DESC LIMIT ?2")                                         \
    X(WEB_JOB_LAST_RUN, "SELECT id, state, queued_at FROM runs WHERE job_id = ?1 "                 \
                        "ORDER BY id DESC LIMIT 1")                                                \
    X(WEB_JOB_LAST_SUCCESS, "SELECT ended_at FROM runs WHERE job_id = ?1 AND state = 'succeeded' " \
                            "ORDER BY id DESC LIMIT 1")                                            \
    X(WEB_METRIC_LAST, "SELECT value FROM metrics WHERE run_id = ?1 AND name = ?2 "                \
                       "ORDER BY step DESC, id DESC LIMIT 1")                                      \
    X(WEB_RUN_COUNTS, "SELECT job_id, state, n FROM run_counts WHERE n > 0 "                       \
                      "ORDER BY job_id, state")                                                    \
    X(WEB_RUN_DURATIONS, "SELECT job_id, le, n, sum_s FROM run_durations ORDER BY job_id, le")     \
    X(WEB_ENDPOINT_LIST, "SELECT n.id, n.url, n.model, n.label, n.created_at, h.checkpoint_id, "   \
                         "h.since, c.uid, coalesce(a.failed, 0), coalesce(a.ok, 0), "              \
                         "coalesce(a.open, 0), coalesce(a.held, 0), a.last, c.created_at, "        \
                         "c.eval_logloss, c.eval_auc, "                                            \
                         "(SELECT CASE WHEN p.state = 'succeeded' THEN NULL ELSE p.error END "     \
                         " FROM pushes p WHERE p.endpoint_id = n.id ORDER BY p.id DESC LIMIT 1), " \
                         "(SELECT CASE WHEN p.state = 'succeeded' THEN 0 ELSE p.http_status END "  \
                         " FROM pushes p WHERE p.endpoint_id = n.id ORDER BY p.id DESC LIMIT 1), " \
                         "n.stats_at, n.predict_requests, n.predict_rows, n.request_rate, "        \
                         "n.stats_error FROM endpoints n LEFT JOIN endpoint_holdings h "           \
                         "ON h.endpoint_id = n.id AND h.until_at IS NULL "                         \
                         "LEFT JOIN checkpoints c ON c.id = h.checkpoint_id "                      \
                         "LEFT JOIN (SELECT endpoint_id, sum(state = 'failed') AS failed, "        \
                         "sum(state = 'succeeded') AS ok, sum(state IN ('pending', 'sending')) "   \
                         "AS open, sum(state = 'held') AS held, max(created_at) AS last "          \
                         "FROM pushes GROUP BY endpoint_id) a ON a.endpoint_id = n.id "            \
                         "ORDER BY n.model, n.label, n.url")                                       \
    X(WEB_HOLDING_HISTORY,                                                                         \
      "SELECT h.checkpoint_id, c.uid, h.since, h.until_at, h.push_id "                             \
      "FROM endpoint_holdings h JOIN checkpoints c ON c.id = h.checkpoint_id "                     \
      "WHERE h.endpoint_id = ?1 ORDER BY h.since DESC, h.id DESC LIMIT ?2")                        \
    X(WEB_CKPT_CHILDREN, "SELECT id FROM checkpoints WHERE parent_id = ?1 ORDER BY id LIMIT ?2")   \
    /* Slurm jobs of runs (slurm.c) */                                                             \
    X(SLURM_JOB_GET, "SELECT run_id, job_id, state, nodes, partition, updated_at "                 \
                     "FROM slurm_jobs WHERE run_id = ?1")                                          \
    X(SLURM_JOB_PUT, "INSERT INTO slurm_jobs (run_id, job_id, state, nodes, partition, "           \
                     "updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (run_id) DO "        \
                     "UPDATE SET job_id = excluded.job_id, state = excluded.state, "               \
                     "nodes = excluded.nodes, partition = excluded.partition, "                    \
                     "updated_at = excluded.updated_at")

typedef enum {
#define STATE_STMT_ENUM(name, sql) STMT_##name,
    STATE_STMTS(STATE_STMT_ENUM)
#undef STATE_STMT_ENUM
    STMT_COUNT
} state_stmt_id_t;

struct state {
    sqlite3 *db;
    char *path;
    sqlite3_stmt *stmts[STMT_COUNT];
    /* Set when the last SQLite failure was SQLITE_BUSY/SQLITE_LOCKED: the
     * transaction runner then reruns the whole transaction. */
    bool busy;
    /* The extended result code of the last SQLite failure (to tell a UNIQUE
     * from a FOREIGN KEY violation). */
    int last_sqlite_rc;
    char last_sqlite_msg[160]; /* and its sqlite3_errmsg */
    int busy_timeout_ms;       /* STATE_BUSY_TIMEOUT_MS but in tests */
};

/* ---- helpers (state.c) --------------------------------------------------------- */

/* Records a SQLite failure: returns KILN_EDB with "database <path>: <what>:
 * <sqlite3_errmsg>", and notes busy / the extended code on st. */
int state_sql_err(state_t *st, int sqlite_rc, const char *what);

/* SQL_CHECK(st, call, what): call returns a SQLite code; anything but OK, ROW
 * or DONE sets `rc` (which must be in scope) to KILN_EDB and jumps to `out`. */
#define SQL_CHECK(st, call, what)                                               \
    do {                                                                        \
        int sql_rc_ = (call);                                                   \
        if (sql_rc_ != SQLITE_OK && sql_rc_ != SQLITE_ROW && sql_rc_ != SQLITE_DONE) { \
            rc = state_sql_err((st), sql_rc_, (what));                          \
            goto out;                                                           \
        }                                                                       \
    } while (0)

/* Sets *out to the cached statement `id`, preparing it on first use. Returns
 * 0 or KILN_EDB. The statement comes back reset with no bindings; hand it
 * back with state_stmt_done. */
int state_stmt(state_t *st, state_stmt_id_t id, sqlite3_stmt **out /* OUT */);
/* Resets a statement and clears its bindings; accepts NULL. */
void state_stmt_done(sqlite3_stmt *s);

/* Binds parameters 1..n from a format: 'i' int, 'I' int64_t, 'J' int64_t
 * stored as NULL when 0 (optional foreign keys), 'd' double, 'n' double stored
 * as NULL when NaN (a figure not measured), 't' const char *
 * (NULL binds NULL), 'b' bool. Returns 0 or KILN_EDB. */
int state_bind(state_t *st, sqlite3_stmt *s, const char *what, const char *fmt, ...);
int state_vbind(state_t *st, sqlite3_stmt *s, const char *what, const char *fmt, va_list ap);

/* Steps s: returns 1 for a row, 0 when done, or KILN_EDB. */
int state_step(state_t *st, sqlite3_stmt *s, const char *what);
/* Steps a write to completion and resets it: 0 or KILN_EDB. */
int state_exec(state_t *st, sqlite3_stmt *s, const char *what);

/* Column readers. state_col_str duplicates a text column into *out (NULL for
 * SQL NULL); returns 0 or KILN_ENOMEM. */
int state_col_str(sqlite3_stmt *s, int col, char **out /* OUT */);
int64_t state_col_i64(sqlite3_stmt *s, int col); /* NULL reads as 0 */

/* Transactions: BEGIN IMMEDIATE (takes the write lock up front, so a
 * read-then-write inside is atomic) and COMMIT or ROLLBACK. tx_end commits
 * when rc is 0 and rolls back otherwise; it returns rc or the COMMIT error. */
int state_tx_begin(state_t *st, const char *what);
int state_tx_end(state_t *st, int rc, const char *what);
/* Decides after a try of a transaction that returned *rc: false when it is
 * done (it succeeded, failed for another reason than a busy file, or was the
 * last try, when *rc gets "database <path> stayed locked ..."); true, after a
 * short sleep that grows with attempt, to run it again. */
bool state_busy_retry(state_t *st, int *rc, int attempt, const char *what);

/* STATE_WRITE(st, what, rc, body): runs the int expression `body` in one
 * BEGIN IMMEDIATE transaction, committing when it returns 0. When SQLite
 * reported busy anywhere (the lock was held past the busy timeout), the whole
 * transaction is rolled back and rerun, up to STATE_BUSY_TRIES times, so no
 * write is lost to a contended file. body must be safe to rerun (free what a
 * failed try allocated). STATE_READ is the same without a transaction. */
#define STATE_WRITE(st, what, rc, body)                                                            \
    do {                                                                                           \
        int try_ = 0;                                                                              \
        do {                                                                                       \
            (st)->busy = false;                                                                    \
            (rc) = state_tx_begin((st), (what));                                                   \
            if ((rc) == 0)                                                                         \
                (rc) = state_tx_end((st), (body), (what));                                         \
        } while (state_busy_retry((st), &(rc), try_++, (what)));                                   \
    } while (0)

#define STATE_READ(st, what, rc, body)                                                             \
    do {                                                                                           \
        int try_ = 0;                                                                              \
        do {                                                                                       \
            (st)->busy = false;                                                                    \
            (rc) = (body);                                                                         \
        } while (state_busy_retry((st), &(rc), try_++, (what)));                                   \
    } while (0)

/* Appends an event inside the caller's transaction (events.c). job_id 0 with
 * run_id > 0 uses the run's job. message is printf-formatted. */
int state_event_insert(state_t *st, int64_t job_id, int64_t run_id, const char *kind,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Queues a run inside the caller's transaction (runs.c): state_run_create's
 * work without its own BEGIN. */
int state_run_create_tx(state_t *st, int64_t job_id, state_trigger_t trigger,
                        int64_t scheduled_at, int attempt, int64_t retry_of,
                        int64_t *run_id /* OUT */);

/* state_run_request_cancel inside the caller's transaction (runs.c). */
int state_run_cancel_tx(state_t *st, int64_t run_id, bool *done /* OUT */);
/* state_job_skip inside the caller's transaction (jobs.c). */
int state_job_skip_tx(state_t *st, int64_t job_id, int64_t at, const char *why);

/* state_endpoint_put inside the caller's transaction (pushes.c); model and
 * label are "" rather than NULL. */
int state_endpoint_put_tx(state_t *st, const state_endpoint_ref_t *e, int64_t *id /* OUT */);

/* state_push_enqueue inside the caller's transaction (pushes.c). */
int state_push_enqueue_tx(state_t *st, int64_t job_id, int64_t run_id,
                          const state_push_req_t *reqs, size_t n, const char *claimer,
                          int64_t lease_ms, int64_t *ids /* OUT */);

/* ---- row tables (rows.c) ------------------------------------------------------
 * A row table says how a SELECT's row becomes a struct: entry i names the
 * field column i fills and as what. The same table reads a row, frees the
 * strings the row owns, and sizes the array that a list of rows fills, so a
 * row type is declared once, next to its column list. */
typedef enum {
    STATE_COL_SKIP, /* read by the table's finish function, or not at all */
    STATE_COL_I64,  /* int64_t; NULL reads 0 */
    STATE_COL_INT,  /* int; NULL reads 0 */
    STATE_COL_BOOL, /* bool: the integer is not 0 */
    STATE_COL_REAL, /* double; NULL (how SQLite stores NaN) reads NAN */
    STATE_COL_TEXT, /* char *, a copy the row owns; NULL reads NULL */
} state_col_kind_t;

typedef struct state_col {
    state_col_kind_t kind;
    size_t off; /* of the field in the row's struct */
} state_col_t;

/* STATE_COL(type, field): the entry for field of struct type, of the kind
 * its C type says (int64_t, int, bool, double or char *; another type does
 * not compile). STATE_COL_SKIPPED: a column no field takes as it is. */
#define STATE_COL_KIND(x)                                                                          \
    _Generic((x), int64_t: STATE_COL_I64, int: STATE_COL_INT, bool: STATE_COL_BOOL, \
             double: STATE_COL_REAL, char *: STATE_COL_TEXT)
#define STATE_COL(type, field)                                                                     \
    {                                                                                              \
        STATE_COL_KIND(((type *)0)->field), offsetof(type, field)                                  \
    }
#define STATE_COL_SKIPPED                                                                          \
    {                                                                                              \
        STATE_COL_SKIP, 0                                                                          \
    }

typedef struct state_row {
    size_t size; /* of the row's struct */
    const state_col_t *cols;
    size_t ncols;
    /* NULL, or reads what no column kind says (an enum stored by name, a
     * flag from whether a column is NULL) once the columns are in: 0 or an
     * error. */
    int (*finish)(sqlite3_stmt *s, void *row);
} state_row_t;

/* STATE_ROW(type, cols, finish): the row table of struct `type` whose
 * columns are the array cols. */
#define STATE_ROW(type, cols, finish)                                                              \
    {                                                                                              \
        sizeof(type), cols, sizeof cols / sizeof cols[0], finish                                   \
    }

/* Zeroes row and reads the current row of s into it by m. Returns 0, or
 * KILN_ENOMEM or the finish function's error with row freed. */
int state_row_read(const state_row_t *m, sqlite3_stmt *s, void *row /* OUT */);
/* Frees the text fields of row and zeroes it; accepts NULL. */
void state_row_fini(const state_row_t *m, void *row);
/* state_row_fini on rows[0..n) and frees the array; accepts NULL. */
void state_rows_free(const state_row_t *m, void *rows, size_t n);

/* The row tables that files other than their own read by: a run
 * (STATE_RUN_COLS, runs.c), a checkpoint (STATE_CKPT_COLS, records.c), and a
 * bare int64_t from column 0 (rows.c): one int64 answer (0 when it is NULL or
 * there is no row), or a list of ids that comes back as an int64_t array. */
extern const state_row_t state_run_row, state_ckpt_row, state_i64_row;

/* The queries below prepare statement id, bind the values that follow fmt
 * (state_bind's letters), run it and reset it. */

/* Steps to the first row: returns 1 with *s on it for the caller to read
 * its columns, 0 when there is none, or an error. Whatever it returns, the
 * caller hands *s (NULL when the statement was not prepared) back with
 * state_stmt_done. */
int state_first_row(state_t *st, state_stmt_id_t id, const char *what, sqlite3_stmt **s /* OUT */,
                    const char *fmt, ...);
/* Reads the first row into row by m: returns 1 for a row, 0 when there is
 * none (row zeroed), or an error (row freed). */
int state_row_query(state_t *st, state_stmt_id_t id, const char *what, const state_row_t *m,
                    void *row /* OUT */, const char *fmt, ...);
/* Reads every row into *out, an array of *n rows by m (NULL when none).
 * Returns 0, or an error with *out NULL and *n 0. */
int state_rows_query(state_t *st, state_stmt_id_t id, const char *what, const state_row_t *m,
                     void **out /* OUT */, size_t *n /* OUT */, const char *fmt, ...);

/* state_row_query and state_rows_query for a public function that reads
 * outside any transaction: each runs in a read of its own, rerun while
 * another process holds the file (STATE_READ). */
int state_row_get(state_t *st, state_stmt_id_t id, const char *what, const state_row_t *m,
                  void *row /* OUT */, const char *fmt, ...);
int state_rows_list(state_t *st, state_stmt_id_t id, const char *what, const state_row_t *m,
                    void **out /* OUT */, size_t *n /* OUT */, const char *fmt, ...);
/* Reads the row of each of ids[0..nids) by m, each with state_row_get of
 * statement id (whose one parameter is the id), into *out, an array of *n
 * rows by m (NULL when none). An id whose row is gone by then is left out.
 * Returns 0, or an error with *out NULL and *n 0. */
int state_rows_of_ids(state_t *st, state_stmt_id_t id, const char *what, const state_row_t *m,
                      const int64_t *ids, size_t nids, void **out /* OUT */, size_t *n /* OUT */);

/* Runs a write to its end: returns how many rows it changed (0 when its
 * WHERE matched none, for the caller to name what was missing), or an error. */
int state_update(state_t *st, state_stmt_id_t id, const char *what, const char *fmt, ...);
/* Runs an INSERT (or an UPDATE that sets a foreign key) to its end: returns 0
 * with *rowid (may be NULL) the new row's id, or an error, KILN_ENOENT ("cannot
 * <what>: it refers to ... that does not exist") for a FOREIGN KEY violation. */
int state_insert(state_t *st, state_stmt_id_t id, const char *what, int64_t *rowid /* OUT */,
                 const char *fmt, ...);

/* Ends a lookup or a write that must find its row, given rc, the answer of
 * one of the queries above or of state_update: none (0) becomes KILN_ENOENT
 * with the message fmt, a row or a count of rows 0, and an error stays as it
 * is. */
int state_found(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Steps s (prepared and bound) and stores column 0 of its rows in ids, at
 * most max of them; *n says how many. 0 or KILN_EDB. */
int state_step_ids(state_t *st, sqlite3_stmt *s, const char *what, int64_t *ids /* OUT */,
                   size_t max, size_t *n /* OUT */);

/* ---- migrations (schema.c) ----------------------------------------------------
 * state_migrations[i] is the SQL script that brings user_version i to i+1;
 * there are STATE_SCHEMA_VERSION of them. Append, never edit. */
typedef enum {
    STATE_BACKFILL_NONE,
    STATE_BACKFILL_TIMEZONES, /* v8: jobs.timezone from each stored spec */
} state_backfill_t;
typedef struct state_migration {
    const char *what; /* one line for logs and errors */
    const char *sql;  /* statements separated by ';' with no values in them */
    /* What the script cannot do in SQL, run after it in its transaction by
     * state.c (a function of this table would call back into the module
     * from below the runner). */
    state_backfill_t backfill;
    /* The script rebuilds tables that others refer to (create new, copy,
     * drop old, rename): it runs with foreign keys off, as SQLite's own
     * procedure for such changes says, and every reference is checked
     * (PRAGMA foreign_key_check) before it commits. */
    bool rebuilds_tables;
} state_migration_t;
extern const state_migration_t state_migrations[STATE_SCHEMA_VERSION];

/* ---- test hooks -------------------------------------------------------------------
 * Used by tests/test_state.c to build databases as older Kilns left them. */

/* state_open, but migrates only up to version (0 <= version <=
 * STATE_SCHEMA_VERSION). Refuses a newer file the same way. */
int state_open_at_version(const char *path, int version, state_t **out /* OUT */);
/* Shortens the busy timeout (normally STATE_BUSY_TIMEOUT_MS), so a test can
 * reach the retry loop without waiting 10 s. */
void state_test_set_busy_timeout(state_t *st, int ms);

#endif /* KILN_STATE_STATE_INT_H */
