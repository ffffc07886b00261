#include "scope.h"

#include <stdlib.h>
#include <string.h>

void
Scope_fini(Scope *self)
{
    free(self->sites.cells);
    free(self->sites.dirty_list);
    memset(&self->sites, 0, sizeof(self->sites));
}

int
SiteStats_copy(SiteStats *dst, const SiteStats *src)
{
    memset(dst, 0, sizeof(*dst));
    dst->oom = src->oom;
    uint32_t cap = SiteStats_capacity(src);
    if (cap == 0)
        return 0;
    dst->cells = malloc(cap * sizeof(SiteCell));
    if (dst->cells == NULL)
        return -1;
    memcpy(dst->cells, src->cells, cap * sizeof(SiteCell));
    dst->mask = src->mask;
    dst->count = src->count;
    return 0;
}

void
ScopeStack_fini(ScopeStack *self)
{
    for (int i = 0; i < self->depth; i++)
        Scope_fini(&self->scopes[i]);
    self->depth = 0;
}

static inline uint32_t
site_hash(uint32_t key)
{
    return key * UINT32_C(0x9E3779B1);
}

/* Doubles the map (or makes the first one) and rebuilds the dirty list,
 * whose indices moved; called on the event path, so a failure only marks
 * the figures incomplete. */
static int
SiteStats_grow(SiteStats *st)
{
    uint32_t old_cap = SiteStats_capacity(st);
    uint32_t cap = old_cap ? old_cap * 2 : 64;
    SiteCell *cells = calloc(cap, sizeof(SiteCell));
    uint32_t *list = malloc(cap * sizeof(uint32_t));
    if (cells == NULL || list == NULL) {
        free(cells);
        free(list);
        return -1;
    }
    uint32_t ndirty = 0;
    for (uint32_t i = 0; i < old_cap; i++) {
        const SiteCell *c = &st->cells[i];
        if (c->key == 0)
            continue;
        uint32_t j = site_hash(c->key) & (cap - 1);
        while (cells[j].key != 0)
            j = (j + 1) & (cap - 1);
        cells[j] = *c;
        if (c->dirty == st->epoch + 1)
            list[ndirty++] = j;
    }
    free(st->cells);
    free(st->dirty_list);
    st->cells = cells;
    st->dirty_list = list;
    st->mask = cap - 1;
    st->ndirty = ndirty;
    return 0;
}

/* The cell of site, made when new; NULL when out of memory. */
static inline SiteCell *
SiteStats_cell(SiteStats *st, uint32_t site, uint32_t *index)
{
    uint32_t key = site + 1;
    if ((st->count + 1) * 2 > SiteStats_capacity(st) && SiteStats_grow(st) < 0)
        return NULL;
    uint32_t i = site_hash(key) & st->mask;
    while (st->cells[i].key != key) {
        if (st->cells[i].key == 0) {
            st->cells[i].key = key;
            st->count++;
            break;
        }
        i = (i + 1) & st->mask;
    }
    *index = i;
    return &st->cells[i];
}

static inline void
SiteStats_add(SiteStats *st, uint32_t site, int64_t delta)
{
    uint32_t i;
    SiteCell *c = SiteStats_cell(st, site, &i);
    if (c == NULL) {
        st->oom = 1;
        return;
    }
    c->live += delta;
    if (c->dirty != st->epoch + 1) {
        c->dirty = st->epoch + 1;
        st->dirty_list[st->ndirty++] = i;
    }
}

/* The scope reached a new peak: the live figures are the peak's now. */
static inline void
SiteStats_snapshot(SiteStats *st)
{
    for (uint32_t i = 0; i < st->ndirty; i++) {
        SiteCell *c = &st->cells[st->dirty_list[i]];
        c->at_peak = c->live;
    }
    st->ndirty = 0;
    st->epoch++;
}

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
    else
        Scope_fini(&self->scopes[self->depth]);
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
Scope_grow(Scope *s, uint32_t site, int64_t delta, int64_t total,
           uint64_t seq)
{
    s->live += delta;
    SiteStats_add(&s->sites, site, delta);
    if (s->live > s->peak) {
        s->peak = s->live;
        s->total_at_peak = total;
        s->seq_at_peak = seq;
        s->peak_site = site;
        SiteStats_snapshot(&s->sites);
    }
}

void
ScopeStack_on_alloc(ScopeStack *self, int64_t size, uint32_t site,
                    int64_t total, uint64_t seq)
{
    for (int i = self->depth - 1; i >= 0; i--) {
        Scope *s = &self->scopes[i];
        if (s->id < self->floor)
            break;
        Scope_grow(s, site, size, total, seq);
        s->allocs++;
        s->allocated_bytes += size;
    }
}

void
ScopeStack_on_resize(ScopeStack *self, uint32_t floor, uint32_t scope,
                     uint32_t site, int64_t delta, int is_free,
                     int64_t total, uint64_t seq)
{
    for (int i = self->depth - 1; i >= 0; i--) {
        Scope *s = &self->scopes[i];
        if (s->id > scope)
            continue;
        if (s->id < floor)
            break;
        Scope_grow(s, site, delta, total, seq);
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
