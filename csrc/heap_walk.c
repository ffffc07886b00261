/* Walks over the garbage collector's heap for the leak check, in C: a
 * Python loop over a million objects costs a large process seconds.
 */
#include "heap_walk.h"

#include "ledger.h"

/* The leak check picks the tensors out of gc.get_objects(), a million
 * objects in a large process: a Python loop over them cost 0.3 s, map and
 * compress 0.12 s. */
PyObject *
HeapWalk_of_types(PyObject *objects, PyObject *kinds)
{
    PyObject *result = PyList_New(0);
    if (result == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(objects); i++) {
        PyObject *obj = PyList_GET_ITEM(objects, i);
        int found = PySet_Contains(kinds, (PyObject *)Py_TYPE(obj));
        if (found < 0 || (found && PyList_Append(result, obj) < 0)) {
            Py_DECREF(result);
            return NULL;
        }
    }
    return result;
}

/* The leak check's holder search asks, a level at a time, which objects
 * refer to hundreds of others at once.  gc.get_referrers compares each
 * reference on the heap with each object asked about, which cost about a
 * second a level over a large heap; here a reference costs one lookup in a
 * table of the objects asked about (a ledger keyed by address). */
static int
referrers_visit(PyObject *obj, void *targets)
{
    return Ledger_find((const Ledger *)targets, (uintptr_t)obj) != NULL;
}

PyObject *
HeapWalk_referrers(PyObject *objects, PyObject *targets)
{
    PyObject *result = NULL;
    Ledger wanted;
    if (Ledger_init(&wanted, 64) < 0)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(targets); i++) {
        int created;
        if (Ledger_insert(&wanted, (uintptr_t)PyList_GET_ITEM(targets, i), &created) == NULL) {
            PyErr_NoMemory();
            goto error;
        }
    }
    result = PyList_New(0);
    if (result == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(objects); i++) {
        PyObject *obj = PyList_GET_ITEM(objects, i);
        traverseproc traverse = Py_TYPE(obj)->tp_traverse;
        /* the two lists refer to everything asked about: no holders */
        if (obj == objects || obj == targets || traverse == NULL)
            continue;
        if (traverse(obj, referrers_visit, &wanted) && PyList_Append(result, obj) < 0)
            goto error;
    }
    Ledger_fini(&wanted);
    return result;
error:
    Py_XDECREF(result);
    Ledger_fini(&wanted);
    return NULL;
}
