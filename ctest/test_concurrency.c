/* The hot path's promises under threads, for ThreadSanitizer (make
 * check-tsan) and the other builds alike: allocator threads deliver events
 * while the measuring thread opens and closes scopes, reads their figures,
 * moves its shadow stack's lines and resets them; the attribution reads
 * that stack and raises its high-water marks from every allocator thread
 * at once, and finds the lines of its located frames while the measuring
 * thread moves them and frees each frame after it left. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine.h"
#include "shadow_stack.h"
#include "sites.h"

#define CPU ENGINE_SLOT_CPU
#define CUDA0 1
#define THREADS 4
#define MIN_EVENTS 1000
/* valgrind runs one thread at a time: bounded, so that workers cannot
 * starve the measuring thread there for long. */
#define MAX_EVENTS 40000

typedef struct World {
    Engine *engine;
    LineTable lines;
    SiteTable sites;
    LineClock clock;
    ShadowStack *stack;         /* the measuring thread's */
    atomic_int go;
    atomic_int stop;
} World;

typedef struct Worker {
    World *world;
    int index;
    int slot;
    long events;
} Worker;

/* As tracer.c's: threads without frames of their own allocate on behalf of
 * the measuring thread's stack. */
static uint32_t
attribute(void *ctx, int slot, int64_t size, int64_t total, int64_t reserved)
{
    World *w = ctx;
    return ShadowStack_attribute(w->stack, &w->clock, 0, slot, size, total,
                                 reserved);
}

static World *
world_new(void)
{
    World *w = calloc(1, sizeof(World));
    assert_non_null(w);
    w->engine = Engine_new();
    assert_non_null(w->engine);
    assert_int_equal(LineTable_init(&w->lines), 0);
    assert_int_equal(SiteTable_init(&w->sites), 0);
    w->clock = (LineClock){w->engine, &w->lines, &w->sites, NULL, NULL};
    w->stack = ShadowStack_new();
    assert_non_null(w->stack);
    atomic_init(&w->go, 0);
    atomic_init(&w->stop, 0);
    /* Devices are created by the API (the measuring thread) before any
     * event can reach them. */
    for (int slot = CPU; slot <= CUDA0; slot++) {
        uint32_t id;
        Scope s;
        assert_int_equal(Engine_begin(w->engine, slot, 0, 0, 0, &id), 0);
        assert_int_equal(Engine_end(w->engine, slot, id, &s), 0);
        Scope_fini(&s);
    }
    Engine_set_attribution(w->engine, attribute, w);
    return w;
}

static void
world_free(World *w)
{
    Engine_free(w->engine);
    free(w->stack);
    SiteTable_fini(&w->sites);
    LineTable_fini(&w->lines);
    free(w);
}

static void *
allocate_and_free(void *arg)
{
    Worker *k = arg;
    World *w = k->world;
    while (!atomic_load(&w->go))
        sched_yield();
    /* Addresses of its own, so that threads never free each other's. */
    uintptr_t base = ((uintptr_t)k->index + 1) << 24;
    int64_t total = 0;
    for (long i = 0; i < MAX_EVENTS && (i < MIN_EVENTS || !atomic_load(&w->stop));
         i++) {
        uintptr_t addr = base + (uintptr_t)(i % 64) * 4096;
        int64_t size = 512 + (i % 7) * 64;
        total += size;
        Engine_event(w->engine, k->slot, addr, size, total, total * 2,
                     EVENT_REPORT);
        total -= size;
        Engine_event(w->engine, k->slot, addr, -size, total, total * 2,
                     EVENT_REPORT);
        k->events += 2;
    }
    return NULL;
}

static void
start_workers(World *w, Worker *workers, pthread_t *threads)
{
    for (int i = 0; i < THREADS; i++) {
        workers[i] = (Worker){w, i, i % 2 ? CUDA0 : CPU, 0};
        assert_int_equal(pthread_create(&threads[i], NULL, allocate_and_free,
                                        &workers[i]), 0);
    }
    atomic_store(&w->go, 1);
}

/* While events flow on two devices at once (a scope stays open on each, so
 * that every allocation is attributed): scopes opened and closed inside
 * them, their figures, blocks, timelines and totals read, the stack's
 * frames pushed, moved and popped, the line statistics read and reset. */
static void
test_events_against_scopes_and_a_moving_stack(void **state)
{
    (void)state;
    World *w = world_new();
    Worker workers[THREADS];
    pthread_t threads[THREADS];
    uint32_t outer[2];
    Scope s;
    assert_int_equal(Engine_begin(w->engine, CPU, 0, -1, -1, &outer[CPU]), 0);
    assert_int_equal(Engine_begin(w->engine, CUDA0, 0, 0, 0, &outer[CUDA0]), 0);
    start_workers(w, workers, threads);
    Block blocks[64];
    for (int round = 0; round < 200; round++) {
        int slot = round % 2 ? CUDA0 : CPU;
        uint32_t id, inner;
        assert_int_equal(Engine_begin(w->engine, slot, 0, -1, -1, &id), 0);
        assert_int_equal(Engine_timeline_start(w->engine, slot, id), 0);
        ShadowStack_push(w->stack, &w->clock, 1, 10);
        ShadowStack_push(w->stack, &w->clock, 2, 20 + round % 3);
        assert_int_equal(ShadowStack_line(w->stack, &w->clock, 2, 21), 1);
        assert_int_equal(Engine_begin(w->engine, slot, round % 3 == 0, -1, -1,
                                      &inner), 0);
        assert_int_equal(Engine_stats(w->engine, slot, inner, 1, &s), 0);
        assert_true(s.peak >= s.live);
        Scope_fini(&s);
        long n = Engine_blocks(w->engine, slot, id, blocks, 64);
        assert_true(n >= 0);
        for (long i = 0; i < n && i < 64; i++)
            assert_true(blocks[i].site <= atomic_load(&w->sites.count));
        assert_int_equal(Engine_end(w->engine, slot, inner, &s), 0);
        Scope_fini(&s);
        ShadowStack_pop(w->stack, &w->clock, 2);
        assert_int_equal(ShadowStack_line(w->stack, &w->clock, 1, 11), 1);
        uint64_t seq;
        assert_int_equal(Engine_timeline_seq(w->engine, slot, &seq), 0);
        int64_t total, reserved;
        assert_int_equal(Engine_totals(w->engine, slot, &total, &reserved), 0);
        uint32_t touched;
        if (LineTable_touched(&w->lines, &touched) == 0) {
            for (uint32_t i = 0; i < touched; i++)
                (void)LineTable_touched_id(&w->lines, i);
        }
        if (round % 10 == 0) {
            LineTable_reset(&w->lines);
            ShadowStack_unwind_to(w->stack, &w->clock, 0);
            ShadowStack_reset(w->stack);
        }
        assert_int_equal(Engine_end(w->engine, slot, id, &s), 0);
        assert_true(s.live >= 0);
        assert_true(s.peak >= s.live);
        Scope_fini(&s);
        uint64_t dropped;
        assert_int_equal(Engine_take_error(w->engine, slot, &dropped), ENGINE_OK);
    }
    atomic_store(&w->stop, 1);
    long events = 0;
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(threads[i], NULL), 0);
        events += workers[i].events;
    }
    for (int slot = CUDA0; slot >= CPU; slot--) {
        assert_int_equal(Engine_end(w->engine, slot, outer[slot], &s), 0);
        assert_int_equal(s.live, 0);    /* every thread freed what it took */
        assert_true(s.allocs > 0);
        Scope_fini(&s);
    }
    assert_true(events >= THREADS * MIN_EVENTS);
    world_free(w);
}

typedef struct Raiser {
    ShadowStack *stack;
    const LineClock *clock;
    atomic_int *go;
    int64_t base;
} Raiser;

static void *
raise_marks(void *arg)
{
    Raiser *r = arg;
    while (!atomic_load(r->go))
        sched_yield();
    for (int64_t i = 0; i < 5000; i++)
        (void)ShadowStack_attribute(r->stack, r->clock, 0, CUDA0, 1,
                                    r->base + i, r->base + 2 * i);
    return NULL;
}

/* Several threads raise one frame's high-water marks at once: none of their
 * raises is lost (the mark ends at the highest), and the line's peak, taken
 * when the line ends, is that mark. */
static void
test_high_water_marks_from_several_threads(void **state)
{
    (void)state;
    World *w = world_new();
    ShadowStack_push(w->stack, &w->clock, 3, 30);
    Raiser raisers[THREADS];
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++) {
        raisers[i] = (Raiser){w->stack, &w->clock, &w->go, (int64_t)i * 1000};
        assert_int_equal(pthread_create(&threads[i], NULL, raise_marks,
                                        &raisers[i]), 0);
    }
    atomic_store(&w->go, 1);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(threads[i], NULL), 0);
    int64_t top = (THREADS - 1) * 1000 + 4999;
    int64_t top_reserved = (THREADS - 1) * 1000 + 2 * 4999;
    assert_int_equal(atomic_load(&w->stack->frames[0].hw[CUDA0]), top);
    assert_int_equal(atomic_load(&w->stack->frames[0].hwr[CUDA0]), top_reserved);
    ShadowStack_pop(w->stack, &w->clock, 3);
    LineRec *line = LineTable_get(&w->lines, LineTable_intern(&w->lines, 3, 30));
    assert_int_equal(atomic_load(&line->peak[CUDA0]), top);
    assert_int_equal(atomic_load(&line->peak_reserved[CUDA0]), top_reserved);
    assert_int_equal(atomic_load(&line->alloc[CUDA0]), THREADS * 5000);
    world_free(w);
}

/* Allocator threads deliver CPU events without pause, up to MAX_EVENTS
 * (valgrind runs one thread at a time: unbounded, they starve the forking
 * thread there). */
typedef struct Churn {
    Engine *engine;
    atomic_int stop;
    uintptr_t base;
} Churn;

static void *
churn_run(void *arg)
{
    Churn *c = arg;
    long i = 0;
    while (!atomic_load(&c->stop) && i < MAX_EVENTS / 2) {
        uintptr_t addr = c->base + (uintptr_t)(i % 64) * 64;
        Engine_event(c->engine, CPU, addr, 64, 0, 0, EVENT_REPORT);
        Engine_event(c->engine, CPU, addr, -1, 0, 0, EVENT_REPORT);
        i++;
    }
    return NULL;
}

#if defined(__SANITIZE_THREAD__)
/* A forked child ends without its parent's threads, which ThreadSanitizer
 * may then report as leaked (it did once in ci/test, on a loaded machine:
 * exit 66 from the child of the fork test below); this file joins every
 * thread it starts. */
const char *__tsan_default_options(void);
const char *
__tsan_default_options(void)
{
    return "report_thread_leaks=0";
}
#endif

/* A fork while other threads deliver events: the fork handlers take the
 * engine's locks first, so the child never starts with one held by a thread
 * it does not have, and its own first events go through (a child that hangs
 * is ended by its alarm and fails the test). */
static void
test_a_fork_while_threads_deliver_events(void **state)
{
    (void)state;
    Engine *e = Engine_new();
    assert_non_null(e);
    uint32_t id;
    Scope s;
    assert_int_equal(Engine_begin(e, CPU, 0, 0, 0, &id), 0);
    Churn churn[2];
    pthread_t threads[2];
    for (int t = 0; t < 2; t++) {
        churn[t].engine = e;
        atomic_init(&churn[t].stop, 0);
        churn[t].base = 0x100000u * (uintptr_t)(t + 1);
        assert_int_equal(pthread_create(&threads[t], NULL, churn_run, &churn[t]), 0);
    }
    for (int round = 0; round < 10; round++) {
        Engine_fork_prepare(e);
        pid_t pid = fork();
        Engine_fork_release(e);
        if (pid == 0) {
            alarm(10);
            Engine_event(e, CPU, 0x900000, 128, 0, 0, EVENT_REPORT);
            Engine_event(e, CPU, 0x900000, -1, 0, 0, EVENT_REPORT);
            _exit(0);
        }
        assert_true(pid > 0);
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    for (int t = 0; t < 2; t++) {
        atomic_store(&churn[t].stop, 1);
        pthread_join(threads[t], NULL);
    }
    assert_int_equal(Engine_end(e, CPU, id, &s), 0);
    assert_int_equal(s.live, 0);
    Scope_fini(&s);
    Engine_free(e);
}

/* A located frame here: the instruction it runs, moved by its owner while
 * other threads read it; freed once it has left, as the interpreter frees
 * a returned frame's memory. */
typedef struct FakeFrame {
    atomic_int lasti;
} FakeFrame;

static int
fake_lasti(const void *where)
{
    return atomic_load_explicit(&((FakeFrame *)where)->lasti,
                                memory_order_relaxed);
}

static int
fake_line_of(const void *code_ref, int lasti)
{
    return *(const int *)code_ref * 100 + lasti % 7;
}

typedef struct Reader {
    World *world;
    long reads;
    atomic_int started;         /* the first read is done */
} Reader;

static void *
read_located(void *arg)
{
    Reader *r = arg;
    World *w = r->world;
    while (!atomic_load(&w->go))
        sched_yield();
    while (!atomic_load(&w->stop) && r->reads < MAX_EVENTS) {
        (void)ShadowStack_attribute(w->stack, &w->clock, 0, CUDA0, 8,
                                    r->reads, r->reads);
        r->reads++;
        atomic_store_explicit(&r->started, 1, memory_order_relaxed);
    }
    return NULL;
}

/* Other threads find the measuring thread's lines in its located frames
 * while it pushes, moves and pops them, and frees each frame once popped:
 * no reader touches a freed frame (AddressSanitizer, valgrind), every
 * table they intern into stays consistent (ThreadSanitizer). */
static void
test_located_frames_read_while_they_come_and_go(void **state)
{
    (void)state;
    World *w = world_new();
    w->clock.lasti = fake_lasti;
    w->clock.line_of = fake_line_of;
    static const int codes[4] = {1, 2, 3, 4};
    FakeFrame *outer = calloc(1, sizeof(FakeFrame));
    assert_non_null(outer);
    ShadowStack_push_located(w->stack, 1, outer, &codes[0]);
    Reader readers[THREADS];
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++) {
        readers[i] = (Reader){w, 0, 0};
        assert_int_equal(pthread_create(&threads[i], NULL, read_located,
                                        &readers[i]), 0);
    }
    atomic_store(&w->go, 1);
    /* The frames come and go while a reader reads: under valgrind, which
     * runs one thread at a time, the rounds could otherwise all pass
     * before any reader is scheduled. */
    while (!atomic_load_explicit(&readers[0].started, memory_order_relaxed))
        sched_yield();
    for (int round = 0; round < 2000; round++) {
        atomic_store_explicit(&outer->lasti, round, memory_order_relaxed);
        FakeFrame *inner = calloc(1, sizeof(FakeFrame));
        assert_non_null(inner);
        ShadowStack_push_located(w->stack, 2 + round % 3, inner,
                                 &codes[1 + round % 3]);
        for (int i = 0; i < 4; i++)
            atomic_store_explicit(&inner->lasti, i * 2, memory_order_relaxed);
        ShadowStack_pop(w->stack, &w->clock, 2 + round % 3);
        free(inner);
        if (round % 100 == 0)
            sched_yield();
    }
    atomic_store(&w->stop, 1);
    long reads = 0;
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(threads[i], NULL), 0);
        reads += readers[i].reads;
    }
    assert_true(reads > 0);
    assert_int_equal(atomic_load(&w->stack->readers), 0);
    ShadowStack_pop(w->stack, &w->clock, 1);
    free(outer);
    assert_true(atomic_load(&w->sites.count) > 0);
    world_free(w);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events_against_scopes_and_a_moving_stack),
        cmocka_unit_test(test_high_water_marks_from_several_threads),
        cmocka_unit_test(test_a_fork_while_threads_deliver_events),
        cmocka_unit_test(test_located_frames_read_while_they_come_and_go),
    };
    return cmocka_run_group_tests_name("concurrency", tests, NULL, NULL);
}
