/* Scopes' per-site accounting: a map sized by the sites a scope touched,
 * whose snapshot at the peak holds what each site held then. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "scope.h"

/* The cell of a site, or NULL when the scope never touched it. */
static const SiteCell *
cell_of(const Scope *s, uint32_t site)
{
    uint32_t cap = SiteStats_capacity(&s->sites);
    for (uint32_t i = 0; i < cap; i++) {
        if (s->sites.cells[i].key == site + 1)
            return &s->sites.cells[i];
    }
    return NULL;
}

static void
test_site_figures_at_the_peak(void **state)
{
    (void)state;
    ScopeStack st;
    Scope s;
    ScopeStack_init(&st);
    assert_int_equal(ScopeStack_push(&st, 1, 0, 0, -1), 0);
    ScopeStack_on_alloc(&st, 100, 7, 100, 1);
    ScopeStack_on_alloc(&st, 50, 0, 150, 2);           /* site 0: unknown */
    ScopeStack_on_resize(&st, 0, 1, 7, -100, 1, 50, 3);
    ScopeStack_on_alloc(&st, 30, 9, 80, 4);
    assert_int_equal(ScopeStack_pop(&st, 1, &s), 0);
    assert_int_equal(s.peak, 150);
    assert_int_equal(cell_of(&s, 7)->at_peak, 100);
    assert_int_equal(cell_of(&s, 7)->live, 0);
    assert_int_equal(cell_of(&s, 0)->at_peak, 50);
    assert_int_equal(cell_of(&s, 9)->at_peak, 0);
    assert_int_equal(cell_of(&s, 9)->live, 30);
    assert_null(cell_of(&s, 8));
    Scope_fini(&s);
}

/* Site ids far apart (a long suite's ids) cost a map of the sites touched,
 * not of the highest id; growing keeps the figures and the dirty list. */
static void
test_many_far_sites_grow_the_map(void **state)
{
    (void)state;
    ScopeStack st;
    Scope s, copy;
    ScopeStack_init(&st);
    assert_int_equal(ScopeStack_push(&st, 1, 0, 0, -1), 0);
    int64_t total = 0;
    for (uint32_t i = 0; i < 1000; i++) {
        total += 1 + i;
        ScopeStack_on_alloc(&st, 1 + i, 1000000 + 4099 * i, total, i);
    }
    copy = *ScopeStack_top(&st);    /* as Engine_stats reads an open scope */
    assert_int_equal(SiteStats_copy(&copy.sites, &ScopeStack_top(&st)->sites), 0);
    assert_int_equal(ScopeStack_pop(&st, 1, &s), 0);
    assert_true(SiteStats_capacity(&s.sites) <= 4096);
    assert_int_equal(s.sites.count, 1000);
    for (uint32_t i = 0; i < 1000; i++) {
        const SiteCell *c = cell_of(&s, 1000000 + 4099 * i);
        assert_non_null(c);
        assert_int_equal(c->at_peak, 1 + i);
        assert_int_equal(c->live, 1 + i);
        assert_int_equal(cell_of(&copy, 1000000 + 4099 * i)->at_peak, 1 + i);
    }
    assert_int_equal(s.sites.oom, 0);
    Scope_fini(&s);
    Scope_fini(&copy);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_site_figures_at_the_peak),
        cmocka_unit_test(test_many_far_sites_grow_the_map),
    };
    return cmocka_run_group_tests_name("scope", tests, NULL, NULL);
}
