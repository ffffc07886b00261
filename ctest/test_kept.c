/* What a test kept: the peak without any subset of the blocks still live at
 * its end, from the tracker's spans, against a brute force over the whole
 * event history; detached scopes, estimates corrected, frees unheard. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"

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

/* The peak without the blocks whose kept flag is set, from the tracker's
 * spans: what pytest_memlab.engine.meters computes. */
static int64_t
peak_without(const KeptBlock *b, uint32_t n, int64_t head_max,
             const int *kept)
{
    int64_t best = head_max, cum = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (kept[i])
            cum += b[i].size;
        if (b[i].span_max - cum > best)
            best = b[i].span_max - cum;
    }
    return best;
}

static void
test_workspace_first_use_is_left_out(void **state)
{
    Engine *e = *state;
    uint32_t id;
    KeptBlock *b;
    uint32_t n;
    KeptBlock h;
    assert_int_equal(Engine_begin(e, CPU, 0, -1, -1, &id), 0);
    assert_int_equal(Engine_timeline_start(e, CPU, id), 0);
    Engine_event(e, CPU, 0x100, 100, 0, 0, EVENT_REPORT);   /* A */
    Engine_event(e, CPU, 0x100, -100, 0, 0, EVENT_REPORT);
    Engine_event(e, CPU, 0x200, 32, 0, 0, EVENT_REPORT);    /* workspace, kept */
    Engine_event(e, CPU, 0x300, 80, 0, 0, EVENT_REPORT);    /* B */
    Engine_event(e, CPU, 0x300, -80, 0, 0, EVENT_REPORT);
    assert_int_equal(Engine_kept(e, CPU, id, &b, &n, &h), 0);
    assert_int_equal(n, 1);
    assert_int_equal(b[0].addr, 0x200);
    assert_int_equal(b[0].size, 32);
    assert_int_equal(b[0].span_max, 112);
    assert_int_equal(h.span_max, 100);
    assert_int_equal(h.span_seq, 1);
    int kept = 1;
    /* The peak with the workspace is 112 at B; without it 100, at A. */
    assert_int_equal(peak_without(b, n, h.span_max, &kept), 100);
    kept = 0;
    assert_int_equal(peak_without(b, n, h.span_max, &kept), 112);
    free(b);
    assert_int_equal(Engine_end(e, CPU, id, NULL), 0);
    /* Closed: not followed any more. */
    assert_int_equal(Engine_kept(e, CPU, id, &b, &n, &h), -1);
}

/* A detached scope's blocks (a broader fixture's) are not the test's: not
 * followed; a scope without a timeline is not followed either. */
static void
test_detached_blocks_are_not_followed(void **state)
{
    Engine *e = *state;
    uint32_t id, fixture, region;
    KeptBlock *b;
    uint32_t n;
    KeptBlock h;
    assert_int_equal(Engine_begin(e, CPU, 0, -1, -1, &id), 0);
    assert_int_equal(Engine_timeline_start(e, CPU, id), 0);
    assert_int_equal(Engine_begin(e, CPU, 1, -1, -1, &fixture), 0);
    Engine_event(e, CPU, 0x100, 500, 0, 0, EVENT_REPORT);
    assert_int_equal(Engine_end(e, CPU, fixture, NULL), 0);
    assert_int_equal(Engine_begin(e, CPU, 0, -1, -1, &region), 0);
    Engine_event(e, CPU, 0x200, 7, 0, 0, EVENT_REPORT);     /* a region's: the test's too */
    assert_int_equal(Engine_kept(e, CPU, region, &b, &n, &h), -1);
    assert_int_equal(Engine_end(e, CPU, region, NULL), 0);
    assert_int_equal(Engine_kept(e, CPU, id, &b, &n, &h), 0);
    assert_int_equal(n, 1);
    assert_int_equal(b[0].addr, 0x200);
    free(b);
    Engine_event(e, CPU, 0x100, -500, 0, 0, EVENT_REPORT);
    Engine_event(e, CPU, 0x200, -7, 0, 0, EVENT_REPORT);
    assert_int_equal(Engine_kept(e, CPU, id, &b, &n, &h), 0);
    assert_int_equal(n, 0);
    assert_null(b);
    assert_int_equal(h.span_max, 7);
    assert_int_equal(Engine_end(e, CPU, id, NULL), 0);
}

/* An inner test's timeline takes the device over (an in-process pytest run
 * inside a measured test): the outer scope can no longer say what it kept. */
static void
test_a_nested_timeline_takes_over(void **state)
{
    Engine *e = *state;
    uint32_t outer, inner;
    KeptBlock *b;
    uint32_t n;
    KeptBlock h;
    assert_int_equal(Engine_begin(e, CPU, 0, -1, -1, &outer), 0);
    assert_int_equal(Engine_timeline_start(e, CPU, outer), 0);
    Engine_event(e, CPU, 0x100, 10, 0, 0, EVENT_REPORT);
    assert_int_equal(Engine_begin(e, CPU, 0, -1, -1, &inner), 0);
    assert_int_equal(Engine_timeline_start(e, CPU, inner), 0);
    Engine_event(e, CPU, 0x200, 20, 0, 0, EVENT_REPORT);
    Engine_event(e, CPU, 0x100, -10, 0, 0, EVENT_REPORT);   /* the outer's: not followed */
    assert_int_equal(Engine_kept(e, CPU, inner, &b, &n, &h), 0);
    assert_int_equal(n, 1);
    assert_int_equal(b[0].size, 20);
    free(b);
    assert_int_equal(Engine_kept(e, CPU, outer, &b, &n, &h), -1);
    assert_int_equal(Engine_end(e, CPU, inner, NULL), 0);
    assert_int_equal(Engine_kept(e, CPU, outer, &b, &n, &h), -1);
    Engine_event(e, CPU, 0x200, -20, 0, 0, EVENT_REPORT);
    assert_int_equal(Engine_end(e, CPU, outer, NULL), 0);
    /* A timeline started on a scope that allocated already says nothing. */
    assert_int_equal(Engine_begin(e, CPU, 0, -1, -1, &outer), 0);
    Engine_event(e, CPU, 0x300, 5, 0, 0, EVENT_REPORT);
    assert_int_equal(Engine_timeline_start(e, CPU, outer), 0);
    assert_int_equal(Engine_kept(e, CPU, outer, &b, &n, &h), -1);
    Engine_event(e, CPU, 0x300, -5, 0, 0, EVENT_REPORT);
    assert_int_equal(Engine_end(e, CPU, outer, NULL), 0);
}

/* CUDA: the tracker heard an allocation first (an estimate), the report
 * corrects it; an address that comes back retires the block unheard. */
static void
test_estimates_and_unheard_frees(void **state)
{
    Engine *e = *state;
    uint32_t id;
    KeptBlock *b;
    uint32_t n;
    KeptBlock h;
    assert_int_equal(Engine_begin(e, CUDA0, 0, 0, 0, &id), 0);
    assert_int_equal(Engine_timeline_start(e, CUDA0, id), 0);
    Engine_event(e, CUDA0, 0x100, 4, 4, 0, EVENT_TRACE);
    Engine_event(e, CUDA0, 0x100, 512, 512, 2048, EVENT_REPORT);
    Engine_event(e, CUDA0, 0x200, 1024, 1536, 2048, EVENT_REPORT);
    Engine_event(e, CUDA0, 0x200, 2048, 2560, 4096, EVENT_REPORT);  /* came back: retired */
    assert_int_equal(Engine_kept(e, CUDA0, id, &b, &n, &h), 0);
    assert_int_equal(n, 2);
    assert_int_equal(b[0].size, 4);         /* the request, not the block */
    assert_int_equal(b[1].size, 2048);
    assert_int_equal(b[0].span_max, 1028);  /* 0x200's span folded into it */
    free(b);
    assert_int_equal(Engine_end(e, CUDA0, id, NULL), 0);
}

/* One event of a random stream over addrs addresses (0x1000 + 0x100 * a):
 * frees address a's block where one is live, else allocates 1 to 1000
 * bytes there.  Returns the size (negative: a free) and the address's
 * index in *which. */
static int64_t
random_event(Engine *e, int64_t *live_size, int addrs, int *which)
{
    int a = rand() % addrs;
    int64_t size;
    if (live_size[a] != 0) {
        size = -live_size[a];
        live_size[a] = 0;
    } else {
        size = 1 + rand() % 1000;
        live_size[a] = size;
    }
    Engine_event(e, CPU, 0x1000 + 0x100 * (uintptr_t)a, size, 0, 0, EVENT_REPORT);
    *which = a;
    return size;
}

/* Frees what a random stream left live. */
static void
free_stream(Engine *e, const int64_t *live_size, int addrs)
{
    for (int a = 0; a < addrs; a++) {
        if (live_size[a] != 0)
            Engine_event(e, CPU, 0x1000 + 0x100 * (uintptr_t)a,
                         -live_size[a], 0, 0, EVENT_REPORT);
    }
}

/* Random streams: for every subset of the blocks live at the end, the peak
 * without them equals a brute force over the whole history. */
static void
test_random_streams_against_brute_force(void **state)
{
    Engine *e = *state;
    enum { EVENTS = 400, ADDRS = 12 };
    srand(7);
    for (int round = 0; round < 200; round++) {
        uint32_t id;
        int64_t live_size[ADDRS] = {0};
        uint64_t alloc_seq[ADDRS] = {0};
        int64_t own[EVENTS + 1];
        uint64_t seqs[EVENTS + 1];
        /* per event: which address it touched and how */
        int64_t hist_size[EVENTS];
        int hist_addr[EVENTS];
        uint64_t seq0 = Engine_seq(e, CPU);
        assert_int_equal(Engine_begin(e, CPU, 0, -1, -1, &id), 0);
        assert_int_equal(Engine_timeline_start(e, CPU, id), 0);
        int64_t now = 0;
        int m = 0;
        for (int i = 0; i < EVENTS; i++) {
            int a;
            int64_t size = random_event(e, live_size, ADDRS, &a);
            now += size;
            if (size > 0)
                alloc_seq[a] = Engine_seq(e, CPU);
            hist_size[m] = size;
            hist_addr[m] = a;
            own[m] = now;
            seqs[m] = Engine_seq(e, CPU);
            m++;
        }
        KeptBlock *b;
        uint32_t n;
        KeptBlock h;
        assert_int_equal(Engine_kept(e, CPU, id, &b, &n, &h), 0);
        int live = 0;
        for (int a = 0; a < ADDRS; a++)
            live += live_size[a] != 0;
        assert_int_equal(n, live);
        for (uint32_t i = 1; i < n; i++)
            assert_true(b[i - 1].seq < b[i].seq);
        for (int mask = 0; mask < (1 << n); mask++) {
            int kept[ADDRS] = {0};
            int kept_addr[ADDRS] = {0};
            for (uint32_t i = 0; i < n; i++) {
                kept[i] = (mask >> i) & 1;
                kept_addr[(b[i].addr - 0x1000) / 0x100] = kept[i];
            }
            /* brute force: own(t) minus the kept blocks allocated by t */
            int64_t best = 0, k = 0;
            for (int i = 0; i < m; i++) {
                int a = hist_addr[i];
                if (hist_size[i] > 0 && kept_addr[a] && live_size[a] != 0
                    && alloc_seq[a] == seqs[i])
                    k += hist_size[i];
                if (own[i] - k > best)
                    best = own[i] - k;
            }
            assert_int_equal(peak_without(b, n, h.span_max, kept), best);
        }
        (void)seq0;
        free(b);
        free_stream(e, live_size, ADDRS);
        assert_int_equal(Engine_end(e, CPU, id, NULL), 0);
    }
}

/* Each phase's peak without a subset of the kept blocks, as the plugin
 * computes it from the spans; -1 where the phase never ran. */
static int64_t
phase_peak_without(const KeptBlock *b, uint32_t n, const KeptBlock *head,
                   const int *kept, int kind)
{
    int64_t best = head->phases.max[kind], cum = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (kept[i])
            cum += b[i].size;
        if (b[i].phases.max[kind] >= 0 && b[i].phases.max[kind] - cum > best)
            best = b[i].phases.max[kind] - cum;
    }
    return best;
}

/* Random streams with the phases switched at random moments: per phase,
 * for every subset of the blocks live at the end, the peak without them
 * equals a brute force over every moment the phase ran (each event in it,
 * and its start, whose live bytes count for it). */
static void
test_phase_peaks_against_brute_force(void **state)
{
    Engine *e = *state;
    enum { EVENTS = 300, ADDRS = 10, MOMENTS = 2 * EVENTS };
    srand(11);
    for (int round = 0; round < 150; round++) {
        uint32_t id;
        int64_t live_size[ADDRS] = {0};
        int64_t mom_own[MOMENTS];
        uint64_t mom_seq[MOMENTS];
        unsigned mom_mask[MOMENTS];
        int moments = 0;
        unsigned mask = 0;
        Engine_set_phases(e, 0);
        assert_int_equal(Engine_begin(e, CPU, 0, -1, -1, &id), 0);
        assert_int_equal(Engine_timeline_start(e, CPU, id), 0);
        int64_t now = 0;
        for (int i = 0; i < EVENTS; i++) {
            if (rand() % 8 == 0) {
                mask = (unsigned)(rand() % 8) << 1;   /* forward, backward, step */
                Engine_set_phases(e, mask);
                mom_own[moments] = now;
                mom_seq[moments] = Engine_seq(e, CPU);
                mom_mask[moments++] = mask;
            }
            int a;
            int64_t size = random_event(e, live_size, ADDRS, &a);
            now += size;
            mom_own[moments] = now;
            mom_seq[moments] = Engine_seq(e, CPU);
            mom_mask[moments++] = mask;
        }
        KeptBlock *b;
        uint32_t n;
        KeptBlock h;
        assert_int_equal(Engine_kept(e, CPU, id, &b, &n, &h), 0);
        for (int m = 0; m < (1 << n); m++) {
            int kept[ADDRS] = {0};
            for (uint32_t i = 0; i < n; i++)
                kept[i] = (m >> i) & 1;
            for (int kind = PHASE_FORWARD; kind <= PHASE_STEP; kind++) {
                int64_t best = -1;
                for (int t = 0; t < moments; t++) {
                    if (!((mom_mask[t] >> kind) & 1u))
                        continue;
                    int64_t k = 0;   /* kept blocks allocated by then */
                    for (uint32_t i = 0; i < n; i++)
                        if (kept[i] && b[i].seq <= mom_seq[t])
                            k += b[i].size;
                    if (mom_own[t] - k > best)
                        best = mom_own[t] - k;
                }
                assert_int_equal(phase_peak_without(b, n, &h, kept, kind), best);
            }
        }
        free(b);
        free_stream(e, live_size, ADDRS);
        assert_int_equal(Engine_end(e, CPU, id, NULL), 0);
    }
    Engine_set_phases(e, 0);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_workspace_first_use_is_left_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_detached_blocks_are_not_followed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_nested_timeline_takes_over, setup, teardown),
        cmocka_unit_test_setup_teardown(test_estimates_and_unheard_frees, setup, teardown),
        cmocka_unit_test_setup_teardown(test_random_streams_against_brute_force, setup, teardown),
        cmocka_unit_test_setup_teardown(test_phase_peaks_against_brute_force, setup, teardown),
    };
    return cmocka_run_group_tests_name("kept", tests, NULL, NULL);
}
