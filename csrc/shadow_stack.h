/* A thread's shadow stack: the user frames (those in scope) it is running,
 * innermost last, each with the line it is on and the highest device totals
 * seen since that line began.  The tracer's event sources push, pop and move
 * lines under the GIL; the allocator path reads the frames from any thread
 * without a lock (depth is published with release/acquire).
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
    uint32_t code;
    int32_t lineno;
    uint32_t line;
    int64_t hw[LINE_SLOTS];     /* highest total since the line began */
    int64_t hwr[LINE_SLOTS];    /* highest reserved since the line began */
} ShadowFrame;

typedef struct ShadowStack {
    struct ShadowStack *next;   /* the tracer's list of every thread's stack */
    atomic_int depth;
    int overflow;               /* frames past SHADOW_STACK_DEPTH, not stored */
    int phase_depth[PHASE_KINDS];   /* phase functions running (phases.h) */
    ShadowFrame frames[SHADOW_STACK_DEPTH];
} ShadowStack;

/* Where line statistics go and where device totals come from. */
typedef struct LineClock {
    Engine *engine;
    LineTable *lines;
} LineClock;

/* NULL when out of memory. */
ShadowStack *ShadowStack_new(void);
void ShadowStack_reset(ShadowStack *self);
void ShadowStack_push(ShadowStack *self, const LineClock *clock, uint32_t code,
                      int lineno);
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

#endif
