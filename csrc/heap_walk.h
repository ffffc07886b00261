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

#endif
