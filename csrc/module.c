/* pytest_memlab._engine: the CPython face of the engine.  Module setup and
 * argument conversion only: the measuring lives in engine.c, the reporter's
 * installs and the scope transaction in reporter.c, the tracer in tracer.c.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>

#include "engine.h"
#include "phases.h"
#include "reporter.h"
#include "tracer.h"

/* The keys of a scope's figures, interned once: a dictionary of them is
 * made for every measured test, and Py_BuildValue would make each key
 * string anew every time. */
enum {
    K_ID, K_LIVE, K_PEAK, K_TOTAL_AT_PEAK, K_SEQ_AT_PEAK, K_PEAK_TOTAL,
    K_START_TOTAL, K_ALLOCS, K_FREES, K_ALLOCATED_BYTES, K_RESERVED_PEAK,
    K_AT_PEAK, K_LIVE_SITES, K_PEAK_SITE, K_SITES_COMPLETE, K_COUNT
};
static const char *const key_names[K_COUNT] = {
    "id", "live", "peak", "total_at_peak", "seq_at_peak", "peak_total",
    "start_total", "allocs", "frees", "allocated_bytes", "reserved_peak",
    "at_peak", "live_sites", "peak_site", "sites_complete",
};

/* What the module holds.  One per process, not per module object (m_size
 * 0): the engine is never freed, because the torch bridge holds its address
 * and may deliver an event from an allocator thread at any time,
 * interpreter shutdown included; and the functions below reach it without
 * looking up module state, on the per-test path. */
typedef struct ModuleState {
    Engine *engine;
    Reporter reporter;
    PyObject *keys[K_COUNT];
    /* Raised where pushing or popping the reporter fails (the bridge's
     * message): the plugin tells it apart from the engine's own errors. */
    PyObject *bridge_error;
} ModuleState;

static ModuleState M;

static int
check_slot(int slot)
{
    if (slot < 0 || slot >= ENGINE_MAX_DEVICES) {
        PyErr_Format(PyExc_ValueError, "device slot %d is out of range 0..%d",
                     slot, ENGINE_MAX_DEVICES - 1);
        return -1;
    }
    return 0;
}

/* A device slot given as a Python int (a METH_O argument); checked
 * before it is narrowed, so that no large value wraps into range. */
static int
slot_arg(PyObject *arg, int *slot)
{
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0 || v >= ENGINE_MAX_DEVICES) {
        PyErr_Format(PyExc_ValueError, "device slot %ld is out of range 0..%d",
                     v, ENGINE_MAX_DEVICES - 1);
        return -1;
    }
    *slot = (int)v;
    return 0;
}

static int
keys_init(void)
{
    for (int i = 0; i < K_COUNT; i++) {
        if (M.keys[i] == NULL
            && (M.keys[i] = PyUnicode_InternFromString(key_names[i])) == NULL)
            return -1;
    }
    return 0;
}

/* d[keys[k]] = v, stealing the reference to v (NULL: an error set). */
static int
set_new(PyObject *d, int k, PyObject *v)
{
    if (v == NULL)
        return -1;
    int rc = PyDict_SetItem(d, M.keys[k], v);
    Py_DECREF(v);
    return rc;
}

static PyObject *
scope_to_dict(const Scope *s)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    if (set_new(d, K_ID, PyLong_FromUnsignedLong(s->id)) < 0
        || set_new(d, K_LIVE, PyLong_FromLongLong(s->live)) < 0
        || set_new(d, K_PEAK, PyLong_FromLongLong(s->peak)) < 0
        || set_new(d, K_TOTAL_AT_PEAK, PyLong_FromLongLong(s->total_at_peak)) < 0
        || set_new(d, K_SEQ_AT_PEAK,
                   PyLong_FromUnsignedLongLong(s->seq_at_peak)) < 0
        || set_new(d, K_PEAK_TOTAL, PyLong_FromLongLong(s->peak_total)) < 0
        || set_new(d, K_START_TOTAL, PyLong_FromLongLong(s->start_total)) < 0
        || set_new(d, K_ALLOCS, PyLong_FromUnsignedLongLong(s->allocs)) < 0
        || set_new(d, K_FREES, PyLong_FromUnsignedLongLong(s->frees)) < 0
        || set_new(d, K_ALLOCATED_BYTES,
                   PyLong_FromLongLong(s->allocated_bytes)) < 0
        || set_new(d, K_RESERVED_PEAK,
                   s->reserved_peak < 0 ? Py_NewRef(Py_None)
                                        : PyLong_FromLongLong(s->reserved_peak)) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* (site, bytes) pairs of the sites whose figure is not zero. */
static PyObject *
sites_to_list(const SiteStats *st, int at_peak)
{
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    uint32_t cap = SiteStats_capacity(st);
    for (uint32_t i = 0; i < cap; i++) {
        const SiteCell *c = &st->cells[i];
        int64_t v = at_peak ? c->at_peak : c->live;
        if (c->key == 0 || v == 0)
            continue;
        PyObject *t = Py_BuildValue("(IL)", c->key - 1, (long long)v);
        if (t == NULL || PyList_Append(list, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(t);
    }
    return list;
}

/* The figures of a closed scope, its site tables included. */
static PyObject *
closed_scope_to_dict(const Scope *s)
{
    PyObject *d = scope_to_dict(s);
    if (d == NULL)
        return NULL;
    if (set_new(d, K_AT_PEAK, sites_to_list(&s->sites, 1)) < 0
        || set_new(d, K_LIVE_SITES, sites_to_list(&s->sites, 0)) < 0
        || set_new(d, K_PEAK_SITE, PyLong_FromUnsignedLong(s->peak_site)) < 0
        || set_new(d, K_SITES_COMPLETE,
                   Py_NewRef(s->sites.oom ? Py_False : Py_True)) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* Turns the sticky error the hot path may have set into an exception. */
static int
raise_engine_error(int slot)
{
    uint64_t dropped;
    int err = Engine_take_error(M.engine, slot, &dropped);
    if (err == ENGINE_OK)
        return 0;
    PyErr_Format(PyExc_MemoryError,
                 "memlab dropped %llu allocator events on device slot %d: "
                 "out of memory while growing the ledger; this scope's "
                 "figures are incomplete",
                 (unsigned long long)dropped, slot);
    return -1;
}

static PyObject *
engine_sink(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    return Py_BuildValue("(KK)",
                         (unsigned long long)(uintptr_t)&Engine_sink,
                         (unsigned long long)(uintptr_t)M.engine);
}

static PyObject *
engine_slot(PyObject *Py_UNUSED(module), PyObject *args)
{
    int type, index;
    if (!PyArg_ParseTuple(args, "ii:slot", &type, &index))
        return NULL;
    return PyLong_FromLong(Engine_slot(type, index));
}

static PyObject *
engine_begin(PyObject *Py_UNUSED(module), PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"slot", "detached", "total", "reserved", NULL};
    int slot, detached = 0;
    long long total = -1, reserved = -1;
    uint32_t id;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "i|pLL:begin", kwlist,
                                     &slot, &detached, &total, &reserved))
        return NULL;
    if (check_slot(slot) < 0)
        return NULL;
    if (Engine_begin(M.engine, slot, detached, total, reserved, &id) < 0) {
        PyErr_Format(PyExc_RuntimeError,
                     "cannot open a scope on device slot %d: more than %d "
                     "nested scopes, or out of memory", slot, SCOPE_MAX_DEPTH);
        return NULL;
    }
    return PyLong_FromUnsignedLong(id);
}

static PyObject *
engine_end(PyObject *Py_UNUSED(module), PyObject *args)
{
    int slot;
    unsigned int id;
    Scope s;
    if (!PyArg_ParseTuple(args, "iI:end", &slot, &id))
        return NULL;
    if (check_slot(slot) < 0)
        return NULL;
    if (Engine_end(M.engine, slot, id, &s) < 0) {
        PyErr_Format(PyExc_ValueError,
                     "scope %u is not the innermost open scope of device "
                     "slot %d", id, slot);
        return NULL;
    }
    PyObject *result = NULL;
    if (raise_engine_error(slot) == 0)
        result = closed_scope_to_dict(&s);
    Scope_fini(&s);
    return result;
}

static PyObject *
engine_stats(PyObject *Py_UNUSED(module), PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"slot", "id", "sites", NULL};
    int slot, sites = 0;
    unsigned int id;
    Scope s;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iI|p:stats", kwlist,
                                     &slot, &id, &sites))
        return NULL;
    if (check_slot(slot) < 0)
        return NULL;
    if (Engine_stats(M.engine, slot, id, sites, &s) < 0) {
        PyErr_Format(PyExc_ValueError,
                     "scope %u is not open on device slot %d", id, slot);
        return NULL;
    }
    PyObject *result = sites ? closed_scope_to_dict(&s) : scope_to_dict(&s);
    Scope_fini(&s);
    return result;
}

/* Only the live bytes: the leak check asks this of every measured test,
 * and a dict of every figure would cost more than the answer. */
static PyObject *
engine_live(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t n)
{
    Scope s;
    if (n != 2 || !PyLong_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "live(slot, id) takes two ints");
        return NULL;
    }
    long slot = PyLong_AsLong(args[0]);
    unsigned long id = PyLong_AsUnsignedLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    if (slot < 0 || slot >= ENGINE_MAX_DEVICES)
        return PyErr_Format(PyExc_ValueError, "device slot %ld is out of "
                            "range 0..%d", slot, ENGINE_MAX_DEVICES - 1);
    if (id > UINT32_MAX
        || Engine_stats(M.engine, (int)slot, (uint32_t)id, 0, &s) < 0) {
        PyErr_Format(PyExc_ValueError,
                     "scope %lu is not open on device slot %ld", id, slot);
        return NULL;
    }
    Scope_fini(&s);
    return PyLong_FromLongLong(s.live);
}

static PyObject *
engine_timeline_start(PyObject *Py_UNUSED(module), PyObject *args)
{
    int slot;
    unsigned int id;
    if (!PyArg_ParseTuple(args, "iI:timeline_start", &slot, &id))
        return NULL;
    if (check_slot(slot) < 0)
        return NULL;
    if (Engine_timeline_start(M.engine, slot, id) < 0)
        return PyErr_Format(PyExc_ValueError, "cannot start a timeline: "
                            "scope %u is not open on device slot %d, or out "
                            "of memory", id, slot);
    Py_RETURN_NONE;
}

static PyObject *
engine_timeline(PyObject *Py_UNUSED(module), PyObject *args)
{
    int slot, max = TIMELINE_MAX;
    uint64_t seq0, last;
    PyObject *points = NULL, *result = NULL;
    if (!PyArg_ParseTuple(args, "i|i:timeline", &slot, &max))
        return NULL;
    if (check_slot(slot) < 0)
        return NULL;
    if (max < 1 || max > TIMELINE_MAX)
        return PyErr_Format(PyExc_ValueError, "timeline: max must be 1..%d",
                            TIMELINE_MAX);
    TimelinePoint *buf = malloc((size_t)max * sizeof(TimelinePoint));
    if (buf == NULL)
        return PyErr_NoMemory();
    uint32_t n = Engine_timeline(M.engine, slot, buf, (uint32_t)max,
                                 &seq0, &last);
    if ((points = PyList_New(n)) == NULL)
        goto error;
    for (uint32_t i = 0; i < n; i++) {
        PyObject *t = Py_BuildValue("(KLLLL)", (unsigned long long)buf[i].seq,
                                    (long long)buf[i].own_min,
                                    (long long)buf[i].own_max,
                                    (long long)buf[i].total_min,
                                    (long long)buf[i].total_max);
        if (t == NULL)
            goto error;
        PyList_SET_ITEM(points, i, t);
    }
    result = Py_BuildValue("(KKO)", (unsigned long long)seq0,
                           (unsigned long long)last, points);
error:
    Py_XDECREF(points);
    free(buf);
    return result;
}

static PyObject *
engine_alloc_log_start(PyObject *Py_UNUSED(module), PyObject *args)
{
    int slot;
    unsigned int id, max;
    if (!PyArg_ParseTuple(args, "iII:alloc_log_start", &slot, &id, &max))
        return NULL;
    if (check_slot(slot) < 0)
        return NULL;
    if (Engine_alloc_log_start(M.engine, slot, id, max) < 0)
        return PyErr_Format(PyExc_ValueError, "scope %u is not open on "
                            "device slot %d", id, slot);
    Py_RETURN_NONE;
}

static PyObject *
engine_alloc_log_take(PyObject *Py_UNUSED(module), PyObject *arg)
{
    int slot;
    uint32_t n;
    uint64_t dropped;
    if (slot_arg(arg, &slot) < 0)
        return NULL;
    AllocEntry *log = Engine_alloc_log_take(M.engine, slot, &n, &dropped);
    PyObject *list = PyList_New(n), *result = NULL;
    if (list == NULL)
        goto error;
    for (uint32_t i = 0; i < n; i++) {
        PyObject *t = Py_BuildValue("(KLKI)", (unsigned long long)log[i].addr,
                                    (long long)log[i].size,
                                    (unsigned long long)log[i].time_us,
                                    log[i].site);
        if (t == NULL)
            goto error;
        PyList_SET_ITEM(list, i, t);
    }
    result = Py_BuildValue("(OK)", list, (unsigned long long)dropped);
error:
    Py_XDECREF(list);
    free(log);
    return result;
}

/* (slot, addrs) -> the slot and a malloc'd array of *n addresses (NULL with
 * an exception set): the arguments of watch and watched. */
static uintptr_t *
parse_slot_addrs(PyObject *args, const char *format, int *slot, Py_ssize_t *n)
{
    PyObject *addrs, *seq;
    uintptr_t *buf = NULL;
    if (!PyArg_ParseTuple(args, format, slot, &addrs) || check_slot(*slot) < 0)
        return NULL;
    seq = PySequence_Fast(addrs, "addrs must be a sequence of addresses");
    if (seq == NULL)
        return NULL;
    *n = PySequence_Fast_GET_SIZE(seq);
    buf = malloc((*n > 0 ? (size_t)*n : 1) * sizeof(uintptr_t));
    if (buf == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        unsigned long long addr =
            PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (addr == (unsigned long long)-1 && PyErr_Occurred()) {
            free(buf);
            buf = NULL;
            goto error;
        }
        buf[i] = (uintptr_t)addr;
    }
error:
    Py_DECREF(seq);
    return buf;
}

/* watch(slot, addrs): leak suspects' addresses, watched until an
 * allocation or a free is heard there. */
static PyObject *
engine_watch(PyObject *Py_UNUSED(module), PyObject *args)
{
    int slot;
    Py_ssize_t n;
    uintptr_t *addrs = parse_slot_addrs(args, "iO:watch", &slot, &n);
    if (addrs == NULL)
        return NULL;
    int rc = Engine_watch(M.engine, slot, addrs, (size_t)n);
    free(addrs);
    if (rc < 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* watched(slot, addrs) -> [bool]: which are still watched. */
static PyObject *
engine_watched(PyObject *Py_UNUSED(module), PyObject *args)
{
    int slot;
    Py_ssize_t n;
    uintptr_t *addrs = parse_slot_addrs(args, "iO:watched", &slot, &n);
    if (addrs == NULL)
        return NULL;
    PyObject *result = PyList_New(n);
    for (Py_ssize_t i = 0; result != NULL && i < n; i++)
        PyList_SET_ITEM(result, i, PyBool_FromLong(Engine_watched(M.engine, slot, addrs[i])));
    free(addrs);
    return result;
}

static PyObject *
engine_unwatch(PyObject *Py_UNUSED(module), PyObject *arg)
{
    int slot;
    if (slot_arg(arg, &slot) < 0)
        return NULL;
    Engine_unwatch(M.engine, slot);
    Py_RETURN_NONE;
}

/* of_types(objects, kinds) -> the items of the list objects whose exact
 * type is in the set kinds.  The leak check picks the tensors out of
 * gc.get_objects(), a million objects in a large process: a Python loop
 * over them cost 0.3 s, map and compress 0.12 s. */
static PyObject *
engine_of_types(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *objects, *kinds;
    if (!PyArg_ParseTuple(args, "O!O!:of_types", &PyList_Type, &objects,
                          &PySet_Type, &kinds))
        return NULL;
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

/* referrers(objects, targets) -> the items of the list objects (the heap:
 * gc.get_objects()) that refer to any item of the list targets. */
static PyObject *
engine_referrers(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *objects, *targets, *result = NULL;
    Ledger wanted;
    if (!PyArg_ParseTuple(args, "O!O!:referrers", &PyList_Type, &objects,
                          &PyList_Type, &targets))
        return NULL;
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

/* kept(slot, id) -> ((head_max, head_seq, head_site), [(addr, size,
 * span_max, span_seq, seq, site, span_site)]) of open scope id, or None
 * where the device does not follow it (kept.h). */
static PyObject *
engine_kept(PyObject *Py_UNUSED(module), PyObject *args)
{
    int slot;
    unsigned int id;
    KeptBlock *buf = NULL;
    uint32_t n = 0;
    KeptBlock head;
    PyObject *blocks = NULL, *result = NULL;
    if (!PyArg_ParseTuple(args, "iI:kept", &slot, &id))
        return NULL;
    if (check_slot(slot) < 0)
        return NULL;
    if (Engine_kept(M.engine, slot, id, &buf, &n, &head) < 0)
        Py_RETURN_NONE;
    blocks = PyList_New(n);
    if (blocks == NULL)
        goto error;
    for (uint32_t i = 0; i < n; i++) {
        const KeptBlock *b = &buf[i];
        PyObject *t = Py_BuildValue("(KLLKKII)", (unsigned long long)b->addr,
                                    (long long)b->size, (long long)b->span_max,
                                    (unsigned long long)b->span_seq,
                                    (unsigned long long)b->seq, b->site,
                                    b->span_site);
        if (t == NULL)
            goto error;
        PyList_SET_ITEM(blocks, i, t);
    }
    result = Py_BuildValue("((LKI)O)", (long long)head.span_max,
                           (unsigned long long)head.span_seq, head.span_site,
                           blocks);
error:
    Py_XDECREF(blocks);
    free(buf);
    return result;
}

static PyObject *
engine_seq(PyObject *Py_UNUSED(module), PyObject *arg)
{
    int slot;
    if (slot_arg(arg, &slot) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(Engine_seq(M.engine, slot));
}

static PyObject *
engine_failed(PyObject *Py_UNUSED(module), PyObject *arg)
{
    int slot;
    if (slot_arg(arg, &slot) < 0)
        return NULL;
    uint64_t count;
    int64_t size;
    uint32_t site;
    Engine_failed(M.engine, slot, &count, &size, &site);
    return Py_BuildValue("(KLI)", (unsigned long long)count, (long long)size, (unsigned int)site);
}

static PyObject *
bridge_bind(PyObject *Py_UNUSED(module), PyObject *args)
{
    unsigned long long install, uninstall, set_cpu, set_tracker;
    unsigned long long cuda_totals = 0;
    if (!PyArg_ParseTuple(args, "KKKK|K:bridge_bind", &install, &uninstall,
                          &set_cpu, &set_tracker, &cuda_totals))
        return NULL;
    /* Addresses of functions with the types memlab_bridge.h declares. */
    ReporterBridge b = {
        .install = (int (*)(memlab_sink_fn, void *, char *, size_t))
            (uintptr_t)install,
        .uninstall = (int (*)(char *, size_t))(uintptr_t)uninstall,
        .set_cpu = (void (*)(int))(uintptr_t)set_cpu,
        .set_tracker = (void (*)(int))(uintptr_t)set_tracker,
        .cuda_totals = (int (*)(int, int64_t *, int64_t *))
            (uintptr_t)cuda_totals,
    };
    if (Reporter_bind(&M.reporter, &b) < 0) {
        PyErr_SetString(PyExc_ValueError, "bridge_bind: a null entry");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The exception for a code of reporter.h; NULL always. */
static PyObject *
reporter_error(int rc, int slot, unsigned long id, const char *err)
{
    switch (rc) {
    case REPORTER_EBRIDGE:
        return PyErr_Format(M.bridge_error, "%s", err);
    case REPORTER_EUNBOUND:
        PyErr_SetString(PyExc_RuntimeError, "the torch bridge is not bound");
        return NULL;
    case REPORTER_ESCOPE:
        return PyErr_Format(PyExc_RuntimeError,
                            "cannot open a scope on device slot %d: more than "
                            "%d nested scopes, or out of memory", slot,
                            SCOPE_MAX_DEPTH);
    case REPORTER_ENOTINNER:
        return PyErr_Format(PyExc_ValueError,
                            "scope %lu is not the innermost open scope of "
                            "device slot %d", id, slot);
    default:
        return PyErr_NoMemory();
    }
}

static PyObject *
bridge_install(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    char err[REPORTER_ERRLEN] = "";
    int first;
    int rc = Reporter_install(&M.reporter, &first, err, sizeof err);
    if (rc < 0)
        return reporter_error(rc, 0, 0, err);
    return PyBool_FromLong(first);
}

static PyObject *
bridge_uninstall(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    char err[REPORTER_ERRLEN] = "";
    int last = Reporter_uninstall(&M.reporter, err, sizeof err);
    if (last < 0)
        return reporter_error(last, 0, 0, err);
    return PyBool_FromLong(last);
}

static PyObject *
bridge_depth(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    return PyLong_FromLong(Reporter_depth());
}

static PyObject *
bridge_step_aside(PyObject *Py_UNUSED(module), PyObject *arg)
{
    char err[REPORTER_ERRLEN] = "";
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    int rc = Reporter_step_aside(&M.reporter, on, err, sizeof err);
    if (rc < 0)
        return reporter_error(rc, 0, 0, err);
    Py_RETURN_NONE;
}

static PyObject *
engine_open(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t n)
{
    char err[REPORTER_ERRLEN] = "";
    int first = 0;
    uint32_t id;
    if (n != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "open(slot, detached, total, reserved, timeline, log_max)");
        return NULL;
    }
    int slot = (int)PyLong_AsLong(args[0]);
    int detached = PyObject_IsTrue(args[1]);
    long long total = PyLong_AsLongLong(args[2]);
    long long reserved = PyLong_AsLongLong(args[3]);
    int timeline = PyObject_IsTrue(args[4]);
    unsigned long log_max = PyLong_AsUnsignedLong(args[5]);
    if (PyErr_Occurred() || detached < 0 || timeline < 0 || check_slot(slot) < 0)
        return NULL;
    int rc = Reporter_open_scope(&M.reporter, slot, detached, total, reserved,
                                 timeline, (uint32_t)log_max, &id, &first,
                                 err, sizeof err);
    if (rc < 0)
        return reporter_error(rc, slot, 0, err);
    return Py_BuildValue("(IO)", id, first ? Py_True : Py_False);
}

static PyObject *
engine_close(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t n)
{
    char err[REPORTER_ERRLEN] = "";
    int last = 0;
    Scope s;
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "close(slot, scope_id)");
        return NULL;
    }
    int slot = (int)PyLong_AsLong(args[0]);
    unsigned long id = PyLong_AsUnsignedLong(args[1]);
    if (PyErr_Occurred() || check_slot(slot) < 0)
        return NULL;
    int rc = Reporter_close_scope(&M.reporter, slot, (uint32_t)id, &s, &last,
                                  err, sizeof err);
    if (rc < 0)
        return reporter_error(rc, slot, id, err);
    PyObject *figures = NULL;
    if (raise_engine_error(slot) == 0)
        figures = closed_scope_to_dict(&s);
    Scope_fini(&s);
    if (figures == NULL)
        return NULL;
    return Py_BuildValue("(NO)", figures, last ? Py_True : Py_False);
}

/* bridge_cuda_totals(index) -> (allocated, reserved), or None: the caller
 * asks torch.cuda then. */
static PyObject *
bridge_cuda_totals(PyObject *Py_UNUSED(module), PyObject *arg)
{
    long index = PyLong_AsLong(arg);
    if (index == -1 && PyErr_Occurred())
        return NULL;
    int64_t allocated = 0, reserved = 0;
    if (index < 0 || index > INT_MAX
        || Reporter_cuda_totals(&M.reporter, (int)index, &allocated,
                                &reserved) < 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(LL)", (long long)allocated, (long long)reserved);
}

static PyObject *
engine_totals(PyObject *Py_UNUSED(module), PyObject *args)
{
    int slot;
    int64_t total, reserved;
    if (!PyArg_ParseTuple(args, "i:totals", &slot))
        return NULL;
    if (check_slot(slot) < 0)
        return NULL;
    if (Engine_totals(M.engine, slot, &total, &reserved) < 0)
        Py_RETURN_NONE;
    if (reserved < 0)
        return Py_BuildValue("(LO)", (long long)total, Py_None);
    return Py_BuildValue("(LL)", (long long)total, (long long)reserved);
}

static PyObject *
engine_blocks(PyObject *Py_UNUSED(module), PyObject *args)
{
    int slot;
    unsigned int id;
    Block *buf = NULL;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "iI:blocks", &slot, &id))
        return NULL;
    if (check_slot(slot) < 0)
        return NULL;
    size_t cap = 256;
    long n;
    for (;;) {
        Block *grown = realloc(buf, cap * sizeof(Block));
        if (grown == NULL) {
            PyErr_NoMemory();
            goto error;
        }
        buf = grown;
        n = Engine_blocks(M.engine, slot, id, buf, cap);
        if (n < 0) {
            PyErr_Format(PyExc_ValueError,
                         "scope %u is not open on device slot %d", id, slot);
            goto error;
        }
        if ((size_t)n <= cap)
            break;
        cap = (size_t)n + 64;   /* blocks came meanwhile; try again */
    }
    result = PyList_New(n);
    if (result == NULL)
        goto error;
    for (long i = 0; i < n; i++) {
        PyObject *t = Py_BuildValue("(KLII)",
                                    (unsigned long long)buf[i].addr,
                                    (long long)buf[i].size, buf[i].scope,
                                    buf[i].site);
        if (t == NULL) {
            Py_CLEAR(result);
            goto error;
        }
        PyList_SET_ITEM(result, i, t);
    }
error:
    free(buf);
    return result;
}

static PyObject *
engine_inject(PyObject *Py_UNUSED(module), PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"slot", "addr", "size", "total", "reserved",
                             "source", NULL};
    int slot, source = EVENT_REPORT;
    unsigned long long addr;
    long long size, total = 0, reserved = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iKL|LLi:inject", kwlist,
                                     &slot, &addr, &size, &total, &reserved,
                                     &source))
        return NULL;
    if (check_slot(slot) < 0)
        return NULL;
    if (addr == 0) {
        PyErr_SetString(PyExc_ValueError, "address 0 is not a block");
        return NULL;
    }
    Engine_event(M.engine, slot, (uintptr_t)addr, size, total, reserved,
                 source);
    Py_RETURN_NONE;
}

static PyObject *
engine_record_start(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_ssize_t capacity;
    if (!PyArg_ParseTuple(args, "n:record_start", &capacity))
        return NULL;
    if (capacity <= 0) {
        PyErr_SetString(PyExc_ValueError, "capacity must be positive");
        return NULL;
    }
    if (Engine_record_start(M.engine, (size_t)capacity) < 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *
engine_record_stop(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    Event *events;
    size_t n = Engine_record_stop(M.engine, &events);
    PyObject *result = PyBytes_FromStringAndSize(
        (const char *)events, (Py_ssize_t)(n * sizeof(Event)));
    free(events);
    return result;
}

static PyObject *
engine_replay(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer view;
    Py_ssize_t repeat = 1;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*|n:replay", &view, &repeat))
        return NULL;
    if (view.len % (Py_ssize_t)sizeof(Event) != 0) {
        PyErr_Format(PyExc_ValueError,
                     "event stream of %zd bytes is not a whole number of "
                     "%zu-byte events", view.len, sizeof(Event));
        goto error;
    }
    size_t n = (size_t)view.len / sizeof(Event);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < repeat; r++)
        Engine_replay(M.engine, (const Event *)view.buf, n);
    Py_END_ALLOW_THREADS
    result = PyLong_FromSize_t(n * (size_t)(repeat > 0 ? repeat : 0));
error:
    PyBuffer_Release(&view);
    return result;
}

static PyObject *
tracer_start(PyObject *Py_UNUSED(module), PyObject *decide)
{
    if (!PyCallable_Check(decide)) {
        PyErr_SetString(PyExc_TypeError, "tracer_start(decide): decide must be callable");
        return NULL;
    }
    return Tracer_start(decide);
}

static PyObject *
tracer_stop(PyObject *Py_UNUSED(module), PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"park", NULL};
    int park = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|p:tracer_stop", kwlist, &park))
        return NULL;
    return Tracer_stop(park);
}

static PyObject *
tracer_unpark(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    return Tracer_unpark();
}

static PyObject *
tracer_redecide(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    return Tracer_redecide();
}

static PyObject *
tracer_line_stats(PyObject *Py_UNUSED(module), PyObject *arg)
{
    long slot = PyLong_AsLong(arg);
    if (slot == -1 && PyErr_Occurred())
        return NULL;
    if (slot < 0 || slot >= LINE_SLOTS) {
        PyErr_Format(PyExc_ValueError, "device slot %ld has no line figures "
                     "(0..%d do)", slot, LINE_SLOTS - 1);
        return NULL;
    }
    return Tracer_line_stats((int)slot);
}

static PyObject *
tracer_phases(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    return Tracer_phases();
}

static PyObject *
tracer_reset_lines(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    return Tracer_reset_lines();
}

static PyObject *
tracer_status(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    return Tracer_status();
}

static PyObject *
engine_site(PyObject *Py_UNUSED(module), PyObject *arg)
{
    unsigned long site = PyLong_AsUnsignedLong(arg);
    if (site == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    return Tracer_site((uint32_t)site);
}

static PyObject *
engine_line(PyObject *Py_UNUSED(module), PyObject *arg)
{
    unsigned long line = PyLong_AsUnsignedLong(arg);
    if (line == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    return Tracer_line((uint32_t)line);
}

static PyMethodDef engine_methods[] = {
    {"sink", engine_sink, METH_NOARGS,
     "sink() -> (function address, context address) for the torch bridge."},
    {"slot", engine_slot, METH_VARARGS,
     "slot(device_type, index) -> the engine's slot for a c10 device, or -1."},
    {"begin", (PyCFunction)(void (*)(void))engine_begin,
     METH_VARARGS | METH_KEYWORDS,
     "begin(slot, detached=False, total=-1, reserved=-1) -> scope id."},
    {"end", engine_end, METH_VARARGS,
     "end(slot, scope_id) -> figures of the closed scope."},
    {"stats", (PyCFunction)(void (*)(void))engine_stats, METH_VARARGS | METH_KEYWORDS,
     "stats(slot, scope_id, sites=False) -> figures of an open scope so far (with sites: its site tables too)."},
    {"live", (PyCFunction)(void (*)(void))engine_live, METH_FASTCALL,
     "live(slot, id) -> bytes of the open scope's blocks still allocated."},
    {"timeline_start", engine_timeline_start, METH_VARARGS,
     "timeline_start(slot, id): the device's timeline follows open scope id "
     "from now on (the previous one is dropped)."},
    {"timeline", engine_timeline, METH_VARARGS,
     "timeline(slot, max=TIMELINE_MAX) -> (seq0, last, [(seq, own_min, "
     "own_max, total_min, total_max), ...]): the latest timeline, merged "
     "into at most max points, extremes kept."},
    {"alloc_log_start", engine_alloc_log_start, METH_VARARGS,
     "alloc_log_start(slot, id, max): log the device's allocations and frees "
     "while open scope id lasts (at most max)."},
    {"alloc_log_take", engine_alloc_log_take, METH_O,
     "alloc_log_take(slot) -> ([(addr, size, time_us, site)], dropped): the "
     "latest log, emptied."},
    {"watch", engine_watch, METH_VARARGS,
     "watch(slot, addrs): leak suspects' addresses, watched until an "
     "allocation or a free is heard there."},
    {"watched", engine_watched, METH_VARARGS,
     "watched(slot, addrs) -> [whether each is still watched]."},
    {"unwatch", engine_unwatch, METH_O,
     "unwatch(slot): forget the device's watched addresses."},
    {"referrers", engine_referrers, METH_VARARGS,
     "referrers(objects, targets) -> the items of the list objects that refer to any item of the "
     "list targets (as gc.get_referrers, at one lookup a reference)"},
    {"of_types", engine_of_types, METH_VARARGS,
     "of_types(objects, kinds) -> the items of the list objects whose exact "
     "type is in the set kinds."},
    {"kept", engine_kept, METH_VARARGS,
     "kept(slot, id) -> ((head_max, head_seq, head_site), [(addr, size, "
     "span_max, span_seq, seq, site, span_site)]): the live blocks of a scope whose timeline runs, "
     "in allocation order, with the most own bytes of each one's span; None "
     "where the device does not follow the scope."},
    {"failed", engine_failed, METH_O,
     "failed(slot) -> (count, bytes, site): the requests the device's allocator could not serve, "
     "the latest one's bytes and site"},
    {"seq", engine_seq, METH_O,
     "seq(slot) -> the device's event number now (where a mark falls)."},
    {"bridge_bind", bridge_bind, METH_VARARGS,
     "bridge_bind(install, uninstall, set_cpu, set_tracker[, cuda_totals]): "
     "the loaded "
     "bridge's entries, by address."},
    {"bridge_cuda_totals", bridge_cuda_totals, METH_O,
     "bridge_cuda_totals(index) -> (allocated, reserved) bytes of a CUDA "
     "device, from its caching allocator, or None."},
    {"bridge_install", bridge_install, METH_NOARGS,
     "bridge_install() -> whether this pushed the reporter: one more install "
     "on this thread (RuntimeError with the bridge's message if it cannot)."},
    {"bridge_uninstall", bridge_uninstall, METH_NOARGS,
     "bridge_uninstall() -> whether this was the thread's last install (the "
     "reporter popped)."},
    {"bridge_depth", bridge_depth, METH_NOARGS,
     "bridge_depth() -> installs open on this thread."},
    {"bridge_step_aside", bridge_step_aside, METH_O,
     "bridge_step_aside(on): pop the reporter for torch.profiler while it "
     "runs (on), push it back (off); nothing where none is installed."},
    {"open", (PyCFunction)(void (*)(void))engine_open, METH_FASTCALL,
     "open(slot, detached, total, reserved, timeline, log_max) -> (scope_id, "
     "first): install, reporting on, begin, timeline and allocation log in "
     "one call; first when this was the thread's first install."},
    {"close", (PyCFunction)(void (*)(void))engine_close, METH_FASTCALL,
     "close(slot, scope_id) -> (figures, last): end() and undo open(); last "
     "when this was the thread's last install."},
    {"totals", engine_totals, METH_VARARGS,
     "totals(slot) -> (total, reserved or None), or None if never used."},
    {"blocks", engine_blocks, METH_VARARGS,
     "blocks(slot, scope_id) -> [(addr, size, scope, site)] live in scope."},
    {"inject", (PyCFunction)(void (*)(void))engine_inject,
     METH_VARARGS | METH_KEYWORDS,
     "inject(slot, addr, size, total=0, reserved=0, source=0): deliver one "
     "event as an allocator would (tests and replays)."},
    {"record_start", engine_record_start, METH_VARARGS,
     "record_start(capacity): record up to capacity events."},
    {"record_stop", engine_record_stop, METH_NOARGS,
     "record_stop() -> bytes of the recorded events."},
    {"replay", engine_replay, METH_VARARGS,
     "replay(events, repeat=1) -> number of events delivered."},
    {"tracer_start", tracer_start, METH_O,
     "tracer_start(decide): trace user frames; decide(code) -> in scope."},
    {"tracer_stop", (PyCFunction)(void (*)(void))tracer_stop, METH_VARARGS | METH_KEYWORDS,
     "tracer_stop(park=False): stop tracing; raises what a callback could not. "
     "With park (sys.monitoring), the events stay on until tracer_unpark()."},
    {"tracer_unpark", tracer_unpark, METH_NOARGS,
     "tracer_unpark(): turn off the events a parked tracer left on."},
    {"tracer_redecide", tracer_redecide, METH_NOARGS,
     "tracer_redecide(): decide every code object's scope again."},
    {"tracer_line_stats", tracer_line_stats, METH_O,
     "tracer_line_stats(slot) -> [(line_id, code, lineno, hits, allocated, "
     "peak_total, peak_reserved, last_total)]: the lines run or allocating "
     "since the last reset, with their figures on device slot 0..3."},
    {"tracer_phases", tracer_phases, METH_NOARGS,
     "tracer_phases() -> ([(kind, slot, seq, label)], dropped): the phases "
     "(PHASE_FORWARD, PHASE_BACKWARD, PHASE_STEP; negated where one ended, "
     "without a label) since the lines were last "
     "reset, each on the timeline of every device whose timeline ran."},
    {"tracer_reset_lines", tracer_reset_lines, METH_NOARGS,
     "tracer_reset_lines(): zero the statistics of the lines touched since "
     "the last reset."},
    {"tracer_status", tracer_status, METH_NOARGS,
     "tracer_status() -> how the tracer runs and what it holds."},
    {"site", engine_site, METH_O,
     "site(id) -> [(code, lineno)], the call chain, innermost first."},
    {"line", engine_line, METH_O, "line(id) -> (code, lineno)."},
    {"_mon_start", (PyCFunction)(void (*)(void))Tracer_mon_start,
     METH_FASTCALL, NULL},
    {"_mon_resume", (PyCFunction)(void (*)(void))Tracer_mon_resume,
     METH_FASTCALL, NULL},
    {"_mon_leave", (PyCFunction)(void (*)(void))Tracer_mon_leave,
     METH_FASTCALL, NULL},
    {"_mon_unwind", (PyCFunction)(void (*)(void))Tracer_mon_unwind,
     METH_FASTCALL, NULL},
    {"_mon_throw", (PyCFunction)(void (*)(void))Tracer_mon_throw,
     METH_FASTCALL, NULL},
    {"_mon_line", (PyCFunction)(void (*)(void))Tracer_mon_line,
     METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

/* The engine's locks across a fork (engine.h: Engine_fork_prepare). */
static void
fork_prepare(void)
{
    if (M.engine != NULL)
        Engine_fork_prepare(M.engine);
}

static void
fork_release(void)
{
    if (M.engine != NULL)
        Engine_fork_release(M.engine);
}

static int
engine_exec(PyObject *module)
{
    if (M.engine == NULL) {
        M.engine = Engine_new();
        if (M.engine == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        Reporter_init(&M.reporter, M.engine);
        /* Once per process: the engine lives as long as it does. */
        if (pthread_atfork(fork_prepare, fork_release, fork_release) != 0) {
            PyErr_SetString(PyExc_OSError, "pthread_atfork failed");
            return -1;
        }
    }
    if (keys_init() < 0 || Tracer_init(module, M.engine) < 0)
        return -1;
    if (M.bridge_error == NULL
        && (M.bridge_error = PyErr_NewException("pytest_memlab._engine.BridgeError",
                                                PyExc_RuntimeError, NULL)) == NULL)
        return -1;
    if (PyModule_AddObjectRef(module, "BridgeError", M.bridge_error) < 0)
        return -1;
    static const struct { const char *name; long value; } constants[] = {
        {"EVENT_REPORT", EVENT_REPORT},
        {"EVENT_TRACE", EVENT_TRACE},
        {"EVENT_FAILED", EVENT_FAILED},
        {"BRIDGE_ABI", MEMLAB_BRIDGE_ABI},
        {"EVENT_SIZE", (long)sizeof(Event)},
        {"SLOT_CPU", ENGINE_SLOT_CPU},
        {"MAX_DEVICES", ENGINE_MAX_DEVICES},
        {"MAX_DEPTH", SCOPE_MAX_DEPTH},
        {"TIMELINE_MAX", TIMELINE_MAX},
        {"LINE_SLOTS", LINE_SLOTS},
        {"SITE_CHAIN", SITE_CHAIN},
        {"PHASE_FORWARD", PHASE_FORWARD},
        {"PHASE_BACKWARD", PHASE_BACKWARD},
        {"PHASE_STEP", PHASE_STEP},
    };
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++) {
        if (PyModule_AddIntConstant(module, constants[i].name,
                                    constants[i].value) < 0)
            return -1;
    }
    return 0;
}

static PyModuleDef_Slot engine_slots[] = {
    {Py_mod_exec, engine_exec},
    {0, NULL},
};

static struct PyModuleDef engine_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pytest_memlab._engine",
    .m_doc = "The C measurement engine of pytest-memlab.",
    .m_size = 0,
    .m_methods = engine_methods,
    .m_slots = engine_slots,
};

PyMODINIT_FUNC
PyInit__engine(void)
{
    return PyModuleDef_Init(&engine_module);
}
