#include "timeline.h"

#include <stdlib.h>
#include <string.h>

static void
merge(TimelinePoint *into, const TimelinePoint *p)
{
    if (p->own_min < into->own_min)
        into->own_min = p->own_min;
    if (p->own_max > into->own_max)
        into->own_max = p->own_max;
    if (p->total_min < into->total_min)
        into->total_min = p->total_min;
    if (p->total_max > into->total_max)
        into->total_max = p->total_max;
}

int
Timeline_start(Timeline *self, uint64_t seq0, int64_t own, int64_t total)
{
    if (self->points == NULL) {
        self->points = malloc(TIMELINE_MAX * sizeof(TimelinePoint));
        if (self->points == NULL)
            return -1;
    }
    self->seq0 = self->last = seq0;
    self->shift = 0;
    self->n = 1;
    self->points[0] = (TimelinePoint){seq0, own, own, total, total};
    return 0;
}

/* Halves the buckets: each pair becomes one spanning twice the events. */
static void
compress(Timeline *self)
{
    uint32_t half = (self->n + 1) / 2;
    for (uint32_t i = 0; i < half; i++) {
        TimelinePoint p = self->points[2 * i];
        if (2 * i + 1 < self->n)
            merge(&p, &self->points[2 * i + 1]);
        self->points[i] = p;
    }
    self->n = half;
    self->shift++;
}

void
Timeline_add(Timeline *self, uint64_t seq, int64_t own, int64_t total)
{
    if (self->points == NULL || self->n == 0 || seq < self->seq0)
        return;
    uint64_t at = (seq - self->seq0) >> self->shift;
    while (at >= TIMELINE_MAX) {
        compress(self);
        at = (seq - self->seq0) >> self->shift;
    }
    TimelinePoint p = {seq, own, own, total, total};
    if (at < self->n) {
        merge(&self->points[at], &p);
    }
    else {
        /* Events of the device that this timeline did not see (none, as
         * the engine feeds every event) would leave buckets empty: the
         * new bucket starts where the last one ended. */
        self->points[self->n] = p;
        self->n++;
    }
    self->last = seq;
}

uint32_t
Timeline_copy(const Timeline *self, TimelinePoint *dst, uint32_t max)
{
    if (self->points == NULL || max == 0)
        return 0;
    uint32_t group = 1;
    while ((self->n + group - 1) / group > max)
        group *= 2;
    uint32_t out = 0;
    for (uint32_t i = 0; i < self->n; i += group) {
        TimelinePoint p = self->points[i];
        for (uint32_t k = 1; k < group && i + k < self->n; k++)
            merge(&p, &self->points[i + k]);
        dst[out++] = p;
    }
    return out;
}

void
Timeline_fini(Timeline *self)
{
    free(self->points);
    memset(self, 0, sizeof(*self));
}
