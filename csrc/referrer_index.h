/* Who refers to what over one snapshot of the garbage collector's heap,
 * built once: the leak check's holder search asks, a level at a time, for
 * the referrers of the objects its paths reached, and each level's walk of
 * a large heap (700 thousand objects, about 70 ms) was the end's largest
 * cost (twelve levels, twice).  Built in one walk; each level then costs a
 * lookup per object asked and the referrers found.  Under the GIL.
 */
#ifndef MEMLAB_REFERRER_INDEX_H
#define MEMLAB_REFERRER_INDEX_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct RefEdge {
    uint32_t from;      /* the referrer's index in the heap list */
    uint32_t next;      /* the referent's next edge, index + 1 (0: none) */
} RefEdge;

typedef struct RefSlot {
    uintptr_t key;      /* the referent's address; 0: empty */
    uint32_t head;      /* its newest edge, index + 1 */
} RefSlot;

typedef struct ReferrerIndex {
    RefSlot *slots;
    size_t mask;        /* capacity - 1, a power of two */
    size_t count;
    RefEdge *edges;
    size_t n_edges, cap_edges;
    Py_ssize_t covered; /* the heap list's items indexed so far */
} ReferrerIndex;

int ReferrerIndex_init(ReferrerIndex *self);
void ReferrerIndex_fini(ReferrerIndex *self);
/* Indexes the items of the list heap past those already covered (a heap
 * list only grows).  -1 with MemoryError set. */
int ReferrerIndex_add(ReferrerIndex *self, PyObject *heap);
/* The positions in heap of the items that referred to any item of the
 * list targets when they were indexed (those appended since are indexed
 * first), ascending, each once: where the
 * items HeapWalk_referrers finds are, for targets that the garbage
 * collector tracked when the index was built (the heap keeps every
 * referrer alive, and so every referent indexed that it tracks). */
PyObject *ReferrerIndex_referrers(ReferrerIndex *self, PyObject *heap, PyObject *targets);

#endif
