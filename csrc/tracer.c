#include "tracer.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#if PY_VERSION_HEX >= 0x030C0000
#define MEMLAB_SYSMON 1
#define Code_GetExtra PyUnstable_Code_GetExtra
#define Code_SetExtra PyUnstable_Code_SetExtra
#define RequestCodeExtraIndex PyUnstable_Eval_RequestCodeExtraIndex
#else
#define MEMLAB_SYSMON 0
#define Code_GetExtra _PyCode_GetExtra
#define Code_SetExtra _PyCode_SetExtra
#define RequestCodeExtraIndex _PyEval_RequestCodeExtraIndex
#endif

typedef struct TFrame {
    uint32_t code;
    int32_t lineno;
    uint32_t line;
    int64_t hw[LINE_SLOTS];     /* highest total since the line began */
    int64_t hwr[LINE_SLOTS];    /* highest reserved since the line began */
} TFrame;

typedef struct TThread {
    struct TThread *next;
    atomic_int depth;
    int overflow;               /* frames past TRACER_STACK, not stored */
    TFrame frames[TRACER_STACK];
} TThread;

/* Hung on each code object (co_extra): the scope decision, made once per
 * decision epoch. */
typedef struct CodeInfo {
    uint32_t code_id;           /* 0 until first found in scope */
    uint32_t decided;           /* epoch of the decision */
    uint32_t local_run;         /* run in which its local events were set */
    int in_scope;
} CodeInfo;

static struct {
    Engine *engine;
    PyObject *module;
    LineTable lines;
    SiteTable sites;
    PyObject *codes;            /* list: code_id - 1 -> code object */
    PyObject *decide;
    PyObject *error;            /* stored by a callback, raised by the API */
    uint32_t epoch;
    uint32_t run;
    atomic_int tracing;
    TThread *threads;           /* every thread seen, under the GIL */
    _Atomic(TThread *) anchor;  /* the measuring thread */
    Py_ssize_t extra_index;
    int tool;                   /* sys.monitoring tool id, -1 if none */
    PyObject *monitoring;
    PyObject *disable;
    PyObject *enabled;          /* code objects with local events this run */
    long ev_local;
    long ev_global;
} T;

static _Thread_local TThread *tls_thread;
/* Set while a callback runs on this thread: events that its own Python
 * calls (the scope decision) cause are ignored. */
static _Thread_local int in_callback;

/* -- errors: never raised from a callback ----------------------------- */

static void
store_error(void)
{
    if (T.error != NULL) {
        PyErr_Clear();
        return;
    }
#if PY_VERSION_HEX >= 0x030C0000
    T.error = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    T.error = value;
#endif
}

static int
raise_stored_error(void)
{
    if (T.error == NULL)
        return 0;
    PyObject *err = T.error;
    T.error = NULL;
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(err);
#else
    PyErr_SetObject((PyObject *)Py_TYPE(err), err);
    Py_DECREF(err);
#endif
    return -1;
}

/* -- code objects ----------------------------------------------------- */

static CodeInfo *
code_info(PyObject *code)
{
    void *extra = NULL;
    if (Code_GetExtra(code, T.extra_index, &extra) < 0) {
        store_error();
        return NULL;
    }
    CodeInfo *ci = extra;
    if (ci == NULL) {
        ci = calloc(1, sizeof(CodeInfo));
        if (ci == NULL)
            return NULL;
        if (Code_SetExtra(code, T.extra_index, ci) < 0) {
            free(ci);
            store_error();
            return NULL;
        }
    }
    if (ci->decided != T.epoch) {
        ci->decided = T.epoch;  /* first: a recursive event sees "out" */
        ci->in_scope = 0;
        if (T.decide != NULL) {
            PyObject *r = PyObject_CallOneArg(T.decide, code);
            int truth = r == NULL ? -1 : PyObject_IsTrue(r);
            Py_XDECREF(r);
            if (truth < 0)
                store_error();
            else
                ci->in_scope = truth;
        }
        if (ci->in_scope && ci->code_id == 0) {
            if (PyList_Append(T.codes, code) < 0) {
                store_error();
                ci->in_scope = 0;
            }
            else {
                ci->code_id = (uint32_t)PyList_GET_SIZE(T.codes);
            }
        }
    }
    return ci;
}

/* -- the shadow stacks -------------------------------------------------- */

static TThread *
thread_get(void)
{
    TThread *t = tls_thread;
    if (t != NULL)
        return t;
    t = calloc(1, sizeof(TThread));
    if (t == NULL)
        return NULL;
    atomic_init(&t->depth, 0);
    t->next = T.threads;
    T.threads = t;
    tls_thread = t;
    return t;
}

static void
line_begin(TFrame *f)
{
    LineRec *r = LineTable_get(&T.lines, f->line);
    if (r != NULL)
        atomic_fetch_add_explicit(&r->hits, 1, memory_order_relaxed);
    for (int s = 0; s < LINE_SLOTS; s++) {
        f->hw[s] = Engine_current_total(T.engine, s);
        f->hwr[s] = Engine_current_reserved(T.engine, s);
    }
}

static inline void
store_max(_Atomic int64_t *where, int64_t v)
{
    /* Only the GIL holder writes line peaks: load and store suffice. */
    if (v > atomic_load_explicit(where, memory_order_relaxed))
        atomic_store_explicit(where, v, memory_order_relaxed);
}

static void
line_end(TFrame *f)
{
    LineRec *r = LineTable_get(&T.lines, f->line);
    if (r == NULL)
        return;
    for (int s = 0; s < LINE_SLOTS; s++) {
        store_max(&r->peak[s], f->hw[s]);
        store_max(&r->peak_reserved[s], f->hwr[s]);
        atomic_store_explicit(&r->last_total[s],
                              Engine_current_total(T.engine, s),
                              memory_order_relaxed);
    }
}

static void
thread_push(TThread *t, uint32_t code_id, int lineno)
{
    int d = atomic_load_explicit(&t->depth, memory_order_relaxed);
    if (d >= TRACER_STACK) {
        t->overflow++;
        return;
    }
    TFrame *f = &t->frames[d];
    f->code = code_id;
    f->lineno = lineno;
    f->line = LineTable_intern(&T.lines, code_id, lineno);
    line_begin(f);
    atomic_store_explicit(&t->depth, d + 1, memory_order_release);
}

/* Ends frames [i, depth): their lines finish, and what they saw counts for
 * the lines of their callers (callees included). */
static void
thread_unwind_to(TThread *t, int i)
{
    int d = atomic_load_explicit(&t->depth, memory_order_relaxed);
    for (int j = d - 1; j >= i; j--) {
        TFrame *f = &t->frames[j];
        line_end(f);
        if (j > 0) {
            TFrame *p = &t->frames[j - 1];
            for (int s = 0; s < LINE_SLOTS; s++) {
                if (f->hw[s] > p->hw[s])
                    p->hw[s] = f->hw[s];
                if (f->hwr[s] > p->hwr[s])
                    p->hwr[s] = f->hwr[s];
            }
        }
    }
    atomic_store_explicit(&t->depth, i, memory_order_release);
}

/* The innermost frame of code_id, searched a few frames deep (a missed
 * return leaves frames above it); -1 if absent. */
static int
thread_find(TThread *t, uint32_t code_id)
{
    int d = atomic_load_explicit(&t->depth, memory_order_relaxed);
    for (int i = d - 1; i >= 0 && i >= d - 16; i--) {
        if (t->frames[i].code == code_id)
            return i;
    }
    return -1;
}

static void
thread_pop(TThread *t, uint32_t code_id)
{
    if (t->overflow > 0) {
        t->overflow--;
        return;
    }
    int i = thread_find(t, code_id);
    if (i >= 0)
        thread_unwind_to(t, i);
}

/* Returns 0 when the line belongs to a frame the tracer never saw start
 * (it was running before tracing began): such frames stay untraced, on
 * every Python, so both event sources agree. */
static int
thread_line(TThread *t, uint32_t code_id, int lineno)
{
    if (t->overflow > 0)
        return 1;
    int d = atomic_load_explicit(&t->depth, memory_order_relaxed);
    if (d == 0 || t->frames[d - 1].code != code_id) {
        int i = thread_find(t, code_id);
        if (i < 0)
            return 0;
        thread_unwind_to(t, i + 1);   /* returns we missed */
        d = i + 1;
    }
    TFrame *f = &t->frames[d - 1];
    line_end(f);
    f->lineno = lineno;
    f->line = LineTable_intern(&T.lines, code_id, lineno);
    line_begin(f);
    return 1;
}

/* The engine's site function: on the allocator's path, any thread, no GIL.
 * Threads with no user frame (autograd's device threads) allocate on
 * behalf of the measuring thread's current line. */
static uint32_t
tracer_site(void *ctx, int slot, int64_t size, int64_t total,
            int64_t reserved)
{
    (void)ctx;
    if (!atomic_load_explicit(&T.tracing, memory_order_relaxed))
        return 0;
    TThread *t = tls_thread;
    if (t == NULL || atomic_load_explicit(&t->depth, memory_order_acquire) == 0)
        t = atomic_load_explicit(&T.anchor, memory_order_acquire);
    if (t == NULL)
        return 0;
    int d = atomic_load_explicit(&t->depth, memory_order_acquire);
    if (d <= 0)
        return 0;
    if (d > TRACER_STACK)
        d = TRACER_STACK;
    TFrame *top = &t->frames[d - 1];
    if (slot < LINE_SLOTS) {
        if (total > top->hw[slot])
            top->hw[slot] = total;
        if (reserved > top->hwr[slot])
            top->hwr[slot] = reserved;
        LineRec *r = LineTable_get(&T.lines, top->line);
        if (r != NULL)
            atomic_fetch_add_explicit(&r->alloc[slot], size,
                                      memory_order_relaxed);
    }
    uint32_t chain[SITE_CHAIN];
    uint32_t n = d < SITE_CHAIN ? (uint32_t)d : SITE_CHAIN;
    for (uint32_t i = 0; i < n; i++)
        chain[i] = t->frames[d - 1 - i].line;
    return SiteTable_intern(&T.sites, chain, n);
}

/* -- Python >= 3.12: sys.monitoring --------------------------------------- */

#if MEMLAB_SYSMON
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
    T.ev_global = event_bit(events, "PY_START") | event_bit(events, "PY_UNWIND")
                  | event_bit(events, "PY_THROW");
    if (PyErr_Occurred())
        goto error;
    /* The profiler's id if free, else the two that CPython leaves unnamed. */
    static const int candidates[] = {2, 4, 3};
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
                        "(2, 3 and 4 are taken by other tools)");
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

PyObject *
Tracer_mon_start(PyObject *m, PyObject *const *args, Py_ssize_t n)
{
    (void)m;
    MON_ENTER(1);
    PyObject *code = args[0];
    CodeInfo *ci = code_info(code);
    if (ci == NULL)
        MON_LEAVE(Py_None);
    if (!ci->in_scope)
        MON_LEAVE(T.disable);   /* never again for this code */
    if (ci->local_run != T.run) {
        ci->local_run = T.run;
        PyObject *r = call_monitoring("set_local_events", "(iOl)", T.tool,
                                      code, T.ev_local);
        if (r == NULL || PyList_Append(T.enabled, code) < 0)
            store_error();
        Py_XDECREF(r);
    }
    TThread *t = thread_get();
    if (t != NULL)
        thread_push(t, ci->code_id, ((PyCodeObject *)code)->co_firstlineno);
    MON_LEAVE(Py_None);
}

/* PY_RESUME and PY_THROW: a generator or coroutine frame comes back. */
static PyObject *
mon_reenter(PyObject *const *args)
{
    PyObject *code = args[0];
    CodeInfo *ci = code_info(code);
    if (ci != NULL && ci->in_scope) {
        int offset = (int)PyLong_AsLong(args[1]);
        if (offset < 0 && PyErr_Occurred())
            store_error();
        TThread *t = thread_get();
        if (t != NULL)
            thread_push(t, ci->code_id,
                        PyCode_Addr2Line((PyCodeObject *)code, offset));
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
    CodeInfo *ci = code_info(args[0]);
    if (ci != NULL && ci->in_scope && tls_thread != NULL)
        thread_pop(tls_thread, ci->code_id);
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
    CodeInfo *ci = code_info(args[0]);
    int lineno = (int)PyLong_AsLong(args[1]);
    if (lineno < 0 && PyErr_Occurred())
        store_error();
    else if (ci != NULL && ci->in_scope) {
        TThread *t = thread_get();
        if (t != NULL)
            (void)thread_line(t, ci->code_id, lineno);
    }
    MON_LEAVE(Py_None);
}

static int
tracing_on(void)
{
    if (T.tool < 0 && monitoring_register() < 0)
        return -1;
    PyObject *r = call_monitoring("set_events", "(il)", T.tool, T.ev_global);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static int
tracing_off(void)
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

static int
forget_disables(void)
{
    if (T.tool < 0)
        return 0;
    PyObject *r = call_monitoring("restart_events", "()");
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

#else /* Python < 3.12: PyEval_SetTrace */

PyObject *Tracer_mon_start(PyObject *m, PyObject *const *a, Py_ssize_t n)
{ (void)m; (void)a; (void)n; Py_RETURN_NONE; }
PyObject *Tracer_mon_resume(PyObject *m, PyObject *const *a, Py_ssize_t n)
{ (void)m; (void)a; (void)n; Py_RETURN_NONE; }
PyObject *Tracer_mon_leave(PyObject *m, PyObject *const *a, Py_ssize_t n)
{ (void)m; (void)a; (void)n; Py_RETURN_NONE; }
PyObject *Tracer_mon_unwind(PyObject *m, PyObject *const *a, Py_ssize_t n)
{ (void)m; (void)a; (void)n; Py_RETURN_NONE; }
PyObject *Tracer_mon_throw(PyObject *m, PyObject *const *a, Py_ssize_t n)
{ (void)m; (void)a; (void)n; Py_RETURN_NONE; }
PyObject *Tracer_mon_line(PyObject *m, PyObject *const *a, Py_ssize_t n)
{ (void)m; (void)a; (void)n; Py_RETURN_NONE; }

static int
trace_fn(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg)
{
    (void)obj;
    (void)arg;
    if (in_callback || (what != PyTrace_CALL && what != PyTrace_LINE
                        && what != PyTrace_RETURN))
        return 0;
    in_callback = 1;
    PyCodeObject *code = PyFrame_GetCode(frame);
    CodeInfo *ci = code_info((PyObject *)code);
    int lines_off = ci != NULL && !ci->in_scope && what != PyTrace_RETURN;
    if (ci != NULL && ci->in_scope) {
        TThread *t = thread_get();
        if (t != NULL) {
            if (what == PyTrace_CALL)
                thread_push(t, ci->code_id, PyFrame_GetLineNumber(frame));
            else if (what == PyTrace_LINE)
                lines_off = !thread_line(t, ci->code_id,
                                         PyFrame_GetLineNumber(frame));
            else
                thread_pop(t, ci->code_id);
        }
    }
    if (lines_off) {
        /* Out of scope, or running since before tracing began: no line
         * events from this frame. */
        if (PyObject_SetAttrString((PyObject *)frame, "f_trace_lines",
                                   Py_False) < 0)
            store_error();
    }
    Py_DECREF(code);
    in_callback = 0;
    return 0;
}

static int
tracing_on(void)
{
    PyEval_SetTrace(trace_fn, NULL);
    return 0;
}

static int
tracing_off(void)
{
    PyThreadState *ts = PyThreadState_Get();
    if (ts->c_tracefunc == trace_fn)
        PyEval_SetTrace(NULL, NULL);
    return 0;
}

static int
forget_disables(void)
{
    return 0;
}
#endif

/* -- the API -------------------------------------------------------------- */

int
Tracer_init(PyObject *module, Engine *engine)
{
    if (T.engine != NULL)
        return 0;   /* one tracer per process, like the engine */
    T.engine = engine;
    T.module = Py_NewRef(module);
    T.tool = -1;
    T.epoch = 1;
    atomic_init(&T.tracing, 0);
    atomic_init(&T.anchor, NULL);
    T.extra_index = RequestCodeExtraIndex(free);
    if (T.extra_index < 0) {
        PyErr_SetString(PyExc_RuntimeError, "no code-object extra slot left");
        return -1;
    }
    if ((T.codes = PyList_New(0)) == NULL || (T.enabled = PyList_New(0)) == NULL)
        return -1;
    if (LineTable_init(&T.lines) < 0 || SiteTable_init(&T.sites) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

PyObject *
Tracer_start(PyObject *decide)
{
    if (raise_stored_error() < 0)
        return NULL;
    if (atomic_load(&T.tracing)) {
        PyErr_SetString(PyExc_RuntimeError, "the tracer is already running");
        return NULL;
    }
    if (decide != T.decide) {
        Py_XSETREF(T.decide, Py_NewRef(decide));
        T.epoch++;
        if (forget_disables() < 0)
            return NULL;
    }
    T.run++;
    for (TThread *t = T.threads; t != NULL; t = t->next) {
        atomic_store(&t->depth, 0);
        t->overflow = 0;
    }
    TThread *anchor = thread_get();
    if (anchor == NULL)
        return PyErr_NoMemory();
    atomic_store(&T.anchor, anchor);
    if (tracing_on() < 0)
        return NULL;
    Engine_set_site_fn(T.engine, tracer_site, NULL);
    atomic_store(&T.tracing, 1);
    Py_RETURN_NONE;
}

PyObject *
Tracer_stop(void)
{
    if (!atomic_load(&T.tracing))
        Py_RETURN_NONE;
    atomic_store(&T.tracing, 0);
    int rc = tracing_off();
    /* Lines still running end now, so their peaks count. */
    for (TThread *t = T.threads; t != NULL; t = t->next)
        thread_unwind_to(t, 0);
    if (rc < 0)
        return NULL;
    if (raise_stored_error() < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *
Tracer_redecide(void)
{
    T.epoch++;
    if (forget_disables() < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
slots_list(_Atomic int64_t *values)
{
    PyObject *list = PyList_New(LINE_SLOTS);
    if (list == NULL)
        return NULL;
    for (int s = 0; s < LINE_SLOTS; s++) {
        PyObject *v = PyLong_FromLongLong(
            atomic_load_explicit(&values[s], memory_order_relaxed));
        if (v == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, s, v);
    }
    return list;
}

PyObject *
Tracer_line(uint32_t line)
{
    LineRec *r = LineTable_get(&T.lines, line);
    if (r == NULL || r->code == 0
        || (Py_ssize_t)r->code > PyList_GET_SIZE(T.codes)) {
        PyErr_Format(PyExc_ValueError, "no line %u", line);
        return NULL;
    }
    return Py_BuildValue("(Oi)", PyList_GET_ITEM(T.codes, r->code - 1),
                         r->lineno);
}

PyObject *
Tracer_line_stats(void)
{
    PyObject *result = PyList_New(0);
    if (result == NULL)
        return NULL;
    uint32_t n = atomic_load(&T.lines.count);
    for (uint32_t id = 1; id <= n; id++) {
        LineRec *r = LineTable_get(&T.lines, id);
        uint64_t hits = atomic_load_explicit(&r->hits, memory_order_relaxed);
        int any = hits != 0;
        for (int s = 0; s < LINE_SLOTS && !any; s++)
            any = atomic_load_explicit(&r->alloc[s], memory_order_relaxed) != 0;
        if (!any)
            continue;
        PyObject *alloc = slots_list(r->alloc), *peak = slots_list(r->peak);
        PyObject *peak_r = slots_list(r->peak_reserved);
        PyObject *last = slots_list(r->last_total);
        PyObject *t = NULL;
        if (alloc && peak && peak_r && last)
            t = Py_BuildValue("(IOiKOOOO)", id,
                              PyList_GET_ITEM(T.codes, r->code - 1), r->lineno,
                              (unsigned long long)hits, alloc, peak, peak_r,
                              last);
        Py_XDECREF(alloc);
        Py_XDECREF(peak);
        Py_XDECREF(peak_r);
        Py_XDECREF(last);
        if (t == NULL || PyList_Append(result, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(result);
            return NULL;
        }
        Py_DECREF(t);
    }
    return result;
}

PyObject *
Tracer_reset_lines(void)
{
    LineTable_reset(&T.lines);
    Py_RETURN_NONE;
}

PyObject *
Tracer_site(uint32_t site)
{
    const SiteRec *r = SiteTable_get(&T.sites, site);
    if (r == NULL) {
        PyErr_Format(PyExc_ValueError, "no site %u", site);
        return NULL;
    }
    PyObject *chain = PyList_New(r->n);
    if (chain == NULL)
        return NULL;
    for (uint32_t i = 0; i < r->n; i++) {
        PyObject *t = Tracer_line(r->lines[i]);
        if (t == NULL) {
            Py_DECREF(chain);
            return NULL;
        }
        PyList_SET_ITEM(chain, i, t);
    }
    return chain;
}

PyObject *
Tracer_status(void)
{
    return Py_BuildValue(
        "{s:s,s:i,s:O,s:n,s:I,s:I}",
        "backend", MEMLAB_SYSMON ? "sys.monitoring" : "PyEval_SetTrace",
        "tool", T.tool,
        "tracing", atomic_load(&T.tracing) ? Py_True : Py_False,
        "codes", T.codes == NULL ? (Py_ssize_t)0 : PyList_GET_SIZE(T.codes),
        "lines", atomic_load(&T.lines.count),
        "sites", atomic_load(&T.sites.count));
}
