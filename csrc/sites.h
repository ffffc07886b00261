/* Lines and sites: the vocabulary of attribution.
 *
 * A line is (code id, line number), interned by the tracer when a traced
 * frame reaches it; it carries the per-line statistics (hits, bytes
 * allocated, the peak device totals while it ran).  A site is a user call
 * chain of up to SITE_CHAIN lines, innermost first, interned by the
 * tracer when a traced frame reaches a line (shadow_stack.c), so that the
 * allocator's path finds its block's site ready and interns nothing.
 *
 * Both tables are append-only and chunked: a record never moves once
 * published, so the allocator path reads lines without the GIL and without
 * a lock.  Interning takes each table's spinlock: lines found at
 * allocation (shadow_stack.h's frames whose lines are not traced) are
 * interned on the allocator's path, from any thread, beside the tracer's
 * owners under the GIL.  Nothing else is done while it is held.
 */
#ifndef MEMLAB_SITES_H
#define MEMLAB_SITES_H

#include <stdatomic.h>
#include <stdint.h>

#include "spinlock.h"

#define SITE_CHAIN 8
#define LINE_SLOTS 4            /* devices with per-line figures: cpu, cuda:0..2 */
#define TABLE_CHUNK_BITS 12
#define TABLE_CHUNK (1u << TABLE_CHUNK_BITS)
#define TABLE_MAX_CHUNKS 4096   /* 16M records */

typedef struct LineRec {
    uint32_t code;
    int32_t lineno;
    _Atomic uint32_t epoch;                 /* LineTable.epoch when last touched */
    _Atomic uint64_t hits;
    _Atomic int64_t alloc[LINE_SLOTS];      /* bytes allocated by the line */
    _Atomic int64_t peak[LINE_SLOTS];       /* highest total while it ran */
    _Atomic int64_t peak_reserved[LINE_SLOTS];
    _Atomic int64_t last_total[LINE_SLOTS]; /* total when it last finished */
} LineRec;

typedef struct LineTable {
    LineRec *chunks[TABLE_MAX_CHUNKS];
    atomic_uint count;          /* ids 1..count are published */
    Spinlock lock;              /* interning */
    uint64_t *keys;             /* (code << 32 | lineno) -> id map, locked */
    uint32_t *vals;
    uint32_t mask;
    /* The lines whose statistics changed since the last reset, so that a
     * reset and a read cost what one test touched, not every line the
     * suite ever ran.  Appended from any thread; 0 marks a slot reserved
     * but not yet written.  Past its capacity every line is read. */
    atomic_uint epoch;
    _Atomic uint32_t *touched;
    atomic_uint ntouched;
    atomic_int touched_overflow;
} LineTable;

#define LINE_TOUCHED_CAP (1u << 16)

typedef struct SiteRec {
    uint32_t n;
    uint32_t lines[SITE_CHAIN];
} SiteRec;

typedef struct SiteTable {
    SiteRec *chunks[TABLE_MAX_CHUNKS];
    atomic_uint count;          /* ids 1..count are published */
    Spinlock lock;              /* interning */
    uint32_t *index;            /* open addressing over site ids, 0 empty */
    uint32_t mask;
} SiteTable;

int LineTable_init(LineTable *self);
void LineTable_fini(LineTable *self);
/* 0 when out of memory.  Any thread (the table's lock). */
uint32_t LineTable_intern(LineTable *self, uint32_t code, int32_t lineno);
static inline LineRec *
LineTable_get(LineTable *self, uint32_t id)
{
    if (id == 0 || id > atomic_load_explicit(&self->count,
                                             memory_order_acquire))
        return 0;
    id--;
    return &self->chunks[id >> TABLE_CHUNK_BITS][id & (TABLE_CHUNK - 1)];
}
/* Notes that a line's statistics change in this epoch; any thread. */
static inline void
LineTable_touch(LineTable *self, LineRec *r, uint32_t id)
{
    uint32_t epoch = atomic_load_explicit(&self->epoch, memory_order_relaxed);
    uint32_t seen = atomic_load_explicit(&r->epoch, memory_order_relaxed);
    if (seen == epoch
        || !atomic_compare_exchange_strong(&r->epoch, &seen, epoch))
        return;
    uint32_t n = atomic_fetch_add_explicit(&self->ntouched, 1,
                                           memory_order_relaxed);
    if (n < LINE_TOUCHED_CAP)
        atomic_store_explicit(&self->touched[n], id, memory_order_relaxed);
    else
        atomic_store_explicit(&self->touched_overflow, 1, memory_order_relaxed);
}
/* The lines touched since the last reset: their count in *n, each read by
 * LineTable_touched_id; -1 when there were more than the list holds, and
 * every line 1..count must be read instead. */
int LineTable_touched(LineTable *self, uint32_t *n);
/* The i-th line touched; 0 (to be skipped) while its toucher has counted
 * it but not yet written it. */
static inline uint32_t
LineTable_touched_id(LineTable *self, uint32_t i)
{
    return atomic_load_explicit(&self->touched[i], memory_order_relaxed);
}
/* Zeroes the statistics of the lines touched since the last reset (not the
 * lines themselves), and starts a new epoch. */
void LineTable_reset(LineTable *self);

int SiteTable_init(SiteTable *self);
void SiteTable_fini(SiteTable *self);
/* Interns a chain (innermost first); 0 when n is 0 or out of memory.
 * Any thread (the table's lock). */
uint32_t SiteTable_intern(SiteTable *self, const uint32_t *lines, uint32_t n);
static inline const SiteRec *
SiteTable_get(SiteTable *self, uint32_t id)
{
    if (id == 0 || id > atomic_load_explicit(&self->count,
                                             memory_order_acquire))
        return 0;
    id--;
    return &self->chunks[id >> TABLE_CHUNK_BITS][id & (TABLE_CHUNK - 1)];
}

#endif
