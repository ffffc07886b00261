/* Lines and sites: interning, growth, and lookups by id. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "sites.h"

static void
test_lines_intern_once_and_reset(void **state)
{
    (void)state;
    LineTable *t = calloc(1, sizeof(LineTable));
    assert_int_equal(LineTable_init(t), 0);
    uint32_t a = LineTable_intern(t, 1, 10);
    uint32_t b = LineTable_intern(t, 1, 11);
    assert_int_not_equal(a, 0);
    assert_int_not_equal(a, b);
    assert_int_equal(LineTable_intern(t, 1, 10), a);
    /* enough lines to grow the map and cross a chunk */
    for (int32_t i = 0; i < 10000; i++)
        assert_int_not_equal(LineTable_intern(t, 7, i), 0);
    assert_int_equal(LineTable_intern(t, 7, 9999), LineTable_intern(t, 7, 9999));
    LineRec *r = LineTable_get(t, a);
    assert_int_equal(r->code, 1);
    assert_int_equal(r->lineno, 10);
    LineTable_touch(t, r, a);
    LineTable_touch(t, r, a);   /* once per epoch */
    atomic_store(&r->hits, 5);
    atomic_store(&r->peak[1], 99);
    uint32_t n;
    assert_int_equal(LineTable_touched(t, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(LineTable_touched_id(t, 0), a);
    LineTable_reset(t);
    assert_int_equal(atomic_load(&r->hits), 0);
    assert_int_equal(atomic_load(&r->peak[1]), 0);
    assert_int_equal(LineTable_touched(t, &n), 0);
    assert_int_equal(n, 0);
    /* a new epoch: the same line is listed again when touched again */
    LineTable_touch(t, r, a);
    assert_int_equal(LineTable_touched(t, &n), 0);
    assert_int_equal(n, 1);
    assert_null(LineTable_get(t, 0));
    assert_null(LineTable_get(t, 1000000));
    LineTable_fini(t);
    free(t);
}

/* More lines touched than the list holds: every line is read and reset. */
static void
test_lines_touched_past_the_list_reset_them_all(void **state)
{
    (void)state;
    LineTable *t = calloc(1, sizeof(LineTable));
    assert_int_equal(LineTable_init(t), 0);
    uint32_t count = LINE_TOUCHED_CAP + 10;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t id = LineTable_intern(t, 3, (int32_t)i);
        assert_int_not_equal(id, 0);
        LineRec *r = LineTable_get(t, id);
        LineTable_touch(t, r, id);
        atomic_store(&r->alloc[0], 1);
    }
    uint32_t n;
    assert_int_equal(LineTable_touched(t, &n), -1);
    LineTable_reset(t);
    for (uint32_t id = 1; id <= count; id++)
        assert_int_equal(atomic_load(&LineTable_get(t, id)->alloc[0]), 0);
    assert_int_equal(LineTable_touched(t, &n), 0);
    assert_int_equal(n, 0);
    LineTable_fini(t);
    free(t);
}

static void
test_sites_intern_chains(void **state)
{
    (void)state;
    SiteTable *t = calloc(1, sizeof(SiteTable));
    assert_int_equal(SiteTable_init(t), 0);
    uint32_t c1[] = {5, 3, 1};
    uint32_t c2[] = {5, 3};
    uint32_t s1 = SiteTable_intern(t, c1, 3);
    uint32_t s2 = SiteTable_intern(t, c2, 2);
    assert_int_not_equal(s1, s2);
    assert_int_equal(SiteTable_intern(t, c1, 3), s1);
    assert_int_equal(SiteTable_intern(t, c1, 0), 0);
    const SiteRec *r = SiteTable_get(t, s1);
    assert_int_equal(r->n, 3);
    assert_int_equal(r->lines[0], 5);
    assert_int_equal(r->lines[2], 1);
    /* long chains keep the innermost SITE_CHAIN lines */
    uint32_t longer[SITE_CHAIN + 4];
    for (int i = 0; i < SITE_CHAIN + 4; i++)
        longer[i] = (uint32_t)i + 1;
    uint32_t s3 = SiteTable_intern(t, longer, SITE_CHAIN + 4);
    assert_int_equal(SiteTable_get(t, s3)->n, SITE_CHAIN);
    for (uint32_t i = 1; i <= 20000; i++) {
        uint32_t c[] = {i, i + 1};
        assert_int_equal(SiteTable_intern(t, c, 2), SiteTable_intern(t, c, 2));
    }
    assert_int_equal(SiteTable_intern(t, c1, 3), s1);
    SiteTable_fini(t);
    free(t);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lines_intern_once_and_reset),
        cmocka_unit_test(test_lines_touched_past_the_list_reset_them_all),
        cmocka_unit_test(test_sites_intern_chains),
    };
    return cmocka_run_group_tests_name("sites", tests, NULL, NULL);
}
