/* The hash of an address, for the engine's open-addressing tables keyed
 * by one (the ledger of live blocks, the holder search's referrer index).
 */
#ifndef MEMLAB_ADDR_HASH_H
#define MEMLAB_ADDR_HASH_H

#include <stddef.h>
#include <stdint.h>

/* Allocator addresses are aligned (16 bytes on CPU, 512 on CUDA) and so
 * are Python objects (16), so the low bits carry nothing; Fibonacci
 * hashing spreads the rest.  Take its low bits with the table's mask. */
static inline size_t
addr_hash(uintptr_t addr)
{
    uint64_t h = (uint64_t)(addr >> 4) * UINT64_C(0x9E3779B97F4A7C15);
    return (size_t)(h >> 32);
}

#endif
