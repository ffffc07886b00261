/* The engine's measurements, as the module's functions: scopes opened
 * and closed by the plugin, their figures as dicts, the timeline, the
 * allocation log, watched blocks, what a test kept, the blocks live, and
 * the injected events and replay of the C tests' benchmarks.
 */
#include "module_state.h"

#include <limits.h>
#include <stdlib.h>

#include "phases.h"
#include "tracer.h"

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
PyObject *
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

PyObject *
engine_sink(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    return Py_BuildValue("(KK)",
                         (unsigned long long)(uintptr_t)&Engine_sink,
                         (unsigned long long)(uintptr_t)M.engine);
}

PyObject *
engine_slot(PyObject *Py_UNUSED(module), PyObject *args)
{
    int type, index;
    if (!PyArg_ParseTuple(args, "ii:slot", &type, &index))
        return NULL;
    return PyLong_FromLong(Engine_slot(type, index));
}

PyObject *
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

PyObject *
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

PyObject *
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
PyObject *
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

PyObject *
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

PyObject *
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

PyObject *
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

PyObject *
engine_alloc_log_take(PyObject *Py_UNUSED(module), PyObject *args)
{
    int slot, keep = 0;
    uint32_t n;
    uint64_t dropped;
    if (!PyArg_ParseTuple(args, "i|p:alloc_log_take", &slot, &keep) || check_slot(slot) < 0)
        return NULL;
    AllocEntry *log = Engine_alloc_log_take(M.engine, slot, keep, &n, &dropped);
    PyObject *list = PyList_New(n), *result = NULL;
    if (list == NULL)
        goto error;
    for (uint32_t i = 0; i < n; i++) {
        PyObject *t = Py_BuildValue("(KLKIKO)", (unsigned long long)log[i].addr,
                                    (long long)log[i].size,
                                    (unsigned long long)log[i].time_us,
                                    log[i].site,
                                    (unsigned long long)log[i].seq,
                                    log[i].counts ? Py_True : Py_False);
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
PyObject *
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
PyObject *
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

PyObject *
engine_unwatch(PyObject *Py_UNUSED(module), PyObject *arg)
{
    int slot;
    if (slot_arg(arg, &slot) < 0)
        return NULL;
    Engine_unwatch(M.engine, slot);
    Py_RETURN_NONE;
}

/* A span's peak per phase, in the order of tracing.PHASE_NAMES:
 * ((max, site), ...), max -1 where the phase did not run; None where none
 * ran (most tests: a block's tuple costs no more than its own fields). */
PyObject *
phases_tuple(const KeptPhases *p)
{
    if (p->max[PHASE_FORWARD] < 0 && p->max[PHASE_BACKWARD] < 0 && p->max[PHASE_STEP] < 0)
        return Py_NewRef(Py_None);
    return Py_BuildValue("((LI)(LI)(LI))",
                         (long long)p->max[PHASE_FORWARD], p->site[PHASE_FORWARD],
                         (long long)p->max[PHASE_BACKWARD], p->site[PHASE_BACKWARD],
                         (long long)p->max[PHASE_STEP], p->site[PHASE_STEP]);
}

/* kept(slot, id) -> ((head_max, head_seq, head_site, phases), [(addr, size,
 * span_max, span_seq, seq, site, span_site, phases)]) of open scope id, or
 * None where the device does not follow it (kept.h); phases: phases_tuple. */
PyObject *
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
        PyObject *t = Py_BuildValue("(KLLKKIIN)", (unsigned long long)b->addr,
                                    (long long)b->size, (long long)b->span_max,
                                    (unsigned long long)b->span_seq,
                                    (unsigned long long)b->seq, b->site,
                                    b->span_site, phases_tuple(&b->phases));
        if (t == NULL)
            goto error;
        PyList_SET_ITEM(blocks, i, t);
    }
    result = Py_BuildValue("((LKIN)O)", (long long)head.span_max,
                           (unsigned long long)head.span_seq, head.span_site,
                           phases_tuple(&head.phases), blocks);
error:
    Py_XDECREF(blocks);
    free(buf);
    return result;
}

PyObject *
engine_seq(PyObject *Py_UNUSED(module), PyObject *arg)
{
    int slot;
    if (slot_arg(arg, &slot) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(Engine_seq(M.engine, slot));
}

PyObject *
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

PyObject *
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

PyObject *
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

PyObject *
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

PyObject *
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

PyObject *
engine_record_stop(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    Event *events;
    size_t n = Engine_record_stop(M.engine, &events);
    PyObject *result = PyBytes_FromStringAndSize(
        (const char *)events, (Py_ssize_t)(n * sizeof(Event)));
    free(events);
    return result;
}

PyObject *
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

PyObject *
engine_site(PyObject *Py_UNUSED(module), PyObject *arg)
{
    unsigned long site = PyLong_AsUnsignedLong(arg);
    if (site == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    return Tracer_site((uint32_t)site);
}

PyObject *
engine_line(PyObject *Py_UNUSED(module), PyObject *arg)
{
    unsigned long line = PyLong_AsUnsignedLong(arg);
    if (line == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    return Tracer_line((uint32_t)line);
}
