/* jobs/cron.c - placeholder until the cron parser lands. */
typedef int kiln_cron_placeholder_t;
