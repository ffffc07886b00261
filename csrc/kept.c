#include "kept.h"

#include <stdlib.h>
#include <string.h>

/* Each phase running starts at own bytes, reached by site (0: live
 * before); the others did not run: -1. */
static void
KeptPhases_clear(KeptPhases *p, unsigned running, int64_t own, uint32_t site)
{
    for (int k = 0; k < PHASE_KINDS; k++) {
        p->max[k] = (running >> k) & 1u ? own : -1;
        p->site[k] = site;
    }
}

static void
KeptPhases_reach(KeptPhases *p, unsigned running, int64_t own, uint32_t site)
{
    for (int k = 1; k < PHASE_KINDS; k++) {
        if (((running >> k) & 1u) && own > p->max[k]) {
            p->max[k] = own;
            p->site[k] = site;
        }
    }
}

/* A freed block's span joins the one before it: per phase, the larger. */
static void
KeptPhases_fold(KeptPhases *into, const KeptPhases *from)
{
    for (int k = 1; k < PHASE_KINDS; k++) {
        if (from->max[k] > into->max[k]) {
            into->max[k] = from->max[k];
            into->site[k] = from->site[k];
        }
    }
}

void
Kept_start(Kept *self, uint32_t scope, uint64_t seq)
{
    /* Every slot back on the free list: the buffer stays for the next test,
     * so the event path allocates only when a test holds more blocks at
     * once than any before it. */
    self->first = self->last = 0;
    self->free_list = 0;
    for (uint32_t i = self->cap; i > 0; i--) {
        self->slots[i - 1].next = self->free_list;
        self->free_list = i;
    }
    self->scope = scope;
    self->lost = 0;
    self->head_max = 0;
    self->head_seq = seq;
    self->head_site = 0;
    KeptPhases_clear(&self->head_phases, self->phases, 0, 0);
}

void
Kept_stop(Kept *self)
{
    self->scope = 0;
}

void
Kept_fini(Kept *self)
{
    free(self->slots);
    memset(self, 0, sizeof(*self));
}

/* Doubles the slots (or makes the first); the new ones join the free list.
 * Indices stay valid: blocks keep them in the ledger. */
static int
Kept_grow(Kept *self)
{
    uint32_t cap = self->cap ? self->cap * 2 : 256;
    if (cap <= self->cap)
        return -1;
    KeptBlock *slots = realloc(self->slots, (size_t)cap * sizeof(KeptBlock));
    if (slots == NULL)
        return -1;
    self->slots = slots;
    for (uint32_t i = cap; i > self->cap; i--) {
        slots[i - 1].next = self->free_list;
        self->free_list = i;
    }
    self->cap = cap;
    return 0;
}

/* The span that own bytes reach now: the latest live block's, or the head's
 * when none is live. */
static inline void
Kept_reach(Kept *self, int64_t own, uint64_t seq, uint32_t site)
{
    if (self->last == 0) {
        if (own > self->head_max) {
            self->head_max = own;
            self->head_seq = seq;
            self->head_site = site;
        }
        KeptPhases_reach(&self->head_phases, self->phases, own, site);
        return;
    }
    KeptBlock *b = &self->slots[self->last - 1];
    KeptPhases_reach(&b->phases, self->phases, own, site);
    if (own > b->span_max) {
        b->span_max = own;
        b->span_seq = seq;
        b->span_site = site;
    }
}

uint32_t
Kept_on_alloc(Kept *self, uintptr_t addr, int64_t size, uint32_t site,
              int64_t own, uint64_t seq)
{
    if (self->free_list == 0 && Kept_grow(self) < 0) {
        self->lost = 1;
        return 0;
    }
    uint32_t slot = self->free_list;
    KeptBlock *b = &self->slots[slot - 1];
    self->free_list = b->next;
    b->addr = addr;
    b->size = size;
    b->span_max = own;
    b->span_seq = seq;
    b->seq = seq;
    b->site = site;
    b->span_site = site;
    KeptPhases_clear(&b->phases, self->phases, own, site);
    b->prev = self->last;
    b->next = 0;
    if (self->last != 0)
        self->slots[self->last - 1].next = slot;
    else
        self->first = slot;
    self->last = slot;
    return slot;
}

void
Kept_on_resize(Kept *self, uint32_t slot, int64_t delta, int64_t own,
               uint64_t seq)
{
    if (slot == 0 || slot > self->cap)
        return;
    KeptBlock *b = &self->slots[slot - 1];
    b->size += delta;
    if (delta > 0)
        Kept_reach(self, own, seq, b->site);
}

void
Kept_on_free(Kept *self, uint32_t slot)
{
    if (slot == 0 || slot > self->cap)
        return;
    KeptBlock *b = &self->slots[slot - 1];
    /* Its span joins the one before it: the freed block is no longer a
     * boundary where K steps up. */
    if (b->prev != 0) {
        KeptBlock *p = &self->slots[b->prev - 1];
        if (b->span_max > p->span_max) {
            p->span_max = b->span_max;
            p->span_seq = b->span_seq;
            p->span_site = b->span_site;
        }
        KeptPhases_fold(&p->phases, &b->phases);
        p->next = b->next;
    } else {
        if (b->span_max > self->head_max) {
            self->head_max = b->span_max;
            self->head_seq = b->span_seq;
            self->head_site = b->span_site;
        }
        KeptPhases_fold(&self->head_phases, &b->phases);
        self->first = b->next;
    }
    if (b->next != 0)
        self->slots[b->next - 1].prev = b->prev;
    else
        self->last = b->prev;
    b->addr = 0;
    b->next = self->free_list;
    self->free_list = slot;
}

void
Kept_set_phases(Kept *self, unsigned mask, int64_t own)
{
    unsigned started = mask & ~self->phases;
    self->phases = mask;
    if (self->scope == 0 || started == 0)
        return;
    /* What is live as a phase starts counts for it, reached by no site. */
    KeptPhases_reach(self->last == 0 ? &self->head_phases : &self->slots[self->last - 1].phases,
                     started, own, 0);
}

uint32_t
Kept_count(const Kept *self)
{
    uint32_t n = 0;
    for (uint32_t i = self->first; i != 0; i = self->slots[i - 1].next)
        n++;
    return n;
}

uint32_t
Kept_copy(const Kept *self, KeptBlock *dst, uint32_t max)
{
    uint32_t n = 0;
    for (uint32_t i = self->first; i != 0 && n < max;
         i = self->slots[i - 1].next)
        dst[n++] = self->slots[i - 1];
    return n;
}
