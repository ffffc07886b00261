/* The tracer: keeps, per thread, the stack of user frames (those in scope)
 * with the line each is on (shadow_stack.h), where the engine's attribution
 * function reads it on the allocator's path without touching Python.
 *
 * Its event source is sys.monitoring on Python >= 3.12 (tracer_sysmon.c)
 * and a PyEval_SetTrace function before (tracer_settrace.c); tracer.c holds
 * what both share.  Callbacks never raise into user code: an error (a scope
 * decision that raised, say) is stored and raised by the next API call.
 */
#ifndef MEMLAB_TRACER_H
#define MEMLAB_TRACER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "engine.h"
#include "sites.h"

/* decide's verdict for code in scope whose lines are found at allocation,
 * without line events (Python 3.12+; before, such code is traced). */
#define SCOPE_LOCATED 16

int Tracer_init(PyObject *module, Engine *engine);
/* decide(code) -> True (in scope, every line traced), SCOPE_LOCATED, 1 +
 * a phase kind, or false; called once per code object (per decide). */
PyObject *Tracer_start(PyObject *decide);
/* With park, on sys.monitoring, the events stay on (callbacks return at
 * once): turning them off and on again makes CPython re-instrument every
 * code object it runs next and undoes every DISABLE, which would cost each
 * measured test its share.  Tracer_unpark turns parked events off. */
PyObject *Tracer_stop(int park);
PyObject *Tracer_unpark(void);
/* Forget scope decisions (the rules changed): re-decide every code. */
PyObject *Tracer_redecide(void);
/* Lines touched since the last reset, with their figures on one device
 * slot (< LINE_SLOTS); with allocated_only, only those that allocated
 * there (a test's heaviest lines: a test runs hundreds of lines); with top
 * in 1..LINE_STATS_TOP_MAX, only the top heaviest of those, heaviest first
 * (among equals in the table's order), else every one, unsorted. */
#define LINE_STATS_TOP_MAX 64
PyObject *Tracer_line_stats(int slot, int allocated_only, int top);
/* Also forgets the phases. */
PyObject *Tracer_reset_lines(void);
/* The phases since the last reset: ([(kind, slot, seq, label)], dropped). */
PyObject *Tracer_phases(void);
/* hook(kind, subject, inputs) as each phase of the measuring thread starts
 * (kind, phases.h) and ends (-kind), subject its module or optimizer or
 * None, inputs a forward's positional arguments (a tuple) or None;
 * None: no hook.  Lets go of the subjects it held. */
PyObject *Tracer_set_phase_hook(PyObject *hook);
PyObject *Tracer_site(uint32_t site);
PyObject *Tracer_line(uint32_t line);
PyObject *Tracer_status(void);
/* A replacement for builtins.__import__ that runs original with the trace
 * function off on this thread (Python < 3.12: a measured child's imports
 * after torch's would pay it on every frame); original itself from 3.12,
 * where code out of scope reports nothing after its first call. */
PyObject *Tracer_untraced_imports(PyObject *original);

/* sys.monitoring callbacks (module methods, METH_FASTCALL). */
PyObject *Tracer_mon_start(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *Tracer_mon_resume(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *Tracer_mon_leave(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *Tracer_mon_unwind(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *Tracer_mon_throw(PyObject *m, PyObject *const *args, Py_ssize_t n);
PyObject *Tracer_mon_line(PyObject *m, PyObject *const *args, Py_ssize_t n);

#endif
