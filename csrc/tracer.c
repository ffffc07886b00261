/* The tracer's core: its state, the scope decision per code object, the
 * threads' shadow stacks, the attribution of each allocation, and the API
 * the module exposes.  The event sources are tracer_sysmon.c (Python >=
 * 3.12) and tracer_settrace.c (before).
 */
#include "tracer_internal.h"

#include <sched.h>
#include <time.h>

#include <stdlib.h>

#include "phase_labels.h"

TracerState T;
_Thread_local int in_callback;
/* The calling thread's stack: what the allocator path reads first, so a
 * thread-local, not a lookup in T.threads. */
static _Thread_local ShadowStack *tls_stack;

/* -- errors: never raised from a callback ----------------------------- */

void
Tracer_store_error(void)
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

int extras_mirrored = -1;   /* -1: not checked yet */

/* A thread that finds a code's scope being decided on another waits at
 * most this long for it (Tracer_code_info). */
#define DECISION_WAIT_YIELDS 64
#define DECISION_WAIT_SLEEPS 2000      /* of 1 ms */

#if PY_VERSION_HEX >= 0x030B0000
static void lines_check(PyCodeObject *code);
#endif

/* A code's CodeInfo, and its table of lines, go with the code. */
static void
CodeInfo_free(void *info)
{
    CodeInfo *ci = info;
    if (ci != NULL) {
        Backend_code_freed(ci);
        free(atomic_load_explicit(&ci->lines, memory_order_relaxed));
    }
    free(ci);
}

/* Whether CodeExtras reads code's extras as the interpreter does (ci just
 * set or read there). */
static int
extras_mirror_check(PyObject *code, const CodeInfo *ci)
{
#if PY_VERSION_HEX < 0x030A0000 || PY_VERSION_HEX >= 0x030F0000
    (void)code;
    (void)ci;
    return 0;   /* a layout not checked here: the interpreter's reader only */
#endif
    const CodeExtras *x = ((PyCodeObject *)code)->co_extra;
    return x != NULL && T.extra_index < x->ce_size && x->ce_extras[T.extra_index] == ci;
}

CodeInfo *
Tracer_code_info(PyObject *code)
{
    void *extra = NULL;
    if (Code_GetExtra(code, T.extra_index, &extra) < 0) {
        Tracer_store_error();
        return NULL;
    }
    CodeInfo *ci = extra;
    if (ci == NULL) {
        ci = calloc(1, sizeof(CodeInfo));
        if (ci == NULL)
            return NULL;
        if (Code_SetExtra(code, T.extra_index, ci) < 0) {
            CodeInfo_free(ci);
            Tracer_store_error();
            return NULL;
        }
        ci->code = (PyCodeObject *)code;
    }
    if (extras_mirrored < 0)
        extras_mirrored = extras_mirror_check(code, ci);
again:
    if (ci->decided == T.epoch)
        return ci;
    unsigned long me = PyThread_get_thread_ident();
    if (ci->deciding) {
        /* The decision's own Python, on the deciding thread: undecided
         * (nothing is disabled on an answer not yet made). */
        if (ci->decider == me)
            return NULL;
        /* Another thread's decide() let the GIL go mid-decision (two
         * threads starting the same function at once): deciding here too,
         * or reading "out" from the half-made decision, would disable the
         * code for good on sys.monitoring.  The decision is that thread's
         * to finish: waited for with the GIL let go, yielding, then
         * sleeping a millisecond at a time, for at most about 2 s (then
         * undecided here: this call goes unfollowed, nothing is disabled,
         * and no wait can hang a test). */
        for (int i = 0; ci->deciding; i++) {
            if (i >= DECISION_WAIT_YIELDS + DECISION_WAIT_SLEEPS)
                return NULL;
            Py_BEGIN_ALLOW_THREADS
            if (i < DECISION_WAIT_YIELDS)
                sched_yield();
            else
                nanosleep(&(struct timespec){0, 1000000}, NULL);
            Py_END_ALLOW_THREADS
        }
        goto again;
    }
    uint32_t epoch = T.epoch;
    int in_scope = 0, located = 0, phase = PHASE_NONE;
    ci->deciding = 1;
    ci->decider = me;
    if (T.decide != NULL) {
        /* True: in scope; an int 1 + PHASE_*: a phase function.  The
         * collector is held off meanwhile: a collection inside decide()
         * would run the finalizers of whatever it frees on this thread,
         * inside the test's call, while another thread may wait here for
         * the decision (a finalizer that takes a lock that thread holds
         * would never let it end). */
        int collecting = PyGC_Disable();
        PyObject *r = PyObject_CallOneArg(T.decide, code);
        if (collecting)
            PyGC_Enable();
        long verdict = -1;
        if (r != NULL && PyLong_CheckExact(r))
            verdict = PyLong_AsLong(r);
        else if (r != NULL)
            verdict = PyObject_IsTrue(r);
        Py_XDECREF(r);
        if (verdict < 0 && PyErr_Occurred())
            Tracer_store_error();
        else if (verdict > 1 && verdict - 1 < PHASE_KINDS)
            phase = (int)(verdict - 1);
        else if (verdict == SCOPE_LOCATED)
            in_scope = located = 1;
        else
            in_scope = verdict == 1;
        located &= Backend_can_locate();
#if PY_VERSION_HEX >= 0x030B0000
        if (located)
            lines_check((PyCodeObject *)code);
#endif
    }
    if (in_scope && ci->code_id == 0) {
        if (PyList_Append(T.codes, code) < 0) {
            Tracer_store_error();
            in_scope = located = 0;
        }
        else {
            ci->code_id = (uint32_t)PyList_GET_SIZE(T.codes);
        }
    }
    /* Made whole before it is seen as made (Tracer_known_code reads only
     * a decision of this epoch). */
    ci->in_scope = in_scope;
    ci->located = located;
    ci->phase = phase;
    ci->decided = epoch;
    ci->deciding = 0;
    if (epoch != T.epoch)
        goto again;     /* the rules changed while deciding: decided anew */
    return ci;
}

/* -- threads ------------------------------------------------------------ */

ShadowStack *
Tracer_thread_if_any(void)
{
    return tls_stack;
}

ShadowStack *
Tracer_thread(void)
{
    ShadowStack *t = tls_stack;
    if (t != NULL)
        return t;
    t = ShadowStack_new();
    if (t == NULL)
        return NULL;
    t->next = T.threads;
    T.threads = t;
    tls_stack = t;
    return t;
}

/* -- phases --------------------------------------------------------------- */

/* The measuring thread's phases, for each phase's peak (kept.h): other
 * threads' phases (a forward in a pool thread) are theirs, not the test's. */
static void
publish_phases(ShadowStack *t)
{
    if (t != atomic_load_explicit(&T.anchor, memory_order_acquire))
        return;
    unsigned mask = 0;
    for (int k = 1; k < PHASE_KINDS; k++)
        if (t->phase_depth[k] > 0)
            mask |= 1u << k;
    Engine_set_phases(T.engine, mask);
}

/* The phase hook (memory by kind: a walk of the module's or optimizer's
 * tensors at the boundary) with kind, negated at the phase's end, its
 * subject and a forward's positional arguments.  Called where the scope
 * decision is: in a callback, whose own frames are not traced; what the
 * hook raises waits for the next API call, and an exception being
 * propagated through the phase's frame is kept. */
static void
call_phase_hook(int kind, PyObject *subject, PyObject *inputs)
{
    PyObject *hook = T.phase_hook;
    if (hook == NULL)
        return;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *pending = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
#endif
    Py_INCREF(hook);
    PyObject *r = PyObject_CallFunction(hook, "iOO", kind,
                                        subject != NULL ? subject : Py_None,
                                        inputs != NULL ? inputs : Py_None);
    Py_DECREF(hook);
    if (r == NULL)
        Tracer_store_error();
    Py_XDECREF(r);
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(pending);
#else
    PyErr_Restore(type, value, tb);
#endif
}

/* A phase's subject or a forward's inputs, read from a frame object
 * (Tracer_phase_enter's reader for Tracer_phase_enter_read). */
static PyObject *
frame_local(const void *where, int kind, int inputs)
{
    PyFrameObject *frame = (PyFrameObject *)where;
    return inputs ? PhaseLabel_inputs(kind, frame) : PhaseLabel_subject(kind, frame);
}

void
Tracer_phase_enter(ShadowStack *t, const CodeInfo *ci, PyFrameObject *frame)
{
    Tracer_phase_enter_read(t, ci, frame_local, frame);
}

int
Tracer_phase_enter_read(ShadowStack *t, const CodeInfo *ci,
                        PyObject *(*read)(const void *where, int kind, int inputs),
                        const void *where)
{
    /* Only the outermost call of each kind starts a phase: a module's
     * forward calls its children's, a step may call another's. */
    if (t == NULL || t->phase_depth[ci->phase]++ > 0)
        return 0;
    /* The phase hook hears only the measuring thread's phases (a forward's
     * inputs are read for it alone: on 3.11 a frame's locals). */
    int hook = T.phase_hook != NULL && t == atomic_load_explicit(&T.anchor, memory_order_acquire);
    PyObject *inputs = hook ? read(where, ci->phase, 1) : NULL;
    PyObject *subject = read(where, ci->phase, 0);
    char label[PHASE_LABEL];
    PhaseLabel_format(label, sizeof label, ci->phase, ci->code, subject);
    for (int slot = 0, slots = Engine_slots(T.engine); slot < slots; slot++) {
        uint64_t seq;
        if (Engine_timeline_seq(T.engine, slot, &seq) == 0)
            PhaseLog_add(&T.phases, ci->phase, slot, seq, label);
    }
    publish_phases(t);
    if (hook) {
        call_phase_hook(ci->phase, subject, inputs);
        /* Until the phase ends, for the walk there (the frame holds it
         * meanwhile; Tracer_set_phase_hook lets go of what is left). */
        Py_XSETREF(T.phase_subject[ci->phase], subject);
        subject = NULL;
    }
    Py_XDECREF(subject);
    Py_XDECREF(inputs);
    return 1;
}

void
Tracer_phase_leave(ShadowStack *t, const CodeInfo *ci)
{
    if (t == NULL || t->phase_depth[ci->phase] == 0)
        return;
    if (--t->phase_depth[ci->phase] > 0)
        return;
    /* Its end too, so that a peak can be told to fall inside it. */
    for (int slot = 0, slots = Engine_slots(T.engine); slot < slots; slot++) {
        uint64_t seq;
        if (Engine_timeline_seq(T.engine, slot, &seq) == 0)
            PhaseLog_add(&T.phases, -ci->phase, slot, seq, "");
    }
    publish_phases(t);
    if (T.phase_hook != NULL && t == atomic_load_explicit(&T.anchor, memory_order_acquire)) {
        PyObject *subject = T.phase_subject[ci->phase];
        T.phase_subject[ci->phase] = NULL;
        call_phase_hook(-ci->phase, subject, NULL);
        Py_XDECREF(subject);
    }
}

PyObject *
Tracer_set_phase_hook(PyObject *hook)
{
    Py_XSETREF(T.phase_hook, hook == Py_None ? NULL : Py_NewRef(hook));
    for (int k = 0; k < PHASE_KINDS; k++)
        Py_CLEAR(T.phase_subject[k]);
    Py_RETURN_NONE;
}

PyObject *
Tracer_phases(void)
{
    PyObject *list = PyList_New(T.phases.n);
    if (list == NULL)
        return NULL;
    for (uint32_t i = 0; i < T.phases.n; i++) {
        const PhaseRec *r = &T.phases.recs[i];
        PyObject *t = Py_BuildValue("(iiKs)", r->kind, r->slot,
                                    (unsigned long long)r->seq, r->label);
        if (t == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, t);
    }
    PyObject *result = Py_BuildValue("(OK)", list,
                                     (unsigned long long)T.phases.dropped);
    Py_DECREF(list);
    return result;
}

/* -- the allocator's path --------------------------------------------- */

/* The engine's attribution function, for every allocation, on any thread,
 * without the GIL and without a lock: it charges the bytes to the running
 * user line (and the line's peak totals) and returns the site that the
 * thread interned for its user call chain when the line began.  Threads
 * with no user frame (autograd's device threads) allocate on behalf of the
 * measuring thread's current line. */
static uint32_t
tracer_attribute(void *ctx, int slot, int64_t size, int64_t total,
                 int64_t reserved)
{
    (void)ctx;
    if (!atomic_load_explicit(&T.tracing, memory_order_relaxed))
        return 0;
    ShadowStack *t = tls_stack;
    int owner = 1;
    if (t == NULL || atomic_load_explicit(&t->depth, memory_order_acquire) == 0) {
        t = atomic_load_explicit(&T.anchor, memory_order_acquire);
        owner = t == tls_stack;
    }
    if (t == NULL)
        return 0;
    /* size 0: a request that failed (engine.c): its site, nothing charged */
    return ShadowStack_attribute(t, &T.clock, owner, slot, size, total,
                                 reserved);
}

#if PY_VERSION_HEX >= 0x030B0000
/* CPython's _PyLineTable_InitAddressRange (internal; the same from 3.11
 * on): a range before the code's first instruction, from which
 * _PyCode_CheckLineNumber walks forward.  lines_mirrored checks the first
 * table made against PyCode_Addr2Line, instruction by instruction. */
static void
address_range_init(PyCodeObject *code, PyCodeAddressRange *r)
{
    r->opaque.lo_next = (const uint8_t *)PyBytes_AS_STRING(code->co_linetable);
    r->opaque.limit = r->opaque.lo_next + PyBytes_GET_SIZE(code->co_linetable);
    r->ar_start = -1;
    r->ar_end = 0;
    r->opaque.computed_line = code->co_firstlineno;
    r->ar_line = -1;
}

static atomic_int lines_mirrored = -1;     /* -1: not checked yet */
/* Bytes of an instruction (code unit), 3.11 to 3.13: Py_SIZE(code) counts
 * them, and offsets are in bytes (the unit's type is internal on 3.13). */
#define CODE_UNIT 2
/* The check compares at most this many instructions (PyCode_Addr2Line
 * scans from the table's start at each: quadratic). */
#define LINES_CHECKED 2048

/* The code's CodeLines in one pass over its line table (each range of
 * instructions on one line at once); NULL when out of memory or before
 * lines_check found the pass to agree with the interpreter.  Reads only
 * the code's immutable line table and allocates with malloc: on any
 * thread, without the GIL. */
static CodeLines *
CodeLines_new(PyCodeObject *code, int checking)
{
    const int unit = CODE_UNIT;
    Py_ssize_t n = Py_SIZE(code);
    if (n <= 0 || n > INT32_MAX / unit || (!checking && atomic_load(&lines_mirrored) != 1))
        return NULL;
    CodeLines *t = malloc(sizeof(CodeLines) + (size_t)n * sizeof(int32_t));
    if (t == NULL)
        return NULL;
    t->n = (int32_t)n;
    PyCodeAddressRange r;
    address_range_init(code, &r);
    int addr = 0, limit = (int)n * unit;
    while (addr < limit) {
        int line = _PyCode_CheckLineNumber(addr, &r);
        /* A table that ends early: -1 to the end, as PyCode_Addr2Line
         * reads each of those instructions. */
        int end = r.ar_end > addr && r.ar_end < limit ? r.ar_end : limit;
        for (; addr < end; addr += unit)
            t->line[addr / unit] = line;
    }
    return t;
}

/* Once, under the GIL, with the first code decided located (before any
 * line is looked up under it): whether one pass over its line table reads
 * what PyCode_Addr2Line reads, instruction by instruction.  Under the GIL,
 * because 3.11's PyCode_Addr2Line reads an array of lines that the
 * interpreter may be filling for a traced code. */
static void
lines_check(PyCodeObject *code)
{
    if (atomic_load(&lines_mirrored) >= 0)
        return;
    CodeLines *t = CodeLines_new(code, 1);
    if (t == NULL)
        return;     /* asked again with the next one */
    int same = 1;
    for (int i = 0; i < t->n && i < LINES_CHECKED && same; i++)
        same = t->line[i] == PyCode_Addr2Line(code, i * CODE_UNIT);
    free(t);
    atomic_store(&lines_mirrored, same);
}
#endif

/* 1: located codes' lines come from CodeLines; 0: from PyCode_Addr2Line
 * (an interpreter where the pass disagreed, or before 3.11); -1: not
 * checked yet (no table made). */
static int
line_tables_status(void)
{
#if PY_VERSION_HEX >= 0x030B0000
    return atomic_load(&lines_mirrored);
#else
    return 0;
#endif
}

/* A located frame's line from its instruction's offset (info: its code's
 * CodeInfo, which lives while the frame holds the code): its CodeLines,
 * made here the first time (two threads that make it at once keep the
 * first published), else a scan of the line table. */
static int
code_line(const void *info, int lasti)
{
    CodeInfo *ci = (CodeInfo *)info;
#if PY_VERSION_HEX >= 0x030B0000
    const int unit = CODE_UNIT;
    CodeLines *t = atomic_load_explicit(&ci->lines, memory_order_acquire);
    if (t == NULL && lasti >= 0) {
        CodeLines *made = CodeLines_new(ci->code, 0);
        if (made != NULL) {
            CodeLines *none = NULL;
            if (atomic_compare_exchange_strong_explicit(&ci->lines, &none, made, memory_order_acq_rel,
                                                        memory_order_acquire))
                t = made;
            else {
                free(made);
                t = none;
            }
        }
    }
    if (t != NULL && lasti >= 0 && lasti / unit < t->n)
        return t->line[lasti / unit];
#endif
    return PyCode_Addr2Line(ci->code, lasti);
}

/* -- the API -------------------------------------------------------------- */

int
Tracer_init(PyObject *module, Engine *engine)
{
    if (T.engine != NULL)
        return 0;   /* one tracer per process, like the engine */
    T.engine = engine;
    T.module = Py_NewRef(module);
    T.clock.engine = engine;
    T.clock.lines = &T.lines;
    T.clock.sites = &T.sites;
    T.clock.lasti = Backend_lasti;
    T.clock.line_of = code_line;
    T.tool = -1;
    T.epoch = 1;
    atomic_init(&T.tracing, 0);
    atomic_init(&T.anchor, NULL);
    T.extra_index = RequestCodeExtraIndex(CodeInfo_free);
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
        if (Backend_forget_disables() < 0)
            return NULL;
    }
    for (ShadowStack *t = T.threads; t != NULL; t = t->next)
        ShadowStack_reset(t);
    Engine_set_phases(T.engine, 0);
    ShadowStack *anchor = Tracer_thread();
    if (anchor == NULL)
        return PyErr_NoMemory();
    atomic_store(&T.anchor, anchor);
    if (!T.parked) {
        T.run++;
        if (Backend_on() < 0)
            return NULL;
    }
    T.parked = 0;
    Engine_set_attribution(T.engine, tracer_attribute, NULL);
    atomic_store(&T.tracing, 1);
    Py_RETURN_NONE;
}

PyObject *
Tracer_stop(int park)
{
    if (!atomic_load(&T.tracing))
        Py_RETURN_NONE;
    atomic_store(&T.tracing, 0);
    int rc = 0;
    if (park && MEMLAB_SYSMON)
        T.parked = 1;
    else
        rc = Backend_off();
    /* Lines still running end now, so their peaks count; phases are not
     * heard while stopped. */
    for (ShadowStack *t = T.threads; t != NULL; t = t->next)
        ShadowStack_unwind_to(t, &T.clock, 0);
    /* Readers that came before tracing stopped leave before any frame
     * can (events are not heard while stopped, so no pop waits for them). */
    for (ShadowStack *t = T.threads; t != NULL; t = t->next)
        ShadowStack_quiesce(t);
    Engine_set_phases(T.engine, 0);
    if (rc < 0)
        return NULL;
    if (raise_stored_error() < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *
Tracer_unpark(void)
{
    if (!T.parked || atomic_load(&T.tracing))
        Py_RETURN_NONE;
    T.parked = 0;
    if (Backend_off() < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *
Tracer_redecide(void)
{
    T.epoch++;
    if (Backend_forget_disables() < 0)
        return NULL;
    Py_RETURN_NONE;
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

/* One line's row of Tracer_line_stats. */
static PyObject *
line_row(uint32_t id, const LineRec *r, int slot, uint64_t hits, long long alloc)
{
    return Py_BuildValue(
        "(IOiKLLLL)", id, PyList_GET_ITEM(T.codes, r->code - 1), r->lineno,
        (unsigned long long)hits, alloc,
        (long long)atomic_load_explicit(&r->peak[slot], memory_order_relaxed),
        (long long)atomic_load_explicit(&r->peak_reserved[slot], memory_order_relaxed),
        (long long)atomic_load_explicit(&r->last_total[slot], memory_order_relaxed));
}

/* The top lines that allocated, heaviest first and, among equals, in the
 * table's order (what a stable sort of every row, heaviest first, would
 * keep): a test's heaviest lines without a row, a Python object and a sort
 * for each of the dozens of lines that allocated a little. */
typedef struct { uint32_t id; long long alloc; } TopLine;

static PyObject *
top_lines(int slot, int top, uint32_t n, int all)
{
    TopLine best[LINE_STATS_TOP_MAX];
    int kept = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = all ? i + 1 : LineTable_touched_id(&T.lines, i);
        LineRec *r = LineTable_get(&T.lines, id);
        if (r == NULL)
            continue;
        long long alloc = atomic_load_explicit(&r->alloc[slot], memory_order_relaxed);
        if (alloc <= 0 || (kept == top && alloc <= best[kept - 1].alloc))
            continue;
        int at = kept < top ? kept : top - 1;   /* the last one drops out */
        while (at > 0 && best[at - 1].alloc < alloc) {
            best[at] = best[at - 1];
            at--;
        }
        best[at] = (TopLine){id, alloc};
        if (kept < top)
            kept++;
    }
    PyObject *result = PyList_New(kept);
    if (result == NULL)
        return NULL;
    for (int i = 0; i < kept; i++) {
        LineRec *r = LineTable_get(&T.lines, best[i].id);
        /* (a line's allocations since the reset are counted by its
         * allocating threads; the figures are read once, here) */
        PyObject *row = r == NULL ? NULL : line_row(best[i].id, r, slot,
            atomic_load_explicit(&r->hits, memory_order_relaxed), best[i].alloc);
        if (row == NULL) {
            Py_DECREF(result);
            if (r == NULL)
                PyErr_SetString(PyExc_RuntimeError, "a line left the table while read");
            return NULL;
        }
        PyList_SET_ITEM(result, i, row);
    }
    return result;
}

PyObject *
Tracer_line_stats(int slot, int allocated_only, int top)
{
    uint32_t n;
    int all = LineTable_touched(&T.lines, &n) < 0;
    if (all)
        n = atomic_load(&T.lines.count);
    if (top > 0 && top <= LINE_STATS_TOP_MAX)
        return top_lines(slot, top, n, all);
    PyObject *result = PyList_New(0);
    if (result == NULL)
        return NULL;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = all ? i + 1 : LineTable_touched_id(&T.lines, i);
        LineRec *r = LineTable_get(&T.lines, id);
        if (r == NULL)
            continue;
        uint64_t hits = atomic_load_explicit(&r->hits, memory_order_relaxed);
        long long alloc = atomic_load_explicit(&r->alloc[slot], memory_order_relaxed);
        if ((hits == 0 && alloc == 0) || ((allocated_only || top > 0) && alloc <= 0))
            continue;
        PyObject *t = line_row(id, r, slot, hits, alloc);
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
    PhaseLog_reset(&T.phases);
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
        "{s:s,s:O,s:O,s:i,s:i,s:O,s:O,s:n,s:I,s:I}",
        "backend", MEMLAB_SYSMON ? "sys.monitoring" : "PyEval_SetTrace",
        "eval_hook", Backend_hooked() ? Py_True : Py_False,
        "located", Backend_can_locate() ? Py_True : Py_False,
        "line_tables", line_tables_status(),
        "tool", T.tool,
        "tracing", atomic_load(&T.tracing) ? Py_True : Py_False,
        "parked", T.parked ? Py_True : Py_False,
        "codes", T.codes == NULL ? (Py_ssize_t)0 : PyList_GET_SIZE(T.codes),
        "lines", atomic_load(&T.lines.count),
        "sites", atomic_load(&T.sites.count));
}
