/* Walks over the garbage collector's heap (gc.get_objects()) for the leak
 * check's tensor search and holder search; under the GIL.
 */
#ifndef MEMLAB_HEAP_WALK_H
#define MEMLAB_HEAP_WALK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The items of the list objects whose exact type is in the set kinds. */
PyObject *HeapWalk_of_types(PyObject *objects, PyObject *kinds);
/* The items of the list objects that refer to any item of the list
 * targets (neither list itself counts). */
PyObject *HeapWalk_referrers(PyObject *objects, PyObject *targets);

/* The objects roots reach through tp_traverse (as gc.get_referents), depth
 * first, each once, at most limit: not modules, classes or functions, nor
 * objects whose class's module starts with one of the str prefixes (a
 * tuple), nor through them. */
PyObject *HeapWalk_reach(PyObject *roots, Py_ssize_t limit, PyObject *prefixes);

/* The items of container, in its order, whose value is of a subtype of
 * tensor or whose exact type is in the tuple containers, among its first
 * limit items: a list of (key, value, is_tensor), key a dict's key, a
 * set's None, else the item's index.  The leak check's walk from modules'
 * globals: most of what it reads is functions, classes and strings, passed
 * over here without an object made for them.  Types are read from the
 * objects themselves (Py_TYPE, never __class__): no Python code runs but a
 * finalizer. */
PyObject *HeapWalk_items_of_kinds(PyObject *container, PyTypeObject *tensor, PyObject *containers,
                                  Py_ssize_t limit);

/* Stops the collector tracking each item of the list objects; returns how
 * many it was tracking.  For records kept to the session's end that can
 * never be part of a reference cycle (an untracked object in a cycle would
 * never be freed): the collector has nothing to find in them, and each
 * tracked one is promoted and walked at every full collection of a large
 * heap.  As CPython untracks a tuple or dict of atoms itself. */
Py_ssize_t HeapWalk_untrack(PyObject *objects);

#endif
