/* The torch bridge's reporter, as the module's functions: binding the
 * bridge, installing and removing the reporter, stepping aside, and the
 * scope transaction (open and close a measured scope on a device at the
 * bridge's totals of that moment).
 */
#include "module_state.h"

#include <limits.h>

PyObject *
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

PyObject *
bridge_install(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    char err[REPORTER_ERRLEN] = "";
    int first;
    int rc = Reporter_install(&M.reporter, &first, err, sizeof err);
    if (rc < 0)
        return reporter_error(rc, 0, 0, err);
    return PyBool_FromLong(first);
}

PyObject *
bridge_uninstall(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    char err[REPORTER_ERRLEN] = "";
    int last = Reporter_uninstall(&M.reporter, err, sizeof err);
    if (last < 0)
        return reporter_error(last, 0, 0, err);
    return PyBool_FromLong(last);
}

PyObject *
bridge_depth(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args))
{
    return PyLong_FromLong(Reporter_depth());
}

PyObject *
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

PyObject *
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

PyObject *
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

/* close_plain(slot, scope_id, failed) -> ((peak, peak_total, reserved_peak,
 * head), last) where the scope left nothing behind: none of its blocks
 * live, the device's count of failed requests still failed, nothing kept
 * (head: engine.kept's, or None where the device does not follow the
 * scope); else None, the scope still open.  A plain test's end
 * (measuring/plain_run.py): live(), failed(), kept() and close() in their
 * order, in one call, building only the figures that its result keeps (no
 * dict of every figure, no list of sites). */
PyObject *
engine_close_plain(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t n)
{
    char err[REPORTER_ERRLEN] = "";
    int last = 0;
    Scope s;
    KeptBlock *blocks = NULL;
    KeptBlock head;
    uint32_t kept = 0;
    uint64_t count;
    int64_t size;
    uint32_t site;
    if (n != 3) {
        PyErr_SetString(PyExc_TypeError, "close_plain(slot, scope_id, failed)");
        return NULL;
    }
    int slot = (int)PyLong_AsLong(args[0]);
    unsigned long id = PyLong_AsUnsignedLong(args[1]);
    unsigned long long failed = PyLong_AsUnsignedLongLong(args[2]);
    if (PyErr_Occurred() || check_slot(slot) < 0)
        return NULL;
    if (id > UINT32_MAX || Engine_stats(M.engine, slot, (uint32_t)id, 0, &s) < 0)
        return PyErr_Format(PyExc_ValueError, "scope %lu is not open on device slot %d", id, slot);
    Scope_fini(&s);
    if (s.live != 0)
        Py_RETURN_NONE;
    Engine_failed(M.engine, slot, &count, &size, &site);
    if (count != failed)
        Py_RETURN_NONE;
    int followed = Engine_kept(M.engine, slot, (uint32_t)id, &blocks, &kept, &head) == 0;
    free(blocks);
    if (followed && kept != 0)
        Py_RETURN_NONE;
    int rc = Reporter_close_scope(&M.reporter, slot, (uint32_t)id, &s, &last, err, sizeof err);
    if (rc < 0)
        return reporter_error(rc, slot, id, err);
    Scope_fini(&s);
    if (raise_engine_error(slot) < 0)
        return NULL;
    PyObject *reserved = s.reserved_peak < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(s.reserved_peak);
    PyObject *span = followed ? Py_BuildValue("(LKIN)", (long long)head.span_max,
                                              (unsigned long long)head.span_seq, head.span_site,
                                              phases_tuple(&head.phases))
                              : Py_NewRef(Py_None);
    if (reserved == NULL || span == NULL) {
        Py_XDECREF(reserved);
        Py_XDECREF(span);
        return NULL;
    }
    return Py_BuildValue("((LLNN)O)", (long long)s.peak, (long long)s.peak_total, reserved, span,
                         last ? Py_True : Py_False);
}

/* bridge_cuda_totals(index) -> (allocated, reserved), or None: the caller
 * asks torch.cuda then. */
PyObject *
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
