#include "shadow_stack.h"

#include <string.h>

#include <stdlib.h>

ShadowStack *
ShadowStack_new(void)
{
    ShadowStack *s = calloc(1, sizeof(ShadowStack));
    if (s != NULL)
        atomic_init(&s->depth, 0);
    return s;
}

void
ShadowStack_reset(ShadowStack *self)
{
    atomic_store(&self->depth, 0);
    self->overflow = 0;
    memset(self->phase_depth, 0, sizeof(self->phase_depth));
}

static void
line_begin(ShadowFrame *f, const LineClock *clock)
{
    LineRec *r = LineTable_get(clock->lines, f->line);
    if (r != NULL) {
        LineTable_touch(clock->lines, r, f->line);
        atomic_fetch_add_explicit(&r->hits, 1, memory_order_relaxed);
    }
    for (int s = 0; s < LINE_SLOTS; s++) {
        f->hw[s] = Engine_current_total(clock->engine, s);
        f->hwr[s] = Engine_current_reserved(clock->engine, s);
    }
}

static inline void
store_max(_Atomic int64_t *where, int64_t v)
{
    /* Only the GIL holder writes line peaks: load and store suffice. */
    if (v > atomic_load_explicit(where, memory_order_relaxed))
        atomic_store_explicit(where, v, memory_order_relaxed);
}

static void
line_end(ShadowFrame *f, const LineClock *clock)
{
    LineRec *r = LineTable_get(clock->lines, f->line);
    if (r == NULL)
        return;
    LineTable_touch(clock->lines, r, f->line);
    for (int s = 0; s < LINE_SLOTS; s++) {
        store_max(&r->peak[s], f->hw[s]);
        store_max(&r->peak_reserved[s], f->hwr[s]);
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
    ShadowFrame *f = &self->frames[d];
    f->code = code;
    f->lineno = lineno;
    f->line = LineTable_intern(clock->lines, code, lineno);
    line_begin(f, clock);
    atomic_store_explicit(&self->depth, d + 1, memory_order_release);
}

void
ShadowStack_unwind_to(ShadowStack *self, const LineClock *clock, int i)
{
    int d = atomic_load_explicit(&self->depth, memory_order_relaxed);
    for (int j = d - 1; j >= i; j--) {
        ShadowFrame *f = &self->frames[j];
        line_end(f, clock);
        if (j > 0) {
            ShadowFrame *p = &self->frames[j - 1];
            for (int s = 0; s < LINE_SLOTS; s++) {
                if (f->hw[s] > p->hw[s])
                    p->hw[s] = f->hw[s];
                if (f->hwr[s] > p->hwr[s])
                    p->hwr[s] = f->hwr[s];
            }
        }
    }
    atomic_store_explicit(&self->depth, i, memory_order_release);
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
    ShadowFrame *f = &self->frames[d - 1];
    line_end(f, clock);
    f->lineno = lineno;
    f->line = LineTable_intern(clock->lines, code, lineno);
    line_begin(f, clock);
    return 1;
}
