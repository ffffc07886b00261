/* Shadow stacks: frames pushed and popped as the tracer's event sources
 * report them, line statistics kept per line, peaks carried to callers,
 * missed returns and overflow survived; located frames' lines found at
 * allocation from the instruction they run. */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "shadow_stack.h"

#define CUDA0 1

/* A located frame here: the instruction it runs, which the test moves as
 * the interpreter would; its code object's line of an instruction is
 * 100 * code + lasti / 2, and each lookup is counted. */
typedef struct FakeFrame {
    int lasti;
} FakeFrame;

static int line_lookups;

static int
fake_lasti(const void *where)
{
    return ((const FakeFrame *)where)->lasti;
}

static int
fake_line_of(const void *code_ref, int lasti)
{
    line_lookups++;
    return 100 * *(const int *)code_ref + lasti / 2;
}

typedef struct Fixture {
    Engine *engine;
    LineTable *lines;
    SiteTable *sites;
    LineClock clock;
    ShadowStack *stack;
    uint32_t scope;
} Fixture;

static int
setup(void **state)
{
    Fixture *f = calloc(1, sizeof(Fixture));
    f->engine = Engine_new();
    f->lines = calloc(1, sizeof(LineTable));
    f->sites = calloc(1, sizeof(SiteTable));
    if (f->engine == NULL || f->lines == NULL || f->sites == NULL
        || LineTable_init(f->lines) < 0 || SiteTable_init(f->sites) < 0)
        return -1;
    f->clock.engine = f->engine;
    f->clock.lines = f->lines;
    f->clock.sites = f->sites;
    f->clock.lasti = fake_lasti;
    f->clock.line_of = fake_line_of;
    line_lookups = 0;
    f->stack = ShadowStack_new();
    if (Engine_begin(f->engine, CUDA0, 0, 0, 0, &f->scope) < 0)
        return -1;
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    Fixture *f = *state;
    Scope s;
    Engine_end(f->engine, CUDA0, f->scope, &s);
    Scope_fini(&s);
    free(f->stack);
    LineTable_fini(f->lines);
    free(f->lines);
    SiteTable_fini(f->sites);
    free(f->sites);
    Engine_free(f->engine);
    free(f);
    return 0;
}

static LineRec *
line(Fixture *f, uint32_t code, int32_t lineno)
{
    return LineTable_get(f->lines, LineTable_intern(f->lines, code, lineno));
}

static void
test_a_callees_peak_counts_for_the_calling_line(void **state)
{
    Fixture *f = *state;
    ShadowStack_push(f->stack, &f->clock, 1, 10);        /* caller, line 10 */
    assert_int_equal(ShadowStack_line(f->stack, &f->clock, 1, 11), 1);
    ShadowStack_push(f->stack, &f->clock, 2, 20);        /* callee */
    Engine_event(f->engine, CUDA0, 0xA00, 512, 512, 2048, EVENT_REPORT);
    /* the allocator path raises the running frame's high-water mark */
    uint32_t site = ShadowStack_attribute(f->stack, &f->clock, 1, CUDA0, 512,
                                          512, 2048);
    Engine_event(f->engine, CUDA0, 0xA00, -512, 0, 2048, EVENT_REPORT);
    /* its site is the chain the frames interned: callee's line, caller's */
    const SiteRec *r = SiteTable_get(f->sites, site);
    assert_non_null(r);
    assert_int_equal(r->n, 2);
    assert_int_equal(r->lines[0], LineTable_intern(f->lines, 2, 20));
    assert_int_equal(r->lines[1], LineTable_intern(f->lines, 1, 11));
    assert_int_equal(atomic_load(&line(f, 2, 20)->alloc[CUDA0]), 512);
    ShadowStack_pop(f->stack, &f->clock, 2);
    assert_int_equal(atomic_load(&f->stack->depth), 1);
    ShadowStack_pop(f->stack, &f->clock, 1);
    assert_int_equal(atomic_load(&f->stack->depth), 0);
    assert_int_equal(atomic_load(&line(f, 2, 20)->peak[CUDA0]), 512);
    assert_int_equal(atomic_load(&line(f, 1, 11)->peak[CUDA0]), 512);
    assert_int_equal(atomic_load(&line(f, 1, 10)->peak[CUDA0]), 0);
    assert_int_equal(atomic_load(&line(f, 1, 11)->last_total[CUDA0]), 0);
    assert_int_equal(atomic_load(&line(f, 1, 11)->hits), 1);
}

static void
test_a_missed_return_is_repaired_by_the_callers_next_line(void **state)
{
    Fixture *f = *state;
    ShadowStack_push(f->stack, &f->clock, 1, 10);
    ShadowStack_push(f->stack, &f->clock, 2, 20);
    ShadowStack_push(f->stack, &f->clock, 3, 30);        /* its return is lost */
    assert_int_equal(ShadowStack_line(f->stack, &f->clock, 1, 12), 1);
    assert_int_equal(atomic_load(&f->stack->depth), 1);
    assert_int_equal(f->stack->frames[0].lineno, 12);
}

static void
test_a_frame_that_began_before_tracing_stays_untraced(void **state)
{
    Fixture *f = *state;
    assert_int_equal(ShadowStack_line(f->stack, &f->clock, 9, 90), 0);
    assert_int_equal(atomic_load(&f->stack->depth), 0);
}

static void
test_frames_past_the_depth_are_counted_not_stored(void **state)
{
    Fixture *f = *state;
    for (int i = 0; i < SHADOW_STACK_DEPTH + 5; i++)
        ShadowStack_push(f->stack, &f->clock, 1, i);
    assert_int_equal(atomic_load(&f->stack->depth), SHADOW_STACK_DEPTH);
    assert_int_equal(f->stack->overflow, 5);
    assert_int_equal(ShadowStack_line(f->stack, &f->clock, 1, 7), 1);
    for (int i = 0; i < 5; i++)
        ShadowStack_pop(f->stack, &f->clock, 1);
    assert_int_equal(f->stack->overflow, 0);
    assert_int_equal(atomic_load(&f->stack->depth), SHADOW_STACK_DEPTH);
    ShadowStack_reset(f->stack);
    assert_int_equal(atomic_load(&f->stack->depth), 0);
}

static uint32_t
chain_line(Fixture *f, uint32_t site, uint32_t i)
{
    const SiteRec *r = SiteTable_get(f->sites, site);
    assert_non_null(r);
    assert_true(i < r->n);
    return r->lines[i];
}

static void
test_a_located_frames_line_is_found_at_allocation(void **state)
{
    Fixture *f = *state;
    int code1 = 1, code2 = 2;
    FakeFrame caller = {.lasti = 8}, callee = {.lasti = 4};
    ShadowStack_push_located(f->stack, 1, &caller, &code1);
    ShadowStack_push_located(f->stack, 2, &callee, &code2);
    assert_int_equal(line_lookups, 0);      /* nothing found until needed */
    uint32_t site = ShadowStack_attribute(f->stack, &f->clock, 1, CUDA0, 512,
                                          512, 2048);
    assert_int_equal(chain_line(f, site, 0), LineTable_intern(f->lines, 2, 202));
    assert_int_equal(chain_line(f, site, 1), LineTable_intern(f->lines, 1, 104));
    assert_int_equal(atomic_load(&line(f, 2, 202)->alloc[CUDA0]), 512);
    assert_int_equal(atomic_load(&line(f, 1, 104)->alloc[CUDA0]), 0);
    /* the chain's lines reach the total, callers included */
    assert_int_equal(atomic_load(&line(f, 2, 202)->peak[CUDA0]), 512);
    assert_int_equal(atomic_load(&line(f, 1, 104)->peak[CUDA0]), 512);
    assert_int_equal(line_lookups, 2);
    /* the same instruction again: the owner's cached site, no lookup */
    assert_int_equal(ShadowStack_attribute(f->stack, &f->clock, 1, CUDA0, 256,
                                           768, 2048), site);
    assert_int_equal(line_lookups, 2);
    assert_int_equal(atomic_load(&line(f, 2, 202)->alloc[CUDA0]), 768);
    assert_int_equal(atomic_load(&line(f, 1, 104)->peak[CUDA0]), 768);
    /* the callee moves on: its line is found again, the caller's cached */
    callee.lasti = 10;
    uint32_t moved = ShadowStack_attribute(f->stack, &f->clock, 1, CUDA0, 64,
                                           832, 2048);
    assert_int_not_equal(moved, site);
    assert_int_equal(chain_line(f, moved, 0), LineTable_intern(f->lines, 2, 205));
    assert_int_equal(chain_line(f, moved, 1), LineTable_intern(f->lines, 1, 104));
    assert_int_equal(line_lookups, 3);
    /* a failed request (0 bytes): its site, nothing charged */
    assert_int_equal(ShadowStack_attribute(f->stack, &f->clock, 1, CUDA0, 0,
                                           0, 0), moved);
    assert_int_equal(atomic_load(&line(f, 2, 205)->alloc[CUDA0]), 64);
    ShadowStack_pop(f->stack, &f->clock, 2);
    /* the caller allocates itself: charged to its own line */
    uint32_t own = ShadowStack_attribute(f->stack, &f->clock, 1, CUDA0, 32,
                                         864, 2048);
    assert_int_equal(chain_line(f, own, 0), LineTable_intern(f->lines, 1, 104));
    assert_int_equal(atomic_load(&line(f, 1, 104)->alloc[CUDA0]), 32);
    ShadowStack_pop(f->stack, &f->clock, 1);
    assert_int_equal(atomic_load(&f->stack->depth), 0);
}

static void
test_another_thread_finds_the_line_without_caching_it(void **state)
{
    Fixture *f = *state;
    int code1 = 1;
    FakeFrame test = {.lasti = 6};
    ShadowStack_push_located(f->stack, 1, &test, &code1);
    uint32_t site = ShadowStack_attribute(f->stack, &f->clock, 0, CUDA0, 512,
                                          512, 2048);
    assert_int_equal(chain_line(f, site, 0), LineTable_intern(f->lines, 1, 103));
    assert_int_equal(f->stack->frames[0].lasti, INT_MIN);   /* the owner's cache */
    assert_int_equal(atomic_load(&f->stack->readers), 0);
    /* where the owner is now, each time */
    test.lasti = 12;
    site = ShadowStack_attribute(f->stack, &f->clock, 0, CUDA0, 512, 1024, 2048);
    assert_int_equal(chain_line(f, site, 0), LineTable_intern(f->lines, 1, 106));
    assert_int_equal(line_lookups, 2);
    assert_int_equal(atomic_load(&line(f, 1, 106)->alloc[CUDA0]), 512);
}

static void
test_a_traced_frame_over_a_located_one(void **state)
{
    Fixture *f = *state;
    int code1 = 1;
    FakeFrame caller = {.lasti = 20};
    ShadowStack_push_located(f->stack, 1, &caller, &code1);
    ShadowStack_push(f->stack, &f->clock, 7, 70);   /* a profiled function */
    uint32_t site = ShadowStack_attribute(f->stack, &f->clock, 1, CUDA0, 128,
                                          128, 2048);
    assert_int_equal(chain_line(f, site, 0), LineTable_intern(f->lines, 7, 70));
    assert_int_equal(chain_line(f, site, 1), LineTable_intern(f->lines, 1, 110));
    assert_int_equal(atomic_load(&line(f, 7, 70)->alloc[CUDA0]), 128);
    ShadowStack_pop(f->stack, &f->clock, 7);
    ShadowStack_pop(f->stack, &f->clock, 1);
    assert_int_equal(atomic_load(&line(f, 7, 70)->peak[CUDA0]), 128);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_a_callees_peak_counts_for_the_calling_line, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_missed_return_is_repaired_by_the_callers_next_line, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_frame_that_began_before_tracing_stays_untraced, setup, teardown),
        cmocka_unit_test_setup_teardown(test_frames_past_the_depth_are_counted_not_stored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_located_frames_line_is_found_at_allocation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_another_thread_finds_the_line_without_caching_it, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_traced_frame_over_a_located_one, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
