/* The heap walks of the leak check (heap_walk.c), in an embedded Python:
 * of_types picks the objects of the asked types, in order; referrers finds
 * the containers that hold any asked object, through tp_traverse, and
 * never the two lists themselves; each list is fresh and owns its items.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "heap_walk.h"

static PyObject *
list_of(Py_ssize_t n, ...)
{
    PyObject *list = PyList_New(n);
    va_list va;
    va_start(va, n);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = va_arg(va, PyObject *);
        PyList_SET_ITEM(list, i, Py_NewRef(item));
    }
    va_end(va);
    return list;
}

static void
test_of_types_keeps_the_asked_types_in_order(void **state)
{
    (void)state;
    PyObject *one = PyLong_FromLong(1), *text = PyUnicode_FromString("t");
    PyObject *two = PyLong_FromLong(2), *empty = PyDict_New();
    PyObject *objects = list_of(4, one, text, two, empty);
    PyObject *kinds = PySet_New(NULL);
    assert_int_equal(PySet_Add(kinds, (PyObject *)&PyLong_Type), 0);
    PyObject *found = HeapWalk_of_types(objects, kinds);
    assert_non_null(found);
    assert_int_equal(PyList_GET_SIZE(found), 2);
    assert_ptr_equal(PyList_GET_ITEM(found, 0), one);
    assert_ptr_equal(PyList_GET_ITEM(found, 1), two);
    Py_DECREF(found);
    Py_DECREF(kinds);
    Py_DECREF(objects);
    Py_DECREF(one);
    Py_DECREF(text);
    Py_DECREF(two);
    Py_DECREF(empty);
}

static void
test_referrers_are_the_holders_of_any_target(void **state)
{
    (void)state;
    PyObject *a = PyList_New(0), *b = PyDict_New(), *c = PyList_New(0);
    PyObject *holds_a = list_of(1, a);
    PyObject *holds_b = PyDict_New();
    assert_int_equal(PyDict_SetItemString(holds_b, "b", b), 0);
    PyObject *holds_c_only = list_of(1, c);
    PyObject *holds_nothing = PyList_New(0);
    PyObject *objects = list_of(4, holds_a, holds_b, holds_c_only, holds_nothing);
    PyObject *targets = list_of(2, a, b);
    PyObject *found = HeapWalk_referrers(objects, targets);
    assert_non_null(found);
    assert_int_equal(PyList_GET_SIZE(found), 2);
    assert_ptr_equal(PyList_GET_ITEM(found, 0), holds_a);
    assert_ptr_equal(PyList_GET_ITEM(found, 1), holds_b);
    Py_DECREF(found);
    /* the two lists asked with refer to what is asked about (the heap
     * list holds a itself here, and itself): never holders */
    PyObject *heap = list_of(3, a, targets, holds_a);
    assert_int_equal(PyList_Append(heap, heap), 0);
    found = HeapWalk_referrers(heap, targets);
    assert_non_null(found);
    assert_int_equal(PyList_GET_SIZE(found), 1);
    assert_ptr_equal(PyList_GET_ITEM(found, 0), holds_a);
    Py_DECREF(found);
    assert_int_equal(PyList_SetSlice(heap, 0, PyList_GET_SIZE(heap), NULL), 0);
    Py_DECREF(heap);
    Py_DECREF(targets);
    Py_DECREF(objects);
    Py_DECREF(holds_a);
    Py_DECREF(holds_b);
    Py_DECREF(holds_c_only);
    Py_DECREF(holds_nothing);
    Py_DECREF(a);
    Py_DECREF(b);
    Py_DECREF(c);
}

int
main(void)
{
    /* The system allocator, so that the sanitizers and valgrind see each
     * object's memory; isolated and without site, so that no start-up
     * Python code runs (valgrind misreads the bytes the random seed reads). */
    PyPreConfig preconfig;
    PyPreConfig_InitIsolatedConfig(&preconfig);
    preconfig.allocator = PYMEM_ALLOCATOR_MALLOC;
    if (PyStatus_Exception(Py_PreInitialize(&preconfig)))
        return 1;
    PyConfig config;
    PyConfig_InitIsolatedConfig(&config);
    config.site_import = 0;
    PyStatus status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_of_types_keeps_the_asked_types_in_order),
        cmocka_unit_test(test_referrers_are_the_holders_of_any_target),
    };
    /* No Py_FinalizeEx: CPython frees only part of its own state there
     * (static types, interned strings), which valgrind would report as
     * lost; left running, all of it stays reachable, and what the tests
     * made and dropped is checked as any allocation is. */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
