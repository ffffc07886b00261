/* The torch reporter's installs per thread, the devices' reporting counts,
 * and opening and closing a measured scope as one transaction.
 *
 * The bridge (memlab_bridge.h) pushes a thread-local reporter into torch's
 * profiler slot; a measured test opens one scope per device, and nested
 * measurements (a region inside a test, a fixture around it) open more, so
 * installs are counted per thread: the first pushes the reporter, the last
 * pops it.  CPU reporting and the CUDA tracker cost torch's allocators work
 * on every allocation, so they are on only while some scope on a device of
 * their kind is open, on any thread.
 *
 * The bridge's entries are bound by address once it is loaded
 * (pytest_memlab/_core.py): every measured test pushes and pops the
 * reporter, and a call from C keeps the GIL where ctypes would drop and
 * retake it around each one.
 *
 * No Python here: the module (module.c) turns the codes into exceptions.
 * Callers serialise every call (the module: the GIL); the install counts
 * are per thread, the reporting counts per process.
 */
#ifndef MEMLAB_REPORTER_H
#define MEMLAB_REPORTER_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "memlab_bridge.h"

/* What the calls below return besides 0; the bridge's failures leave its
 * message in err. */
enum {
    REPORTER_OK = 0,
    REPORTER_EBRIDGE = -1,      /* the bridge failed (err says why) */
    REPORTER_EUNBOUND = -2,     /* no bridge bound yet */
    REPORTER_ESCOPE = -3,       /* the device's scope stack is full, or OOM */
    REPORTER_ENOMEM = -4,       /* no memory for the timeline or the log */
    REPORTER_ENOTINNER = -5,    /* the scope is not the innermost open one */
};

/* Room for the bridge's messages. */
#define REPORTER_ERRLEN 512

/* The bridge's entries (memlab_bridge.h's types); cuda_totals may be NULL
 * (a bridge older than that entry).  err may be NULL (errlen 0) where the
 * message is not wanted. */
typedef struct ReporterBridge {
    int (*install)(memlab_sink_fn sink, void *ctx, char *err, size_t errlen);
    int (*uninstall)(char *err, size_t errlen);
    void (*set_cpu)(int on);
    void (*set_tracker)(int on);
    int (*cuda_totals)(int device, int64_t *allocated, int64_t *reserved);
} ReporterBridge;

typedef struct Reporter {
    Engine *engine;             /* the sink's context */
    ReporterBridge bridge;      /* install is NULL until bound */
    int users[2];               /* scopes open on the CPU, on CUDA devices */
} Reporter;

void Reporter_init(Reporter *self, Engine *engine);
/* -1 when an entry other than cuda_totals is NULL. */
int Reporter_bind(Reporter *self, const ReporterBridge *bridge);
int Reporter_bound(const Reporter *self);

/* One more install on the calling thread; *first when this one pushed the
 * reporter. */
int Reporter_install(Reporter *self, int *first, char *err, size_t errlen);
/* One install fewer: 1 when this undid the thread's last install (the
 * reporter popped), 0 when not, REPORTER_EBRIDGE when popping it failed
 * (the count is down all the same). */
int Reporter_uninstall(Reporter *self, char *err, size_t errlen);
/* Installs open on the calling thread. */
int Reporter_depth(void);
/* torch.profiler refuses a thread whose profiler slot holds anything: its
 * start hook steps the reporter aside (on: popped), its stop hook brings it
 * back.  Nothing where the thread has no install. */
int Reporter_step_aside(Reporter *self, int on, char *err, size_t errlen);
/* The CUDA caching allocator's own counters of a device; -1 where the
 * bridge cannot tell (no CUDA, an older bridge, an error). */
int Reporter_cuda_totals(Reporter *self, int index, int64_t *allocated,
                         int64_t *reserved);

/* What one measured scope needs: the reporter installed, the device's
 * reporting on, the scope begun (Engine_begin), its timeline started and
 * its allocations logged (log_max > 0).  All or nothing: a failure undoes
 * the parts done.  *first as for Reporter_install. */
int Reporter_open_scope(Reporter *self, int slot, int detached, int64_t total,
                        int64_t reserved, int timeline, uint32_t log_max,
                        uint32_t *id, int *first, char *err, size_t errlen);
/* Undoes Reporter_open_scope: ends the scope into *out (the caller
 * Scope_fini's it on REPORTER_OK only), and takes back the reporting and the
 * install even when the scope is not the innermost (REPORTER_ENOTINNER,
 * which outranks a failure to pop the reporter).  *last as
 * Reporter_uninstall's 1. */
int Reporter_close_scope(Reporter *self, int slot, uint32_t id, Scope *out,
                         int *last, char *err, size_t errlen);

#endif
