#include "sites.h"

#include <stdlib.h>
#include <string.h>

static inline uint32_t
mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    return (uint32_t)x;
}

/* Makes room for record number `count` (0-based) in a chunked table. */
static int
chunk_reserve(void **chunks, uint32_t count, size_t rec_size)
{
    uint32_t c = count >> TABLE_CHUNK_BITS;
    if (c >= TABLE_MAX_CHUNKS)
        return -1;
    if (chunks[c] == NULL) {
        chunks[c] = calloc(TABLE_CHUNK, rec_size);
        if (chunks[c] == NULL)
            return -1;
    }
    return 0;
}

int
LineTable_init(LineTable *self)
{
    memset(self, 0, sizeof(*self));
    Spinlock_init(&self->lock);
    atomic_init(&self->count, 0);
    atomic_init(&self->epoch, 1);     /* new records hold 0: untouched */
    atomic_init(&self->ntouched, 0);
    atomic_init(&self->touched_overflow, 0);
    self->mask = 1023;
    self->keys = calloc(self->mask + 1, sizeof(uint64_t));
    self->vals = calloc(self->mask + 1, sizeof(uint32_t));
    self->touched = calloc(LINE_TOUCHED_CAP, sizeof(*self->touched));
    if (self->keys == NULL || self->vals == NULL || self->touched == NULL) {
        LineTable_fini(self);
        return -1;
    }
    return 0;
}

void
LineTable_fini(LineTable *self)
{
    for (int i = 0; i < TABLE_MAX_CHUNKS; i++)
        free(self->chunks[i]);
    free(self->keys);
    free(self->vals);
    free((void *)self->touched);
    memset(self, 0, sizeof(*self));
}

static int
LineTable_grow(LineTable *self)
{
    uint32_t cap = (self->mask + 1) * 2;
    uint64_t *keys = calloc(cap, sizeof(uint64_t));
    uint32_t *vals = calloc(cap, sizeof(uint32_t));
    if (keys == NULL || vals == NULL) {
        free(keys);
        free(vals);
        return -1;
    }
    for (uint32_t i = 0; i <= self->mask; i++) {
        if (self->vals[i] == 0)
            continue;
        uint32_t j = mix64(self->keys[i]) & (cap - 1);
        while (vals[j] != 0)
            j = (j + 1) & (cap - 1);
        keys[j] = self->keys[i];
        vals[j] = self->vals[i];
    }
    free(self->keys);
    free(self->vals);
    self->keys = keys;
    self->vals = vals;
    self->mask = cap - 1;
    return 0;
}

static uint32_t
LineTable_intern_locked(LineTable *self, uint32_t code, int32_t lineno)
{
    uint64_t key = ((uint64_t)code << 32) | (uint32_t)lineno;
    uint32_t i = mix64(key) & self->mask;
    while (self->vals[i] != 0) {
        if (self->keys[i] == key)
            return self->vals[i];
        i = (i + 1) & self->mask;
    }
    uint32_t n = atomic_load_explicit(&self->count, memory_order_relaxed);
    if ((n + 1) * 2 > self->mask + 1) {
        if (LineTable_grow(self) < 0)
            return 0;
        return LineTable_intern_locked(self, code, lineno);
    }
    if (chunk_reserve((void **)self->chunks, n, sizeof(LineRec)) < 0)
        return 0;
    LineRec *rec = &self->chunks[n >> TABLE_CHUNK_BITS][n & (TABLE_CHUNK - 1)];
    rec->code = code;
    rec->lineno = lineno;
    self->keys[i] = key;
    self->vals[i] = n + 1;
    atomic_store_explicit(&self->count, n + 1, memory_order_release);
    return n + 1;
}

uint32_t
LineTable_intern(LineTable *self, uint32_t code, int32_t lineno)
{
    Spinlock_acquire(&self->lock);
    uint32_t id = LineTable_intern_locked(self, code, lineno);
    Spinlock_release(&self->lock);
    return id;
}

int
LineTable_touched(LineTable *self, uint32_t *n)
{
    if (atomic_load_explicit(&self->touched_overflow, memory_order_relaxed))
        return -1;
    uint32_t k = atomic_load_explicit(&self->ntouched, memory_order_acquire);
    *n = k < LINE_TOUCHED_CAP ? k : LINE_TOUCHED_CAP;
    return 0;
}

static void
LineRec_zero(LineRec *r)
{
    atomic_store_explicit(&r->hits, 0, memory_order_relaxed);
    for (int s = 0; s < LINE_SLOTS; s++) {
        atomic_store_explicit(&r->alloc[s], 0, memory_order_relaxed);
        atomic_store_explicit(&r->peak[s], 0, memory_order_relaxed);
        atomic_store_explicit(&r->peak_reserved[s], 0, memory_order_relaxed);
        atomic_store_explicit(&r->last_total[s], 0, memory_order_relaxed);
    }
}

void
LineTable_reset(LineTable *self)
{
    uint32_t n;
    if (LineTable_touched(self, &n) < 0) {
        n = atomic_load(&self->count);
        for (uint32_t id = 1; id <= n; id++)
            LineRec_zero(LineTable_get(self, id));
        n = LINE_TOUCHED_CAP;
    }
    else {
        for (uint32_t i = 0; i < n; i++) {
            LineRec *r = LineTable_get(self, LineTable_touched_id(self, i));
            if (r != NULL)
                LineRec_zero(r);
        }
    }
    for (uint32_t i = 0; i < n; i++)
        atomic_store_explicit(&self->touched[i], 0, memory_order_relaxed);
    atomic_store(&self->ntouched, 0);
    atomic_store(&self->touched_overflow, 0);
    atomic_fetch_add(&self->epoch, 1);
}

int
SiteTable_init(SiteTable *self)
{
    memset(self, 0, sizeof(*self));
    Spinlock_init(&self->lock);
    atomic_init(&self->count, 0);
    self->mask = 1023;
    self->index = calloc(self->mask + 1, sizeof(uint32_t));
    return self->index == NULL ? -1 : 0;
}

void
SiteTable_fini(SiteTable *self)
{
    for (int i = 0; i < TABLE_MAX_CHUNKS; i++)
        free(self->chunks[i]);
    free(self->index);
    memset(self, 0, sizeof(*self));
}

static uint32_t
chain_hash(const uint32_t *lines, uint32_t n)
{
    uint64_t h = n;
    for (uint32_t i = 0; i < n; i++)
        h = h * UINT64_C(0x100000001b3) ^ lines[i];
    return mix64(h);
}

static int
SiteTable_grow(SiteTable *self)
{
    uint32_t cap = (self->mask + 1) * 2;
    uint32_t *index = calloc(cap, sizeof(uint32_t));
    if (index == NULL)
        return -1;
    uint32_t n = atomic_load_explicit(&self->count, memory_order_relaxed);
    for (uint32_t id = 1; id <= n; id++) {
        const SiteRec *r = SiteTable_get(self, id);
        uint32_t j = chain_hash(r->lines, r->n) & (cap - 1);
        while (index[j] != 0)
            j = (j + 1) & (cap - 1);
        index[j] = id;
    }
    free(self->index);
    self->index = index;
    self->mask = cap - 1;
    return 0;
}

static uint32_t
SiteTable_intern_locked(SiteTable *self, const uint32_t *lines, uint32_t n)
{
    uint32_t h = chain_hash(lines, n);
    uint32_t i = h & self->mask;
    while (self->index[i] != 0) {
        const SiteRec *r = SiteTable_get(self, self->index[i]);
        if (r->n == n && memcmp(r->lines, lines, n * sizeof(uint32_t)) == 0)
            return self->index[i];
        i = (i + 1) & self->mask;
    }
    uint32_t count = atomic_load_explicit(&self->count, memory_order_relaxed);
    if ((count + 1) * 2 > self->mask + 1) {
        if (SiteTable_grow(self) < 0)
            return 0;
        return SiteTable_intern_locked(self, lines, n);
    }
    if (chunk_reserve((void **)self->chunks, count, sizeof(SiteRec)) < 0)
        return 0;
    SiteRec *rec = &self->chunks[count >> TABLE_CHUNK_BITS][count & (TABLE_CHUNK - 1)];
    rec->n = n;
    memcpy(rec->lines, lines, n * sizeof(uint32_t));
    self->index[i] = count + 1;
    atomic_store_explicit(&self->count, count + 1, memory_order_release);
    return count + 1;
}

uint32_t
SiteTable_intern(SiteTable *self, const uint32_t *lines, uint32_t n)
{
    if (n == 0)
        return 0;
    if (n > SITE_CHAIN)
        n = SITE_CHAIN;
    Spinlock_acquire(&self->lock);
    uint32_t id = SiteTable_intern_locked(self, lines, n);
    Spinlock_release(&self->lock);
    return id;
}
