/* The phase log: bounded, labels cut safely. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "phases.h"

static void
test_records_in_order_and_counts_past_the_end(void **state)
{
    (void)state;
    PhaseLog *log = calloc(1, sizeof(PhaseLog));
    assert_non_null(log);
    PhaseLog_add(log, PHASE_FORWARD, 0, 5, "forward Net");
    PhaseLog_add(log, PHASE_BACKWARD, 1, 9, "backward");
    assert_int_equal(log->n, 2);
    assert_string_equal(log->recs[0].label, "forward Net");
    assert_int_equal(log->recs[1].slot, 1);
    assert_int_equal(log->recs[1].seq, 9);
    for (int i = 0; i < PHASE_LOG_MAX; i++)
        PhaseLog_add(log, PHASE_STEP, 0, (uint64_t)i, "SGD.step");
    assert_int_equal(log->n, PHASE_LOG_MAX);
    assert_int_equal(log->dropped, 2);
    PhaseLog_reset(log);
    assert_int_equal(log->n, 0);
    assert_int_equal(log->dropped, 0);
    free(log);
}

static void
test_a_long_label_is_cut_at_a_character_boundary(void **state)
{
    (void)state;
    PhaseLog *log = calloc(1, sizeof(PhaseLog));
    assert_non_null(log);
    char label[200];
    /* "forward " then 3-byte characters, so the cut falls inside one */
    strcpy(label, "forward ");
    for (int i = 0; i < 40; i++)
        strcat(label, "\xe2\x82\xac");     /* the euro sign */
    PhaseLog_add(log, PHASE_FORWARD, 0, 1, label);
    size_t len = strlen(log->recs[0].label);
    assert_true(len <= PHASE_LABEL - 1);
    assert_int_equal((len - 8) % 3, 0);
    PhaseLog_add(log, PHASE_FORWARD, 0, 2, NULL);
    assert_string_equal(log->recs[1].label, "");
    free(log);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_records_in_order_and_counts_past_the_end),
        cmocka_unit_test(test_a_long_label_is_cut_at_a_character_boundary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
