/* A test's allocations and frees on one device, in order, for the
 * memory_viz snapshot (--memlab-snapshot) and for the memory by kind of a
 * test with phases (from its first phase on): each with its address, size,
 * time, the device's event number and the site (user call chain) that
 * allocated it.  Kept only when one of those asks; bounded (past max
 * entries they are counted, not kept).  Appended under the device's lock;
 * the array grows by doubling through malloc (never through torch).
 */
#ifndef MEMLAB_ALLOC_LOG_H
#define MEMLAB_ALLOC_LOG_H

#include <stdint.h>

typedef struct AllocEntry {
    uint64_t addr;
    int64_t size;           /* > 0 allocated, < 0 freed */
    uint64_t time_us;       /* CLOCK_REALTIME, as torch's traces have it */
    uint64_t seq;           /* the device's event number */
    uint32_t site;
    uint32_t counts;        /* 1 if the block counts for the log's scope */
} AllocEntry;

typedef struct AllocLog {
    AllocEntry *entries;
    uint32_t n;
    uint32_t cap;
    uint32_t max;
    uint64_t dropped;
} AllocLog;

/* Empties the log and sets its bound. */
void AllocLog_start(AllocLog *self, uint32_t max);
void AllocLog_add(AllocLog *self, uint64_t addr, int64_t size, uint32_t site,
                  uint64_t seq, int counts);
/* Hands the entries to the caller (free()), leaving the log empty. */
AllocEntry *AllocLog_take(AllocLog *self, uint32_t *n, uint64_t *dropped);
/* A copy of the entries so far (the caller frees it; NULL when empty or
 * out of memory, *n then 0), the log left as it is. */
AllocEntry *AllocLog_copy(const AllocLog *self, uint32_t *n, uint64_t *dropped);
void AllocLog_fini(AllocLog *self);

#endif
