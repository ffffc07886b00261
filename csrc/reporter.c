#include "reporter.h"

#include <string.h>

/* The calling thread's installs, and whether torch.profiler has the
 * reporter stepped aside (popped) meanwhile: then the last uninstall has
 * nothing left to pop. */
static _Thread_local int install_depth;
static _Thread_local int stepped_aside;

void
Reporter_init(Reporter *self, Engine *engine)
{
    memset(self, 0, sizeof(*self));
    self->engine = engine;
}

int
Reporter_bind(Reporter *self, const ReporterBridge *bridge)
{
    if (bridge->install == NULL || bridge->uninstall == NULL
        || bridge->set_cpu == NULL || bridge->set_tracker == NULL)
        return -1;
    self->bridge = *bridge;
    return 0;
}

int
Reporter_bound(const Reporter *self)
{
    return self->bridge.install != NULL;
}

int
Reporter_install(Reporter *self, int *first, char *err, size_t errlen)
{
    if (!Reporter_bound(self))
        return REPORTER_EUNBOUND;
    *first = install_depth == 0;
    if (*first
        && self->bridge.install(&Engine_sink, self->engine, err, errlen) != 0)
        return REPORTER_EBRIDGE;
    install_depth++;
    return REPORTER_OK;
}

int
Reporter_uninstall(Reporter *self, char *err, size_t errlen)
{
    if (!Reporter_bound(self))
        return REPORTER_EUNBOUND;
    if (install_depth == 0 || --install_depth > 0)
        return 0;
    int aside = stepped_aside;
    stepped_aside = 0;
    if (!aside && self->bridge.uninstall(err, errlen) != 0)
        return REPORTER_EBRIDGE;
    return 1;
}

int
Reporter_depth(void)
{
    return install_depth;
}

int
Reporter_step_aside(Reporter *self, int on, char *err, size_t errlen)
{
    if (!Reporter_bound(self))
        return REPORTER_EUNBOUND;
    on = on != 0;
    if (install_depth == 0 || on == stepped_aside)
        return REPORTER_OK;
    int rc = on ? self->bridge.uninstall(err, errlen)
                : self->bridge.install(&Engine_sink, self->engine, err, errlen);
    if (rc != 0)
        return REPORTER_EBRIDGE;
    stepped_aside = on;
    return REPORTER_OK;
}

int
Reporter_cuda_totals(Reporter *self, int index, int64_t *allocated,
                     int64_t *reserved)
{
    if (self->bridge.cuda_totals == NULL || index < 0
        || self->bridge.cuda_totals(index, allocated, reserved) != 0)
        return -1;
    return 0;
}

/* One scope more (delta 1) or fewer (-1) on a device; the bridge hears only
 * when a kind of device starts or stops having any. */
static void
Reporter_use(Reporter *self, int slot, int delta)
{
    int cuda = slot != ENGINE_SLOT_CPU;
    int before = self->users[cuda] > 0;
    self->users[cuda] += delta;
    if (self->users[cuda] < 0)
        self->users[cuda] = 0;
    int now = self->users[cuda] > 0;
    if (now != before)
        (cuda ? self->bridge.set_tracker : self->bridge.set_cpu)(now);
}

int
Reporter_open_scope(Reporter *self, int slot, int detached, int64_t total,
                    int64_t reserved, int timeline, uint32_t log_max,
                    uint32_t *id, int *first, char *err, size_t errlen)
{
    int ret = Reporter_install(self, first, err, errlen);
    if (ret < 0)
        return ret;
    Reporter_use(self, slot, 1);
    if (Engine_begin(self->engine, slot, detached, total, reserved, id) < 0) {
        ret = REPORTER_ESCOPE;
        goto error;
    }
    if ((timeline && Engine_timeline_start(self->engine, slot, *id) < 0)
        || (log_max > 0
            && Engine_alloc_log_start(self->engine, slot, *id, log_max) < 0)) {
        Scope s;
        if (Engine_end(self->engine, slot, *id, &s) == 0)
            Scope_fini(&s);
        ret = REPORTER_ENOMEM;
        goto error;
    }
    return REPORTER_OK;
error:
    Reporter_use(self, slot, -1);
    /* The first failure is the one to tell: a failure to pop the reporter
     * now leaves no message (the bridge takes a NULL err). */
    (void)Reporter_uninstall(self, NULL, 0);
    return ret;
}

int
Reporter_close_scope(Reporter *self, int slot, uint32_t id, Scope *out,
                     int *last, char *err, size_t errlen)
{
    if (!Reporter_bound(self))
        return REPORTER_EUNBOUND;
    int ended = Engine_end(self->engine, slot, id, out) == 0;
    Reporter_use(self, slot, -1);
    int rc = Reporter_uninstall(self, err, errlen);
    if (!ended)
        return REPORTER_ENOTINNER;
    if (rc < 0) {
        Scope_fini(out);
        return rc;
    }
    *last = rc;
    return REPORTER_OK;
}
