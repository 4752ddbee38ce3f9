/*
 * tests/test_web_browser.c - the pages in a real browser: Debian's chromium,
 * headless, loads the runs page, a run's page and a lineage page from the
 * server over the fixture database, and the DOM it builds (--dump-dom) must
 * hold the runs table, the loss plot's SVG with its polyline and the lineage
 * graph's SVG with its nodes. Screenshots are kept in
 * KILN_BINARY_DIR/web-screens/ for a person to look at. Reports itself
 * skipped (77) when chromium is not installed (tools/deps.sh installs it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln.h"
#include "proc.h"
#include "web.h"
#include "web_fixture.h"


#define CHROMIUM "/usr/bin/chromium"

static web_fixture_t fx;
static char *dom; /* the last --dump-dom */

static int setup(void **state)
{
    web_config_t cfg;
    web_config_init(&cfg);
    if (web_fixture_start(&fx, "webui", &cfg) < 0)
        return -1;
    dom = malloc(1 << 20);
    return dom ? 0 : -1;
}

static int teardown(void **state)
{
    web_fixture_stop(&fx);
    free(dom);
    return 0;
}

/* Runs chromium headless on path: its DOM into `dom`, and a screenshot to
 * KILN_BINARY_DIR/web-screens/<shot>.png when shot is not NULL. */
static void browse(const char *path, const char *shot)
{
    char url[256], profile[400], mode[600];
    snprintf(url, sizeof url, "%s%s", fx.base, path);
    snprintf(profile, sizeof profile, "--user-data-dir=%s/profile-%s", fx.dir, shot ? shot : "dom");
    if (shot != NULL) {
        char out[400];
        snprintf(out, sizeof out, "%s/web-screens", KILN_BINARY_DIR);
        assert_int_equal(kiln_mkdir_p(out), 0);
        snprintf(mode, sizeof mode, "--screenshot=%s/web-screens/%s.png", KILN_BINARY_DIR, shot);
    } else {
        snprintf(mode, sizeof mode, "--dump-dom");
    }
    const char *argv[] = {CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                          "--disable-quic", "--no-first-run", "--disable-background-networking",
                          "--disable-component-update", "--disable-sync",
                          "--disable-dev-shm-usage", "--hide-scrollbars", profile,
                          "--window-size=1280,900", mode, url, NULL};
    static proc_result_t r;
    proc_run(&r, fx.dir, argv);
    if (r.code != 0)
        fail_msg("chromium on %s exited %d:\n%s", url, r.code, r.err);
    snprintf(dom, 1 << 20, "%s", r.out);
}

/* Loads path in the browser; its DOM must hold each string of want
 * (NULL-ended). */
static void expect_dom(const char *path, const char *const *want)
{
    browse(path, NULL);
    for (size_t i = 0; want[i] != NULL; i++)
        if (strstr(dom, want[i]) == NULL)
            fail_msg("the DOM of %s lacks %s", path, want[i]);
}

static void test_runs_table(void **state)
{
    char link[64];
    snprintf(link, sizeof link, "<a href=\"/runs/%lld\">", (long long)fx.run_ok);
    const char *const want[] = {"<table id=\"runs\">", link, "succeeded", NULL};
    expect_dom("/runs", want);
    browse("/runs", "runs");
}

static void test_run_page(void **state)
{
    char path[64];
    snprintf(path, sizeof path, "/runs/%lld", (long long)fx.run_ok);
    /* The browser parsed the inline SVG into the DOM: the plot and its line. */
    const char *const want[] = {"<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"loss-plot\"",
                                "<polyline class=\"series\"", "<table id=\"timeline\">",
                                "<pre class=\"log\" id=\"log\">", NULL};
    expect_dom(path, want);
    browse(path, "run");
    /* The failed run: its hostile error is text in the DOM, not an element. */
    snprintf(path, sizeof path, "/runs/%lld", (long long)fx.run_failed);
    const char *const escaped[] = {"&lt;script&gt;alert(1)&lt;/script&gt;", NULL};
    expect_dom(path, escaped);
    assert_null(strstr(dom, "<script"));
}

static void test_lineage_graph(void **state)
{
    char path[64];
    snprintf(path, sizeof path, "/lineage/checkpoint/%lld", (long long)fx.ckpt_incr);
    const char *const want[] = {"id=\"lineage\"", "<g class=\"node checkpoint\">",
                                "<g class=\"node endpoint\">", "<g class=\"edge\">", NULL};
    expect_dom(path, want);
    browse(path, "lineage");
    browse("/endpoints", "endpoints");
    browse("/jobs", "jobs");
}

int main(void)
{
    if (access(CHROMIUM, X_OK) != 0) {
        printf("chromium is not installed (apt-get install chromium); skipping\n");
        return 77;
    }
    return PROC_TESTS(setup, teardown, NULL, NULL, test_runs_table, test_run_page,
                      test_lineage_graph);
}
