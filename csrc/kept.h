/* What a test kept: its peak without the blocks it still holds at its end.
 *
 * Memory that a test allocates once for the whole process (a CUDA library's
 * workspace, a module cache filled on first use) lands in whichever test is
 * the first in its process to need it; every later test finds it there.  A
 * figure that counts it depends on test order.  The peak without it is
 *
 *     max over t of  own(t) - K(t)
 *
 * where K(t) is the bytes of the blocks still live at the end (the kept
 * ones) allocated by t.  Which blocks those are is known only at the end,
 * so the tracker keeps, for every live block of its scope in allocation
 * order, the most own bytes seen from its allocation to the next live
 * block's: between two such allocations K is constant, so at the end the
 * peak without any subset of the live blocks is one walk over them.  A free
 * folds the block's span into the previous live block's (max of both), so
 * every event is O(1) and memory is O(live blocks).
 *
 * Not thread-safe: the device that owns it holds its lock.
 */
#ifndef MEMLAB_KEPT_H
#define MEMLAB_KEPT_H

#include <stdint.h>

#include "phases.h"

/* Each phase's peak without what was kept comes from the same walk: a span
 * also keeps, per phase kind (phases.h; index 0 unused), the most own bytes
 * while that phase ran, -1 where it did not run in the span.  The phases
 * running are a mask of 1 << kind, set by the engine as the measuring
 * thread enters and leaves them; the own bytes at a phase's start count
 * for it (they are live while it runs). */
typedef struct KeptPhases {
    int64_t max[PHASE_KINDS];
    uint32_t site[PHASE_KINDS]; /* site of the allocation that reached it; 0: live at the phase's start */
} KeptPhases;

typedef struct KeptBlock {
    uintptr_t addr;
    int64_t size;
    int64_t span_max;   /* most own bytes from its allocation to the next live block's */
    uint64_t span_seq;  /* event number of span_max */
    uint64_t seq;       /* event number of its allocation */
    uint32_t site;
    uint32_t span_site; /* site of the allocation that reached span_max */
    uint32_t prev;      /* neighbours in allocation order, index + 1 (0: none); */
    uint32_t next;      /* a free slot's next is the free list's */
    KeptPhases phases;  /* per phase, as span_max */
} KeptBlock;

typedef struct Kept {
    KeptBlock *slots;
    uint32_t cap;
    uint32_t first, last;   /* index + 1 */
    uint32_t free_list;     /* index + 1 */
    uint32_t scope;         /* the scope followed, 0: none */
    int lost;               /* out of memory: the figures are incomplete */
    int64_t head_max;       /* most own bytes before the first live block */
    uint64_t head_seq;
    uint32_t head_site;
    KeptPhases head_phases;
    unsigned phases;        /* the phases running: 1 << kind each */
} Kept;

/* Follows a scope from its start (own bytes 0 at event seq); forgets the
 * scope followed before. */
void Kept_start(Kept *self, uint32_t scope, uint64_t seq);
void Kept_stop(Kept *self);
void Kept_fini(Kept *self);
/* A block of the followed scope was allocated; own is the scope's live
 * bytes after it.  Returns its slot (index + 1) for the block to keep, 0
 * when out of memory (then lost is set). */
uint32_t Kept_on_alloc(Kept *self, uintptr_t addr, int64_t size,
                       uint32_t site, int64_t own, uint64_t seq);
/* The block in slot changed size by delta (an estimate corrected); own is
 * the scope's live bytes after it. */
void Kept_on_resize(Kept *self, uint32_t slot, int64_t delta, int64_t own,
                    uint64_t seq);
/* The block in slot was freed. */
void Kept_on_free(Kept *self, uint32_t slot);
/* The phases running are now mask (1 << kind each); own is the scope's
 * live bytes, which count for each phase that starts. */
void Kept_set_phases(Kept *self, unsigned mask, int64_t own);
/* How many live blocks the tracker holds. */
uint32_t Kept_count(const Kept *self);
/* Copies the live blocks, in allocation order, into dst (room for max);
 * returns how many were written. */
uint32_t Kept_copy(const Kept *self, KeptBlock *dst, uint32_t max);

#endif
