/* pytest_memlab._engine: the CPython face of the engine.  Module setup,
 * the argument helpers and the method table: the engine's functions are in
 * module_engine.c, the reporter's in module_reporter.c, the heap walks in
 * heap_walk.c, the children's environment buffers in environ_buffer.c; the
 * measuring itself lives in engine.c, the reporter's installs and the scope
 * transaction in reporter.c, the tracer in tracer.c.
 */
#include "module_state.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine.h"
#include "environ_buffer.h"
#include "heap_walk.h"
#include "phases.h"
#include "referrer_index.h"
#include "reporter.h"
#include "tracer.h"

static const char *const key_names[K_COUNT] = {
    "id", "live", "peak", "total_at_peak", "seq_at_peak", "peak_total",
    "start_total", "allocs", "frees", "allocated_bytes", "reserved_peak",
    "at_peak", "live_sites", "peak_site", "sites_complete",
};

ModuleState M;

int
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
int
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

/* arg is callable, else a TypeError naming the call and the parameter. */
static int
callable_arg(PyObject *arg, const char *call, const char *param)
{
    if (PyCallable_Check(arg))
        return 0;
    PyErr_Format(PyExc_TypeError, "%s(%s): %s must be callable", call, param, param);
    return -1;
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

/* Turns the sticky error the hot path may have set into an exception. */
int
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

/* of_types(objects, kinds) -> the items of the list objects whose exact
 * type is in the set kinds (heap_walk.h). */
static PyObject *
engine_of_types(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *objects, *kinds;
    if (!PyArg_ParseTuple(args, "O!O!:of_types", &PyList_Type, &objects,
                          &PySet_Type, &kinds))
        return NULL;
    return HeapWalk_of_types(objects, kinds);
}

/* reach(roots, limit, prefixes) -> the objects the list roots reach
 * (heap_walk.h). */
static PyObject *
engine_reach(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *roots, *prefixes;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "O!nO!:reach", &PyList_Type, &roots, &limit, &PyTuple_Type, &prefixes))
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prefixes); i++) {
        if (!PyUnicode_Check(PyTuple_GET_ITEM(prefixes, i))) {
            PyErr_SetString(PyExc_TypeError, "reach: prefixes must be str");
            return NULL;
        }
    }
    return HeapWalk_reach(roots, limit, prefixes);
}

/* items_of_kinds(container, tensor, containers, limit) -> [(key, value,
 * is_tensor)] (heap_walk.h). */
static PyObject *
engine_items_of_kinds(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *container, *tensor, *containers;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "OO!O!n:items_of_kinds", &container, &PyType_Type, &tensor,
                          &PyTuple_Type, &containers, &limit))
        return NULL;
    return HeapWalk_items_of_kinds(container, (PyTypeObject *)tensor, containers, limit);
}

/* untrack(objects) -> how many items of the list objects the collector
 * tracked and no longer does (heap_walk.h). */
static PyObject *
engine_untrack(PyObject *Py_UNUSED(module), PyObject *objects)
{
    if (!PyList_Check(objects)) {
        PyErr_SetString(PyExc_TypeError, "untrack: objects must be a list");
        return NULL;
    }
    return PyLong_FromSsize_t(HeapWalk_untrack(objects));
}

/* environ_put(name, value) -> None: name=value (bytes) in the process's
 * environment, through memlab's own buffers (environ_buffer.h); the
 * caller keeps os.environ's table alike. */
static PyObject *
engine_environ_put(PyObject *Py_UNUSED(module), PyObject *args)
{
    const char *name, *value;
    Py_ssize_t name_len, value_len;
    if (!PyArg_ParseTuple(args, "y#y#:environ_put", &name, &name_len, &value, &value_len))
        return NULL;
    if (name_len == 0 || memchr(name, '=', (size_t)name_len) != NULL
        || memchr(name, '\0', (size_t)name_len) != NULL) {
        PyErr_SetString(PyExc_ValueError, "environ_put: the name is empty or holds '=' or a NUL");
        return NULL;
    }
    if (memchr(value, '\0', (size_t)value_len) != NULL) {
        PyErr_SetString(PyExc_ValueError, "environ_put: the value holds a NUL");
        return NULL;
    }
    if (EnvironBuffer_put(name, (size_t)name_len, value, (size_t)value_len) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

/* links(fd) -> the link count of the open file fd: fstat's st_nlink,
 * without the stat_result that os.fstat builds (its times as floats and
 * nanoseconds: most of the call).  The children's root is looked at after
 * every measured test (children/gathering.py). */
static PyObject *
engine_links(PyObject *Py_UNUSED(module), PyObject *arg)
{
    long fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    if (fd < 0 || fd > INT_MAX) {
        errno = EBADF;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    struct stat st;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fstat((int)fd, &st);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromUnsignedLongLong((unsigned long long)st.st_nlink);
}

/* referrers(objects, targets) -> the items of the list objects (the heap:
 * gc.get_objects()) that refer to any item of the list targets. */
#define REFERRER_INDEX "pytest_memlab.referrer_index"

static void
referrer_index_free(PyObject *capsule)
{
    ReferrerIndex *index = PyCapsule_GetPointer(capsule, REFERRER_INDEX);
    if (index != NULL) {
        ReferrerIndex_fini(index);
        PyMem_Free(index);
    }
}

/* referrer_index(objects) -> an index of who refers to what in the list
 * objects (the heap: gc.get_objects()), for index_referrers. */
static PyObject *
engine_referrer_index(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *objects, *capsule = NULL;
    if (!PyArg_ParseTuple(args, "O!:referrer_index", &PyList_Type, &objects))
        return NULL;
    ReferrerIndex *index = PyMem_Malloc(sizeof(ReferrerIndex));
    if (index == NULL || ReferrerIndex_init(index) < 0) {
        PyMem_Free(index);
        return PyErr_NoMemory();
    }
    if (ReferrerIndex_add(index, objects) < 0)
        goto error;
    capsule = PyCapsule_New(index, REFERRER_INDEX, referrer_index_free);
    if (capsule == NULL)
        goto error;
    return capsule;
error:
    ReferrerIndex_fini(index);
    PyMem_Free(index);
    return NULL;
}

/* index_referrers(index, objects, targets) -> the positions in objects
 * of referrers(objects, targets), from the index of objects (items
 * appended since are indexed first). */
static PyObject *
engine_index_referrers(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *capsule, *objects, *targets;
    if (!PyArg_ParseTuple(args, "OO!O!:index_referrers", &capsule, &PyList_Type, &objects,
                          &PyList_Type, &targets))
        return NULL;
    ReferrerIndex *index = PyCapsule_GetPointer(capsule, REFERRER_INDEX);
    if (index == NULL)
        return NULL;
    return ReferrerIndex_referrers(index, objects, targets);
}

static PyObject *
engine_referrers(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *objects, *targets;
    if (!PyArg_ParseTuple(args, "O!O!:referrers", &PyList_Type, &objects,
                          &PyList_Type, &targets))
        return NULL;
    return HeapWalk_referrers(objects, targets);
}

static PyObject *
tracer_start(PyObject *Py_UNUSED(module), PyObject *decide)
{
    if (callable_arg(decide, "tracer_start", "decide") < 0)
        return NULL;
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
tracer_line_stats(PyObject *Py_UNUSED(module), PyObject *args)
{
    long slot;
    int allocated_only = 0, top = 0;
    if (!PyArg_ParseTuple(args, "l|pi:tracer_line_stats", &slot, &allocated_only, &top))
        return NULL;
    if (top < 0) {
        PyErr_Format(PyExc_ValueError, "top must be 0 (every line) or more, not %d", top);
        return NULL;
    }
    if (slot < 0 || slot >= LINE_SLOTS) {
        PyErr_Format(PyExc_ValueError, "device slot %ld has no line figures "
                     "(0..%d do)", slot, LINE_SLOTS - 1);
        return NULL;
    }
    return Tracer_line_stats((int)slot, allocated_only, top);
}

static PyObject *
tracer_phases(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    return Tracer_phases();
}

static PyObject *
tracer_phase_hook(PyObject *Py_UNUSED(module), PyObject *hook)
{
    if (hook != Py_None && callable_arg(hook, "tracer_phase_hook", "hook") < 0)
        return NULL;
    return Tracer_set_phase_hook(hook);
}

static PyObject *
tracer_reset_lines(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    return Tracer_reset_lines();
}

static PyObject *
tracer_untraced_imports(PyObject *Py_UNUSED(module), PyObject *original)
{
    if (callable_arg(original, "untraced_imports", "original") < 0)
        return NULL;
    return Tracer_untraced_imports(original);
}

static PyObject *
tracer_status(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    return Tracer_status();
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
    {"alloc_log_take", engine_alloc_log_take, METH_VARARGS,
     "alloc_log_take(slot, keep=False) -> ([(addr, size, time_us, site, seq, counts)], "
     "dropped): the device's latest allocation log, taken (with keep, a copy: the log "
     "goes on)."},
    {"watch", engine_watch, METH_VARARGS,
     "watch(slot, addrs): leak suspects' addresses, watched until an "
     "allocation or a free is heard there."},
    {"watched", engine_watched, METH_VARARGS,
     "watched(slot, addrs) -> [whether each is still watched]."},
    {"unwatch", engine_unwatch, METH_O,
     "unwatch(slot): forget the device's watched addresses."},
    {"referrer_index", engine_referrer_index, METH_VARARGS,
     "referrer_index(objects) -> an index of which items of the list objects refer to which "
     "tracked objects, built in one walk (index_referrers asks it)"},
    {"index_referrers", engine_index_referrers, METH_VARARGS,
     "index_referrers(index, objects, targets) -> the positions in objects of referrers(objects, "
     "targets), from the index (items appended to objects since are indexed first)"},
    {"reach", engine_reach, METH_VARARGS,
     "reach(roots, limit, prefixes) -> the objects the list roots reach through their references, "
     "depth first, at most limit: not modules, classes, functions, nor objects of classes from modules "
     "named with one of the str prefixes"},
    {"referrers", engine_referrers, METH_VARARGS,
     "referrers(objects, targets) -> the items of the list objects that refer to any item of the "
     "list targets (as gc.get_referrers, at one lookup a reference)"},
    {"items_of_kinds", engine_items_of_kinds, METH_VARARGS,
     "items_of_kinds(container, tensor, containers, limit) -> [(key, value, is_tensor)]: the items among "
     "the first limit of container whose value is a tensor (of a subtype of tensor) or of a type in the "
     "tuple containers, by the objects' own types; key: a dict's key, a set's None, else the index"},
    {"links", engine_links, METH_O,
     "links(fd) -> the link count of the open file fd (fstat's st_nlink)."},
    {"environ_put", engine_environ_put, METH_VARARGS,
     "environ_put(name, value) -> None: name=value (bytes) set in the process's environment without "
     "setenv, which keeps every distinct value for the life of the process (os.environ is not "
     "touched)."},
    {"untrack", engine_untrack, METH_O,
     "untrack(objects) -> how many items of the list objects the collector tracked: it no longer "
     "does (records kept to the session's end that can never be in a reference cycle)."},
    {"of_types", engine_of_types, METH_VARARGS,
     "of_types(objects, kinds) -> the items of the list objects whose exact "
     "type is in the set kinds."},
    {"kept", engine_kept, METH_VARARGS,
     "kept(slot, id) -> ((head_max, head_seq, head_site, phases), [(addr, size, "
     "span_max, span_seq, seq, site, span_site, phases)]): the live blocks of a scope whose timeline runs, "
     "in allocation order, with the most own bytes of each one's span, and per phase (forward, backward, "
     "step) the most while it ran, as (max, site), max -1 where it did not run (None: none ran); None "
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
    {"close_plain", (PyCFunction)(void (*)(void))engine_close_plain, METH_FASTCALL,
     "close_plain(slot, scope_id, failed) -> ((peak, peak_total, "
     "reserved_peak, head), last) where the scope left nothing (no live "
     "block, no new failed request, nothing kept), else None, still open."},
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
    {"tracer_line_stats", tracer_line_stats, METH_VARARGS,
     "tracer_line_stats(slot, allocated_only=False, top=0) -> [(line_id, code, lineno, hits, allocated, "
     "peak_total, peak_reserved, last_total)]: the lines run or allocating "
     "since the last reset (with allocated_only, those that allocated), with their figures on "
     "device slot 0..3; with top > 0, only the top that allocated the most, heaviest first "
     "(among equals in the order the unsorted list has them)."},
    {"tracer_phases", tracer_phases, METH_NOARGS,
     "tracer_phases() -> ([(kind, slot, seq, label)], dropped): the phases "
     "(PHASE_FORWARD, PHASE_BACKWARD, PHASE_STEP; negated where one ended, "
     "without a label) since the lines were last "
     "reset, each on the timeline of every device whose timeline ran."},
    {"tracer_phase_hook", tracer_phase_hook, METH_O,
     "tracer_phase_hook(hook): hook(kind, subject, inputs) as each phase of the "
     "measuring thread starts (kind) and ends (-kind); subject: its module or "
     "optimizer, or None; inputs: a forward's positional arguments, or None.  "
     "None: no hook."},
    {"tracer_reset_lines", tracer_reset_lines, METH_NOARGS,
     "tracer_reset_lines(): zero the statistics of the lines touched since "
     "the last reset."},
    {"tracer_status", tracer_status, METH_NOARGS,
     "tracer_status() -> how the tracer runs and what it holds."},
    {"untraced_imports", tracer_untraced_imports, METH_O,
     "untraced_imports(original) -> a replacement for builtins.__import__ that runs original "
     "with the tracer's trace function off (Python < 3.12; original itself after)."},
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
        {"SCOPE_LOCATED", SCOPE_LOCATED},
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
