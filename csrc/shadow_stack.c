#include "shadow_stack.h"

#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

ShadowStack *
ShadowStack_new(void)
{
    ShadowStack *s = calloc(1, sizeof(ShadowStack));
    if (s != NULL) {
        atomic_init(&s->depth, 0);
        atomic_init(&s->readers, 0);
    }
    return s;
}

void
ShadowStack_reset(ShadowStack *self)
{
    atomic_store(&self->depth, 0);
    self->overflow = 0;
    memset(self->phase_depth, 0, sizeof(self->phase_depth));
}

static inline int64_t
load(_Atomic int64_t *where)
{
    return atomic_load_explicit(where, memory_order_relaxed);
}

/* For figures only the owner writes (line peaks): load and store suffice. */
static inline void
store_max(_Atomic int64_t *where, int64_t v)
{
    if (v > load(where))
        atomic_store_explicit(where, v, memory_order_relaxed);
}

/* For a frame's high-water marks, which allocator threads raise several at
 * once: a compare-and-swap, so that no raise is lost.  It costs the
 * allocator path only when the mark does rise. */
static inline void
raise_max(_Atomic int64_t *where, int64_t v)
{
    int64_t seen = load(where);
    while (v > seen
           && !atomic_compare_exchange_weak_explicit(where, &seen, v,
                                                     memory_order_relaxed,
                                                     memory_order_relaxed))
        ;
}

/* A frame's line: a traced frame's running line; a located frame's
 * found from the instruction it runs, which the owner caches. */
static uint32_t
frame_line(ShadowFrame *f, const LineClock *clock, int owner)
{
    if (f->where == NULL)
        return atomic_load_explicit(&f->line, memory_order_relaxed);
    int lasti = clock->lasti(f->where);
    if (owner && lasti == f->lasti)
        return atomic_load_explicit(&f->line, memory_order_relaxed);
    uint32_t line = LineTable_intern(clock->lines, f->code,
                                     clock->line_of(f->code_ref, lasti));
    if (owner) {
        f->lasti = lasti;
        atomic_store_explicit(&f->line, line, memory_order_relaxed);
    }
    return line;
}

/* Frame d - 1 starts its line: the line is interned with its chain (the
 * innermost SITE_CHAIN frames' lines) as a site, here and not on the
 * allocator path. */
static void
line_begin(ShadowStack *self, int d, const LineClock *clock, uint32_t code,
           int lineno)
{
    ShadowFrame *f = &self->frames[d - 1];
    uint32_t line = LineTable_intern(clock->lines, code, lineno);
    uint32_t chain[SITE_CHAIN];
    uint32_t n = d < SITE_CHAIN ? (uint32_t)d : SITE_CHAIN;
    chain[0] = line;
    for (uint32_t i = 1; i < n; i++)
        chain[i] = frame_line(&self->frames[d - 1 - i], clock, 1);
    f->lineno = lineno;
    atomic_store_explicit(&f->line, line, memory_order_relaxed);
    atomic_store_explicit(&f->site, SiteTable_intern(clock->sites, chain, n),
                          memory_order_relaxed);
    LineRec *r = LineTable_get(clock->lines, line);
    if (r != NULL) {
        LineTable_touch(clock->lines, r, line);
        atomic_fetch_add_explicit(&r->hits, 1, memory_order_relaxed);
    }
    for (int s = 0; s < LINE_SLOTS; s++) {
        atomic_store_explicit(&f->hw[s], Engine_current_total(clock->engine, s),
                              memory_order_relaxed);
        atomic_store_explicit(&f->hwr[s],
                              Engine_current_reserved(clock->engine, s),
                              memory_order_relaxed);
    }
}

static void
line_end(ShadowFrame *f, const LineClock *clock)
{
    uint32_t line = atomic_load_explicit(&f->line, memory_order_relaxed);
    LineRec *r = LineTable_get(clock->lines, line);
    if (r == NULL)
        return;
    LineTable_touch(clock->lines, r, line);
    for (int s = 0; s < LINE_SLOTS; s++) {
        store_max(&r->peak[s], load(&f->hw[s]));
        store_max(&r->peak_reserved[s], load(&f->hwr[s]));
        atomic_store_explicit(&r->last_total[s],
                              Engine_current_total(clock->engine, s),
                              memory_order_relaxed);
    }
}

void
ShadowStack_push(ShadowStack *self, const LineClock *clock, uint32_t code,
                 int lineno)
{
    int d = atomic_load_explicit(&self->depth, memory_order_relaxed);
    if (d >= SHADOW_STACK_DEPTH) {
        self->overflow++;
        return;
    }
    self->frames[d].code = code;
    self->frames[d].where = NULL;
    line_begin(self, d + 1, clock, code, lineno);
    atomic_store_explicit(&self->depth, d + 1, memory_order_release);
}

void
ShadowStack_push_located(ShadowStack *self, uint32_t code, const void *where,
                         const void *code_ref)
{
    int d = atomic_load_explicit(&self->depth, memory_order_relaxed);
    if (d >= SHADOW_STACK_DEPTH) {
        self->overflow++;
        return;
    }
    ShadowFrame *f = &self->frames[d];
    f->code = code;
    f->lineno = 0;
    f->where = where;
    f->code_ref = code_ref;
    f->lasti = f->site_lasti = INT_MIN;     /* none yet */
    atomic_store_explicit(&f->line, 0, memory_order_relaxed);
    atomic_store_explicit(&f->site, 0, memory_order_relaxed);
    atomic_store_explicit(&self->depth, d + 1, memory_order_release);
}

void
ShadowStack_quiesce(ShadowStack *self)
{
    unsigned spins = 0;
    while (atomic_load(&self->readers) != 0) {
        if (++spins > 64)
            sched_yield();
    }
}

void
ShadowStack_unwind_to(ShadowStack *self, const LineClock *clock, int i)
{
    int d = atomic_load_explicit(&self->depth, memory_order_relaxed);
    for (int j = d - 1; j >= i; j--) {
        ShadowFrame *f = &self->frames[j];
        if (f->where != NULL)
            continue;   /* located: its lines' peaks were raised as it ran */
        line_end(f, clock);
        if (j > 0) {
            ShadowFrame *p = &self->frames[j - 1];
            for (int s = 0; s < LINE_SLOTS; s++) {
                raise_max(&p->hw[s], load(&f->hw[s]));
                raise_max(&p->hwr[s], load(&f->hwr[s]));
            }
        }
    }
    /* Sequentially consistent, with readers: a reader that announced
     * itself after this store sees the new depth; one before it is waited
     * for (ShadowStack_quiesce) before the frame leaves. */
    atomic_store(&self->depth, i);
}

/* The innermost frame of code, searched a few frames deep (a missed
 * return leaves frames above it); -1 if absent. */
static int
find(ShadowStack *self, uint32_t code)
{
    int d = atomic_load_explicit(&self->depth, memory_order_relaxed);
    for (int i = d - 1; i >= 0 && i >= d - 16; i--) {
        if (self->frames[i].code == code)
            return i;
    }
    return -1;
}

void
ShadowStack_pop(ShadowStack *self, const LineClock *clock, uint32_t code)
{
    if (self->overflow > 0) {
        self->overflow--;
        return;
    }
    int i = find(self, code);
    if (i >= 0)
        ShadowStack_unwind_to(self, clock, i);
    /* Also when the frame was not found (a reset emptied the stack while
     * a reader was in it): the frame leaves after this returns. */
    ShadowStack_quiesce(self);
}

int
ShadowStack_is_top(ShadowStack *self, const void *where)
{
    int d = atomic_load_explicit(&self->depth, memory_order_relaxed);
    return d > 0 && self->frames[d - 1].where == where;
}

void
ShadowStack_pop_located(ShadowStack *self, const LineClock *clock,
                        const void *where)
{
    int d = atomic_load_explicit(&self->depth, memory_order_relaxed);
    if (d > 0 && self->frames[d - 1].where == where)
        ShadowStack_unwind_to(self, clock, d - 1);
    else if (self->overflow > 0 && d == SHADOW_STACK_DEPTH)
        self->overflow--;       /* a frame past the depth, never stored */
    ShadowStack_quiesce(self);
}

int
ShadowStack_line(ShadowStack *self, const LineClock *clock, uint32_t code,
                 int lineno)
{
    if (self->overflow > 0)
        return 1;
    int d = atomic_load_explicit(&self->depth, memory_order_relaxed);
    if (d == 0 || self->frames[d - 1].code != code) {
        int i = find(self, code);
        if (i < 0)
            return 0;
        ShadowStack_unwind_to(self, clock, i + 1);   /* returns we missed */
        d = i + 1;
    }
    line_end(&self->frames[d - 1], clock);
    line_begin(self, d, clock, code, lineno);
    return 1;
}

/* A located top frame: the site of the chain, found from the frames'
 * instructions (the owner's cache when its instruction did not change:
 * the frames below it cannot move while it runs); the lines' peaks are
 * raised here, as nothing ends them. */
static uint32_t
located_attribute(ShadowStack *self, int d, const LineClock *clock, int owner,
                  int slot, int64_t size, int64_t total, int64_t reserved)
{
    ShadowFrame *top = &self->frames[d - 1];
    uint32_t site;
    int lasti = clock->lasti(top->where);
    if (owner && lasti == top->site_lasti) {
        site = atomic_load_explicit(&top->site, memory_order_relaxed);
    }
    else {
        uint32_t chain[SITE_CHAIN];
        uint32_t n = d < SITE_CHAIN ? (uint32_t)d : SITE_CHAIN;
        for (uint32_t i = 0; i < n; i++)
            chain[i] = frame_line(&self->frames[d - 1 - i], clock, owner);
        site = SiteTable_intern(clock->sites, chain, n);
        if (owner) {
            top->site_lasti = lasti;
            atomic_store_explicit(&top->site, site, memory_order_relaxed);
        }
    }
    const SiteRec *rec = SiteTable_get(clock->sites, site);
    if (size == 0 || slot >= LINE_SLOTS || rec == NULL)
        return site;
    for (uint32_t i = 0; i < rec->n; i++) {
        uint32_t line = rec->lines[i];
        LineRec *r = LineTable_get(clock->lines, line);
        if (r == NULL)
            continue;
        LineTable_touch(clock->lines, r, line);
        if (i == 0)
            atomic_fetch_add_explicit(&r->alloc[slot], size,
                                      memory_order_relaxed);
        raise_max(&r->peak[slot], total);
        raise_max(&r->peak_reserved[slot], reserved);
    }
    return site;
}

uint32_t
ShadowStack_attribute(ShadowStack *self, const LineClock *clock, int owner,
                      int slot, int64_t size, int64_t total, int64_t reserved)
{
    if (!owner)
        atomic_fetch_add(&self->readers, 1);
    uint32_t site = 0;
    int d = atomic_load(&self->depth);
    if (d > SHADOW_STACK_DEPTH)
        d = SHADOW_STACK_DEPTH;
    if (d <= 0)
        goto done;
    ShadowFrame *top = &self->frames[d - 1];
    if (top->where != NULL) {
        site = located_attribute(self, d, clock, owner, slot, size, total,
                                 reserved);
        goto done;
    }
    site = atomic_load_explicit(&top->site, memory_order_relaxed);
    if (size == 0 || slot >= LINE_SLOTS)
        goto done;
    raise_max(&top->hw[slot], total);
    raise_max(&top->hwr[slot], reserved);
    uint32_t line = atomic_load_explicit(&top->line, memory_order_relaxed);
    LineRec *r = LineTable_get(clock->lines, line);
    if (r != NULL) {
        LineTable_touch(clock->lines, r, line);
        atomic_fetch_add_explicit(&r->alloc[slot], size, memory_order_relaxed);
    }
done:
    if (!owner)
        atomic_fetch_sub(&self->readers, 1);
    return site;
}
