/* What the parts of the engine's CPython module share: its state (one per
 * process), the argument helpers, and the method functions that
 * module_engine.c (the engine's measurements) and module_reporter.c (the
 * torch bridge's reporter and scope transaction) define for module.c's
 * method table.
 */
#ifndef MEMLAB_MODULE_STATE_H
#define MEMLAB_MODULE_STATE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "engine.h"
#include "reporter.h"

/* The keys of a scope's figures, interned once: a dictionary of them is
 * made for every measured test, and Py_BuildValue would make each key
 * string anew every time. */
enum {
    K_ID, K_LIVE, K_PEAK, K_TOTAL_AT_PEAK, K_SEQ_AT_PEAK, K_PEAK_TOTAL,
    K_START_TOTAL, K_ALLOCS, K_FREES, K_ALLOCATED_BYTES, K_RESERVED_PEAK,
    K_AT_PEAK, K_LIVE_SITES, K_PEAK_SITE, K_SITES_COMPLETE, K_COUNT
};
/* What the module holds.  One per process, not per module object (m_size
 * 0): the engine is never freed, because the torch bridge holds its address
 * and may deliver an event from an allocator thread at any time,
 * interpreter shutdown included; and the functions below reach it without
 * looking up module state, on the per-test path. */
typedef struct ModuleState {
    Engine *engine;
    Reporter reporter;
    PyObject *keys[K_COUNT];
    /* Raised where pushing or popping the reporter fails (the bridge's
     * message): the plugin tells it apart from the engine's own errors. */
    PyObject *bridge_error;
} ModuleState;

extern ModuleState M;

/* Argument helpers (module.c): each sets the exception it returns -1 or
 * NULL for. */
int check_slot(int slot);
int slot_arg(PyObject *arg, int *slot);
int raise_engine_error(int slot);
/* A closed scope's figures as the dict the plugin reads (module_engine.c). */
PyObject *closed_scope_to_dict(const Scope *s);
/* A span's peak per phase as engine.kept gives it (module_engine.c). */
PyObject *phases_tuple(const KeptPhases *p);

/* module_engine.c */
PyObject *engine_sink(PyObject *module, PyObject *args);
PyObject *engine_slot(PyObject *module, PyObject *args);
PyObject *engine_begin(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *engine_end(PyObject *module, PyObject *args);
PyObject *engine_stats(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *engine_live(PyObject *module, PyObject *const *args, Py_ssize_t n);
PyObject *engine_timeline_start(PyObject *module, PyObject *args);
PyObject *engine_timeline(PyObject *module, PyObject *args);
PyObject *engine_alloc_log_start(PyObject *module, PyObject *args);
PyObject *engine_alloc_log_take(PyObject *module, PyObject *args);
PyObject *engine_watch(PyObject *module, PyObject *args);
PyObject *engine_watched(PyObject *module, PyObject *args);
PyObject *engine_unwatch(PyObject *module, PyObject *arg);
PyObject *engine_kept(PyObject *module, PyObject *args);
PyObject *engine_seq(PyObject *module, PyObject *arg);
PyObject *engine_failed(PyObject *module, PyObject *arg);
PyObject *engine_totals(PyObject *module, PyObject *args);
PyObject *engine_blocks(PyObject *module, PyObject *args);
PyObject *engine_inject(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *engine_record_start(PyObject *module, PyObject *args);
PyObject *engine_record_stop(PyObject *module, PyObject *args);
PyObject *engine_replay(PyObject *module, PyObject *args);
PyObject *engine_site(PyObject *module, PyObject *arg);
PyObject *engine_line(PyObject *module, PyObject *arg);

/* module_reporter.c */
PyObject *bridge_bind(PyObject *module, PyObject *args);
PyObject *bridge_install(PyObject *module, PyObject *args);
PyObject *bridge_uninstall(PyObject *module, PyObject *args);
PyObject *bridge_depth(PyObject *module, PyObject *args);
PyObject *bridge_step_aside(PyObject *module, PyObject *arg);
PyObject *engine_open(PyObject *module, PyObject *const *args, Py_ssize_t n);
PyObject *engine_close(PyObject *module, PyObject *const *args, Py_ssize_t n);
PyObject *engine_close_plain(PyObject *module, PyObject *const *args, Py_ssize_t n);
PyObject *bridge_cuda_totals(PyObject *module, PyObject *arg);

#endif
