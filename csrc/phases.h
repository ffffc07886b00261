/* Phases that mark themselves on a test's timeline: the start of each
 * top-level module forward, of each backward and of each optimizer step.
 * The tracer hears them as calls of a few torch functions (Module.__call__,
 * torch.autograd.backward and grad, the optimizer's step wrapper) whose
 * code objects the scope decision names, so torch's state is never touched:
 * no global hooks, nothing for torch.compile to trace.
 *
 * A log of the phases since the last reset, each with the event number of
 * every device whose timeline runs, so that it lands on those timelines.
 */
#ifndef MEMLAB_PHASES_H
#define MEMLAB_PHASES_H

#include <stdint.h>

/* The kinds, as the scope decision returns them (its value minus 1). */
#define PHASE_NONE 0
#define PHASE_FORWARD 1
#define PHASE_BACKWARD 2
#define PHASE_STEP 3
#define PHASE_KINDS 4

#define PHASE_LOG_MAX 4096
#define PHASE_LABEL 64

typedef struct PhaseRec {
    int kind;                   /* PHASE_*; negated: where that phase ended */
    int slot;                   /* the device whose timeline it marks */
    uint64_t seq;               /* that device's event number then */
    char label[PHASE_LABEL];    /* "forward Net", "backward", "SGD.step" */
} PhaseRec;

typedef struct PhaseLog {
    PhaseRec recs[PHASE_LOG_MAX];
    uint32_t n;
    uint64_t dropped;           /* past PHASE_LOG_MAX: counted, not kept */
} PhaseLog;

void PhaseLog_reset(PhaseLog *self);
/* label is cut to PHASE_LABEL - 1 bytes (at a UTF-8 boundary). */
void PhaseLog_add(PhaseLog *self, int kind, int slot, uint64_t seq,
                  const char *label);

#endif
