/* The measurement engine: per device, a ledger of live blocks, the device's
 * running totals and a stack of open scopes.  Engine_event is the hot path:
 * it is called from allocator callbacks on any thread, possibly under the
 * allocator's lock, so
 *   - it never calls into Python and never takes the GIL;
 *   - it blocks on nothing but the device's own spinlock (and, only while a
 *     recording runs, the recorder's, taken and released before it): the
 *     attribution function it calls under the device's lock takes no lock
 *     (tracer.c reads sites its threads interned beforehand);
 *   - it allocates only with the C library's allocator, under the device's
 *     lock, where a ledger or a scope's site table grows: never through
 *     torch, whose allocator may be the caller;
 *   - it never fails loudly: trouble sets a flag that the next
 *     Engine_take_error reports.
 */
#ifndef MEMLAB_ENGINE_H
#define MEMLAB_ENGINE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kept.h"
#include "ledger.h"
#include "memlab_bridge.h"
#include "scope.h"
#include "spinlock.h"
#include "timeline.h"
#include "alloc_log.h"

/* Slot 0 is the CPU, slot 1 + i is cuda:i. */
#define ENGINE_MAX_DEVICES 65
#define ENGINE_SLOT_CPU 0

/* Where an event came from: the bridge's constants (memlab_bridge.h). */
enum {
    EVENT_REPORT = MEMLAB_SOURCE_REPORT,
    EVENT_TRACE = MEMLAB_SOURCE_TRACE,
    EVENT_FAILED = MEMLAB_SOURCE_FAILED,
};

/* Sticky errors, reported once by Engine_take_error. */
enum {
    ENGINE_OK = 0,
    ENGINE_ENOMEM = 1,  /* the ledger could not grow: events were dropped */
};

/* One recorded event (the replay format of fixtures/events/). */
typedef struct Event {
    uint64_t addr;
    int64_t size;       /* > 0 allocation, < 0 free */
    int64_t total;
    int64_t reserved;
    int32_t slot;
    int32_t source;
} Event;

/* Attributes an allocation: the tracer charges it to the allocating thread's
 * running user line (per-line statistics) and returns the site id of its user
 * call chain (0: unknown).  Called on the event path under the device's lock;
 * it must not call into Python, take a lock or allocate. */
typedef uint32_t (*AttributeFn)(void *ctx, int slot, int64_t size,
                                int64_t total, int64_t reserved);

typedef struct Device {
    Spinlock lock;
    Ledger ledger;
    Ledger watch;       /* leak suspects' addresses (Engine_watch) */
    ScopeStack stack;
    int reports_totals; /* CUDA: the allocator's totals are the truth */
    /* Written under the lock; read without it by the tracer (line peaks). */
    _Atomic int64_t total;  /* CPU: bytes of the ledger's blocks */
    _Atomic int64_t reserved;   /* -1 when the device has no reserved pool */
    uint64_t seq;
    uint64_t events;
    uint64_t dropped;
    uint64_t missed_frees;  /* blocks retired because their address came back */
    uint64_t failed;        /* requests the allocator could not serve (EVENT_FAILED) */
    int64_t failed_size;    /* the latest one's bytes */
    uint32_t failed_site;   /* and the site of its call chain (0: unknown) */
    int error;
    /* The timeline of one scope (a test's): kept after the scope closes,
     * until the next one starts. */
    Timeline timeline;
    uint32_t timeline_scope;    /* its scope's id while open, else 0 */
    int timeline_depth;         /* that scope's index in the stack */
    /* The same scope's live blocks in allocation order: its peak without
     * what it keeps (kept.h). */
    Kept kept;
    /* Its allocations and frees, only while a snapshot is asked for. */
    AllocLog alloc_log;
    uint32_t alloc_log_scope;   /* its scope's id while open, else 0 */
} Device;

typedef struct Engine {
    _Atomic(Device *) devices[ENGINE_MAX_DEVICES];
    /* One past the highest slot made: the loops over every device stop
     * there (most processes have the CPU's alone, of 65 slots). */
    atomic_int slots_made;
    atomic_uint next_scope_id;
    Spinlock record_lock;
    /* The devices whose locks Engine_fork_prepare took (a device made
     * between prepare and release is not released by it). */
    Device *fork_held[ENGINE_MAX_DEVICES];
    Event *record;
    size_t record_len;
    size_t record_cap;
    atomic_int recording;
    _Atomic(AttributeFn) attribute;
    _Atomic(void *) attribute_ctx;  /* read on the event path, set by the API */
    atomic_uint phases;             /* the measuring thread's phases: 1 << kind each */
} Engine;

Engine *Engine_new(void);
void Engine_free(Engine *self);

int Engine_slot(int device_type, int device_index);
void Engine_event(Engine *self, int slot, uintptr_t addr, int64_t size,
                  int64_t total, int64_t reserved, int source);
/* The bridge's entry: c10 device type and index instead of a slot. */
void Engine_sink(void *ctx, int device_type, int device_index, void *ptr,
                 int64_t size, uint64_t total, uint64_t reserved, int source);

void Engine_set_attribution(Engine *self, AttributeFn fn, void *ctx);
/* The phases the measuring thread runs are now mask (1 << kind each,
 * phases.h): every device whose kept blocks follow a scope keeps each
 * phase's peak from here on (kept.h). */
void Engine_set_phases(Engine *self, unsigned mask);

/* A fork while another thread holds a device's lock would leave the lock
 * held in the child, whose first event would spin forever (memlab's CPU
 * allocator hears every thread: a DataLoader forking its workers while a
 * pool thread allocates).  Engine_fork_prepare takes every lock the event
 * path takes, in one order; Engine_fork_release gives them back, in the
 * parent and in the child (pthread_atfork's three handlers, module.c). */
void Engine_fork_prepare(Engine *self);
void Engine_fork_release(Engine *self);
/* The device's total and reserved bytes now, without its lock (0 if never
 * used). */
int64_t Engine_current_total(Engine *self, int slot);
int64_t Engine_current_reserved(Engine *self, int slot);

/* Opens a scope on a device.  total and reserved are the device's figures
 * now (ignored when negative, and for devices that do not report totals). */
int Engine_begin(Engine *self, int slot, int detached, int64_t total,
                 int64_t reserved, uint32_t *id);
/* Closes a scope; *out owns its site tables (Scope_fini). */
int Engine_end(Engine *self, int slot, uint32_t id, Scope *out);
/* Figures of an open scope so far; with with_sites, *out owns a copy of its
 * site tables (Scope_fini), else it has none. */
int Engine_stats(Engine *self, int slot, uint32_t id, int with_sites,
                 Scope *out);
int Engine_totals(Engine *self, int slot, int64_t *total, int64_t *reserved);
/* Copies up to cap blocks that count for open scope id; returns how many
 * count in all (may exceed cap), or -1 if id is not open. */
long Engine_blocks(Engine *self, int slot, uint32_t id, Block *out,
                   size_t cap);
/* Starts the timeline of open scope id (the device's previous timeline is
 * dropped); -1 if id is not open or out of memory. */
int Engine_timeline_start(Engine *self, int slot, uint32_t id);
/* The latest timeline of the device, merged into at most max points of dst;
 * returns how many, and *seq0 / *last its first and latest event numbers. */
uint32_t Engine_timeline(Engine *self, int slot, TimelinePoint *dst,
                         uint32_t max, uint64_t *seq0, uint64_t *last);
/* Logs the allocations and frees of the device while open scope id lasts,
 * up to max entries; -1 if id is not open. */
int Engine_alloc_log_start(Engine *self, int slot, uint32_t id, uint32_t max);
/* The latest log (the caller frees it); NULL when empty.  With keep, a
 * copy, the log going on (a verdict while the test runs). */
AllocEntry *Engine_alloc_log_take(Engine *self, int slot, int keep, uint32_t *n,
                                  uint64_t *dropped);
/* Leak suspects' addresses, watched after their test's scope closed (the
 * ledger forgets its blocks then): an address stays watched until an
 * allocation or a free is heard there (the suspect's block is gone: freed,
 * or freed unheard and reused).  -1 when out of memory. */
int Engine_watch(Engine *self, int slot, const uintptr_t *addrs, size_t n);
/* 1 while addr is watched. */
int Engine_watched(Engine *self, int slot, uintptr_t addr);
/* Forgets every watched address of the device. */
void Engine_unwatch(Engine *self, int slot);
/* The device's event number now: where a mark falls on a timeline. */
uint64_t Engine_seq(Engine *self, int slot);
/* Like Engine_seq, for a device whose timeline runs now; -1 when none does. */
int Engine_timeline_seq(Engine *self, int slot, uint64_t *seq);
/* One past the highest slot that has a device: slots from there on have none. */
int Engine_slots(Engine *self);
/* The live blocks of open scope id in allocation order, each with the most
 * own bytes of its span (kept.h), and the span before the first (*head's
 * span_max, span_seq, span_site): *out is
 * the caller's (free(); NULL when none).  -1 when the device does not
 * follow id (its timeline is another scope's, or it ran out of memory). */
int Engine_kept(Engine *self, int slot, uint32_t id, KeptBlock **out,
                uint32_t *n, KeptBlock *head);
/* The requests the device's allocator could not serve, heard so far, with
 * the latest one's bytes and site (0 of each when none). */
void Engine_failed(Engine *self, int slot, uint64_t *count, int64_t *size,
                   uint32_t *site);
/* Returns and clears the device's sticky error; *dropped gets the count. */
int Engine_take_error(Engine *self, int slot, uint64_t *dropped);

int Engine_record_start(Engine *self, size_t capacity);
/* Stops recording; the caller owns *events (free()). */
size_t Engine_record_stop(Engine *self, Event **events);
void Engine_replay(Engine *self, const Event *events, size_t n);

#endif
