/* Scopes: the bracketed intervals whose memory is measured (a test, a region
 * inside it, a broader fixture being set up).  Per device they nest as a
 * stack.  A block counts for every open scope from its floor up to the scope
 * that was innermost when it was allocated; ids grow monotonically, so "open
 * and floor <= id <= block.scope" is exactly "was open when the block was
 * allocated and is not cut off by a detached scope".
 */
#ifndef MEMLAB_SCOPE_H
#define MEMLAB_SCOPE_H

#include <stdint.h>

#define SCOPE_MAX_DEPTH 32

/* Own live bytes of one allocation site, now and at the scope's peak. */
typedef struct SiteCell {
    uint32_t key;       /* site id + 1; 0: an empty cell */
    int64_t live;
    int64_t at_peak;
    uint64_t dirty;     /* == SiteStats.epoch + 1: changed since the last peak */
} SiteCell;

/* Per-site accounting of a scope: an open-addressing map from site id (0:
 * unknown) to its cell, sized by the sites this scope touched, so that a
 * test costs the same in the ten-thousandth test of a suite as in the
 * first (site ids grow with the suite).  The snapshot at the peak is kept
 * amortised O(1): a new peak copies only the cells that changed since the
 * previous one (the dirty list). */
typedef struct SiteStats {
    SiteCell *cells;
    uint32_t *dirty_list;   /* cell indices */
    uint32_t mask;          /* capacity - 1; capacity 0 until the first site */
    uint32_t count;         /* cells in use */
    uint32_t ndirty;
    uint64_t epoch;
    int oom;            /* a table could not grow: site figures incomplete */
} SiteStats;

static inline uint32_t
SiteStats_capacity(const SiteStats *st)
{
    return st->cells == 0 ? 0 : st->mask + 1;
}

typedef struct Scope {
    uint32_t id;
    int detached;           /* its blocks do not count for enclosing scopes */
    int64_t live;           /* bytes of its blocks still allocated */
    int64_t peak;           /* most live bytes at one moment */
    int64_t total_at_peak;  /* device total when that peak was reached */
    uint64_t seq_at_peak;   /* event number when that peak was reached */
    int64_t peak_total;     /* most device total while open */
    int64_t start_total;
    int64_t reserved_peak;  /* -1 when the device reports no reserved bytes */
    uint64_t allocs;
    uint64_t frees;
    int64_t allocated_bytes;
    uint32_t peak_site;     /* site whose allocation reached the peak */
    SiteStats sites;        /* owned; Scope_fini frees it */
} Scope;

/* Frees what a popped scope owns (its site tables). */
void Scope_fini(Scope *self);
/* A copy of the site figures (no dirty list), for reading an open scope;
 * -1 when out of memory. */
int SiteStats_copy(SiteStats *dst, const SiteStats *src);

typedef struct ScopeStack {
    Scope scopes[SCOPE_MAX_DEPTH];
    int depth;
    uint32_t floor;         /* id of the innermost detached scope, else 0 */
} ScopeStack;

void ScopeStack_init(ScopeStack *self);
/* -1 when the stack is full. */
int ScopeStack_push(ScopeStack *self, uint32_t id, int detached,
                    int64_t total, int64_t reserved);
/* -1 when id is not the innermost scope.  *out takes ownership of the
 * scope's site tables (Scope_fini); with out NULL they are freed. */
int ScopeStack_pop(ScopeStack *self, uint32_t id, Scope *out);
/* Frees every open scope's tables (engine teardown). */
void ScopeStack_fini(ScopeStack *self);
Scope *ScopeStack_find(ScopeStack *self, uint32_t id);
static inline Scope *
ScopeStack_top(ScopeStack *self)
{
    return self->depth > 0 ? &self->scopes[self->depth - 1] : 0;
}
/* A block of `size` bytes was allocated in the innermost scope. */
void ScopeStack_on_alloc(ScopeStack *self, int64_t size, uint32_t site,
                         int64_t total, uint64_t seq);
/* A block that counted for [floor, scope] changed by delta bytes: freed
 * (is_free, delta = -size) or its estimated size corrected. */
void ScopeStack_on_resize(ScopeStack *self, uint32_t floor, uint32_t scope,
                          uint32_t site, int64_t delta, int is_free,
                          int64_t total, uint64_t seq);
/* The device's totals moved without an allocation of ours (another block). */
void ScopeStack_on_totals(ScopeStack *self, int64_t total, int64_t reserved);

#endif
