#include "phases.h"

#include <string.h>

void
PhaseLog_reset(PhaseLog *self)
{
    self->n = 0;
    self->dropped = 0;
}

void
PhaseLog_add(PhaseLog *self, int kind, int slot, uint64_t seq,
             const char *label)
{
    if (self->n >= PHASE_LOG_MAX) {
        self->dropped++;
        return;
    }
    PhaseRec *r = &self->recs[self->n++];
    r->kind = kind;
    r->slot = slot;
    r->seq = seq;
    size_t len = label == NULL ? 0 : strlen(label);
    if (len > PHASE_LABEL - 1) {
        len = PHASE_LABEL - 1;
        /* never cut a UTF-8 sequence in two */
        while (len > 0 && ((unsigned char)label[len] & 0xC0) == 0x80)
            len--;
    }
    if (len > 0)
        memcpy(r->label, label, len);
    r->label[len] = '\0';
}
