/* The ledger: hashing, growth, backward-shift deletion, iteration. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "ledger.h"

static void
test_insert_find_remove(void **state)
{
    (void)state;
    Ledger l;
    assert_int_equal(Ledger_init(&l, 16), 0);
    int created;
    Block *b = Ledger_insert(&l, 0x1000, &created);
    assert_non_null(b);
    assert_true(created);
    b->size = 42;
    b = Ledger_insert(&l, 0x1000, &created);
    assert_false(created);
    assert_int_equal(b->size, 42);
    assert_int_equal(l.count, 1);
    Block out;
    assert_int_equal(Ledger_remove(&l, 0x1000, &out), 1);
    assert_int_equal(out.size, 42);
    assert_int_equal(Ledger_remove(&l, 0x1000, &out), 0);
    assert_null(Ledger_find(&l, 0x1000));
    assert_int_equal(l.count, 0);
    Ledger_fini(&l);
}

/* Addresses that collide in a small table exercise the probe runs and the
 * backward shift: every survivor must stay findable after each removal. */
static void
test_colliding_runs_survive_removals(void **state)
{
    (void)state;
    Ledger l;
    assert_int_equal(Ledger_init(&l, 16), 0);
    enum { N = 2000 };
    int created;
    for (uintptr_t i = 1; i <= N; i++) {
        Block *b = Ledger_insert(&l, i * 4096, &created);
        assert_non_null(b);
        b->size = (int64_t)i;
    }
    assert_int_equal(l.count, N);
    /* remove every third, in an order unlike insertion */
    for (uintptr_t i = N; i >= 1; i--) {
        if (i % 3 == 0)
            assert_int_equal(Ledger_remove(&l, i * 4096, NULL), 1);
    }
    for (uintptr_t i = 1; i <= N; i++) {
        Block *b = Ledger_find(&l, i * 4096);
        if (i % 3 == 0) {
            assert_null(b);
        }
        else {
            assert_non_null(b);
            assert_int_equal(b->size, (int64_t)i);
        }
    }
    size_t pos = 0, seen = 0;
    int64_t sum = 0;
    Block *b;
    while ((b = Ledger_next(&l, &pos)) != NULL) {
        seen++;
        sum += b->size;
    }
    int64_t expected = 0;
    for (int64_t i = 1; i <= N; i++)
        if (i % 3 != 0)
            expected += i;
    assert_int_equal(seen, l.count);
    assert_int_equal(sum, expected);
    Ledger_clear(&l);
    assert_int_equal(l.count, 0);
    assert_null(Ledger_find(&l, 4096));
    Ledger_fini(&l);
}

/* Clearing leaves an empty ledger alone, gives a grown one back as a small
 * table, and either is usable afterwards. */
static void
test_clear_empty_and_grown(void **state)
{
    (void)state;
    enum { N = 100000 };
    Ledger l;
    assert_int_equal(Ledger_init(&l, 1024), 0);
    Block *before = l.slots;
    Ledger_clear(&l);   /* empty: nothing swept, nothing reallocated */
    assert_ptr_equal(l.slots, before);
    assert_int_equal(l.mask + 1, 1024);
    int created;
    for (uintptr_t i = 1; i <= N; i++) {
        Block *b = Ledger_insert(&l, i * 512, &created);
        assert_non_null(b);
        b->size = 1;
    }
    assert_true(l.mask + 1 > N);
    Ledger_clear(&l);
    assert_int_equal(l.count, 0);
    assert_true(l.mask + 1 <= 4096);
    for (uintptr_t i = 1; i <= N; i += 997)
        assert_null(Ledger_find(&l, i * 512));
    Block *b = Ledger_insert(&l, 512, &created);
    assert_non_null(b);
    assert_true(created);
    assert_int_equal(l.count, 1);
    Ledger_clear(&l);   /* small and not empty: swept in place */
    assert_int_equal(l.count, 0);
    assert_null(Ledger_find(&l, 512));
    Ledger_fini(&l);
}

/* A pseudo-random workload against a plain array model. */
static void
test_random_against_model(void **state)
{
    (void)state;
    enum { SPACE = 512, STEPS = 200000 };
    int64_t model[SPACE] = {0};
    Ledger l;
    assert_int_equal(Ledger_init(&l, 16), 0);
    uint64_t x = 88172645463325252ULL;
    size_t live = 0;
    for (int step = 0; step < STEPS; step++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t k = (size_t)(x % SPACE);
        uintptr_t addr = (uintptr_t)(k + 1) * 512;
        if (model[k] == 0) {
            int created;
            Block *b = Ledger_insert(&l, addr, &created);
            assert_true(created);
            b->size = (int64_t)(x % 1000) + 1;
            model[k] = b->size;
            live++;
        }
        else {
            Block out;
            assert_int_equal(Ledger_remove(&l, addr, &out), 1);
            assert_int_equal(out.size, model[k]);
            model[k] = 0;
            live--;
        }
        assert_int_equal(l.count, live);
    }
    for (size_t k = 0; k < SPACE; k++) {
        Block *b = Ledger_find(&l, (uintptr_t)(k + 1) * 512);
        if (model[k])
            assert_int_equal(b->size, model[k]);
        else
            assert_null(b);
    }
    Ledger_fini(&l);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_insert_find_remove),
        cmocka_unit_test(test_colliding_runs_survive_removals),
        cmocka_unit_test(test_random_against_model),
        cmocka_unit_test(test_clear_empty_and_grown),
    };
    return cmocka_run_group_tests_name("ledger", tests, NULL, NULL);
}
