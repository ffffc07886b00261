/* The tracer's event source on Python >= 3.12: sys.monitoring.
 *
 * PY_START is on globally and the scope is decided once per code object:
 * code out of scope gets DISABLE and never reports again (until the scope
 * rules change and restart_events() asks anew).  Code in scope gets LINE,
 * PY_RETURN, PY_YIELD and PY_RESUME as local events; PY_UNWIND and PY_THROW
 * are global (they cannot be disabled per location).  Located code (the
 * plugin's: shadow_stack.h) gets no LINE: its frames are pushed with the
 * interpreter's frame, and their lines found when something is allocated.  The tool id is one
 * that CPython leaves unnamed (4, else 3), never the profiler's or the
 * debugger's: a test may run cProfile or pdb.
 */
#include "tracer_internal.h"

#if MEMLAB_SYSMON

#include <stdarg.h>

PyObject *
Tracer_untraced_imports(PyObject *original)
{
    return Py_NewRef(original);
}

static PyObject *
call_monitoring(const char *name, const char *fmt, ...)
{
    PyObject *fn = PyObject_GetAttrString(T.monitoring, name);
    if (fn == NULL)
        return NULL;
    va_list va;
    va_start(va, fmt);
    PyObject *args = Py_VaBuildValue(fmt, va);
    va_end(va);
    PyObject *r = args == NULL ? NULL : PyObject_CallObject(fn, args);
    Py_XDECREF(args);
    Py_DECREF(fn);
    return r;
}

static long
event_bit(PyObject *events, const char *name)
{
    PyObject *v = PyObject_GetAttrString(events, name);
    if (v == NULL)
        return -1;
    long bit = PyLong_AsLong(v);
    Py_DECREF(v);
    return bit;
}

static int
monitoring_register(void)
{
    int ret = -1;
    PyObject *sys = NULL, *events = NULL, *r = NULL;
    static const struct { const char *event; const char *callback; } cbs[] = {
        {"PY_START", "_mon_start"}, {"PY_RESUME", "_mon_resume"},
        {"PY_RETURN", "_mon_leave"}, {"PY_YIELD", "_mon_leave"},
        {"PY_UNWIND", "_mon_unwind"}, {"PY_THROW", "_mon_throw"},
        {"LINE", "_mon_line"},
    };
    if ((sys = PyImport_ImportModule("sys")) == NULL)
        goto error;
    if ((T.monitoring = PyObject_GetAttrString(sys, "monitoring")) == NULL)
        goto error;
    if ((T.disable = PyObject_GetAttrString(T.monitoring, "DISABLE")) == NULL)
        goto error;
    if ((events = PyObject_GetAttrString(T.monitoring, "events")) == NULL)
        goto error;
    T.ev_local = event_bit(events, "LINE") | event_bit(events, "PY_RETURN")
                 | event_bit(events, "PY_YIELD") | event_bit(events, "PY_RESUME");
    T.ev_located = T.ev_local & ~event_bit(events, "LINE");
    T.ev_phase = event_bit(events, "PY_RETURN");
    T.ev_global = event_bit(events, "PY_START") | event_bit(events, "PY_UNWIND")
                  | event_bit(events, "PY_THROW");
    if (PyErr_Occurred())
        goto error;
    /* One of the two ids that CPython leaves unnamed, never the profiler's
     * (2): cProfile takes that one, and a measured test that profiles
     * would fail with "Another profiling tool is already active". */
    static const int candidates[] = {4, 3};
    for (size_t i = 0; i < sizeof(candidates) / sizeof(candidates[0]); i++) {
        r = call_monitoring("get_tool", "(i)", candidates[i]);
        if (r == NULL)
            goto error;
        int free_id = r == Py_None;
        Py_CLEAR(r);
        if (free_id) {
            r = call_monitoring("use_tool_id", "(is)", candidates[i], "pytest-memlab");
            if (r == NULL)
                goto error;
            Py_CLEAR(r);
            T.tool = candidates[i];
            break;
        }
    }
    if (T.tool < 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "pytest-memlab: no free sys.monitoring tool id "
                        "(3 and 4 are taken by other tools)");
        goto error;
    }
    for (size_t i = 0; i < sizeof(cbs) / sizeof(cbs[0]); i++) {
        long bit = event_bit(events, cbs[i].event);
        PyObject *cb = PyObject_GetAttrString(T.module, cbs[i].callback);
        if (bit < 0 || cb == NULL) {
            Py_XDECREF(cb);
            goto error;
        }
        r = call_monitoring("register_callback", "(ilO)", T.tool, bit, cb);
        Py_DECREF(cb);
        if (r == NULL)
            goto error;
        Py_CLEAR(r);
    }
    ret = 0;
error:
    Py_XDECREF(sys);
    Py_XDECREF(events);
    Py_XDECREF(r);
    return ret;
}

/* Callback prologue: the thread's stack, unless this is a nested event. */
#define MON_ENTER(nargs_needed)                                              \
    if (n < (nargs_needed) || in_callback                                    \
        || !atomic_load_explicit(&T.tracing, memory_order_relaxed))          \
        Py_RETURN_NONE;                                                      \
    in_callback = 1

#define MON_LEAVE(result)                                                    \
    do {                                                                     \
        in_callback = 0;                                                     \
        return Py_NewRef(result);                                            \
    } while (0)

/* The interpreter frame the event came from: the thread's innermost (a
 * callback is a C function: it has none). */
static const void *
current_frame(void)
{
    PyThreadState *ts = PyThreadState_Get();
#if PY_VERSION_HEX >= 0x030D0000
    return ts->current_frame;
#else
    return ts->cframe->current_frame;
#endif
}

/* A frame in scope starts or comes back on this thread. */
static void
push(const CodeInfo *ci, int lineno)
{
    ShadowStack *t = Tracer_thread();
    if (t == NULL)
        return;
    if (ci->located)
        ShadowStack_push_located(t, ci->code_id, current_frame(), ci);
    else
        ShadowStack_push(t, &T.clock, ci->code_id, lineno);
}

PyObject *
Tracer_mon_start(PyObject *m, PyObject *const *args, Py_ssize_t n)
{
    (void)m;
    /* Parked between measured tests, PY_START stays on: code out of scope
     * is disabled then too.  Otherwise what pytest runs between one test's
     * end and the next one's start would never be disabled, and would
     * report again in every measured test.  (Parking keeps the scope's
     * rule as it was while tracing, so the decision is the same.) */
    if (n < 1 || in_callback)
        Py_RETURN_NONE;
    int tracing = atomic_load_explicit(&T.tracing, memory_order_relaxed);
    if (!tracing && !T.parked)
        Py_RETURN_NONE;
    in_callback = 1;
    PyObject *code = args[0];
    CodeInfo *ci = Tracer_known_code(code);
    if (ci == NULL)
        MON_LEAVE(Py_None);
    if (!ci->in_scope && !ci->phase)
        MON_LEAVE(T.disable);   /* never again for this code */
    /* Read again: a decision (or the wait for one) lets the GIL go, and
     * the tracer may have stopped meanwhile. */
    tracing = atomic_load_explicit(&T.tracing, memory_order_relaxed);
    if (!tracing)
        MON_LEAVE(Py_None);     /* in scope: its events wait for a test */
    /* A phase function only needs its returns (its depth), no lines; a
     * located code no lines either. */
    long wanted = ci->phase ? T.ev_phase : ci->located ? T.ev_located : T.ev_local;
    if (ci->local_run != T.run || ci->local_events != wanted) {
        int listed = ci->local_run == T.run;
        ci->local_run = T.run;
        ci->local_events = wanted;
        PyObject *r = call_monitoring("set_local_events", "(iOl)", T.tool,
                                      code, wanted);
        if (r == NULL || (!listed && PyList_Append(T.enabled, code) < 0))
            Tracer_store_error();
        Py_XDECREF(r);
    }
    if (ci->phase) {
        Tracer_phase_enter(Tracer_thread(), ci, PyEval_GetFrame());
        MON_LEAVE(Py_None);
    }
    push(ci, ((PyCodeObject *)code)->co_firstlineno);
    MON_LEAVE(Py_None);
}

/* PY_RESUME and PY_THROW: a generator or coroutine frame comes back. */
static PyObject *
mon_reenter(PyObject *const *args)
{
    PyObject *code = args[0];
    CodeInfo *ci = Tracer_known_code(code);
    if (ci != NULL && ci->in_scope) {
        int offset = (int)PyLong_AsLong(args[1]);
        if (offset < 0 && PyErr_Occurred())
            Tracer_store_error();
        push(ci, PyCode_Addr2Line((PyCodeObject *)code, offset));
    }
    MON_LEAVE(Py_None);
}

PyObject *
Tracer_mon_resume(PyObject *m, PyObject *const *args, Py_ssize_t n)
{
    (void)m;
    MON_ENTER(2);
    return mon_reenter(args);
}

PyObject *
Tracer_mon_throw(PyObject *m, PyObject *const *args, Py_ssize_t n)
{
    (void)m;
    MON_ENTER(2);
    return mon_reenter(args);
}

/* PY_RETURN, PY_YIELD and PY_UNWIND: the frame leaves. */
PyObject *
Tracer_mon_leave(PyObject *m, PyObject *const *args, Py_ssize_t n)
{
    (void)m;
    MON_ENTER(1);
    CodeInfo *ci = Tracer_known_code(args[0]);
    ShadowStack *t = Tracer_thread_if_any();
    /* code_id: a frame pushed in scope leaves even if the scope's rules
     * changed since (a located frame must never outlive its entry). */
    if (ci != NULL && ci->code_id != 0 && t != NULL)
        ShadowStack_pop(t, &T.clock, ci->code_id);
    else if (ci != NULL && ci->phase)
        Tracer_phase_leave(t, ci);
    MON_LEAVE(Py_None);
}

PyObject *
Tracer_mon_unwind(PyObject *m, PyObject *const *args, Py_ssize_t n)
{
    return Tracer_mon_leave(m, args, n);
}

PyObject *
Tracer_mon_line(PyObject *m, PyObject *const *args, Py_ssize_t n)
{
    (void)m;
    MON_ENTER(2);
    CodeInfo *ci = Tracer_known_code(args[0]);
    int lineno = (int)PyLong_AsLong(args[1]);
    if (lineno < 0 && PyErr_Occurred())
        Tracer_store_error();
    else if (ci != NULL && ci->in_scope) {
        ShadowStack *t = Tracer_thread();
        if (t != NULL)
            (void)ShadowStack_line(t, &T.clock, ci->code_id, lineno);
    }
    MON_LEAVE(Py_None);
}

int
Backend_on(void)
{
    if (T.tool < 0 && monitoring_register() < 0)
        return -1;
    PyObject *r = call_monitoring("set_events", "(il)", T.tool, T.ev_global);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

int
Backend_off(void)
{
    int ret = 0;
    PyObject *r = call_monitoring("set_events", "(ii)", T.tool, 0);
    if (r == NULL)
        ret = -1;
    Py_XDECREF(r);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(T.enabled); i++) {
        r = call_monitoring("set_local_events", "(iOi)", T.tool,
                            PyList_GET_ITEM(T.enabled, i), 0);
        if (r == NULL)
            ret = -1;
        Py_XDECREF(r);
    }
    if (PyList_SetSlice(T.enabled, 0, PyList_GET_SIZE(T.enabled), NULL) < 0)
        ret = -1;
    return ret;
}

int
Backend_forget_disables(void)
{
    if (T.tool < 0)
        return 0;
    PyObject *r = call_monitoring("restart_events", "()");
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

int
Backend_hooked(void)
{
    return 0;   /* sys.monitoring needs no frame hook */
}

void
Backend_code_freed(const CodeInfo *ci)
{
    (void)ci;   /* sys.monitoring keeps nothing of a decision */
}

int
Backend_can_locate(void)
{
    return 1;
}

int
Backend_lasti(const void *where)
{
    return PyUnstable_InterpreterFrame_GetLasti((struct _PyInterpreterFrame *)where);
}

#endif
