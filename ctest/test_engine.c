/* The engine: scopes, peaks, detached scopes, the two event sources,
 * threads, and replays of recorded torch event streams. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include <cmocka.h>

#include "engine.h"

#define MiB ((int64_t)1 << 20)
#define CPU ENGINE_SLOT_CPU
#define CUDA0 1

static int
setup(void **state)
{
    *state = Engine_new();
    return *state == NULL ? -1 : 0;
}

static int
teardown(void **state)
{
    Engine_free(*state);
    return 0;
}

static void
test_peak_of_32_and_16_mib_is_48(void **state)
{
    Engine *e = *state;
    uint32_t id;
    Scope s;
    assert_int_equal(Engine_begin(e, CPU, 0, -1, -1, &id), 0);
    Engine_event(e, CPU, 0x1000, 32 * MiB, 0, 0, EVENT_REPORT);
    Engine_event(e, CPU, 0x2000, 16 * MiB, 0, 0, EVENT_REPORT);
    Engine_event(e, CPU, 0x1000, -32 * MiB, 0, 0, EVENT_REPORT);
    Engine_event(e, CPU, 0x2000, -16 * MiB, 0, 0, EVENT_REPORT);
    assert_int_equal(Engine_end(e, CPU, id, &s), 0);
    Scope_fini(&s);
    assert_int_equal(s.peak, 48 * MiB);
    assert_int_equal(s.live, 0);
    assert_int_equal(s.peak_total, 48 * MiB);
    assert_int_equal(s.reserved_peak, -1);
}

/* A leak suspect's addresses stay watched, across scopes and while
 * nothing is measured, until an allocation or a free is heard there. */
static void
test_watched_addresses(void **state)
{
    Engine *e = *state;
    uint32_t first, second;
    Scope s;
    assert_int_equal(Engine_begin(e, CPU, 0, -1, -1, &first), 0);
    Engine_event(e, CPU, 0x1000, 4096, 0, 0, EVENT_REPORT);
    Engine_event(e, CPU, 0x2000, 4096, 0, 0, EVENT_REPORT);
    Engine_event(e, CPU, 0x3000, 4096, 0, 0, EVENT_REPORT);
    assert_int_equal(Engine_end(e, CPU, first, &s), 0);
    Scope_fini(&s);
    const uintptr_t suspects[] = {0x1000, 0x2000, 0x3000};
    assert_int_equal(Engine_watch(e, CPU, suspects, 3), 0);
    assert_int_equal(Engine_begin(e, CPU, 0, -1, -1, &second), 0);
    Engine_event(e, CPU, 0x2000, -4096, 0, 0, EVENT_REPORT);   /* freed, heard */
    Engine_event(e, CPU, 0x3000, 512, 0, 0, EVENT_REPORT);     /* reused */
    Engine_event(e, CPU, 0x3000, -512, 0, 0, EVENT_REPORT);
    assert_int_equal(Engine_end(e, CPU, second, &s), 0);
    Scope_fini(&s);
    assert_int_equal(Engine_watched(e, CPU, 0x1000), 1);
    assert_int_equal(Engine_watched(e, CPU, 0x2000), 0);
    assert_int_equal(Engine_watched(e, CPU, 0x3000), 0);
    assert_int_equal(Engine_watched(e, CUDA0, 0x1000), 0);   /* a device never used */
    Engine_unwatch(e, CPU);
    assert_int_equal(Engine_watched(e, CPU, 0x1000), 0);
}

static void
test_nesting_and_detached(void **state)
{
    Engine *e = *state;
    uint32_t test, fixture, region;
    Scope s;
    assert_int_equal(Engine_begin(e, CUDA0, 0, 100, 1000, &test), 0);
    assert_int_equal(Engine_begin(e, CUDA0, 1, -1, -1, &fixture), 0);
    Engine_event(e, CUDA0, 0xA00, 50, 150, 1000, EVENT_REPORT);
    assert_int_equal(Engine_end(e, CUDA0, fixture, &s), 0);
    Scope_fini(&s);
    assert_int_equal(s.peak, 50);
    assert_int_equal(Engine_begin(e, CUDA0, 0, -1, -1, &region), 0);
    Engine_event(e, CUDA0, 0xB00, 30, 180, 1024, EVENT_REPORT);
    /* out of order: the inner scope must close first */
    assert_int_equal(Engine_end(e, CUDA0, test, &s), -1);
    assert_int_equal(Engine_end(e, CUDA0, region, &s), 0);
    Scope_fini(&s);
    assert_int_equal(s.peak, 30);
    assert_int_equal(s.peak_total, 180);
    assert_int_equal(s.reserved_peak, 1024);
    Engine_event(e, CUDA0, 0xA00, -50, 130, 1024, EVENT_REPORT);
    Block blocks[4];
    assert_int_equal(Engine_blocks(e, CUDA0, test, blocks, 4), 1);
    assert_int_equal(blocks[0].addr, 0xB00);
    assert_int_equal(Engine_end(e, CUDA0, test, &s), 0);
    Scope_fini(&s);
    assert_int_equal(s.peak, 30);      /* the fixture's 50 is not the test's */
    assert_int_equal(s.live, 30);
    assert_int_equal(s.start_total, 100);
    assert_int_equal(s.peak_total, 180);
}

static void
test_trace_and_report_merge(void **state)
{
    Engine *e = *state;
    uint32_t id;
    Scope s;
    int64_t total, reserved;
    assert_int_equal(Engine_begin(e, CUDA0, 0, 0, 0, &id), 0);
    Engine_event(e, CUDA0, 0xC00, 512, 0, 0, EVENT_TRACE);
    /* a cached block of 1024 handed out unsplit: the scope counts the
     * request (512), the device's total the block */
    Engine_event(e, CUDA0, 0xC00, 1024, 1024, 2048, EVENT_REPORT);
    Engine_event(e, CUDA0, 0xC00, 1024, 0, 0, EVENT_TRACE);   /* late echo */
    Engine_event(e, CUDA0, 0xD00, 512, 0, 0, EVENT_TRACE);    /* other thread */
    assert_int_equal(Engine_totals(e, CUDA0, &total, &reserved), 0);
    assert_int_equal(total, 1536);
    Engine_event(e, CUDA0, 0xD00, -1, 0, 0, EVENT_TRACE);
    Engine_event(e, CUDA0, 0xC00, -1024, 0, 2048, EVENT_REPORT);
    Engine_event(e, CUDA0, 0xC00, -1, 0, 0, EVENT_TRACE);
    assert_int_equal(Engine_end(e, CUDA0, id, &s), 0);
    Scope_fini(&s);
    assert_int_equal(s.peak, 1024);
    assert_int_equal(s.peak_total, 1536);
    assert_int_equal(s.live, 0);
    assert_int_equal(s.allocs, 2);
    assert_int_equal(s.frees, 2);
}

static void
test_report_first_then_the_request(void **state)
{
    Engine *e = *state;
    uint32_t id;
    Scope s;
    assert_int_equal(Engine_begin(e, CUDA0, 0, 0, 0, &id), 0);
    Engine_event(e, CUDA0, 0xA00, 2 << 20, 2 << 20, 2 << 20, EVENT_REPORT);
    Engine_event(e, CUDA0, 0xA00, 1536 << 10, 0, 0, EVENT_TRACE);
    Engine_event(e, CUDA0, 0xA00, 1536 << 10, 0, 0, EVENT_TRACE);  /* an echo: nothing */
    Engine_stats(e, CUDA0, id, 0, &s);
    assert_int_equal(s.live, 1536 << 10);
    Engine_event(e, CUDA0, 0xA00, -(2 << 20), 0, 2 << 20, EVENT_REPORT);
    Engine_event(e, CUDA0, 0xA00, -1, 0, 0, EVENT_TRACE);
    assert_int_equal(Engine_end(e, CUDA0, id, &s), 0);
    Scope_fini(&s);
    /* The high-water mark was taken at the report, before the request was
     * heard; torch 2.x's allocator calls the tracker first (measured on the
     * H100: scratch's order probe, bench/RESULTS.md), so this order is the
     * exception, and live figures count the request from then on. */
    assert_int_equal(s.peak, 2 << 20);
    assert_int_equal(s.peak_total, 2 << 20);
    assert_int_equal(s.live, 0);
    assert_int_equal(s.allocs, 1);
}

static void
test_depth_limit(void **state)
{
    Engine *e = *state;
    uint32_t ids[SCOPE_MAX_DEPTH + 1];
    for (int i = 0; i < SCOPE_MAX_DEPTH; i++)
        assert_int_equal(Engine_begin(e, CPU, 0, -1, -1, &ids[i]), 0);
    assert_int_equal(Engine_begin(e, CPU, 0, -1, -1, &ids[SCOPE_MAX_DEPTH]), -1);
    for (int i = SCOPE_MAX_DEPTH - 1; i >= 0; i--)
        assert_int_equal(Engine_end(e, CPU, ids[i], NULL), 0);
}

typedef struct {
    Engine *e;
    uintptr_t base;
    int rounds;
} Worker;

static void *
worker_run(void *arg)
{
    Worker *w = arg;
    for (int r = 0; r < w->rounds; r++) {
        for (uintptr_t i = 0; i < 64; i++)
            Engine_event(w->e, CPU, w->base + i * 64, 64, 0, 0, EVENT_REPORT);
        for (uintptr_t i = 0; i < 64; i++)
            Engine_event(w->e, CPU, w->base + i * 64, -64, 0, 0, EVENT_REPORT);
    }
    return NULL;
}

/* Events from several threads at once (autograd device threads): nothing
 * lost, nothing counted twice. */
static void
test_threads(void **state)
{
    Engine *e = *state;
    enum { THREADS = 4 };
    uint32_t id;
    Scope s;
    assert_int_equal(Engine_begin(e, CPU, 0, -1, -1, &id), 0);
    pthread_t threads[THREADS];
    Worker workers[THREADS];
    for (int t = 0; t < THREADS; t++) {
        workers[t] = (Worker){e, (uintptr_t)(t + 1) << 32, 2000};
        assert_int_equal(pthread_create(&threads[t], NULL, worker_run, &workers[t]), 0);
    }
    for (int t = 0; t < THREADS; t++)
        pthread_join(threads[t], NULL);
    assert_int_equal(Engine_end(e, CPU, id, &s), 0);
    Scope_fini(&s);
    assert_int_equal(s.live, 0);
    assert_int_equal(s.allocs, THREADS * 2000 * 64);
    assert_int_equal(s.frees, THREADS * 2000 * 64);
    assert_true(s.peak >= 64 * 64);
    assert_true(s.peak <= THREADS * 64 * 64);
}

static Event *
load_stream(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    Event *ev = malloc((size_t)len);
    if (ev != NULL && fread(ev, 1, (size_t)len, f) != (size_t)len) {
        free(ev);
        ev = NULL;
    }
    fclose(f);
    *n = (size_t)len / sizeof(Event);
    return ev;
}

/* A recorded torch stream replayed twice gives the same figures, and the
 * engine's CUDA totals follow the allocator's reports exactly. */
static void
replay_file(Engine *e, const char *path)
{
    size_t n = 0;
    Event *ev = load_stream(path, &n);
    if (ev == NULL) {
        print_message("no stream at %s\n", path);
        skip();
    }
    int slot = ev[0].slot;
    int64_t max_total = 0;
    for (size_t i = 0; i < n; i++)
        if (ev[i].total > max_total)
            max_total = ev[i].total;
    Scope first, again;
    uint32_t id;
    assert_int_equal(Engine_begin(e, slot, 0, ev[0].total, ev[0].reserved, &id), 0);
    Engine_replay(e, ev, n);
    assert_int_equal(Engine_end(e, slot, id, &first), 0);
    Scope_fini(&first);
    assert_int_equal(Engine_begin(e, slot, 0, ev[0].total, ev[0].reserved, &id), 0);
    Engine_replay(e, ev, n);
    assert_int_equal(Engine_end(e, slot, id, &again), 0);
    Scope_fini(&again);
    assert_true(first.peak > 0);
    assert_int_equal(first.peak, again.peak);
    assert_int_equal(first.live, again.live);
    assert_int_equal(first.allocs, again.allocs);
    if (slot != CPU)
        assert_int_equal(first.peak_total, max_total);
    free(ev);
}

static void
test_replay_cpu_stream(void **state)
{
    replay_file(*state, "fixtures/events/cpu_transformer.bin");
}

static void
test_replay_cuda_stream(void **state)
{
    replay_file(*state, "fixtures/events/cuda_transformer.bin");
}

static void
test_recording(void **state)
{
    Engine *e = *state;
    uint32_t id;
    Event *ev;
    assert_int_equal(Engine_record_start(e, 2), 0);
    assert_int_equal(Engine_begin(e, CPU, 0, -1, -1, &id), 0);
    Engine_event(e, CPU, 0x10, 1, 0, 0, EVENT_REPORT);
    Engine_event(e, CPU, 0x20, 2, 0, 0, EVENT_REPORT);
    Engine_event(e, CPU, 0x30, 3, 0, 0, EVENT_REPORT);   /* over capacity */
    size_t n = Engine_record_stop(e, &ev);
    assert_int_equal(n, 2);
    assert_int_equal(ev[1].addr, 0x20);
    assert_int_equal(ev[1].size, 2);
    free(ev);
    assert_int_equal(Engine_end(e, CPU, id, NULL), 0);
}

/* A request the allocator could not serve is counted with its bytes; it
 * allocates nothing and is no event of the timeline. */
static void
test_a_failed_request_is_counted_and_allocates_nothing(void **state)
{
    Engine *e = *state;
    uint32_t id, site;
    uint64_t count;
    int64_t size;
    Scope s;
    Engine_failed(e, CPU, &count, &size, &site);
    assert_int_equal(count, 0);
    assert_int_equal(Engine_begin(e, CPU, 0, -1, -1, &id), 0);
    Engine_event(e, CPU, 0x1000, MiB, 0, 0, EVENT_REPORT);
    uint64_t seq = Engine_seq(e, CPU);
    Engine_event(e, CPU, 0, (int64_t)1 << 50, 0, 0, EVENT_FAILED);
    Engine_event(e, CPU, 0, 3 * MiB, 0, 0, EVENT_FAILED);
    Engine_failed(e, CPU, &count, &size, &site);
    assert_int_equal(count, 2);
    assert_int_equal(size, 3 * MiB);
    assert_int_equal(site, 0);   /* no attribution set */
    assert_int_equal(Engine_seq(e, CPU), seq);
    assert_int_equal(Engine_current_total(e, CPU), MiB);
    assert_int_equal(Engine_end(e, CPU, id, &s), 0);
    Scope_fini(&s);
    assert_int_equal(s.peak, MiB);
    assert_int_equal(s.live, MiB);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_peak_of_32_and_16_mib_is_48, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nesting_and_detached, setup, teardown),
        cmocka_unit_test_setup_teardown(test_watched_addresses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trace_and_report_merge, setup, teardown),
        cmocka_unit_test_setup_teardown(test_report_first_then_the_request, setup, teardown),
        cmocka_unit_test_setup_teardown(test_depth_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_cpu_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_cuda_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recording, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_failed_request_is_counted_and_allocates_nothing, setup, teardown),
    };
    return cmocka_run_group_tests_name("engine", tests, NULL, NULL);
}
