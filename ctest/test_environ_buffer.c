/* The children's variable through memlab's own buffers: each value
 * published whole, the buffers taking turns, nothing kept per value. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "environ_buffer.h"

#define NAME "MEMLAB_TEST_VARIABLE"

static int
put(const char *value)
{
    return EnvironBuffer_put(NAME, strlen(NAME), value, strlen(value));
}

static void
test_each_value_is_published_and_the_buffers_take_turns(void **state)
{
    (void)state;
    assert_int_equal(put("first"), 0);
    const char *first = getenv(NAME);
    assert_non_null(first);
    assert_string_equal(first, "first");
    assert_int_equal(put("second"), 0);
    const char *second = getenv(NAME);
    assert_string_equal(second, "second");
    /* Written into the buffer the environment did not hold: the first
     * value was never overwritten while published. */
    assert_ptr_not_equal(first, second);
    assert_string_equal(first, "first");
    assert_int_equal(put("third"), 0);
    assert_ptr_equal(getenv(NAME), first);
    assert_string_equal(getenv(NAME), "third");
    unsetenv(NAME);
}

static void
test_unset_and_a_value_set_by_setenv_in_between(void **state)
{
    (void)state;
    assert_int_equal(put("armed"), 0);
    assert_int_equal(unsetenv(NAME), 0);
    assert_null(getenv(NAME));
    assert_int_equal(put("again"), 0);
    assert_string_equal(getenv(NAME), "again");
    assert_int_equal(setenv(NAME, "someone else's", 1), 0);
    assert_int_equal(put("ours"), 0);
    assert_string_equal(getenv(NAME), "ours");
    unsetenv(NAME);
}

/* Values longer than the buffers grow them, and thousands of distinct
 * values (one a measured test) keep only the two buffers. */
static void
test_long_and_many_values(void **state)
{
    (void)state;
    char *big = malloc(5000);
    assert_non_null(big);
    memset(big, 'x', 4999);
    big[4999] = '\0';
    assert_int_equal(put(big), 0);
    assert_string_equal(getenv(NAME), big);
    assert_int_equal(put("short"), 0);
    assert_int_equal(put(big), 0);
    assert_string_equal(getenv(NAME), big);
    char value[64];
    for (int i = 0; i < 20000; i++) {
        snprintf(value, sizeof(value), "/tmp/memlab-children-test/%d", i);
        assert_int_equal(put(value), 0);
        assert_string_equal(getenv(NAME), value);
        if (i % 2)
            unsetenv(NAME);
    }
    unsetenv(NAME);
    free(big);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_value_is_published_and_the_buffers_take_turns),
        cmocka_unit_test(test_unset_and_a_value_set_by_setenv_in_between),
        cmocka_unit_test(test_long_and_many_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
