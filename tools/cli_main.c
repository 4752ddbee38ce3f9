/*
 * tools/cli_main.c - the `kiln` command: global options, the command table,
 * --help for every command, and dispatch. Each command lives in a cmd_*.c
 * file and returns one of the exit codes documented in docs/cli.md.
 */
#include "cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

static const cli_opt_t no_opts[] = {{NULL, NULL, NULL}};

static const cli_opt_t submit_opts[] = {
    {"dry-run", NULL, "validate the spec and show what would be scheduled; touch no database"},
    {NULL, NULL, NULL}};

static const cli_opt_t runs_opts[] = {
    {"job", "NAME", "only runs of this job"},
    {"state", "STATE", "only runs in this state (queued, running, succeeded, failed, ...)"},
    {"limit", "N", "show at most N runs, newest first (default 50; 0 for all)"},
    {NULL, NULL, NULL}};

static const cli_opt_t schedule_opts[] = {
    {"after", "TIME", "ISO 8601 instant to start after (default: now), e.g. 2024-05-02T00:00:00Z"},
    {"count", "N", "how many fire times to print (default 5, at most 10000)"},
    {"timezone", "TZ", "evaluate the expression in this zone (default UTC)"},
    {NULL, NULL, NULL}};

static const cli_opt_t datagen_opts[] = {
    {"rows", "N", "rows to write"},
    {"out", "FILE", "output file (Criteo-format TSV)"},
    {"seed", "S", "seed of the hidden model and the ids (default 42)"},
    {"day", "D", "day number: popularity and weights drift from day to day (default 0)"},
    {"zipf", "S", "Zipf exponent of every slot's ids (0: uniform; default: 1.1-1.2 by slot)"},
    {"vocab", "N", "distinct ids per slot (default: 10 to 1e6 by slot, scaled to --rows)"},
    {"empty", "F", "share of empty categorical fields, 0..1 (default: 2-5%, 30-42% in 6 slots)"},
    {"part", "P", "another draw of rows from the same model and ids, e.g. eval rows (default 0)"},
    {NULL, NULL, NULL}};

static const cli_opt_t convert_opts[] = {
    {"out", "FILE", "the kiln-bin file to write"},
    {"spec", "JOB.yaml", "Parquet input: the column mapping of this job spec (data.columns)"},
    {NULL, NULL, NULL}};

/* cmd_export.c (checkpoints) keeps its options next to the command. */
extern const cli_opt_t export_opts[];
int cmd_export(cli_t *cli);

/* cmd_sched.c (scheduler): daemon, retry, logs, lineage. */
int cmd_daemon(cli_t *cli);
int cmd_retry(cli_t *cli);
int cmd_logs(cli_t *cli);
int cmd_lineage(cli_t *cli);

static const cli_opt_t daemon_opts[] = {
    {"home", "DIR", "run directories go in DIR/runs (default $KILN_HOME or ~/.kiln)"},
    {"listen", "ADDR", "address of the status page (default 127.0.0.1:8480)"},
    {"max-ranks", "N", "ranks in use at once (default: the number of cores)"},
    {"grace", "DURATION", "SIGTERM to SIGKILL on cancel and timeout (default 10s)"},
    {"poll", "DURATION", "database change poll (default 1s)"},
    {"stats-every", "DURATION", "read endpoints' /v1/stats this often (default 10s; 0: never)"},
    {"slurm-poll", "DURATION",
     "how often a Slurm run's supervisor asks about its job (default 5s)"},
    {"keep-runs", "DURATION",
     "compact runs that ended DURATION ago (7d, 90s; a bare number is days)"},
    {"drain", NULL, "on SIGTERM, wait for running runs to end"},
    {"trainer", "PATH", "kiln-train to launch"},
    {"mpirun", "PATH", "mpirun to launch it with"},
    {"log", "FILE", "append the daemon's log to FILE"},
    {NULL, NULL, NULL}};

static const cli_opt_t logs_opts[] = {
    {"follow", NULL, "keep printing until the run ends (with --json: one JSON line per piece)"},
    {NULL, NULL, NULL}};

/* cmd_serve.c (serving): push, promote, rollback. */
extern const cli_opt_t push_opts[], promote_opts[], rollback_opts[];
int cmd_push(cli_t *cli);
int cmd_promote(cli_t *cli);
int cmd_rollback(cli_t *cli);

static const cli_opt_t delete_opts[] = {
    {"cancel", NULL, "cancel the job's queued and running runs instead of refusing"},
    {NULL, NULL, NULL},
};
/* cmd_split.c (serving): a model's traffic split. */
extern const cli_opt_t split_opts[];
int cmd_split(cli_t *cli);
/* cmd_endpoints.c (serving): the endpoints, their traffic and ramps. */
extern const cli_opt_t endpoints_opts[];
int cmd_endpoints(cli_t *cli);

static const cli_cmd_t commands[] = {
    {"submit", "FILE", "validate a job spec and queue it (or register its schedule)",
     "Parses and validates FILE. A job without `schedule` gets one run queued now; a job with "
     "a schedule is registered and kilnd fires it. Submitting a job name that exists replaces "
     "its spec (the job's version goes up when the text changed). Errors name "
     "file:line:col and the field.",
     submit_opts, 1, 1, true, cmd_submit},
    {"jobs", "", "list jobs", NULL, no_opts, 0, 0, true, cmd_jobs},
    {"runs", "", "list runs, newest first", NULL, runs_opts, 0, 0, true, cmd_runs},
    {"show", "RUN|JOB", "show one run (by number) or one job (by name)",
     "A run shows its state, times, exit, error and events; a job shows its spec and its latest "
     "runs.",
     no_opts, 1, 1, true, cmd_show},
    {"cancel", "RUN", "cancel a run",
     "A queued run is canceled at once. A running run is flagged; kilnd sends SIGTERM to its "
     "process group, waits the grace period, then SIGKILL.",
     no_opts, 1, 1, true, cmd_cancel},
    {"pause", "JOB", "stop a job's cron fires until it is resumed",
     "kilnd neither runs nor records the fires of a paused job and launches none of its queued "
     "runs; running runs go on. `kiln jobs` shows it paused.",
     no_opts, 1, 1, true, cmd_pause},
    {"resume", "JOB", "resume a paused job",
     "The fires missed while it was paused follow the job's catchup policy (none: skipped, "
     "latest: the newest runs, all: each runs), as after a kilnd downtime.",
     no_opts, 1, 1, true, cmd_resume},
    {"delete", "JOB", "delete a job (its runs, checkpoints and lineage stay)",
     "Refused while runs of the job are queued or running, unless --cancel, which cancels them "
     "(kilnd stops running ones). The job leaves `kiln jobs` and the schedule; `kiln runs`, "
     "`kiln show RUN` and `kiln lineage` still find its runs. Submitting the name again brings "
     "it back.",
     delete_opts, 1, 1, true, cmd_delete},
    {"schedule", "next EXPR", "print the next fire times of a cron expression",
     "`kiln schedule next \"EXPR\" --after 2024-05-02T00:00:00Z --count N` prints the next N "
     "fire times strictly after the instant, ISO 8601 UTC, one per line. See docs/cron.md.",
     schedule_opts, 2, 2, false, cmd_schedule},
    {"datagen", "", "write synthetic Criteo-format data",
     "`kiln datagen --rows N --out FILE [--seed S] [--day D] [--zipf S] [--vocab N] "
     "[--empty F] [--part P]` writes N rows with power-law ids, a learnable signal and drift "
     "from day to day, and prints the Bayes-optimal logloss of the rows it wrote "
     "(docs/data-formats.md).",
     datagen_opts, 0, 0, false, cmd_datagen},
    {"convert", "FILE...", "convert Criteo TSV or Parquet files to kiln-bin",
     "Reads the TSV files (or Parquet files, told by PAR1 at the start of the first, read "
     "with --spec's data.columns or Criteo's column names label, I1..I13, C1..C26) in order "
     "and writes one kiln-bin file (docs/data-formats.md); malformed lines are skipped and "
     "reported.",
     convert_opts, 1, CLI_MAX_POS, false, cmd_convert},
    {"export", "[CHECKPOINT]", "export a checkpoint to files, or a job's latest to its endpoints",
     "`kiln export CHECKPOINT --format hugectr|npy --out DIR` resolves the checkpoint (a uid "
     "the database knows, or a directory; an incremental one with its chain), checks every "
     "file against the manifest and writes one folder per table with raw int64 `key` and "
     "float32 `emb_vector` files (hugectr; fm's linear term as its own <table>_linear, and "
     "the dense model file <job>_dense_<step>.model when the database knows the checkpoint) "
     "or .npy arrays (npy). With --db the export is recorded (docs/checkpoint-format.md). "
     "`kiln export --job NAME --incremental --push [--label B]` (for system cron) pushes the "
     "job's latest checkpoint to its endpoints, as a delta on what each holds "
     "(docs/serving-protocol.md).",
     export_opts, 0, 1, false, cmd_export},
    {"daemon", "", "run kilnd, the scheduler daemon, in the foreground",
     "The same daemon as `kilnd`: fires schedules, launches and supervises runs, retries and "
     "recovers. SIGTERM or ^C stops it; runs keep going and are adopted at the next start "
     "(--drain waits for them). See docs/operations.md.",
     daemon_opts, 0, 0, true, cmd_daemon},
    {"retry", "RUN", "queue a new attempt of a failed, canceled or timed-out run",
     "The new run has trigger retry, attempt + 1 and serves the same scheduled time; it "
     "resumes from the job's latest checkpoint when the spec says init_from: latest.",
     no_opts, 1, 1, true, cmd_retry},
    {"logs", "RUN", "print a run's combined log (every rank, mpirun, the supervisor)",
     "With --follow, keeps printing as the log grows until the run ends.", logs_opts, 1, 1, true,
     cmd_logs},
    {"lineage", "FILE|RUN|CHECKPOINT|ENDPOINT", "trace lineage both ways",
     "Starts from an input file, a run number, a checkpoint uid or an endpoint URL. Back: the "
     "runs that read the data (retries, inputs with size, mtime and checksum, the checkpoint "
     "each started from). Forward: their checkpoints and every checkpoint derived from them, "
     "each with its pushes, and the endpoints that serve one of them now.",
     no_opts, 1, 1, true, cmd_lineage},
    {"push", "", "push a job's latest checkpoint to its endpoints of a label",
     "Sends each endpoint a delta on what it holds (a full push when it holds something "
     "else), in parallel, with the job's push.retries and push.timeout; records every push. "
     "A push that fails in a way a retry may fix stays queued and kilnd retries it. kilnd "
     "pushes after every successful run by itself (export.on_success): use this for a label "
     "with auto: false, or by hand.",
     push_opts, 0, 0, true, cmd_push},
    {"promote", "", "push what one label's endpoints hold to another label's",
     NULL, promote_opts, 0, 0, true, cmd_promote},
    {"rollback", "", "push the checkpoint a label held before its current one",
     NULL, rollback_opts, 0, 0, true, cmd_rollback},
    {"split", "MODEL [A=90,B=10]", "set (or show) a model's predict traffic split",
     "Gives each label of MODEL its weight on every kiln-serve serving one of the model's "
     "endpoints (PUT /v1/models/MODEL/split with the job's push token); without a split, shows "
     "the one in force. A label left out, or with weight 0, gets no traffic; a label pushed "
     "for the first time gets none until a split names it (or its endpoint's `traffic:` in "
     "the spec). kiln-serve keeps the split across restarts (docs/serving-protocol.md). "
     "The ramps of the model's labels (push.ramp) are shown after the splits: their share, "
     "the next step, or what stopped them.",
     split_opts, 1, 2, true, cmd_split},
    {"endpoints", "", "list the serving endpoints: what each holds, its traffic and ramp",
     "One line per endpoint (URL, model, label) Kiln pushes to: the checkpoint it holds and how "
     "old it is, its eval logloss, its share of the model's predict traffic (from the stats "
     "kilnd reads every --stats-every), its pushes, and for a label with push.ramp where the "
     "ramp stands (its share, the next step) or what stopped it. The same as kilnd's endpoints "
     "page and /api/endpoints (docs/api.md).",
     endpoints_opts, 0, 0, true, cmd_endpoints},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static const cli_opt_t global_opts[] = {
    {"db", "PATH", "database file (default $KILN_HOME/kiln.db, KILN_HOME defaults to ~/.kiln)"},
    {"json", NULL, "print JSON for scripts instead of tables"},
    {"help", NULL, "show help"},
    {"version", NULL, "print kiln's version"},
    {NULL, NULL, NULL}};

static void print_opts(FILE *f, const cli_opt_t *opts)
{
    for (const cli_opt_t *o = opts; o->name != NULL; o++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        fprintf(f, "  %-22s %s\n", left, o->help);
    }
}

static void usage_main(FILE *f)
{
    fprintf(f, "usage: kiln [--db PATH] [--json] COMMAND [ARGS]\n\n"
               "Kiln keeps embedding-heavy recommender models fresh.\n\ncommands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nglobal options:\n");
    print_opts(f, global_opts);
    fprintf(f, "\n`kiln COMMAND --help` describes a command. Exit codes: 0 ok, 1 failure, "
               "2 usage, 3 bad input, 4 not found, 5 refused by state (docs/cli.md).\n");
}

static void usage_cmd(FILE *f, const cli_cmd_t *c)
{
    fprintf(f, "usage: kiln %s%s%s [options]\n\n%s.\n", c->name, c->args[0] ? " " : "", c->args,
            c->summary);
    if (c->details != NULL)
        fprintf(f, "\n%s\n", c->details);
    if (c->opts[0].name != NULL) {
        fprintf(f, "\noptions:\n");
        print_opts(f, c->opts);
    }
    fprintf(f, "\nglobal options:\n");
    print_opts(f, global_opts);
}

static const cli_cmd_t *find_command(const char *name)
{
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

static int opt_index(const cli_opt_t *opts, const char *name, size_t len)
{
    for (int i = 0; opts[i].name != NULL; i++)
        if (strlen(opts[i].name) == len && strncmp(opts[i].name, name, len) == 0)
            return i;
    return -1;
}

static int unknown_option(const char *arg, const cli_opt_t *opts, const char *cmd)
{
    const char *names[2 * CLI_MAX_OPTS + 4];
    size_t n = 0;
    for (const cli_opt_t *o = opts; o && o->name && n < CLI_MAX_OPTS; o++)
        names[n++] = o->name;
    for (const cli_opt_t *o = global_opts; o->name; o++)
        names[n++] = o->name;
    names[n] = NULL;
    const char *bare = arg + 2;
    char word[64];
    snprintf(word, sizeof word, "%.*s", (int)strcspn(bare, "="), bare);
    const char *hint = kiln_did_you_mean(word, names);
    return cli_fail(KILN_EUSAGE, "unknown option '%s'%s%s%s; see 'kiln %s--help'", arg,
                    hint ? " (did you mean --" : "", hint ? hint : "", hint ? "?)" : "",
                    cmd ? cmd : "");
}

/* Parses argv[from..] into cli: the global options anywhere, the command's
 * own options, and positionals. Returns -1 to go on, or an exit code. */
static int parse_args(int argc, char **argv, int from, const cli_cmd_t *cmd, cli_t *cli,
                      bool *help)
{
    const cli_opt_t *opts = cmd ? cmd->opts : no_opts;
    char cmdsp[32] = "";
    if (cmd)
        snprintf(cmdsp, sizeof cmdsp, "%s ", cmd->name);
    for (int i = from; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            for (i++; i < argc; i++) {
                if (cli->npos >= CLI_MAX_POS)
                    return cli_fail(KILN_EUSAGE, "too many arguments");
                cli->pos[cli->npos++] = argv[i];
            }
            break;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            *help = true;
            continue;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            if (cmd == NULL)
                return -2 - i; /* the command word */
            if (cli->npos >= CLI_MAX_POS)
                return cli_fail(KILN_EUSAGE, "too many arguments");
            cli->pos[cli->npos++] = a;
            continue;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const char *value = eq ? eq + 1 : NULL;
        int gi = opt_index(global_opts, name, len);
        int ci = opt_index(opts, name, len);
        const cli_opt_t *o = ci >= 0 ? &opts[ci] : gi >= 0 ? &global_opts[gi] : NULL;
        if (o == NULL)
            return unknown_option(a, opts, cmd ? cmdsp : NULL);
        if (o->arg != NULL && value == NULL) {
            if (i + 1 >= argc)
                return cli_fail(KILN_EUSAGE, "option --%s needs a value (%s)", o->name, o->arg);
            value = argv[++i];
        } else if (o->arg == NULL && value != NULL) {
            return cli_fail(KILN_EUSAGE, "option --%s takes no value", o->name);
        }
        if (ci >= 0) {
            cli->values[ci] = value ? value : "";
        } else if (strcmp(o->name, "db") == 0) {
            cli->db_path = value;
        } else if (strcmp(o->name, "json") == 0) {
            cli->json = true;
        }
    }
    return -1;
}

static char *default_db_path(void)
{
    const char *home = getenv("KILN_HOME");
    if (home != NULL && home[0] != '\0')
        return kiln_asprintf("%s/kiln.db", home);
    const char *user_home = getenv("HOME");
    if (user_home == NULL || user_home[0] == '\0')
        return NULL;
    return kiln_asprintf("%s/.kiln/kiln.db", user_home);
}

/* Parses the command line and runs the command; returns the exit code. */
static int run_command(int argc, char **argv)
{
    cli_t cli = {0};
    bool help = false;
    /* A command prints what it did itself; the library's info lines (a push
     * landed) would say it twice. Warnings and errors still show, and
     * KILN_LOG asks for more (kiln daemon logs at info by default). */
    const char *level = getenv("KILN_LOG");
    kiln_log_level_t lv = KILN_LOG_WARN;
    if (level != NULL && kiln_log_level_parse(level, &lv) < 0)
        lv = KILN_LOG_WARN;
    kiln_log_set_level(lv);

    /* First pass: global options up to the command word. */
    int rc = parse_args(argc, argv, 1, NULL, &cli, &help);
    if (rc >= 0)
        return rc;
    if (rc == -1) {
        usage_main(help ? stdout : stderr);
        return help ? CLI_EXIT_OK : cli_fail(KILN_EUSAGE, "no command given");
    }
    int cmd_at = -2 - rc;
    const char *name = argv[cmd_at];
    if (strcmp(name, "help") == 0) {
        const cli_cmd_t *c = cmd_at + 1 < argc ? find_command(argv[cmd_at + 1]) : NULL;
        if (c)
            usage_cmd(stdout, c);
        else
            usage_main(stdout);
        return CLI_EXIT_OK;
    }
    const cli_cmd_t *cmd = find_command(name);
    if (cmd == NULL) {
        const char *names[NCOMMANDS + 1];
        for (size_t i = 0; i < NCOMMANDS; i++)
            names[i] = commands[i].name;
        names[NCOMMANDS] = NULL;
        const char *hint = kiln_did_you_mean(name, names);
        return cli_fail(KILN_EUSAGE, "unknown command '%s'%s%s%s; see 'kiln --help'", name,
                        hint ? " (did you mean '" : "", hint ? hint : "", hint ? "'?)" : "");
    }
    cli.opts = cmd->opts;
    rc = parse_args(argc, argv, cmd_at + 1, cmd, &cli, &help);
    if (rc >= 0)
        return rc;
    if (help) {
        usage_cmd(stdout, cmd);
        return CLI_EXIT_OK;
    }
    if (cli.npos < cmd->min_pos || cli.npos > cmd->max_pos)
        return cli_fail(KILN_EUSAGE, "%s expects %s%s; see 'kiln %s --help'", cmd->name,
                        cmd->args[0] ? cmd->args : "no arguments",
                        cli.npos > cmd->max_pos ? " (too many arguments)" : "", cmd->name);
    char *owned_db = NULL;
    if (cmd->needs_db && cli.db_path == NULL) {
        owned_db = default_db_path();
        if (owned_db == NULL)
            return cli_fail(KILN_EUSAGE, "neither KILN_HOME nor HOME is set; pass --db PATH");
        cli.db_path = owned_db;
    }
    rc = cmd->run(&cli);
    free(owned_db);
    return rc;
}

int main(int argc, char **argv)
{
    if (kiln_version_flag(argc, argv, "kiln"))
        return CLI_EXIT_OK;
    cli_json_errors(argc, argv);
    return cli_finish(run_command(argc, argv));
}
