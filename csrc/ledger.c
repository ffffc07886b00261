#include "ledger.h"

#include <stdlib.h>
#include <string.h>

#include "addr_hash.h"

int
Ledger_init(Ledger *self, size_t capacity)
{
    size_t cap = 16;
    while (cap < capacity)
        cap <<= 1;
    self->slots = calloc(cap, sizeof(Block));
    if (self->slots == NULL)
        return -1;
    self->mask = cap - 1;
    self->count = 0;
    return 0;
}

void
Ledger_fini(Ledger *self)
{
    free(self->slots);
    self->slots = NULL;
    self->mask = 0;
    self->count = 0;
}

/* Past this many slots a cleared ledger goes back to a fresh small table
 * instead of being swept: one test that held a million blocks must not
 * make every later test clear tens of megabytes. */
#define LEDGER_KEEP_SLOTS 4096

void
Ledger_clear(Ledger *self)
{
    /* It runs after every measured test, and a test that frees what it
     * allocated leaves the ledger empty already. */
    if (self->count == 0)
        return;
    size_t cap = self->mask + 1;
    if (cap > LEDGER_KEEP_SLOTS) {
        Block *small = calloc(LEDGER_KEEP_SLOTS, sizeof(Block));
        if (small != NULL) {
            free(self->slots);
            self->slots = small;
            self->mask = LEDGER_KEEP_SLOTS - 1;
            self->count = 0;
            return;
        }
    }
    memset(self->slots, 0, cap * sizeof(Block));
    self->count = 0;
}

Block *
Ledger_find(const Ledger *self, uintptr_t addr)
{
    size_t i = addr_hash(addr) & self->mask;
    for (;;) {
        Block *b = &self->slots[i];
        if (b->addr == addr)
            return b;
        if (b->addr == 0)
            return NULL;
        i = (i + 1) & self->mask;
    }
}

static int
Ledger_grow(Ledger *self)
{
    size_t old_cap = self->mask + 1;
    size_t new_cap = old_cap * 2;
    Block *old = self->slots;
    Block *slots = calloc(new_cap, sizeof(Block));
    if (slots == NULL)
        return -1;
    self->slots = slots;
    self->mask = new_cap - 1;
    for (size_t j = 0; j < old_cap; j++) {
        if (old[j].addr == 0)
            continue;
        size_t i = addr_hash(old[j].addr) & self->mask;
        while (slots[i].addr != 0)
            i = (i + 1) & self->mask;
        slots[i] = old[j];
    }
    free(old);
    return 0;
}

Block *
Ledger_insert(Ledger *self, uintptr_t addr, int *created)
{
    /* Load factor at most 1/2 keeps probe runs short. */
    if ((self->count + 1) * 2 > self->mask + 1 && Ledger_grow(self) < 0)
        return NULL;
    size_t i = addr_hash(addr) & self->mask;
    for (;;) {
        Block *b = &self->slots[i];
        if (b->addr == addr) {
            *created = 0;
            return b;
        }
        if (b->addr == 0) {
            memset(b, 0, sizeof(*b));
            b->addr = addr;
            self->count++;
            *created = 1;
            return b;
        }
        i = (i + 1) & self->mask;
    }
}

int
Ledger_remove(Ledger *self, uintptr_t addr, Block *out)
{
    size_t i = addr_hash(addr) & self->mask;
    for (;;) {
        if (self->slots[i].addr == addr)
            break;
        if (self->slots[i].addr == 0)
            return 0;
        i = (i + 1) & self->mask;
    }
    if (out != NULL)
        *out = self->slots[i];
    /* Backward-shift: pull later members of the run into the hole unless
     * their home lies cyclically in (hole, j]. */
    size_t hole = i;
    size_t j = i;
    for (;;) {
        j = (j + 1) & self->mask;
        if (self->slots[j].addr == 0)
            break;
        size_t home = addr_hash(self->slots[j].addr) & self->mask;
        int stays = (hole <= j) ? (hole < home && home <= j)
                                : (hole < home || home <= j);
        if (!stays) {
            self->slots[hole] = self->slots[j];
            hole = j;
        }
    }
    memset(&self->slots[hole], 0, sizeof(Block));
    self->count--;
    return 1;
}

Block *
Ledger_next(const Ledger *self, size_t *pos)
{
    while (*pos <= self->mask) {
        Block *b = &self->slots[(*pos)++];
        if (b->addr != 0)
            return b;
    }
    return NULL;
}
