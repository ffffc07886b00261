/* Walks over the garbage collector's heap for the leak check, in C: a
 * Python loop over a million objects costs a large process seconds.
 */
#include "heap_walk.h"

#include <stdlib.h>

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

/* Appends (key, value, is_tensor) to picked where value is a tensor or a
 * container (HeapWalk_items_of_kinds); 0, or -1 with an exception. */
static int
pick(PyObject *picked, PyObject *key, PyObject *value, PyTypeObject *tensor, PyObject *containers)
{
    PyTypeObject *kind = Py_TYPE(value);
    int is_tensor = PyType_IsSubtype(kind, tensor);
    int is_container = 0;
    for (Py_ssize_t i = 0; !is_tensor && i < PyTuple_GET_SIZE(containers); i++)
        is_container |= (PyObject *)kind == PyTuple_GET_ITEM(containers, i);
    if (!is_tensor && !is_container)
        return 0;
    /* key and value are held (by the caller) before anything is allocated:
     * a collection that an allocation starts (before 3.12) may run a
     * finalizer that takes them out of the container. */
    PyObject *entry = PyTuple_Pack(3, key, value, is_tensor ? Py_True : Py_False);
    if (entry == NULL)
        return -1;
    int rc = PyList_Append(picked, entry);
    Py_DECREF(entry);
    return rc;
}

PyObject *
HeapWalk_items_of_kinds(PyObject *container, PyTypeObject *tensor, PyObject *containers, Py_ssize_t limit)
{
    PyObject *picked = PyList_New(0);
    PyObject *iter = NULL, *key = NULL, *value = NULL;
    if (picked == NULL)
        return NULL;
    if (PyDict_Check(container)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        /* A dict changed while read (by a finalizer) is read on as it is:
         * PyDict_Next stays within it. */
        for (Py_ssize_t read = 0; read < limit && PyDict_Next(container, &pos, &k, &v); read++) {
            key = Py_NewRef(k);
            value = Py_NewRef(v);
            if (pick(picked, key, value, tensor, containers) < 0)
                goto error;
            Py_CLEAR(key);
            Py_CLEAR(value);
        }
        return picked;
    }
    int members = PyAnySet_Check(container);
    iter = PyObject_GetIter(container);
    if (iter == NULL)
        goto error;
    for (Py_ssize_t read = 0; read < limit && (value = PyIter_Next(iter)) != NULL; read++) {
        key = members ? Py_NewRef(Py_None) : PyLong_FromSsize_t(read);
        if (key == NULL || pick(picked, key, value, tensor, containers) < 0)
            goto error;
        Py_CLEAR(key);
        Py_CLEAR(value);
    }
    if (PyErr_Occurred())   /* changed while read: a set or a deque raises */
        goto error;
    Py_DECREF(iter);
    return picked;
error:
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(iter);
    Py_DECREF(picked);
    return NULL;
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

/* What a test's function fixtures' values and a failure's frames reach
 * (the leak check's storages that pytest alone holds): about twenty
 * thousand objects for a parametrized module, 1.6 ms a test in a Python
 * loop.  Depth first, as that loop was: the last referent pushed is the
 * next visited, so that the objects reached within the limit are the
 * same. */
typedef struct Pushing {
    PyObject **stack;
    size_t n, cap;
    int failed;
} Pushing;

static int
reach_push(PyObject *obj, void *arg)
{
    Pushing *p = arg;
    if (obj == NULL)
        return 0;
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        PyObject **stack = realloc(p->stack, cap * sizeof(PyObject *));
        if (stack == NULL) {
            p->failed = 1;
            return 1;
        }
        p->stack = stack;
        p->cap = cap;
    }
    /* owned: asking a class its __module__ may run code that drops
     * what only a container held */
    p->stack[p->n++] = Py_NewRef(obj);
    return 0;
}

/* 1 if obj's class is defined in a module named with one of prefixes
 * (pytest's and memlab's own objects reach the whole session), 0 if not,
 * -1 on error; decisions are kept per class in cache. */
static int
machinery(PyObject *obj, PyObject *prefixes, PyObject *cache)
{
    PyObject *kind = (PyObject *)Py_TYPE(obj);
    PyObject *known = PyDict_GetItemWithError(cache, kind);
    if (known != NULL)
        return known == Py_True;
    if (PyErr_Occurred())
        return -1;
    int found = 0;
    PyObject *module = PyObject_GetAttrString(kind, "__module__");
    PyObject *text = module == NULL ? NULL : PyObject_Str(module);
    Py_XDECREF(module);
    if (text == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prefixes) && !found; i++) {
        Py_ssize_t r = PyUnicode_Tailmatch(text, PyTuple_GET_ITEM(prefixes, i), 0, PY_SSIZE_T_MAX, -1);
        if (r < 0) {
            Py_DECREF(text);
            return -1;
        }
        found = r > 0;
    }
    Py_DECREF(text);
    if (PyDict_SetItem(cache, kind, found ? Py_True : Py_False) < 0)
        return -1;
    return found;
}

PyObject *
HeapWalk_reach(PyObject *roots, Py_ssize_t limit, PyObject *prefixes)
{
    Pushing p = {NULL, 0, 0, 0};
    Ledger seen;
    PyObject *result = NULL, *cache = NULL;
    if (Ledger_init(&seen, 256) < 0)
        return PyErr_NoMemory();
    cache = PyDict_New();
    result = PyList_New(0);
    if (cache == NULL || result == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(roots); i++)
        reach_push(PyList_GET_ITEM(roots, i), &p);
    if (p.failed)
        goto nomemory;
    while (p.n > 0 && PyList_GET_SIZE(result) < limit) {
        PyObject *obj = p.stack[--p.n];   /* owned */
        int skip = Ledger_find(&seen, (uintptr_t)obj) != NULL || PyModule_Check(obj) || PyType_Check(obj)
                   || PyFunction_Check(obj);
        if (!skip) {
            skip = machinery(obj, prefixes, cache);
            if (skip < 0) {
                Py_DECREF(obj);
                goto error;
            }
        }
        if (!skip) {
            int created;
            if (Ledger_insert(&seen, (uintptr_t)obj, &created) == NULL || PyList_Append(result, obj) < 0) {
                Py_DECREF(obj);
                goto nomemory;
            }
            traverseproc traverse = Py_TYPE(obj)->tp_traverse;
            /* as gc.get_referents: only what the collector tracks the type of */
            if (PyObject_IS_GC(obj) && traverse != NULL) {
                traverse(obj, reach_push, &p);
                if (p.failed) {
                    Py_DECREF(obj);
                    goto nomemory;
                }
            }
        }
        Py_DECREF(obj);
    }
    goto done;
nomemory:
    if (!PyErr_Occurred())
        PyErr_NoMemory();
error:
    Py_CLEAR(result);
done:
    while (p.n > 0)
        Py_DECREF(p.stack[--p.n]);
    free(p.stack);
    Py_XDECREF(cache);
    Ledger_fini(&seen);
    return result;
}

Py_ssize_t
HeapWalk_untrack(PyObject *objects)
{
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(objects); i++) {
        PyObject *item = PyList_GET_ITEM(objects, i);
        if (PyObject_IS_GC(item) && PyObject_GC_IsTracked(item)) {
            PyObject_GC_UnTrack(item);
            count++;
        }
    }
    return count;
}
