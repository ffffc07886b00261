/* What the tracer's parts share, and nothing outside them sees: the
 * tracer's state, the scope decision per code object, the error store, the
 * per-thread shadow stacks, and the three entries of the event source
 * (tracer_sysmon.c on Python >= 3.12, tracer_settrace.c before).
 */
#ifndef MEMLAB_TRACER_INTERNAL_H
#define MEMLAB_TRACER_INTERNAL_H

#include "tracer.h"
#include "phases.h"
#include "shadow_stack.h"

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

/* A located code's line of each of its instructions (code units), made
 * in one pass over its line table the first time a line is looked up
 * under it (by whichever thread allocates there first): PyCode_Addr2Line
 * scans the table from its start at each call, the largest part of the
 * tracer's own C on a suite that allocates much under user code (kornia's),
 * and the small cache of lookups that came before missed on functions that
 * allocate on many lines.  Immutable once published. */
typedef struct CodeLines {
    int32_t n;                  /* instructions */
    int32_t line[];             /* PyCode_Addr2Line of each, -1: none */
} CodeLines;

/* Hung on each code object (co_extra): the scope decision, made once per
 * decision epoch (decided: the epoch of the last decision made whole; its
 * fields are read only under the GIL, lines aside). */
typedef struct CodeInfo {
    uint32_t code_id;           /* 0 until first found in scope */
    uint32_t decided;           /* epoch of the decision */
    uint32_t local_run;         /* run in which its local events were set */
    int in_scope;
    int located;                /* in scope, lines found at allocation (3.12+) */
    long local_events;          /* the local events set in local_run */
    int phase;                  /* a phase function (phases.h), else 0 */
    int deciding;               /* decide() runs now, on thread decider */
    unsigned long decider;
    PyCodeObject *code;         /* its code object (borrowed: the code owns this) */
    /* A located code's instruction -> line, made at its first lookup
     * (NULL: none yet, or none could be made) */
    _Atomic(CodeLines *) lines;
} CodeInfo;

typedef struct TracerState {
    Engine *engine;
    PyObject *module;
    LineTable lines;
    SiteTable sites;
    LineClock clock;            /* engine, lines and sites, for the stacks */
    PhaseLog phases;            /* since the last reset of the lines */
    PyObject *phase_hook;       /* called as each phase starts and ends, or NULL */
    PyObject *phase_subject[PHASE_KINDS];   /* each running phase's module or optimizer */
    PyObject *codes;            /* list: code_id - 1 -> code object */
    PyObject *decide;
    PyObject *error;            /* stored by a callback, raised by the API */
    uint32_t epoch;
    uint32_t run;               /* bumped each time the events are turned on */
    int parked;                 /* stopped, with the events left on (3.12+) */
    atomic_int tracing;
    ShadowStack *threads;       /* every thread's stack, under the GIL */
    _Atomic(ShadowStack *) anchor;  /* the measuring thread's */
    Py_ssize_t extra_index;
    /* sys.monitoring (3.12+) */
    int tool;                   /* tool id, -1 if none yet */
    PyObject *monitoring;
    PyObject *disable;
    PyObject *enabled;          /* code objects with local events this run */
    long ev_local;
    long ev_located;            /* local events of a located code: no LINE */
    long ev_phase;              /* local events of a phase function */
    long ev_global;
} TracerState;

extern TracerState T;
/* Set while a callback runs on this thread: events that its own Python
 * calls (the scope decision) cause are ignored. */
extern _Thread_local int in_callback;

/* Stores the pending exception for the next API call (callbacks never
 * raise into user code). */
void Tracer_store_error(void);
/* The code object's scope decision; NULL on error (stored). */
CodeInfo *Tracer_code_info(PyObject *code);

/* The layout of a code object's extras (CPython's _PyCodeObjectExtra, in
 * its internal headers, the same from 3.6 on), read in place on the hot
 * paths: one call into the interpreter less for every frame that 3.11's
 * hook starts and every event sys.monitoring reports.  Tracer_code_info
 * checks the mirror against the interpreter's own reader the first time,
 * and extras_mirrored stays 0 where they differ. */
typedef struct {
    Py_ssize_t ce_size;
    void *ce_extras[1];
} CodeExtras;
extern int extras_mirrored;

/* Tracer_code_info for a code object already decided in this epoch,
 * without leaving the tracer; else the full decision. */
static inline CodeInfo *
Tracer_known_code(PyObject *code)
{
    const CodeExtras *x = ((PyCodeObject *)code)->co_extra;
    if (extras_mirrored == 1 && x != NULL && T.extra_index < x->ce_size) {
        CodeInfo *ci = x->ce_extras[T.extra_index];
        if (ci != NULL && ci->decided == T.epoch)
            return ci;
    }
    return Tracer_code_info(code);
}
/* A phase function starts or ends on thread t; frame is the starting
 * function's frame (its self names the module or optimizer), or NULL. */
void Tracer_phase_enter(ShadowStack *t, const CodeInfo *ci, PyFrameObject *frame);
/* The same where the caller reads the frame (3.11's frame hook, before the
 * frame runs): read(where, kind, 0) gives the phase's subject and
 * read(where, kind, 1) a forward's inputs, new references or NULL.  Returns
 * whether this call started the phase (the outermost of its kind). */
int Tracer_phase_enter_read(ShadowStack *t, const CodeInfo *ci,
                            PyObject *(*read)(const void *where, int kind, int inputs),
                            const void *where);
void Tracer_phase_leave(ShadowStack *t, const CodeInfo *ci);
/* The calling thread's shadow stack, created on first use; NULL when out
 * of memory.  Tracer_thread_if_any never creates one. */
ShadowStack *Tracer_thread(void);
ShadowStack *Tracer_thread_if_any(void);

/* The event source. */
int Backend_on(void);
int Backend_off(void);
/* 1 if frames can be located (shadow_stack.h): their interpreter frames'
 * layout is known (3.12+; 3.11 once checked on a live frame). */
int Backend_can_locate(void);
/* A located frame's instruction offset (bytes), for LineClock.lasti: a
 * read of the interpreter's frame, on any thread while it lives. */
int Backend_lasti(const void *where);
/* 1 while the 3.11 frame-evaluation hook is in (tracer_settrace.c). */
int Backend_hooked(void);
/* A code's CodeInfo goes with it (under the GIL): what the event source
 * kept of its decision goes too. */
void Backend_code_freed(const CodeInfo *ci);
/* Scope decisions changed: code that was told never to report again must
 * be asked anew. */
int Backend_forget_disables(void);

#endif
