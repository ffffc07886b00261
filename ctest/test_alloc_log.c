/* The allocation log of a snapshot: only what the ledger changed, in
 * order, with sites; bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "engine.h"

static void
test_logs_allocations_and_frees_of_a_scope(void **state)
{
    (void)state;
    Engine *e = Engine_new();
    assert_non_null(e);
    uint32_t id, n;
    uint64_t dropped;
    Scope s;
    assert_int_equal(Engine_begin(e, 0, 0, -1, -1, &id), 0);
    assert_int_equal(Engine_alloc_log_start(e, 0, id, 1000), 0);
    Engine_event(e, 0, 0x1000, 100, 0, 0, EVENT_REPORT);
    Engine_event(e, 0, 0x2000, 50, 0, 0, EVENT_REPORT);
    Engine_event(e, 0, 0x9000, -7, 0, 0, EVENT_REPORT);   /* unknown: not logged */
    Engine_event(e, 0, 0x1000, -100, 0, 0, EVENT_REPORT);
    assert_int_equal(Engine_end(e, 0, id, &s), 0);
    Scope_fini(&s);
    Engine_event(e, 0, 0x3000, 10, 0, 0, EVENT_REPORT);    /* after: not logged */
    AllocEntry *log = Engine_alloc_log_take(e, 0, 0, &n, &dropped);
    assert_non_null(log);
    assert_int_equal(n, 3);
    assert_int_equal(dropped, 0);
    assert_int_equal(log[0].addr, 0x1000);
    assert_int_equal(log[0].size, 100);
    assert_int_equal(log[1].size, 50);
    assert_int_equal(log[2].addr, 0x1000);
    assert_int_equal(log[2].size, -100);
    assert_true(log[2].time_us >= log[0].time_us);
    /* Each entry's event number, as a phase's start or the peak has it
     * (the unknown free between them was an event too). */
    assert_int_equal(log[1].seq, log[0].seq + 1);
    assert_int_equal(log[2].seq, log[0].seq + 3);
    assert_int_equal(log[0].counts, 1);
    free(log);
    assert_null(Engine_alloc_log_take(e, 0, 0, &n, &dropped));
    assert_int_equal(n, 0);
    Engine_free(e);
}

static void
test_past_the_bound_entries_are_counted(void **state)
{
    (void)state;
    AllocLog log = {0};
    uint32_t n;
    uint64_t dropped;
    AllocLog_start(&log, 300);
    for (uint64_t i = 0; i < 1000; i++)
        AllocLog_add(&log, 0x1000 + i, 8, 1, 7 + i, 1);
    AllocEntry *entries = AllocLog_take(&log, &n, &dropped);
    assert_int_equal(n, 300);
    assert_int_equal(dropped, 700);
    assert_int_equal(entries[299].addr, 0x1000 + 299);
    assert_int_equal(entries[299].seq, 7 + 299);
    free(entries);
    AllocLog_fini(&log);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logs_allocations_and_frees_of_a_scope),
        cmocka_unit_test(test_past_the_bound_entries_are_counted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
