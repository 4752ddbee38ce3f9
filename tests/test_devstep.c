/*
 * tests/test_devstep.c - the device step's host stand-in
 * (trainer/train_dev_host.c) on its own: the ordering it must refuse (a
 * stream reading what another wrote with no event between, the host
 * overwriting pinned memory a copy may still read, a stream overwriting what
 * another may still read) and what it must let through (the same calls with
 * their events, and a stream call the host enqueues after its own access).
 * kiln-train's whole device step runs on it in test_train
 * (test_device_step_standin).
 */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <string.h>

#include "kiln.h"
#include "proc.h"
#include "train_dev.h"

#define NB 64

/* One call of a script: an op on a stream (or the host) with buffers named
 * H (pinned), D and D2 (device), X (outside every allocation) and D1 (D one
 * byte on, so its NB bytes overrun D); refused: the words the stand-in's
 * refusal must hold, NULL when the call must pass. */
typedef enum { COPY, RECORD, WAIT, SYNC, TOUCH_R, TOUCH_W } op_t;
typedef enum { H, D, D2, X, D1 } buf_t;
typedef struct {
    op_t op;
    int stream; /* COPY, RECORD and WAIT: the stream */
    buf_t dst, src;
    int ev;
    const char *refused;
} call_t;

static const dev_ops_t *ops = &train_dev_host_ops;

static void run_script(const char *name, const call_t *calls, size_t n)
{
    void *ctx = NULL, *b[5];
    static char outside[NB];
    assert_int_equal(ops->create(0, &ctx), 0);
    assert_int_equal(ops->alloc(ctx, NB, true, &b[H]), 0);
    assert_int_equal(ops->alloc(ctx, NB, false, &b[D]), 0);
    assert_int_equal(ops->alloc(ctx, NB, false, &b[D2]), 0);
    b[X] = outside;
    b[D1] = (char *)b[D] + 1;
    for (size_t i = 0; i < n; i++) {
        const call_t *c = &calls[i];
        int rc = 0;
        switch (c->op) {
        case COPY:
            rc = ops->copy(ctx, c->stream, b[c->dst], b[c->src], NB);
            break;
        case RECORD:
            rc = ops->record(ctx, c->stream, c->ev);
            break;
        case WAIT:
            rc = ops->wait(ctx, c->stream, c->ev);
            break;
        case SYNC:
            rc = ops->sync(ctx, c->ev);
            break;
        case TOUCH_R:
            rc = ops->host_touch(ctx, b[c->dst], NB, false);
            break;
        case TOUCH_W:
            rc = ops->host_touch(ctx, b[c->dst], NB, true);
            break;
        }
        if (c->refused == NULL && rc != 0)
            fail_msg("%s, call %zu: refused: %s", name, i, kiln_errmsg());
        if (c->refused != NULL &&
            (rc != KILN_EINTERNAL || strstr(kiln_errmsg(), c->refused) == NULL))
            fail_msg("%s, call %zu: expected a refusal with \"%s\", got %d: %s", name, i,
                     c->refused, rc, rc ? kiln_errmsg() : "");
    }
    ops->destroy(ctx);
}

#define SCRIPT(calls) run_script(#calls, calls, sizeof calls / sizeof calls[0])

/* What the copy stream staged, the compute stream may read only after an event. */
static void test_read_needs_wait(void **state)
{
    (void)state;
    static const call_t calls[] = {
        {TOUCH_W, 0, H, H, 0, NULL},
        {COPY, DEV_COPY, D, H, 0, NULL},
        {COPY, DEV_COMPUTE, D2, D, 0, "no event between"},
        {RECORD, DEV_COPY, H, H, 0, NULL},
        {WAIT, DEV_COMPUTE, H, H, 0, NULL},
        {COPY, DEV_COMPUTE, D2, D, 0, NULL},
    };
    SCRIPT(calls);
}

/* The host may not rewrite a pinned buffer a copy may still read, nor read
 * results before the copy that brings them was waited for. */
static void test_host_needs_sync(void **state)
{
    (void)state;
    static const call_t calls[] = {
        {TOUCH_W, 0, H, H, 0, NULL},
        {COPY, DEV_COPY, D, H, 0, NULL},
        {TOUCH_W, 0, H, H, 0, "may still be reading"},
        {RECORD, DEV_COPY, H, H, 1, NULL},
        {SYNC, 0, H, H, 1, NULL},
        {TOUCH_W, 0, H, H, 0, NULL},
        {COPY, DEV_COMPUTE, H, D, 0, NULL},
        {TOUCH_R, 0, H, H, 0, "no event between"},
    };
    SCRIPT(calls);
}

/* A stream may not overwrite what the other stream may still read. */
static void test_overwrite_needs_wait(void **state)
{
    (void)state;
    static const call_t calls[] = {
        {COPY, DEV_COMPUTE, D2, D, 0, NULL},  {COPY, DEV_COPY, D, H, 0, "may still be reading"},
        {RECORD, DEV_COMPUTE, H, H, 2, NULL}, {WAIT, DEV_COPY, H, H, 2, NULL},
        {COPY, DEV_COPY, D, H, 0, NULL},
    };
    SCRIPT(calls);
}

/* A call the host enqueues comes after the host's own accesses: after a
 * sync and a read of the results, the next step may overwrite them. An
 * access outside every allocation, or past the end of one, is refused. */
static void test_host_order_and_bounds(void **state)
{
    (void)state;
    static const call_t calls[] = {
        {COPY, DEV_COMPUTE, H, D, 0, NULL},
        {RECORD, DEV_COMPUTE, H, H, 3, NULL},
        {SYNC, 0, H, H, 3, NULL},
        {TOUCH_R, 0, H, H, 0, NULL},
        {COPY, DEV_COMPUTE, H, D, 0, NULL},
        {COPY, DEV_COMPUTE, X, D, 0, "outside every allocation"},
        {COPY, DEV_COMPUTE, D2, D1, 0, "outside every allocation"},
    };
    SCRIPT(calls);
}

PROC_TEST_MAIN(NULL, NULL, cmocka_unit_test(test_read_needs_wait),
               cmocka_unit_test(test_host_needs_sync), cmocka_unit_test(test_overwrite_needs_wait),
               cmocka_unit_test(test_host_order_and_bounds))
