/* The ledger: every live block that was allocated while a scope was open,
 * keyed by address.  Open addressing with linear probing and backward-shift
 * deletion, so there are no tombstones and a lookup never scans more than the
 * run it hashes into.  Not thread-safe: the device that owns it holds its lock.
 */
#ifndef MEMLAB_LEDGER_H
#define MEMLAB_LEDGER_H

#include <stddef.h>
#include <stdint.h>

/* A block whose size came from the CUDA trace tracker (requested bytes,
 * rounded the allocator's way) rather than from the allocator's report. */
#define BLOCK_ESTIMATED 1u
/* Both the tracker and the allocator's report were heard for it. */
#define BLOCK_PAIRED 2u

typedef struct Block {
    uintptr_t addr;     /* 0 marks an empty slot; no allocator returns 0 */
    int64_t size;
    uint32_t scope;     /* innermost open scope when it was allocated */
    uint32_t floor;     /* outermost scope it counts for (detached scopes) */
    uint32_t site;      /* allocation site id, 0 when unknown */
    uint32_t flags;
    uint32_t kept;      /* its slot in the device's Kept tracker, 0: none */
} Block;

typedef struct Ledger {
    Block *slots;
    size_t mask;        /* capacity - 1; capacity is a power of two */
    size_t count;
} Ledger;

int Ledger_init(Ledger *self, size_t capacity);
void Ledger_fini(Ledger *self);
void Ledger_clear(Ledger *self);
Block *Ledger_find(const Ledger *self, uintptr_t addr);
/* Returns the slot for addr, new (addr set, the rest zero) or existing;
 * *created says which.  NULL when growing the table failed. */
Block *Ledger_insert(Ledger *self, uintptr_t addr, int *created);
/* Removes addr, copying its block to *out.  Returns 1 if it was there. */
int Ledger_remove(Ledger *self, uintptr_t addr, Block *out);
/* Iteration: start with *pos = 0; NULL at the end.  No inserts meanwhile. */
Block *Ledger_next(const Ledger *self, size_t *pos);

#endif
