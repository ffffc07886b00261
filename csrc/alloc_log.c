#define _POSIX_C_SOURCE 200809L
#include "alloc_log.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

void
AllocLog_start(AllocLog *self, uint32_t max)
{
    self->n = 0;
    self->max = max;
    self->dropped = 0;
}

void
AllocLog_add(AllocLog *self, uint64_t addr, int64_t size, uint32_t site,
             uint64_t seq, int counts)
{
    if (self->n >= self->max) {
        self->dropped++;
        return;
    }
    if (self->n == self->cap) {
        uint32_t cap = self->cap == 0 ? 256 : self->cap * 2;
        if (cap > self->max)
            cap = self->max;
        AllocEntry *grown = realloc(self->entries, (size_t)cap * sizeof(AllocEntry));
        if (grown == NULL) {
            self->dropped++;
            return;
        }
        self->entries = grown;
        self->cap = cap;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    self->entries[self->n++] = (AllocEntry){
        addr, size, (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u,
        seq, site, counts != 0};
}

AllocEntry *
AllocLog_take(AllocLog *self, uint32_t *n, uint64_t *dropped)
{
    AllocEntry *entries = self->entries;
    *n = self->n;
    *dropped = self->dropped;
    self->entries = NULL;
    self->n = self->cap = 0;
    self->dropped = 0;
    return entries;
}

AllocEntry *
AllocLog_copy(const AllocLog *self, uint32_t *n, uint64_t *dropped)
{
    *n = 0;
    *dropped = self->dropped;
    if (self->n == 0)
        return NULL;
    AllocEntry *copy = malloc((size_t)self->n * sizeof(AllocEntry));
    if (copy == NULL)
        return NULL;
    memcpy(copy, self->entries, (size_t)self->n * sizeof(AllocEntry));
    *n = self->n;
    return copy;
}

void
AllocLog_fini(AllocLog *self)
{
    free(self->entries);
    memset(self, 0, sizeof(*self));
}
