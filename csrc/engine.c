#include "engine.h"

#include <stdlib.h>
#include <string.h>

/* The bridge calls Engine_sink through memlab_sink_fn: the build stops if
 * either signature drifts. */
_Static_assert(_Generic(&Engine_sink, memlab_sink_fn: 1, default: 0),
               "Engine_sink must have memlab_bridge.h's memlab_sink_fn type");

static Device *
Device_new(int slot)
{
    Device *d = calloc(1, sizeof(Device));
    if (d == NULL)
        return NULL;
    if (Ledger_init(&d->ledger, 1024) < 0) {
        free(d);
        return NULL;
    }
    if (Ledger_init(&d->watch, 64) < 0) {
        Ledger_fini(&d->ledger);
        free(d);
        return NULL;
    }
    Spinlock_init(&d->lock);
    ScopeStack_init(&d->stack);
    d->reports_totals = slot != ENGINE_SLOT_CPU;
    atomic_init(&d->total, 0);
    atomic_init(&d->reserved, d->reports_totals ? 0 : -1);
    return d;
}

static void
Device_free(Device *d)
{
    if (d == NULL)
        return;
    ScopeStack_fini(&d->stack);
    Ledger_fini(&d->ledger);
    Ledger_fini(&d->watch);
    Timeline_fini(&d->timeline);
    Kept_fini(&d->kept);
    AllocLog_fini(&d->alloc_log);
    free(d);
}

Engine *
Engine_new(void)
{
    Engine *e = calloc(1, sizeof(Engine));
    if (e == NULL)
        return NULL;
    for (int i = 0; i < ENGINE_MAX_DEVICES; i++)
        atomic_init(&e->devices[i], NULL);
    atomic_init(&e->slots_made, 0);
    atomic_init(&e->next_scope_id, 1);
    atomic_init(&e->recording, 0);
    atomic_init(&e->attribute, NULL);
    atomic_init(&e->attribute_ctx, NULL);
    atomic_init(&e->phases, 0u);
    Spinlock_init(&e->record_lock);
    return e;
}

void
Engine_free(Engine *self)
{
    if (self == NULL)
        return;
    for (int i = 0; i < ENGINE_MAX_DEVICES; i++)
        Device_free(atomic_load(&self->devices[i]));
    free(self->record);
    free(self);
}

int
Engine_slot(int device_type, int device_index)
{
    /* Other c10 device types are not measured. */
    if (device_type == MEMLAB_DEVICE_CPU)
        return ENGINE_SLOT_CPU;
    if (device_type == MEMLAB_DEVICE_CUDA && device_index >= 0
        && device_index < ENGINE_MAX_DEVICES - 1)
        return 1 + device_index;
    return -1;
}

void
Engine_fork_prepare(Engine *self)
{
    /* The event path takes the record lock and then, once it has let it go,
     * one device's lock, never two at once: taking them all in slot order
     * here waits for each holder and can deadlock with none. */
    Spinlock_acquire(&self->record_lock);
    for (int i = 0; i < ENGINE_MAX_DEVICES; i++) {
        Device *d = atomic_load_explicit(&self->devices[i], memory_order_acquire);
        if (d != NULL)
            Spinlock_acquire(&d->lock);
        self->fork_held[i] = d;
    }
}

void
Engine_fork_release(Engine *self)
{
    for (int i = ENGINE_MAX_DEVICES - 1; i >= 0; i--) {
        if (self->fork_held[i] != NULL)
            Spinlock_release(&self->fork_held[i]->lock);
        self->fork_held[i] = NULL;
    }
    Spinlock_release(&self->record_lock);
}

void
Engine_set_attribution(Engine *self, AttributeFn fn, void *ctx)
{
    atomic_store(&self->attribute_ctx, ctx);
    atomic_store(&self->attribute, fn);
}

static Device *
Engine_device(Engine *self, int slot, int create)
{
    if (slot < 0 || slot >= ENGINE_MAX_DEVICES)
        return NULL;
    Device *d = atomic_load(&self->devices[slot]);
    if (d != NULL || !create)
        return d;
    /* Devices are created from the API thread only (under the GIL), so no
     * two threads race to create the same slot. */
    d = Device_new(slot);
    if (d != NULL) {
        atomic_store(&self->devices[slot], d);
        if (slot >= atomic_load(&self->slots_made))
            atomic_store(&self->slots_made, slot + 1);
    }
    return d;
}

/* Only the lock holder writes the total, so a load and a store suffice. */
static inline void
Device_add_total(Device *d, int64_t delta)
{
    atomic_store_explicit(&d->total,
                          atomic_load_explicit(&d->total,
                                               memory_order_relaxed) + delta,
                          memory_order_relaxed);
}

static inline int64_t
Device_total(Device *d)
{
    return atomic_load_explicit(&d->total, memory_order_relaxed);
}

static inline int64_t
Device_reserved(Device *d)
{
    return atomic_load_explicit(&d->reserved, memory_order_relaxed);
}

int64_t
Engine_current_total(Engine *self, int slot)
{
    Device *d = Engine_device(self, slot, 0);
    return d == NULL ? 0 : Device_total(d);
}

int64_t
Engine_current_reserved(Engine *self, int slot)
{
    Device *d = Engine_device(self, slot, 0);
    return d == NULL ? 0 : Device_reserved(d);
}

/* Whether block b counts for scope id (0: none): allocated while it was
 * open, not cut off by a detached scope (scope.h). */
static inline int
Block_counts_for(const Block *b, uint32_t id)
{
    return id != 0 && b->floor <= id && id <= b->scope;
}

/* Whether block b counts for the scope whose kept blocks the device follows
 * (allocated while it was open, not cut off by a detached scope). */
static inline int
Device_follows(const Device *d, const Block *b)
{
    return b->kept != 0 && Block_counts_for(b, d->kept.scope);
}

/* A block we still hold came back from the allocator: its free happened on a
 * thread we do not hear from.  Retire it so the figures stay consistent. */
static void
Device_retire(Device *d, Block *b)
{
    if (!d->reports_totals)
        Device_add_total(d, -b->size);
    ScopeStack_on_resize(&d->stack, b->floor, b->scope, b->site, -b->size, 1,
                         Device_total(d), d->seq);
    if (Device_follows(d, b))
        Kept_on_free(&d->kept, b->kept);
    b->kept = 0;
    d->missed_frees++;
}

/* An allocation or a free heard at a watched address: the suspect's block
 * that lived there is gone. */
static inline void
Device_unwatch_addr(Device *d, uintptr_t addr)
{
    if (d->watch.count != 0)
        Ledger_remove(&d->watch, addr, NULL);
}

/* Block b, still live, counts delta bytes more for its scopes. */
static void
Device_resize(Device *d, Block *b, int64_t delta)
{
    b->size += delta;
    ScopeStack_on_resize(&d->stack, b->floor, b->scope, b->site, delta, 0,
                         Device_total(d), d->seq);
    if (Device_follows(d, b))
        Kept_on_resize(&d->kept, b->kept, delta,
                       d->stack.scopes[d->timeline_depth].live, d->seq);
}

static void
Device_alloc(Engine *e, int slot, Device *d, uintptr_t addr, int64_t size,
             int source)
{
    Device_unwatch_addr(d, addr);
    Scope *top = ScopeStack_top(&d->stack);
    if (top == NULL)
        return;
    int created;
    Block *b = Ledger_insert(&d->ledger, addr, &created);
    if (b == NULL) {
        d->dropped++;
        d->error = ENGINE_ENOMEM;
        return;
    }
    if (!created) {
        /* Both sources heard one allocation.  The tracker's size is what was
         * asked for, rounded as the allocator rounds; the report's is the
         * block's, which is larger where the allocator handed out a cached
         * block without splitting it: by what earlier tests left in its
         * cache.  Scopes count the request, the same whatever ran before;
         * the device's totals stay the allocator's. */
        if (source == EVENT_TRACE) {
            if (!(b->flags & (BLOCK_ESTIMATED | BLOCK_PAIRED))) {
                b->flags |= BLOCK_PAIRED;   /* the report came first */
                if (size < b->size)
                    Device_resize(d, b, size - b->size);
            }
            return;     /* else a late echo of the tracker's own */
        }
        if (b->flags & BLOCK_ESTIMATED) {
            b->flags = BLOCK_PAIRED;        /* the tracker came first */
            return;
        }
        Device_retire(d, b);
    }
    b->size = size;
    b->scope = top->id;
    b->floor = d->stack.floor;
    b->flags = source == EVENT_TRACE ? BLOCK_ESTIMATED : 0;
    if (!d->reports_totals || source == EVENT_TRACE)
        Device_add_total(d, size);
    AttributeFn attribute = atomic_load_explicit(&e->attribute,
                                                 memory_order_acquire);
    b->site = attribute == NULL
                  ? 0
                  : attribute(atomic_load_explicit(&e->attribute_ctx,
                                                   memory_order_relaxed),
                              slot, size, Device_total(d), Device_reserved(d));
    ScopeStack_on_alloc(&d->stack, size, b->site, Device_total(d), d->seq);
    b->kept = 0;
    if (d->kept.scope != 0 && b->floor <= d->kept.scope && !d->kept.lost)
        b->kept = Kept_on_alloc(&d->kept, addr, size, b->site,
                                d->stack.scopes[d->timeline_depth].live,
                                d->seq);
    if (d->alloc_log_scope != 0)
        AllocLog_add(&d->alloc_log, addr, size, b->site, d->seq,
                     Block_counts_for(b, d->alloc_log_scope));
}

static void
Device_release(Device *d, uintptr_t addr, int source)
{
    Block old;
    Device_unwatch_addr(d, addr);
    if (d->ledger.count == 0 || !Ledger_remove(&d->ledger, addr, &old))
        return;
    if (!d->reports_totals || source == EVENT_TRACE)
        Device_add_total(d, -old.size);
    ScopeStack_on_resize(&d->stack, old.floor, old.scope, old.site, -old.size,
                         1, Device_total(d), d->seq);
    if (Device_follows(d, &old))
        Kept_on_free(&d->kept, old.kept);
    if (d->alloc_log_scope != 0)
        AllocLog_add(&d->alloc_log, addr, -old.size, old.site, d->seq,
                     Block_counts_for(&old, d->alloc_log_scope));
}

static void
Engine_record_event(Engine *self, int slot, uintptr_t addr, int64_t size,
                    int64_t total, int64_t reserved, int source)
{
    Spinlock_acquire(&self->record_lock);
    if (self->record != NULL && self->record_len < self->record_cap) {
        Event *ev = &self->record[self->record_len++];
        ev->addr = addr;
        ev->size = size;
        ev->total = total;
        ev->reserved = reserved;
        ev->slot = slot;
        ev->source = source;
    }
    Spinlock_release(&self->record_lock);
}

/* A request the allocator could not serve: counted, nothing allocated (no
 * event number, no ledger, no timeline).  Its site is the running line's:
 * the attribution function given 0 bytes charges nothing. */
static void
Device_failed(Engine *self, Device *d, int slot, int64_t size)
{
    AttributeFn attribute = atomic_load_explicit(&self->attribute,
                                                 memory_order_acquire);
    uint32_t site = attribute == NULL
                        ? 0
                        : attribute(atomic_load_explicit(&self->attribute_ctx,
                                                         memory_order_acquire),
                                    slot, 0, 0, 0);
    Spinlock_acquire(&d->lock);
    d->failed++;
    d->failed_size = size;
    d->failed_site = site;
    Spinlock_release(&d->lock);
}

void
Engine_failed(Engine *self, int slot, uint64_t *count, int64_t *size,
              uint32_t *site)
{
    Device *d = Engine_device(self, slot, 0);
    *count = 0;
    *size = 0;
    *site = 0;
    if (d == NULL)
        return;
    Spinlock_acquire(&d->lock);
    *count = d->failed;
    *size = d->failed_size;
    *site = d->failed_site;
    Spinlock_release(&d->lock);
}

void
Engine_event(Engine *self, int slot, uintptr_t addr, int64_t size,
             int64_t total, int64_t reserved, int source)
{
    if (slot < 0 || slot >= ENGINE_MAX_DEVICES)
        return;
    Device *d = atomic_load_explicit(&self->devices[slot],
                                     memory_order_acquire);
    if (d == NULL)
        return;
    if (source == EVENT_FAILED) {
        Device_failed(self, d, slot, size);
        return;
    }
    if (atomic_load_explicit(&self->recording, memory_order_relaxed))
        Engine_record_event(self, slot, addr, size, total, reserved, source);
    Spinlock_acquire(&d->lock);
    d->seq++;
    d->events++;
    if (d->reports_totals && source == EVENT_REPORT) {
        atomic_store_explicit(&d->total, total, memory_order_relaxed);
        atomic_store_explicit(&d->reserved, reserved, memory_order_relaxed);
    }
    if (size > 0)
        Device_alloc(self, slot, d, addr, size, source);
    else
        Device_release(d, addr, source);
    if (d->stack.depth > 0)
        ScopeStack_on_totals(&d->stack, Device_total(d), Device_reserved(d));
    if (d->timeline_scope != 0)
        Timeline_add(&d->timeline, d->seq,
                     d->stack.scopes[d->timeline_depth].live, Device_total(d));
    Spinlock_release(&d->lock);
}

void
Engine_sink(void *ctx, int device_type, int device_index, void *ptr,
            int64_t size, uint64_t total, uint64_t reserved, int source)
{
    Engine_event((Engine *)ctx, Engine_slot(device_type, device_index),
                 (uintptr_t)ptr, size, (int64_t)total, (int64_t)reserved,
                 source);
}

int
Engine_begin(Engine *self, int slot, int detached, int64_t total,
             int64_t reserved, uint32_t *id)
{
    Device *d = Engine_device(self, slot, 1);
    if (d == NULL)
        return -1;
    int ret = -1;
    Spinlock_acquire(&d->lock);
    if (d->reports_totals) {
        if (total >= 0)
            atomic_store(&d->total, total);
        if (reserved >= 0)
            atomic_store(&d->reserved, reserved);
    }
    *id = atomic_fetch_add(&self->next_scope_id, 1);
    if (ScopeStack_push(&d->stack, *id, detached, Device_total(d),
                        Device_reserved(d)) < 0)
        goto error;
    ret = 0;
error:
    Spinlock_release(&d->lock);
    return ret;
}

int
Engine_end(Engine *self, int slot, uint32_t id, Scope *out)
{
    Device *d = Engine_device(self, slot, 0);
    if (d == NULL)
        return -1;
    int ret = -1;
    Spinlock_acquire(&d->lock);
    if (ScopeStack_pop(&d->stack, id, out) < 0)
        goto error;
    if (id == d->timeline_scope)
        d->timeline_scope = 0;
    if (id == d->kept.scope)
        Kept_stop(&d->kept);
    if (id == d->alloc_log_scope)
        d->alloc_log_scope = 0;
    if (d->stack.depth == 0) {
        /* Nothing is measured any more: blocks still held cannot be
         * followed reliably (CPU reporting stops), so forget them. */
        Ledger_clear(&d->ledger);
        if (!d->reports_totals)
            atomic_store(&d->total, 0);
    }
    ret = 0;
error:
    Spinlock_release(&d->lock);
    return ret;
}

int
Engine_timeline_start(Engine *self, int slot, uint32_t id)
{
    Device *d = Engine_device(self, slot, 0);
    if (d == NULL)
        return -1;
    int ret = -1;
    Spinlock_acquire(&d->lock);
    Scope *s = ScopeStack_find(&d->stack, id);
    if (s == NULL)
        goto error;
    /* The buffer is allocated on first use only, under the lock; the hot
     * path never allocates for it. */
    if (Timeline_start(&d->timeline, d->seq, s->live, Device_total(d)) < 0)
        goto error;
    d->timeline_scope = id;
    d->timeline_depth = (int)(s - d->stack.scopes);
    /* Its kept blocks are followed from its first allocation on; a scope
     * that allocated already cannot say what it kept. */
    d->kept.phases = atomic_load(&self->phases);
    Kept_start(&d->kept, id, d->seq);
    d->kept.lost = s->allocs != 0;
    ret = 0;
error:
    Spinlock_release(&d->lock);
    return ret;
}

uint32_t
Engine_timeline(Engine *self, int slot, TimelinePoint *dst, uint32_t max,
                uint64_t *seq0, uint64_t *last)
{
    Device *d = Engine_device(self, slot, 0);
    *seq0 = *last = 0;
    if (d == NULL)
        return 0;
    Spinlock_acquire(&d->lock);
    uint32_t n = Timeline_copy(&d->timeline, dst, max);
    *seq0 = d->timeline.seq0;
    *last = d->timeline.last;
    Spinlock_release(&d->lock);
    return n;
}

int
Engine_alloc_log_start(Engine *self, int slot, uint32_t id, uint32_t max)
{
    Device *d = Engine_device(self, slot, 0);
    if (d == NULL)
        return -1;
    int ret = -1;
    Spinlock_acquire(&d->lock);
    if (ScopeStack_find(&d->stack, id) != NULL) {
        AllocLog_start(&d->alloc_log, max);
        d->alloc_log_scope = id;
        ret = 0;
    }
    Spinlock_release(&d->lock);
    return ret;
}

AllocEntry *
Engine_alloc_log_take(Engine *self, int slot, int keep, uint32_t *n,
                      uint64_t *dropped)
{
    Device *d = Engine_device(self, slot, 0);
    *n = 0;
    *dropped = 0;
    if (d == NULL)
        return NULL;
    Spinlock_acquire(&d->lock);
    AllocEntry *entries = keep ? AllocLog_copy(&d->alloc_log, n, dropped)
                               : AllocLog_take(&d->alloc_log, n, dropped);
    Spinlock_release(&d->lock);
    return entries;
}

int
Engine_watch(Engine *self, int slot, const uintptr_t *addrs, size_t n)
{
    Device *d = Engine_device(self, slot, 1);
    if (d == NULL)
        return -1;
    int ret = 0;
    Spinlock_acquire(&d->lock);
    for (size_t i = 0; i < n; i++) {
        int created;
        if (addrs[i] != 0 && Ledger_insert(&d->watch, addrs[i], &created) == NULL) {
            ret = -1;
            break;
        }
    }
    Spinlock_release(&d->lock);
    return ret;
}

int
Engine_watched(Engine *self, int slot, uintptr_t addr)
{
    Device *d = Engine_device(self, slot, 0);
    if (d == NULL)
        return 0;
    Spinlock_acquire(&d->lock);
    int found = Ledger_find(&d->watch, addr) != NULL;
    Spinlock_release(&d->lock);
    return found;
}

void
Engine_unwatch(Engine *self, int slot)
{
    Device *d = Engine_device(self, slot, 0);
    if (d == NULL)
        return;
    Spinlock_acquire(&d->lock);
    Ledger_clear(&d->watch);
    Spinlock_release(&d->lock);
}

uint64_t
Engine_seq(Engine *self, int slot)
{
    uint64_t seq = 0;
    (void)Engine_timeline_seq(self, slot, &seq);
    return seq;
}

void
Engine_set_phases(Engine *self, unsigned mask)
{
    atomic_store(&self->phases, mask);
    int slots = Engine_slots(self);
    for (int slot = 0; slot < slots; slot++) {
        Device *d = atomic_load_explicit(&self->devices[slot], memory_order_acquire);
        if (d == NULL)
            continue;
        Spinlock_acquire(&d->lock);
        int64_t own = d->kept.scope != 0 ? d->stack.scopes[d->timeline_depth].live : 0;
        Kept_set_phases(&d->kept, mask, own);
        Spinlock_release(&d->lock);
    }
}

int
Engine_slots(Engine *self)
{
    return atomic_load_explicit(&self->slots_made, memory_order_acquire);
}

int
Engine_timeline_seq(Engine *self, int slot, uint64_t *seq)
{
    Device *d = Engine_device(self, slot, 0);
    if (d == NULL)
        return -1;
    Spinlock_acquire(&d->lock);
    int ret = d->timeline_scope != 0 ? 0 : -1;
    *seq = d->seq;
    Spinlock_release(&d->lock);
    return ret;
}

int
Engine_stats(Engine *self, int slot, uint32_t id, int with_sites, Scope *out)
{
    Device *d = Engine_device(self, slot, 0);
    if (d == NULL)
        return -1;
    int ret = -1;
    Spinlock_acquire(&d->lock);
    Scope *s = ScopeStack_find(&d->stack, id);
    if (s == NULL)
        goto error;
    *out = *s;
    memset(&out->sites, 0, sizeof(out->sites));  /* not the caller's */
    if (with_sites && SiteStats_copy(&out->sites, &s->sites) < 0)
        out->sites.oom = 1;
    ret = 0;
error:
    Spinlock_release(&d->lock);
    return ret;
}

int
Engine_totals(Engine *self, int slot, int64_t *total, int64_t *reserved)
{
    Device *d = Engine_device(self, slot, 0);
    if (d == NULL)
        return -1;
    Spinlock_acquire(&d->lock);
    *total = Device_total(d);
    *reserved = Device_reserved(d);
    Spinlock_release(&d->lock);
    return 0;
}

long
Engine_blocks(Engine *self, int slot, uint32_t id, Block *out, size_t cap)
{
    Device *d = Engine_device(self, slot, 0);
    if (d == NULL)
        return -1;
    long n = -1;
    Spinlock_acquire(&d->lock);
    if (ScopeStack_find(&d->stack, id) == NULL)
        goto error;
    n = 0;
    size_t pos = 0;
    Block *b;
    while ((b = Ledger_next(&d->ledger, &pos)) != NULL) {
        if (b->floor <= id && id <= b->scope) {
            if ((size_t)n < cap)
                out[n] = *b;
            n++;
        }
    }
error:
    Spinlock_release(&d->lock);
    return n;
}

int
Engine_take_error(Engine *self, int slot, uint64_t *dropped)
{
    Device *d = Engine_device(self, slot, 0);
    *dropped = 0;
    if (d == NULL)
        return ENGINE_OK;
    Spinlock_acquire(&d->lock);
    int err = d->error;
    *dropped = d->dropped;
    d->error = ENGINE_OK;
    d->dropped = 0;
    Spinlock_release(&d->lock);
    return err;
}

int
Engine_record_start(Engine *self, size_t capacity)
{
    Event *buf = malloc(capacity * sizeof(Event));
    if (buf == NULL)
        return -1;
    Spinlock_acquire(&self->record_lock);
    free(self->record);
    self->record = buf;
    self->record_len = 0;
    self->record_cap = capacity;
    Spinlock_release(&self->record_lock);
    atomic_store(&self->recording, 1);
    return 0;
}

size_t
Engine_record_stop(Engine *self, Event **events)
{
    atomic_store(&self->recording, 0);
    Spinlock_acquire(&self->record_lock);
    *events = self->record;
    size_t n = self->record_len;
    self->record = NULL;
    self->record_len = 0;
    self->record_cap = 0;
    Spinlock_release(&self->record_lock);
    return n;
}

void
Engine_replay(Engine *self, const Event *events, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const Event *ev = &events[i];
        Engine_event(self, ev->slot, (uintptr_t)ev->addr, ev->size,
                     ev->total, ev->reserved, ev->source);
    }
}

int
Engine_kept(Engine *self, int slot, uint32_t id, KeptBlock **out, uint32_t *n,
            KeptBlock *head)
{
    Device *d = Engine_device(self, slot, 0);
    *out = NULL;
    *n = 0;
    if (d == NULL)
        return -1;
    int ret = -1;
    Spinlock_acquire(&d->lock);
    if (d->kept.scope != id || d->kept.lost)
        goto error;
    uint32_t count = Kept_count(&d->kept);
    if (count != 0) {
        *out = malloc((size_t)count * sizeof(KeptBlock));
        if (*out == NULL)
            goto error;
        *n = Kept_copy(&d->kept, *out, count);
    }
    memset(head, 0, sizeof(*head));
    head->span_max = d->kept.head_max;
    head->span_seq = d->kept.head_seq;
    head->span_site = d->kept.head_site;
    head->phases = d->kept.head_phases;
    ret = 0;
error:
    Spinlock_release(&d->lock);
    return ret;
}
