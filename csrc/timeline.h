/* A test's memory over its allocator events, bounded: at most
 * TIMELINE_MAX buckets, each the min and max of the scope's own bytes and
 * of the device total over a run of consecutive events.  When the buckets
 * run out, neighbours merge pairwise and each bucket spans twice as many
 * events, so memory stays O(1) per test, every event costs O(1) amortised,
 * and no peak or trough is ever averaged away: a merged bucket keeps the
 * extremes of both halves.
 *
 * The x axis is the device's event number, not time: the hot path reads no
 * clock, and marks (memlab.mark, phases) record the event number they fell
 * on.
 */
#ifndef MEMLAB_TIMELINE_H
#define MEMLAB_TIMELINE_H

#include <stdint.h>

#define TIMELINE_MAX 4096

typedef struct TimelinePoint {
    uint64_t seq;           /* device event number of the bucket's first event */
    int64_t own_min, own_max;
    int64_t total_min, total_max;
} TimelinePoint;

typedef struct Timeline {
    TimelinePoint *points;  /* TIMELINE_MAX of them, kept between tests */
    uint32_t n;             /* buckets in use */
    uint32_t shift;         /* a bucket spans 1 << shift events */
    uint64_t seq0;          /* event number at the start: bucket 0 */
    uint64_t last;          /* event number of the latest point */
} Timeline;

/* -1 when out of memory (the buffer is allocated once, on first use). */
int Timeline_start(Timeline *self, uint64_t seq0, int64_t own, int64_t total);
/* seq never goes back; a seq before seq0 is ignored. */
void Timeline_add(Timeline *self, uint64_t seq, int64_t own, int64_t total);
/* Merges buckets into dst (capacity max >= 1) so that at most max remain,
 * extremes kept; returns how many were written. */
uint32_t Timeline_copy(const Timeline *self, TimelinePoint *dst, uint32_t max);
void Timeline_fini(Timeline *self);

#endif
