/* The heap walks of the leak check (heap_walk.c), in an embedded Python:
 * of_types picks the objects of the asked types, in order; referrers finds
 * the containers that hold any asked object, through tp_traverse, and
 * never the two lists themselves; each list is fresh and owns its items.
 * The referrer index (referrer_index.c) answers as referrers does, from
 * one walk, for a heap large enough that its tables grow, and for items
 * appended to the heap after it was built.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "heap_walk.h"
#include "referrer_index.h"

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


/* The positions ReferrerIndex_referrers gives, as the objects they name,
 * equal HeapWalk_referrers' answer over the same heap. */
static void
assert_same_referrers(ReferrerIndex *index, PyObject *heap, PyObject *targets)
{
    PyObject *scanned = HeapWalk_referrers(heap, targets);
    PyObject *positions = ReferrerIndex_referrers(index, heap, targets);
    assert_non_null(scanned);
    assert_non_null(positions);
    assert_int_equal(PyList_GET_SIZE(positions), PyList_GET_SIZE(scanned));
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(positions); i++) {
        Py_ssize_t at = PyLong_AsSsize_t(PyList_GET_ITEM(positions, i));
        assert_ptr_equal(PyList_GET_ITEM(heap, at), PyList_GET_ITEM(scanned, i));
    }
    Py_DECREF(scanned);
    Py_DECREF(positions);
}

static void
test_the_referrer_index_answers_as_the_walk(void **state)
{
    (void)state;
    enum { LEAVES = 3000 };
    /* leaves[i] is held by holders[i] (a list), by every tenth dict, and
     * by a tuple with a string and a number (references not indexed) */
    PyObject *leaves = PyList_New(LEAVES), *heap = PyList_New(0);
    for (Py_ssize_t i = 0; i < LEAVES; i++)
        PyList_SET_ITEM(leaves, i, PyList_New(0));
    for (Py_ssize_t i = 0; i < LEAVES; i++) {
        PyObject *leaf = PyList_GET_ITEM(leaves, i);
        PyObject *holder = list_of(1, leaf);
        PyObject *text = PyUnicode_FromFormat("leaf %zd", i), *number = PyLong_FromSsize_t(i);
        PyObject *tuple = PyTuple_Pack(3, text, number, leaf);
        assert_int_equal(PyList_Append(heap, holder), 0);
        assert_int_equal(PyList_Append(heap, tuple), 0);
        if (i % 10 == 0) {   /* a dict holding this leaf and the nine before it */
            PyObject *d = PyDict_New();
            for (Py_ssize_t j = i < 9 ? 0 : i - 9; j <= i; j++) {
                PyObject *key = PyLong_FromSsize_t(j);
                assert_int_equal(PyDict_SetItem(d, key, PyList_GET_ITEM(leaves, j)), 0);
                Py_DECREF(key);
            }
            assert_int_equal(PyList_Append(heap, d), 0);
            Py_DECREF(d);
        }
        Py_DECREF(holder);
        Py_DECREF(tuple);
        Py_DECREF(text);
        Py_DECREF(number);
    }
    ReferrerIndex index;
    assert_int_equal(ReferrerIndex_init(&index), 0);
    assert_int_equal(ReferrerIndex_add(&index, heap), 0);
    assert_true(index.mask + 1 > 1024);     /* the table grew */
    assert_true(index.n_edges > 4096);      /* and the edges */
    PyObject *one = list_of(1, PyList_GET_ITEM(leaves, 7));
    PyObject *some = list_of(3, PyList_GET_ITEM(leaves, 2999), PyList_GET_ITEM(leaves, 10),
                             PyList_GET_ITEM(leaves, 11));
    PyObject *unheld = list_of(1, heap);
    assert_same_referrers(&index, heap, one);
    assert_same_referrers(&index, heap, some);
    assert_same_referrers(&index, heap, unheld);
    /* an item appended later is indexed at the next question */
    PyObject *late = list_of(2, PyList_GET_ITEM(leaves, 7), PyList_GET_ITEM(leaves, 10));
    assert_int_equal(PyList_Append(heap, late), 0);
    assert_same_referrers(&index, heap, one);
    assert_same_referrers(&index, heap, some);
    assert_int_equal(index.covered, PyList_GET_SIZE(heap));
    ReferrerIndex_fini(&index);
    Py_DECREF(late);
    Py_DECREF(one);
    Py_DECREF(some);
    Py_DECREF(unheld);
    Py_DECREF(heap);
    Py_DECREF(leaves);
}

/* reach: depth first from the roots (the last referent pushed is visited
 * next), each object once, at most limit; classes, modules and functions
 * and objects of classes from the named modules are neither listed nor
 * walked through. */
static void
test_reach_walks_depth_first_and_stops_where_told(void **state)
{
    (void)state;
    PyObject *globals = PyDict_New();
    assert_int_equal(PyDict_SetItemString(globals, "__builtins__", PyEval_GetBuiltins()), 0);
    PyObject *r = PyRun_String(
        "class Machinery: pass\n"
        "Machinery.__module__ = '_pytest.fixtures'\n"
        "class Plain: pass\n"
        "deep = [1]\n"
        "hidden = ['behind the machinery']\n"
        "m = Machinery(); m.x = hidden\n"
        "p = Plain(); p.items = [deep, m, len, Plain]\n"
        "roots = [p, deep]\n",
        Py_file_input, globals, globals);
    assert_non_null(r);
    Py_DECREF(r);
    PyObject *roots = PyDict_GetItemString(globals, "roots");
    PyObject *p = PyDict_GetItemString(globals, "p"), *deep = PyDict_GetItemString(globals, "deep");
    PyObject *prefixes = Py_BuildValue("(ss)", "_pytest.", "pluggy.");
    PyObject *reached = HeapWalk_reach(roots, 1000, prefixes);
    assert_non_null(reached);
    /* deep (the last root) first, then p, its attributes and items (len, a
     * builtin, is no function): never m, hidden or the class */
    assert_ptr_equal(PyList_GET_ITEM(reached, 0), deep);
    int saw_p = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(reached); i++) {
        PyObject *obj = PyList_GET_ITEM(reached, i);
        saw_p |= obj == p;
        assert_ptr_not_equal(obj, PyDict_GetItemString(globals, "m"));
        assert_ptr_not_equal(obj, PyDict_GetItemString(globals, "hidden"));
        assert_false(PyType_Check(obj));
        for (Py_ssize_t j = 0; j < i; j++)
            assert_ptr_not_equal(obj, PyList_GET_ITEM(reached, j));
    }
    assert_true(saw_p);
    Py_DECREF(reached);
    reached = HeapWalk_reach(roots, 2, prefixes);
    assert_non_null(reached);
    assert_int_equal(PyList_GET_SIZE(reached), 2);
    Py_DECREF(reached);
    Py_DECREF(prefixes);
    Py_DECREF(globals);
}

/* untrack stops the collector tracking each tracked item, says how many
 * it did, and passes over what it does not track (an int, an untracked
 * tuple); the items still live and read as before. */
static void
test_untrack_stops_tracking_what_was_tracked(void **state)
{
    (void)state;
    PyObject *record = PyList_New(0), *devices = PyDict_New();
    PyObject *number = PyLong_FromLong(7), *empty = PyTuple_New(0);
    assert_int_equal(PyDict_SetItemString(devices, "cpu", record), 0);
    assert_true(PyObject_GC_IsTracked(record));
    assert_true(PyObject_GC_IsTracked(devices));   /* it holds a tracked list */
    PyObject *objects = Py_BuildValue("[OOOO]", record, devices, number, empty);
    assert_int_equal(HeapWalk_untrack(objects), 2);
    assert_false(PyObject_GC_IsTracked(record));
    assert_false(PyObject_GC_IsTracked(devices));
    assert_int_equal(HeapWalk_untrack(objects), 0);   /* again: nothing left to untrack */
    assert_ptr_equal(PyDict_GetItemString(devices, "cpu"), record);
    assert_int_equal(PyList_Append(record, number), 0);
    assert_int_equal(PyList_GET_SIZE(record), 1);
    Py_DECREF(objects);
    Py_DECREF(devices);   /* freed while untracked: as a tracked one is */
    Py_DECREF(record);
    Py_DECREF(number);
    Py_DECREF(empty);
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
        cmocka_unit_test(test_the_referrer_index_answers_as_the_walk),
        cmocka_unit_test(test_reach_walks_depth_first_and_stops_where_told),
        cmocka_unit_test(test_untrack_stops_tracking_what_was_tracked),
    };
    /* No Py_FinalizeEx: CPython frees only part of its own state there
     * (static types, interned strings), which valgrind would report as
     * lost; left running, all of it stays reachable, and what the tests
     * made and dropped is checked as any allocation is. */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
