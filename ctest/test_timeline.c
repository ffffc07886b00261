/* Timelines: bounded, and no peak or trough lost however long the test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "engine.h"
#include "timeline.h"

static void
test_short_timeline_keeps_every_event(void **state)
{
    (void)state;
    Timeline t = {0};
    TimelinePoint out[16];
    assert_int_equal(Timeline_start(&t, 10, 0, 100), 0);
    Timeline_add(&t, 11, 64, 164);
    Timeline_add(&t, 12, 0, 100);
    Timeline_add(&t, 9, 999, 999);          /* before the start: ignored */
    assert_int_equal(t.n, 3);
    assert_int_equal(Timeline_copy(&t, out, 16), 3);
    assert_int_equal(out[1].seq, 11);
    assert_int_equal(out[1].own_max, 64);
    assert_int_equal(out[1].total_max, 164);
    assert_int_equal(out[2].own_min, 0);
    Timeline_fini(&t);
}

/* A million events with one spike and one dip among them: the buckets
 * stay within TIMELINE_MAX and both extremes survive every merge, in the
 * engine's timeline and in a copy merged down to 100 points. */
static void
test_long_timeline_is_bounded_and_keeps_extremes(void **state)
{
    (void)state;
    Timeline t = {0};
    TimelinePoint *out = malloc(TIMELINE_MAX * sizeof(TimelinePoint));
    assert_non_null(out);
    assert_int_equal(Timeline_start(&t, 0, 1000, 5000), 0);
    for (uint64_t seq = 1; seq <= 1000000; seq++) {
        int64_t own = 1000 + (int64_t)(seq % 7);
        if (seq == 777777)
            own = 1 << 30;                  /* the peak */
        if (seq == 333333)
            own = -5;                       /* the trough */
        Timeline_add(&t, seq, own, own + 4000);
    }
    assert_true(t.n <= TIMELINE_MAX);
    assert_true(t.n > TIMELINE_MAX / 2);
    for (uint32_t max = 100; max <= TIMELINE_MAX; max += TIMELINE_MAX - 100) {
        uint32_t n = Timeline_copy(&t, out, max);
        assert_true(n <= max);
        int64_t hi = 0, lo = 1 << 30, total_hi = 0;
        uint64_t prev = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (out[i].own_max > hi)
                hi = out[i].own_max;
            if (out[i].own_min < lo)
                lo = out[i].own_min;
            if (out[i].total_max > total_hi)
                total_hi = out[i].total_max;
            assert_true(i == 0 || out[i].seq > prev);
            prev = out[i].seq;
        }
        assert_int_equal(hi, 1 << 30);
        assert_int_equal(lo, -5);
        assert_int_equal(total_hi, (1 << 30) + 4000);
    }
    free(out);
    Timeline_fini(&t);
}

/* Through the engine: the test scope's timeline follows its own bytes and
 * the device total; a nested scope does not start another; the timeline
 * stays readable after its scope closed. */
static void
test_engine_timeline_of_a_scope(void **state)
{
    (void)state;
    Engine *e = Engine_new();
    assert_non_null(e);
    uint32_t outer, inner;
    Scope s;
    TimelinePoint out[8];
    uint64_t seq0, last;
    assert_int_equal(Engine_begin(e, 0, 0, -1, -1, &outer), 0);
    assert_int_equal(Engine_timeline_start(e, 0, outer), 0);
    Engine_event(e, 0, 0x1000, 100, 0, 0, EVENT_REPORT);
    assert_int_equal(Engine_begin(e, 0, 0, -1, -1, &inner), 0);
    Engine_event(e, 0, 0x2000, 50, 0, 0, EVENT_REPORT);
    assert_int_equal(Engine_end(e, 0, inner, &s), 0);
    Scope_fini(&s);
    Engine_event(e, 0, 0x1000, -100, 0, 0, EVENT_REPORT);
    assert_int_equal(Engine_seq(e, 0), 3);
    assert_int_equal(Engine_end(e, 0, outer, &s), 0);
    Scope_fini(&s);
    Engine_event(e, 0, 0x3000, 10, 0, 0, EVENT_REPORT);   /* after: not in it */
    assert_int_equal(Engine_timeline(e, 0, out, 8, &seq0, &last), 4);
    assert_int_equal(seq0, 0);
    assert_int_equal(last, 3);
    assert_int_equal(out[1].own_max, 100);
    assert_int_equal(out[2].own_max, 150);
    assert_int_equal(out[2].total_max, 150);
    assert_int_equal(out[3].own_max, 50);
    assert_int_equal(Engine_timeline_start(e, 0, outer), -1);  /* closed */
    Engine_free(e);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_short_timeline_keeps_every_event),
        cmocka_unit_test(test_long_timeline_is_bounded_and_keeps_extremes),
        cmocka_unit_test(test_engine_timeline_of_a_scope),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
