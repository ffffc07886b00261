/* The tracer's event source before Python 3.12: a C trace function
 * (PyEval_SetTrace) on the measuring thread.  CPython calls it for every
 * call and return of every frame while it is set, which is why measured
 * tests trace only in windows around user code (tracing.py); line events
 * are turned off in frames out of scope, and in frames that were running
 * before tracing began.
 *
 * On 3.11 a frame-evaluation hook (PEP 523) keeps code out of scope from
 * paying for the trace function at all: while a window is open it sees each
 * frame start and runs it with the interpreter's tracing mode on only where
 * the code is in scope (or a phase function), and off for out-of-scope code
 * and everything that code calls, down to the next frame in scope.  Without
 * it, 3.11 runs every frame in tracing mode (unspecialised, each call and
 * return reported), in scope or not: most of what a measured test paid on a
 * suite that calls much library code.  The sys.monitoring callbacks exist as
 * no-ops so that the module's method table is the same on every Python.
 */
#include "tracer_internal.h"
#include "phase_labels.h"

#include <stdlib.h>
#include <string.h>

#if !MEMLAB_SYSMON

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

/* A frame's f_trace_lines, written in place: PyObject_SetAttrString made a
 * string and looked the member up on every call of out-of-scope code, the
 * largest part of the tracer's cost on a suite whose tests call much
 * library code.  3.10 declares the frame's struct; 3.11 keeps it internal,
 * with the same leading fields for every 3.11 release (mirrored here). */
#if PY_VERSION_HEX >= 0x030B0000
typedef struct {
    PyObject_HEAD
    PyFrameObject *f_back;
    void *f_frame;
    PyObject *f_trace;
    int f_lineno;
    char f_trace_lines;
} FrameHead;
#define FRAME_TRACE_LINES(frame) (((FrameHead *)(frame))->f_trace_lines)
#else
#include <frameobject.h>
#define FRAME_TRACE_LINES(frame) ((frame)->f_trace_lines)
#endif

#if PY_VERSION_HEX >= 0x030B0000
/* 3.11's _PyInterpreterFrame keeps these fields at these places in every
 * 3.11 release (Include/internal/pycore_frame.h, mirrored: the internal
 * header needs Py_BUILD_CORE); layout_check tests them on a live frame
 * before the hook goes in or a frame is located. */
typedef struct {
    PyObject *f_func;
    PyObject *f_globals;
    PyObject *f_builtins;
    PyObject *f_locals;
    PyCodeObject *f_code;
    PyObject *frame_obj;
    void *previous;
    _Py_CODEUNIT *prev_instr;
    int stacktop;
    _Bool is_entry;
    char owner;
    PyObject *localsplus[1];    /* the arguments first, in their order */
} InterpFrameHead;
#define INTERP_FRAME_CODE(f) (((InterpFrameHead *)(f))->f_code)
static int layout_ok = -1;          /* -1: not checked yet */

static const void *
frame_where(PyFrameObject *frame)
{
    return ((FrameHead *)frame)->f_frame;
}

int
Backend_lasti(const void *where)
{
    const InterpFrameHead *f = where;
    const _Py_CODEUNIT *first = (const _Py_CODEUNIT *)f->f_code->co_code_adaptive;
    return (int)(f->prev_instr - first) * (int)sizeof(_Py_CODEUNIT);
}

/* True if the frame's first local reads the same from localsplus as from
 * its locals (the hook reads a phase's subject there: phase_local). */
static int
locals_check(const InterpFrameHead *f, PyFrameObject *frame)
{
    PyCodeObject *code = f->f_code;
    if (code->co_nlocalsplus < 1 || f->localsplus[0] == NULL)
        return 1;   /* nothing to compare: the hook then finds no subject either */
    PyObject *locals = PyFrame_GetLocals(frame);
    if (locals == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *v = PyObject_GetItem(locals, PyTuple_GET_ITEM(code->co_localsplusnames, 0));
    Py_DECREF(locals);
    if (v == NULL)
        PyErr_Clear();
    PyObject *raw = f->localsplus[0];
    int same = v != NULL && (raw == v || (PyCell_Check(raw) && PyCell_GET(raw) == v));
    Py_XDECREF(v);
    return same;
}

/* True if the mirrored frame layout holds on this interpreter: the code
 * and the frame object of the frame that called into memlab, read both
 * ways. */
static int
layout_check(void)
{
    if (layout_ok >= 0)
        return layout_ok;
    PyFrameObject *frame = PyEval_GetFrame();
    if (frame == NULL)
        return 0;   /* asked again with a frame */
    PyCodeObject *code = PyFrame_GetCode(frame);
    const InterpFrameHead *f = frame_where(frame);
    layout_ok = f != NULL && f->f_code == code && f->frame_obj == (PyObject *)frame
                && Backend_lasti(f) == PyFrame_GetLasti(frame) && locals_check(f, frame);
    Py_DECREF(code);
    return layout_ok;
}

int
Backend_can_locate(void)
{
    return layout_ok == 1;
}
#else
static const void *frame_where(PyFrameObject *frame) { (void)frame; return NULL; }
int Backend_lasti(const void *where) { (void)where; return -1; }
static int layout_check(void) { return 0; }
int Backend_can_locate(void) { return 0; }
#endif

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
    CodeInfo *ci = Tracer_known_code((PyObject *)code);
    int lines_off = ci != NULL && !ci->in_scope && what != PyTrace_RETURN;
    if (ci != NULL && ci->phase) {
        if (what == PyTrace_CALL)
            Tracer_phase_enter(Tracer_thread(), ci, frame);
        else if (what == PyTrace_RETURN)
            Tracer_phase_leave(Tracer_thread_if_any(), ci);
    }
    else if (ci != NULL && ci->in_scope) {
        ShadowStack *t = Tracer_thread();
        if (t != NULL) {
            if (ci->located) {
                /* Its line is found at allocation: no line events.  The
                 * frame hook pushes and pops it where it is in; here only
                 * a frame it did not push (no hook, or a profiler beside
                 * memlab's trace function). */
                const void *where = frame_where(frame);
                if (what == PyTrace_CALL && !ShadowStack_is_top(t, where))
                    ShadowStack_push_located(t, ci->code_id, where, ci);
                else if (what == PyTrace_RETURN)
                    ShadowStack_pop_located(t, &T.clock, where);
                lines_off = 1;
            }
            else if (what == PyTrace_CALL)
                ShadowStack_push(t, &T.clock, ci->code_id, PyFrame_GetLineNumber(frame));
            else if (what == PyTrace_LINE)
                lines_off = !ShadowStack_line(t, &T.clock, ci->code_id,
                                         PyFrame_GetLineNumber(frame));
            else
                ShadowStack_pop(t, &T.clock, ci->code_id);
        }
    }
    if (lines_off) {
        /* Out of scope, or running since before tracing began: no line
         * events from this frame. */
        FRAME_TRACE_LINES(frame) = 0;
    }
    Py_DECREF(code);
    in_callback = 0;
    return 0;
}

/* builtins.__import__ while tracing: the import machinery's frames and the
 * imported modules' top-level code run untraced (a large harness imported
 * by a measured child cost it about 0.25 s of trace calls); the trace
 * function comes back when the outermost import returns, for the frame
 * that imported.  What a module allocates at its import goes to no line. */
static PyObject *
untraced_import(PyObject *original, PyObject *args, PyObject *kwargs)
{
    PyThreadState *ts = PyThreadState_Get();
    int traced = ts->c_tracefunc == trace_fn;
    if (traced)
        PyEval_SetTrace(NULL, NULL);
    PyObject *result = PyObject_Call(original, args, kwargs);
    if (traced && ts->c_tracefunc == NULL && atomic_load(&T.tracing)) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);    /* the import's error, kept */
        PyEval_SetTrace(trace_fn, NULL);
        PyErr_Clear();                      /* an audit hook's refusal: tracing stays off */
        PyErr_Restore(type, value, tb);
    }
    return result;
}

static PyMethodDef untraced_import_def = {
    "__import__", (PyCFunction)(void (*)(void))untraced_import, METH_VARARGS | METH_KEYWORDS,
    "__import__(name, globals=None, locals=None, fromlist=(), level=0): the builtin's, with "
    "pytest-memlab's trace function off while it runs.",
};

PyObject *
Tracer_untraced_imports(PyObject *original)
{
    return PyCFunction_NewEx(&untraced_import_def, original, NULL);
}

#if PY_VERSION_HEX >= 0x030B0000
/* The evaluation function the hook hands frames to: CPython's, or whatever
 * another tool had installed (torch.compile's, say) when the hook went in. */
static _PyFrameEvalFunction next_eval;
/* About 0.3 to 0.5 KiB of C stack a level with a hook in (measured on
 * 3.11: a 1 MiB thread stack held 2000 levels of a recursive function, not
 * 4000; none is used without one): 5000 levels stay within 2.5 MiB of a
 * thread's 8 MiB. */
#define HOOK_RECURSION_LIMIT 5000

/* The decisions the hook read last, by code object.  Tracer_known_code
 * reads the code's extras and then its CodeInfo: two dependent reads of
 * memory that a suite's thousands of functions keep out of the
 * processor's caches (on kornia's augmentation tests, most of the hook's
 * own time).  This table is small and read for every frame, so it stays
 * cached; what the hook needs of a decision is copied into it.  Under the
 * GIL; an entry is read only in its decision's epoch and goes with its
 * code (Backend_code_freed), before another code can take the address. */
#define HOOK_CACHE_SIZE 1024
typedef struct {
    const PyObject *code;
    CodeInfo *ci;
    uint32_t epoch;
    uint32_t code_id;
    uint8_t want;               /* the tracing mode to run it in */
    uint8_t located;
    uint8_t phase;
} HookDecision;
static HookDecision hook_cache[HOOK_CACHE_SIZE];

static inline HookDecision *
hook_cache_slot(const void *code)
{
    uintptr_t h = (uintptr_t)code;
    return &hook_cache[((h >> 4) ^ (h >> 14)) & (HOOK_CACHE_SIZE - 1)];
}

void
Backend_code_freed(const CodeInfo *ci)
{
    HookDecision *e = hook_cache_slot(ci->code);
    if (e->code == (const PyObject *)ci->code)
        e->code = NULL;
}

/* After a frame's evaluation, which wrote its own tracing mode into its
 * caller's: the caller's own mode back (off if the trace function went
 * away meanwhile). */
static inline void
mode_give_back(PyThreadState *ts, _PyCFrame *caller, uint8_t was)
{
    if (ts->cframe == caller)
        caller->use_tracing = ts->c_tracefunc != NULL || ts->c_profilefunc != NULL ? was : 0;
}

/* A phase's subject or a forward's inputs (Tracer_phase_enter_read), read
 * from a frame that has not run yet: its arguments are in place in
 * localsplus, none made a cell yet (MAKE_CELL is its first instruction). */
static PyObject *
phase_local(const void *where, int kind, int inputs)
{
    const char *name;
    int first_item;
    if (!PhaseLabel_local(kind, inputs, &name, &first_item))
        return NULL;
    const InterpFrameHead *f = where;
    PyCodeObject *code = f->f_code;
    Py_ssize_t args = code->co_argcount + code->co_kwonlyargcount
                      + ((code->co_flags & CO_VARARGS) != 0) + ((code->co_flags & CO_VARKEYWORDS) != 0);
    for (Py_ssize_t i = 0; i < args && i < PyTuple_GET_SIZE(code->co_localsplusnames); i++) {
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(code->co_localsplusnames, i), name) != 0)
            continue;
        PyObject *v = PhaseLabel_pick(f->localsplus[i], first_item);
        Py_XINCREF(v);
        return v;
    }
    return NULL;
}

/* A phase function called inside one of its own kind (a module's forward
 * calling its children's): only the depth of the outermost counts
 * (Tracer_phase_enter and _leave), kept here around its evaluation
 * without its events.  The depth is put back as it was, not decremented:
 * the tracing mode can come back on inside the call (a callee that set a
 * profile function, or memlab's own import hook, writes its mode back to
 * its caller), and the frame's return then reaches trace_fn, which
 * decrements it too. */
static PyObject *
eval_nested_phase(_PyFrameEvalFunction next, PyThreadState *ts, struct _PyInterpreterFrame *f,
                  int throwflag, ShadowStack *t, int phase)
{
    int before = t->phase_depth[phase];
    t->phase_depth[phase] = before + 1;
    _PyCFrame *caller = ts->cframe;
    uint8_t was = caller->use_tracing;
    caller->use_tracing = 0;
    PyObject *result = next(ts, f, throwflag);
    mode_give_back(ts, caller, was);
    /* (lower if the tracer started again meanwhile: Tracer_start resets it) */
    if (t->phase_depth[phase] > before)
        t->phase_depth[phase] = before;
    return result;
}

static PyObject *
eval_hook(PyThreadState *ts, struct _PyInterpreterFrame *f, int throwflag)
{
    _PyFrameEvalFunction next = next_eval != NULL ? next_eval : _PyEval_EvalFrameDefault;
    /* Only the measuring thread's frames, while memlab's trace function is
     * the only one (a profiler set beside it keeps every frame's events). */
    if (ts->c_tracefunc != trace_fn || ts->c_profilefunc != NULL || in_callback)
        return next(ts, f, throwflag);
    PyObject *code = (PyObject *)INTERP_FRAME_CODE(f);
    HookDecision *e = hook_cache_slot(code), d;
    if (e->code == code && e->epoch == T.epoch) {
        d = *e;
    }
    else {
        in_callback = 1;
        CodeInfo *ci;
        if (PyErr_Occurred()) {
            /* A generator resumed by throw(): the scope decision runs Python. */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            ci = Tracer_code_info(code);
            PyErr_Restore(type, value, tb);
        }
        else {
            ci = Tracer_known_code(code);
        }
        in_callback = 0;
        d = (HookDecision){.code = code, .ci = ci, .epoch = T.epoch};
        if (ci != NULL) {
            d.code_id = ci->code_id;
            d.want = (ci->in_scope && !ci->located) || ci->phase ? 255 : 0;
            d.located = ci->located != 0;
            d.phase = (uint8_t)ci->phase;
            if (ci->decided == T.epoch)
                *e = d;     /* (undecided, or decided on another thread since: asked again) */
        }
    }
    /* The outermost call of a phase function: its start and end heard
     * here, around its evaluation, and the frame run without the tracing
     * mode, like library code.  In the tracing mode its own body ran
     * unspecialised, each instruction checked for a new line
     * (torch.autograd.backward's forty lines, in every test that calls
     * backward).  A generator's frame may resume (its cells made, its
     * arguments gone): the tracing mode and trace_fn hear it as before. */
    ShadowStack *phased = NULL;
    if (d.phase) {
        ShadowStack *t = Tracer_thread_if_any();
        if (t != NULL && t->phase_depth[d.phase] > 0)
            return eval_nested_phase(next, ts, f, throwflag, t, d.phase);
        if (!throwflag && !(((PyCodeObject *)code)->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR)))
            phased = Tracer_thread();
    }
    _PyCFrame *caller = ts->cframe;
    uint8_t was = caller->use_tracing;
    uint8_t want = d.want;
    int started = 0;
    if (phased != NULL) {
        want = 0;
        caller->use_tracing = 0;    /* the phase hook's own Python too */
        in_callback = 1;
        started = Tracer_phase_enter_read(phased, d.ci, phase_local, f);
        in_callback = 0;
    }
    /* A located frame is pushed and popped here, around its evaluation
     * (a generator's each time it resumes), and runs untraced like
     * library code: its line is found at allocation. */
    ShadowStack *located = NULL;
    if (d.located && (located = Tracer_thread()) != NULL)
        ShadowStack_push_located(located, d.code_id, f, d.ci);
    /* The frame's evaluation copies its caller's mode on entry and writes
     * its own back on exit: set it around the call, then give the caller
     * its own back. */
    if (want != was)
        caller->use_tracing = want;
    PyObject *result = next(ts, f, throwflag);
    if (located != NULL)
        ShadowStack_pop_located(located, &T.clock, f);
    /* Where the tracing mode came back on inside (a profile function
     * set), the frame's return reached trace_fn, which ended the phase
     * first: it is not ended twice. */
    if (started && phased->phase_depth[d.phase] > 0) {
        caller->use_tracing = 0;
        in_callback = 1;
        Tracer_phase_leave(phased, d.ci);
        in_callback = 0;
    }
    if (want != was || phased != NULL)
        mode_give_back(ts, caller, was);
    return result;
}

static void
eval_hook_install(void)
{
    const char *setting = getenv("MEMLAB_EVAL_HOOK");
    if (setting != NULL && strcmp(setting, "0") == 0)
        return;
    /* With the hook in, CPython calls every Python function through C (no
     * inlined calls), a C stack frame per level: a recursion limit raised
     * far past the default could then overflow the C stack where the test
     * unmeasured would not.  Above HOOK_RECURSION_LIMIT the trace function
     * runs alone, as without the hook. */
    if (Py_GetRecursionLimit() > HOOK_RECURSION_LIMIT || !layout_check())
        return;
    PyInterpreterState *interp = PyInterpreterState_Get();
    _PyFrameEvalFunction current = _PyInterpreterState_GetEvalFrameFunc(interp);
    if (current == eval_hook)
        return;
    next_eval = current;
    _PyInterpreterState_SetEvalFrameFunc(interp, eval_hook);
}

static void
eval_hook_remove(void)
{
    PyInterpreterState *interp = PyInterpreterState_Get();
    /* Another tool's hook that went in after memlab's calls memlab's in
     * turn, which passes every frame on while no window is open: left. */
    if (_PyInterpreterState_GetEvalFrameFunc(interp) == eval_hook && next_eval != NULL) {
        _PyInterpreterState_SetEvalFrameFunc(interp, next_eval);
        next_eval = NULL;
    }
}

int
Backend_hooked(void)
{
    return _PyInterpreterState_GetEvalFrameFunc(PyInterpreterState_Get()) == eval_hook
           || next_eval != NULL;
}
#else
static void eval_hook_install(void) {}
static void eval_hook_remove(void) {}
int Backend_hooked(void) { return 0; }
void Backend_code_freed(const CodeInfo *ci) { (void)ci; }
#endif

int
Backend_on(void)
{
    (void)layout_check();   /* before any frame is located */
    PyEval_SetTrace(trace_fn, NULL);
    eval_hook_install();
#if PY_VERSION_HEX >= 0x030B0000
    /* PyEval_SetTrace turned the tracing mode on for the frames running
     * now (pytest's, a whole chain of them inlined in one evaluation loop),
     * and each evaluation hands its mode back to its caller's: they would
     * run unspecialised, each call and return reported, until the window
     * closes.  With the hook in, only frames it starts need the mode (a
     * profiled function, a phase function): the running ones go on
     * without it, as frames running before tracing began always did. */
    if (Backend_hooked())
        PyThreadState_Get()->cframe->use_tracing = 0;
#endif
    return 0;
}

int
Backend_off(void)
{
    PyThreadState *ts = PyThreadState_Get();
    if (ts->c_tracefunc == trace_fn)
        PyEval_SetTrace(NULL, NULL);
    eval_hook_remove();
    return 0;
}

int
Backend_forget_disables(void)
{
    return 0;
}
#endif
