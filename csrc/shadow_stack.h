/* A thread's shadow stack: the user frames (those in scope) it is running,
 * innermost last, each with the line it is on, the site of the call chain
 * that ends there, and the highest device totals seen since that line
 * began.  The tracer's event sources push, pop and move lines on the owning
 * thread, under the GIL; the allocator path reads the frames from any
 * thread without a lock (ShadowStack_attribute).
 *
 * So that the allocator path never interns anything (which would take a
 * lock and may allocate), the owner interns the site of each frame's chain
 * when the frame starts or moves to another line; the allocator path only
 * loads it.  What the allocator path reads or raises is atomic: depth
 * (release/acquire: a frame is written before it is published), and each
 * frame's line, site and high-water marks (relaxed: a frame read while its
 * owner moves it may pair the old line with the new site, which charges
 * one allocation to a neighbouring line, never to garbage).
 *
 * Located frames have no line events at all (a line event on every line of
 * user code was most of what measuring cost): each keeps where it runs (the
 * interpreter's frame) and its line is found when something is allocated
 * under it (LineClock.lasti and line_of), interned there, on any thread;
 * the owner caches the last instruction's line and site.  Another thread
 * reading a located frame (autograd's, a pool's, for the measuring thread's
 * line) announces itself in readers, and the owner waits for none to be
 * left before a frame leaves (ShadowStack_pop): the interpreter frees the
 * frame's memory once it has returned.
 */
#ifndef MEMLAB_SHADOW_STACK_H
#define MEMLAB_SHADOW_STACK_H

#include <stdatomic.h>
#include <stdint.h>

#include "engine.h"
#include "phases.h"
#include "sites.h"

#define SHADOW_STACK_DEPTH 128

typedef struct ShadowFrame {
    uint32_t code;              /* the owner's alone */
    int32_t lineno;             /* the owner's alone */
    const void *where;          /* a located frame's interpreter frame, else NULL */
    /* A located frame's code, as line_of takes it (the tracer's: its
     * CodeInfo, which lives as long as the code that the frame holds). */
    const void *code_ref;
    int lasti;                  /* the owner's: the instruction of line */
    int site_lasti;             /* the owner's: the instruction of site */
    _Atomic uint32_t line;
    _Atomic uint32_t site;      /* the chain ending at this frame's line */
    /* Raised by allocator threads, several at once (the measuring thread's
     * and autograd's on its behalf), and reset by the owner. */
    _Atomic int64_t hw[LINE_SLOTS];     /* highest total since the line began */
    _Atomic int64_t hwr[LINE_SLOTS];    /* highest reserved since then */
} ShadowFrame;

typedef struct ShadowStack {
    struct ShadowStack *next;   /* the tracer's list of every thread's stack */
    atomic_int depth;
    atomic_int readers;         /* other threads reading located frames now */
    int overflow;               /* frames past SHADOW_STACK_DEPTH, not stored */
    int phase_depth[PHASE_KINDS];   /* phase functions running (phases.h) */
    ShadowFrame frames[SHADOW_STACK_DEPTH];
} ShadowStack;

/* Where line statistics go, where device totals come from, where chains
 * are interned as sites, and how a located frame's line is found: the
 * offset of the instruction it runs (lasti), and that offset's line. */
typedef struct LineClock {
    Engine *engine;
    LineTable *lines;
    SiteTable *sites;
    int (*lasti)(const void *where);
    int (*line_of)(const void *code_ref, int lasti);
} LineClock;

/* NULL when out of memory. */
ShadowStack *ShadowStack_new(void);
void ShadowStack_reset(ShadowStack *self);
void ShadowStack_push(ShadowStack *self, const LineClock *clock, uint32_t code,
                      int lineno);
/* A located frame starts (no line events: its line is found at
 * allocation). */
void ShadowStack_push_located(ShadowStack *self, uint32_t code,
                              const void *where, const void *code_ref);
/* Whether where is the innermost frame. */
int ShadowStack_is_top(ShadowStack *self, const void *where);
/* Ends the located frame where if it is the innermost (a frame that two
 * event sources may end, 3.11's frame hook and its trace function: the
 * second finds it gone). */
void ShadowStack_pop_located(ShadowStack *self, const LineClock *clock,
                             const void *where);
/* Ends the innermost frame of code (and frames above it whose return was
 * missed). */
void ShadowStack_pop(ShadowStack *self, const LineClock *clock, uint32_t code);
/* The frame of code moved to lineno.  0 when no frame of code is on the
 * stack: it was running before tracing began, and stays untraced. */
int ShadowStack_line(ShadowStack *self, const LineClock *clock, uint32_t code,
                     int lineno);
/* Ends frames [i, depth): their lines finish, and what they saw counts for
 * their callers' lines (callees included). */
void ShadowStack_unwind_to(ShadowStack *self, const LineClock *clock, int i);

/* Waits until no other thread reads the stack's located frames: the
 * owner, before a frame of its leaves (and whoever reset the stack). */
void ShadowStack_quiesce(ShadowStack *self);

/* The allocator's path, from any thread, without the GIL: charges an
 * allocation of size bytes on device slot to the stack's running line
 * (bytes allocated, high-water marks; nothing when size is 0: a request
 * that failed) and returns the site of its call chain; 0 when the stack
 * has no frame.  owner: the calling thread is the stack's (it may cache a
 * located frame's line); traced frames need no lock, located ones intern
 * under the tables' locks. */
uint32_t ShadowStack_attribute(ShadowStack *self, const LineClock *clock,
                               int owner, int slot, int64_t size,
                               int64_t total, int64_t reserved);

#endif
