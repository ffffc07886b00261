/* The holder search's referrer index (referrer_index.h).
 *
 * Only references to objects the garbage collector tracks are kept, and
 * none to a class: what the search asks about is a tensor or a container
 * on a path to it (tracked, since it holds a tracked object), and a class
 * ends a path, never continues one.  That leaves out most references
 * (strings, numbers, each instance's class) and with them most of the
 * index's memory.
 */
#include "referrer_index.h"

#include <stdlib.h>
#include <string.h>

#include "addr_hash.h"

int
ReferrerIndex_init(ReferrerIndex *self)
{
    memset(self, 0, sizeof(*self));
    self->slots = calloc(1024, sizeof(RefSlot));
    if (self->slots == NULL)
        return -1;
    self->mask = 1023;
    return 0;
}

void
ReferrerIndex_fini(ReferrerIndex *self)
{
    free(self->slots);
    free(self->edges);
    memset(self, 0, sizeof(*self));
}

static RefSlot *
find_slot(RefSlot *slots, size_t mask, uintptr_t key)
{
    size_t i = addr_hash(key) & mask;
    while (slots[i].key != 0 && slots[i].key != key)
        i = (i + 1) & mask;
    return &slots[i];
}

static int
grow(ReferrerIndex *self)
{
    size_t cap = (self->mask + 1) * 2;
    RefSlot *slots = calloc(cap, sizeof(RefSlot));
    if (slots == NULL)
        return -1;
    for (size_t i = 0; i <= self->mask; i++) {
        if (self->slots[i].key != 0)
            *find_slot(slots, cap - 1, self->slots[i].key) = self->slots[i];
    }
    free(self->slots);
    self->slots = slots;
    self->mask = cap - 1;
    return 0;
}

typedef struct Adding {
    ReferrerIndex *index;
    uint32_t from;
    int failed;
} Adding;

static int
add_visit(PyObject *obj, void *arg)
{
    Adding *a = arg;
    if (obj == NULL || !PyObject_IS_GC(obj) || !PyObject_GC_IsTracked(obj) || PyType_Check(obj))
        return 0;
    ReferrerIndex *self = a->index;
    if ((self->count + 1) * 4 > (self->mask + 1) * 3 && grow(self) < 0)
        goto fail;
    if (self->n_edges == self->cap_edges) {
        size_t cap = self->cap_edges ? self->cap_edges * 2 : 4096;
        if (cap > UINT32_MAX)
            goto fail;
        RefEdge *edges = realloc(self->edges, cap * sizeof(RefEdge));
        if (edges == NULL)
            goto fail;
        self->edges = edges;
        self->cap_edges = cap;
    }
    RefSlot *slot = find_slot(self->slots, self->mask, (uintptr_t)obj);
    if (slot->key == 0) {
        slot->key = (uintptr_t)obj;
        self->count++;
    }
    self->edges[self->n_edges] = (RefEdge){a->from, slot->head};
    slot->head = (uint32_t)++self->n_edges;
    return 0;
fail:
    a->failed = 1;
    return 1;   /* stops this object's traversal */
}

int
ReferrerIndex_add(ReferrerIndex *self, PyObject *heap)
{
    Py_ssize_t n = PyList_GET_SIZE(heap);
    if (n > (Py_ssize_t)UINT32_MAX) {
        PyErr_SetString(PyExc_MemoryError, "the heap is too large to index");
        return -1;
    }
    for (Py_ssize_t i = self->covered; i < n; i++) {
        PyObject *obj = PyList_GET_ITEM(heap, i);
        traverseproc traverse = Py_TYPE(obj)->tp_traverse;
        if (obj == heap || traverse == NULL)
            continue;
        Adding a = {self, (uint32_t)i, 0};
        traverse(obj, add_visit, &a);
        if (a.failed) {
            PyErr_NoMemory();
            return -1;
        }
    }
    self->covered = n;
    return 0;
}

static int
compare_index(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

PyObject *
ReferrerIndex_referrers(ReferrerIndex *self, PyObject *heap, PyObject *targets)
{
    size_t n = 0, cap = 64;
    uint32_t *found = malloc(cap * sizeof(uint32_t));
    PyObject *result = NULL;
    if (found == NULL)
        return PyErr_NoMemory();
    if (ReferrerIndex_add(self, heap) < 0)   /* what was appended since */
        goto error;
    for (Py_ssize_t t = 0; t < PyList_GET_SIZE(targets); t++) {
        const RefSlot *slot = find_slot(self->slots, self->mask,
                                        (uintptr_t)PyList_GET_ITEM(targets, t));
        for (uint32_t e = slot->key ? slot->head : 0; e != 0; e = self->edges[e - 1].next) {
            if (n == cap) {
                uint32_t *more = realloc(found, cap * 2 * sizeof(uint32_t));
                if (more == NULL) {
                    PyErr_NoMemory();
                    goto error;
                }
                found = more;
                cap *= 2;
            }
            found[n++] = self->edges[e - 1].from;
        }
    }
    qsort(found, n, sizeof(uint32_t), compare_index);
    result = PyList_New(0);
    if (result == NULL)
        goto error;
    for (size_t i = 0; i < n; i++) {
        if ((i > 0 && found[i] == found[i - 1]) || (Py_ssize_t)found[i] >= PyList_GET_SIZE(heap)
            || PyList_GET_ITEM(heap, found[i]) == targets)
            continue;
        PyObject *at = PyLong_FromUnsignedLong(found[i]);
        if (at == NULL || PyList_Append(result, at) < 0) {
            Py_XDECREF(at);
            Py_CLEAR(result);
            goto error;
        }
        Py_DECREF(at);
    }
error:
    free(found);
    return result;
}
