/* The tracer's event source before Python 3.12: a C trace function
 * (PyEval_SetTrace) on the measuring thread.  CPython calls it for every
 * call and return of every frame while it is set, which is why measured
 * tests trace only in windows around user code (tracing.py); line events
 * are turned off in frames out of scope, and in frames that were running
 * before tracing began.  The sys.monitoring callbacks exist as no-ops so
 * that the module's method table is the same on every Python.
 */
#include "tracer_internal.h"

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
    CodeInfo *ci = Tracer_code_info((PyObject *)code);
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
            if (what == PyTrace_CALL)
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

int
Backend_on(void)
{
    PyEval_SetTrace(trace_fn, NULL);
    return 0;
}

int
Backend_off(void)
{
    PyThreadState *ts = PyThreadState_Get();
    if (ts->c_tracefunc == trace_fn)
        PyEval_SetTrace(NULL, NULL);
    return 0;
}

int
Backend_forget_disables(void)
{
    return 0;
}
#endif
