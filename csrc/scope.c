#include "scope.h"

#include <string.h>

void
ScopeStack_init(ScopeStack *self)
{
    memset(self, 0, sizeof(*self));
}

static void
ScopeStack_refloor(ScopeStack *self)
{
    self->floor = 0;
    for (int i = self->depth - 1; i >= 0; i--) {
        if (self->scopes[i].detached) {
            self->floor = self->scopes[i].id;
            return;
        }
    }
}

int
ScopeStack_push(ScopeStack *self, uint32_t id, int detached, int64_t total,
                int64_t reserved)
{
    if (self->depth >= SCOPE_MAX_DEPTH)
        return -1;
    Scope *s = &self->scopes[self->depth++];
    memset(s, 0, sizeof(*s));
    s->id = id;
    s->detached = detached;
    s->total_at_peak = total;
    s->peak_total = total;
    s->start_total = total;
    s->reserved_peak = reserved;
    if (detached)
        self->floor = id;
    return 0;
}

int
ScopeStack_pop(ScopeStack *self, uint32_t id, Scope *out)
{
    if (self->depth == 0 || self->scopes[self->depth - 1].id != id)
        return -1;
    self->depth--;
    if (out != NULL)
        *out = self->scopes[self->depth];
    ScopeStack_refloor(self);
    return 0;
}

Scope *
ScopeStack_find(ScopeStack *self, uint32_t id)
{
    for (int i = self->depth - 1; i >= 0; i--) {
        if (self->scopes[i].id == id)
            return &self->scopes[i];
    }
    return NULL;
}

static inline void
Scope_grow(Scope *s, int64_t delta, int64_t total, uint64_t seq)
{
    s->own += delta;
    if (s->own > s->peak) {
        s->peak = s->own;
        s->total_at_peak = total;
        s->seq_at_peak = seq;
    }
}

void
ScopeStack_on_alloc(ScopeStack *self, int64_t size, int64_t total,
                    uint64_t seq)
{
    for (int i = self->depth - 1; i >= 0; i--) {
        Scope *s = &self->scopes[i];
        if (s->id < self->floor)
            break;
        Scope_grow(s, size, total, seq);
        s->allocs++;
        s->allocated_bytes += size;
    }
}

void
ScopeStack_on_resize(ScopeStack *self, uint32_t floor, uint32_t scope,
                     int64_t delta, int is_free, int64_t total, uint64_t seq)
{
    for (int i = self->depth - 1; i >= 0; i--) {
        Scope *s = &self->scopes[i];
        if (s->id > scope)
            continue;
        if (s->id < floor)
            break;
        Scope_grow(s, delta, total, seq);
        if (is_free)
            s->frees++;
    }
}

void
ScopeStack_on_totals(ScopeStack *self, int64_t total, int64_t reserved)
{
    for (int i = 0; i < self->depth; i++) {
        Scope *s = &self->scopes[i];
        if (total > s->peak_total)
            s->peak_total = total;
        if (reserved > s->reserved_peak)
            s->reserved_peak = reserved;
    }
}
