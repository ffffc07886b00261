/* The reporter's installs and the scope transaction, against a fake bridge
 * that counts what it is asked and fails when told to. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reporter.h"

#define CPU ENGINE_SLOT_CPU
#define CUDA0 1

static struct {
    int pushed;         /* reporters in the profiler slot now */
    int pushes, pops;
    int cpu, tracker;   /* the reporting switches */
    int fail_install, fail_uninstall;
} fake;

static int
fake_install(memlab_sink_fn sink, void *ctx, char *err, size_t errlen)
{
    (void)sink;
    (void)ctx;
    if (fake.fail_install) {
        snprintf(err, errlen, "install refused");
        return -1;
    }
    fake.pushed++;
    fake.pushes++;
    return 0;
}

static int
fake_uninstall(char *err, size_t errlen)
{
    if (fake.fail_uninstall) {
        if (err != NULL)
            snprintf(err, errlen, "uninstall refused");
        return -1;
    }
    fake.pushed--;
    fake.pops++;
    return 0;
}

static void fake_set_cpu(int on) { fake.cpu = on; }
static void fake_set_tracker(int on) { fake.tracker = on; }

static const ReporterBridge bridge = {
    fake_install, fake_uninstall, fake_set_cpu, fake_set_tracker, NULL,
};

typedef struct Fixture {
    Engine *engine;
    Reporter reporter;
    char err[REPORTER_ERRLEN];
} Fixture;

static int
setup(void **state)
{
    Fixture *f = calloc(1, sizeof(Fixture));
    if (f == NULL || (f->engine = Engine_new()) == NULL)
        return -1;
    Reporter_init(&f->reporter, f->engine);
    memset(&fake, 0, sizeof fake);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    Fixture *f = *state;
    assert_int_equal(Reporter_depth(), 0);  /* every test undoes its installs */
    Engine_free(f->engine);
    free(f);
    return 0;
}

static void
test_unbound_refuses_everything(void **state)
{
    Fixture *f = *state;
    int first;
    uint32_t id;
    ReporterBridge partial = bridge;
    partial.set_cpu = NULL;
    assert_int_equal(Reporter_bind(&f->reporter, &partial), -1);
    assert_false(Reporter_bound(&f->reporter));
    assert_int_equal(Reporter_install(&f->reporter, &first, f->err, sizeof f->err),
                     REPORTER_EUNBOUND);
    assert_int_equal(Reporter_open_scope(&f->reporter, CPU, 0, -1, -1, 0, 0, &id,
                                         &first, f->err, sizeof f->err),
                     REPORTER_EUNBOUND);
    assert_int_equal(Reporter_cuda_totals(&f->reporter, 0, &(int64_t){0},
                                          &(int64_t){0}), -1);
    assert_int_equal(fake.pushes, 0);
}

/* Nested installs push the reporter once and pop it once; one stepped aside
 * by torch.profiler is not popped again. */
static void
test_installs_are_counted_per_thread(void **state)
{
    Fixture *f = *state;
    int first;
    assert_int_equal(Reporter_bind(&f->reporter, &bridge), 0);
    assert_int_equal(Reporter_install(&f->reporter, &first, f->err, sizeof f->err), 0);
    assert_true(first);
    assert_int_equal(Reporter_install(&f->reporter, &first, f->err, sizeof f->err), 0);
    assert_false(first);
    assert_int_equal(Reporter_depth(), 2);
    assert_int_equal(fake.pushed, 1);
    assert_int_equal(Reporter_step_aside(&f->reporter, 1, f->err, sizeof f->err), 0);
    assert_int_equal(Reporter_step_aside(&f->reporter, 1, f->err, sizeof f->err), 0);
    assert_int_equal(fake.pushed, 0);
    assert_int_equal(Reporter_uninstall(&f->reporter, f->err, sizeof f->err), 0);
    assert_int_equal(Reporter_uninstall(&f->reporter, f->err, sizeof f->err), 1);
    assert_int_equal(fake.pops, 1);     /* the step aside's, not another */
    assert_int_equal(Reporter_uninstall(&f->reporter, f->err, sizeof f->err), 0);
}

/* open and close: the install, the device kind's reporting and the scope
 * in one call each; CPU reporting and the tracker follow their devices. */
static void
test_open_and_close_a_scope(void **state)
{
    Fixture *f = *state;
    int first, last;
    uint32_t cpu, cuda;
    Scope s;
    assert_int_equal(Reporter_bind(&f->reporter, &bridge), 0);
    assert_int_equal(Reporter_open_scope(&f->reporter, CPU, 0, -1, -1, 1, 16,
                                         &cpu, &first, f->err, sizeof f->err), 0);
    assert_true(first);
    assert_true(fake.cpu);
    assert_false(fake.tracker);
    assert_int_equal(Reporter_open_scope(&f->reporter, CUDA0, 0, 0, 0, 0, 0,
                                         &cuda, &first, f->err, sizeof f->err), 0);
    assert_false(first);
    assert_true(fake.tracker);
    Engine_event(f->engine, CPU, 0x10, 100, 0, 0, EVENT_REPORT);
    /* not the innermost on its device: refused, yet undone (as close says) */
    uint32_t inner;
    assert_int_equal(Engine_begin(f->engine, CPU, 0, -1, -1, &inner), 0);
    assert_int_equal(Reporter_close_scope(&f->reporter, CPU, cpu, &s, &last,
                                          f->err, sizeof f->err),
                     REPORTER_ENOTINNER);
    assert_false(fake.cpu);
    assert_int_equal(Engine_end(f->engine, CPU, inner, &s), 0);
    Scope_fini(&s);
    assert_int_equal(Engine_end(f->engine, CPU, cpu, &s), 0);
    Scope_fini(&s);
    assert_int_equal(s.live, 100);
    assert_int_equal(Reporter_close_scope(&f->reporter, CUDA0, cuda, &s, &last,
                                          f->err, sizeof f->err), 0);
    Scope_fini(&s);
    assert_true(last);
    assert_false(fake.tracker);
    assert_int_equal(fake.pushed, 0);
}

/* A failure anywhere in open undoes what it did; the bridge's message is
 * the first failure's. */
static void
test_a_failed_open_undoes_itself(void **state)
{
    Fixture *f = *state;
    int first, last;
    uint32_t id, ids[SCOPE_MAX_DEPTH];
    Scope s;
    assert_int_equal(Reporter_bind(&f->reporter, &bridge), 0);
    fake.fail_install = 1;
    assert_int_equal(Reporter_open_scope(&f->reporter, CPU, 0, -1, -1, 0, 0, &id,
                                         &first, f->err, sizeof f->err),
                     REPORTER_EBRIDGE);
    assert_string_equal(f->err, "install refused");
    assert_false(fake.cpu);
    fake.fail_install = 0;
    for (int i = 0; i < SCOPE_MAX_DEPTH; i++)
        assert_int_equal(Engine_begin(f->engine, CUDA0, 0, 0, 0, &ids[i]), 0);
    fake.fail_uninstall = 1;
    f->err[0] = '\0';
    assert_int_equal(Reporter_open_scope(&f->reporter, CUDA0, 0, 0, 0, 0, 0, &id,
                                         &first, f->err, sizeof f->err),
                     REPORTER_ESCOPE);
    assert_string_equal(f->err, "");
    assert_false(fake.tracker);
    assert_int_equal(Reporter_depth(), 0);
    fake.fail_uninstall = 0;
    fake.pushed = 0;
    for (int i = SCOPE_MAX_DEPTH - 1; i >= 0; i--) {
        assert_int_equal(Engine_end(f->engine, CUDA0, ids[i], &s), 0);
        Scope_fini(&s);
    }
    /* popping the reporter fails on close: the scope is closed all the same */
    assert_int_equal(Reporter_open_scope(&f->reporter, CPU, 0, -1, -1, 0, 0, &id,
                                         &first, f->err, sizeof f->err), 0);
    fake.fail_uninstall = 1;
    assert_int_equal(Reporter_close_scope(&f->reporter, CPU, id, &s, &last,
                                          f->err, sizeof f->err),
                     REPORTER_EBRIDGE);
    assert_string_equal(f->err, "uninstall refused");
    assert_int_equal(Engine_stats(f->engine, CPU, id, 0, &s), -1);
    assert_int_equal(Reporter_depth(), 0);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unbound_refuses_everything, setup, teardown),
        cmocka_unit_test_setup_teardown(test_installs_are_counted_per_thread, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_and_close_a_scope, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_failed_open_undoes_itself, setup, teardown),
    };
    return cmocka_run_group_tests_name("reporter", tests, NULL, NULL);
}
