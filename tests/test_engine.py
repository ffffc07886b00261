"""The engine through its CPython module, with events injected as an
allocator would deliver them.  Needs no torch, so it runs on every Python."""

import pytest

from pytest_memlab import _engine as E

CUDA0 = 1  # slot of cuda:0
CPU = E.SLOT_CPU
MiB = 2**20


def test_own_peak_of_two_blocks_freed_is_their_sum():
    sid = E.begin(CPU)
    E.inject(CPU, 0x1000, 32 * MiB)
    E.inject(CPU, 0x2000, 16 * MiB)
    E.inject(CPU, 0x1000, -32 * MiB)
    E.inject(CPU, 0x2000, -16 * MiB)
    s = E.end(CPU, sid)
    assert s["peak"] == 48 * MiB
    assert s["live"] == 0
    assert (s["allocs"], s["frees"]) == (2, 2)
    assert s["reserved_peak"] is None


def test_cuda_totals_come_from_the_allocator_reports():
    sid = E.begin(CUDA0, total=1000 * MiB, reserved=2000 * MiB)
    E.inject(CUDA0, 0xA000, 10 * MiB, total=1010 * MiB, reserved=2000 * MiB)
    E.inject(CUDA0, 0xB000, 30 * MiB, total=1040 * MiB, reserved=2048 * MiB)
    E.inject(CUDA0, 0xA000, -10 * MiB, total=1030 * MiB, reserved=2048 * MiB)
    s = E.end(CUDA0, sid)
    assert s["start_total"] == 1000 * MiB
    assert s["peak_total"] == 1040 * MiB
    assert s["reserved_peak"] == 2048 * MiB
    assert s["peak"] == 40 * MiB
    assert s["total_at_peak"] == 1040 * MiB
    assert s["live"] == 30 * MiB  # still held at the end: what a leak check reads


def test_frees_of_older_blocks_do_not_count():
    E.inject(CPU, 0x5000, 8 * MiB)  # no scope open: not followed
    sid = E.begin(CPU)
    E.inject(CPU, 0x5000, -8 * MiB)
    E.inject(CPU, 0x6000, 1 * MiB)
    s = E.end(CPU, sid)
    assert s["peak"] == 1 * MiB
    assert s["live"] == 1 * MiB
    assert s["frees"] == 0


def test_nested_scopes_each_keep_their_own_peak():
    outer = E.begin(CPU)
    E.inject(CPU, 0x1000, 10 * MiB)
    inner = E.begin(CPU)
    E.inject(CPU, 0x2000, 5 * MiB)
    E.inject(CPU, 0x1000, -10 * MiB)  # older than inner: only outer drops
    E.inject(CPU, 0x3000, 2 * MiB)
    si = E.end(CPU, inner)
    E.inject(CPU, 0x2000, -5 * MiB)
    E.inject(CPU, 0x3000, -2 * MiB)
    so = E.end(CPU, outer)
    assert si["peak"] == 7 * MiB
    assert si["live"] == 7 * MiB
    assert so["peak"] == 15 * MiB
    assert so["live"] == 0


def test_detached_scope_blocks_do_not_count_for_the_enclosing_test():
    test = E.begin(CPU)
    fixture = E.begin(CPU, detached=True)
    E.inject(CPU, 0x1000, 100 * MiB)  # a module fixture's tensor
    sf = E.end(CPU, fixture)
    E.inject(CPU, 0x2000, 1 * MiB)
    st = E.stats(CPU, test)
    assert E.totals(CPU)[0] == 101 * MiB  # still part of the device total
    E.inject(CPU, 0x1000, -100 * MiB)
    E.inject(CPU, 0x2000, -1 * MiB)
    s = E.end(CPU, test)
    assert sf["peak"] == 100 * MiB
    assert st["peak"] == 1 * MiB
    assert s["peak"] == 1 * MiB and s["live"] == 0
    assert s["peak_total"] == 101 * MiB


def test_scopes_must_nest():
    a = E.begin(CPU)
    b = E.begin(CPU)
    with pytest.raises(ValueError, match="not the innermost"):
        E.end(CPU, a)
    E.end(CPU, b)
    E.end(CPU, a)
    with pytest.raises(ValueError, match="not open"):
        E.stats(CPU, a)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="out of range"):
        E.begin(E.MAX_DEVICES)
    with pytest.raises(ValueError, match="address 0"):
        E.inject(CPU, 0, 1)
    with pytest.raises(ValueError, match="whole number"):
        E.replay(b"x" * (E.EVENT_SIZE + 1))


def test_the_request_counts_for_the_scope_and_the_block_for_the_device():
    sid = E.begin(CUDA0, total=0, reserved=0)
    # the tracker sees the request (1000 B, rounded to 1024) before the
    # report, whose block is a cached one handed out unsplit (1536 B): its
    # slack depends on what earlier tests left in the cache, so the scope
    # counts the request, the device's total the block
    E.inject(CUDA0, 0xC000, 1024, source=E.EVENT_TRACE)
    E.inject(CUDA0, 0xC000, 1536, total=1536, reserved=2 * MiB)
    # the free is heard twice: tracker first, then the report
    E.inject(CUDA0, 0xC000, -1, source=E.EVENT_TRACE)
    E.inject(CUDA0, 0xC000, -1536, total=0, reserved=2 * MiB)
    s = E.end(CUDA0, sid)
    assert s["peak"] == 1024
    assert s["peak_total"] == 1536
    assert s["live"] == 0 and s["allocs"] == 1 and s["frees"] == 1


def test_free_heard_only_by_the_tracker_releases_the_block():
    sid = E.begin(CUDA0, total=0, reserved=0)
    E.inject(CUDA0, 0xD000, 4096, total=4096, reserved=MiB)
    E.inject(CUDA0, 0xD000, -1, source=E.EVENT_TRACE)  # freed on a plain thread
    assert E.stats(CUDA0, sid)["live"] == 0
    assert E.totals(CUDA0)[0] == 0
    E.end(CUDA0, sid)


def test_reused_address_retires_a_block_whose_free_was_missed():
    sid = E.begin(CPU)
    E.inject(CPU, 0x7000, 100)
    E.inject(CPU, 0x7000, 200)  # the allocator handed the address out again
    s = E.end(CPU, sid)
    assert s["live"] == 200
    assert s["peak"] == 200


def test_blocks_lists_what_counts_for_a_scope():
    outer = E.begin(CPU)
    E.inject(CPU, 0x1000, 10)
    inner = E.begin(CPU)
    E.inject(CPU, 0x2000, 20)
    assert sorted(b[:2] for b in E.blocks(CPU, inner)) == [(0x2000, 20)]
    assert sorted(b[:2] for b in E.blocks(CPU, outer)) == [(0x1000, 10), (0x2000, 20)]
    E.end(CPU, inner)
    E.end(CPU, outer)


def test_many_blocks_grow_the_ledger_and_all_come_back():
    sid = E.begin(CPU)
    n = 50_000
    for i in range(1, n + 1):
        E.inject(CPU, i * 64, 64)
    assert E.stats(CPU, sid)["live"] == n * 64
    assert len(E.blocks(CPU, sid)) == n
    for i in range(n, 0, -1):
        E.inject(CPU, i * 64, -64)
    s = E.end(CPU, sid)
    assert s["peak"] == n * 64 and s["live"] == 0


def test_record_and_replay_reproduce_the_figures():
    sid = E.begin(CPU)
    E.record_start(100)
    E.inject(CPU, 0x1000, 300)
    E.inject(CPU, 0x2000, 500)
    E.inject(CPU, 0x1000, -300)
    E.inject(CPU, 0x2000, -500)
    data = E.record_stop()
    first = E.end(CPU, sid)
    assert len(data) == 4 * E.EVENT_SIZE
    sid = E.begin(CPU)
    assert E.replay(data, 3) == 12
    again = E.end(CPU, sid)
    assert again["peak"] == first["peak"] == 800
    assert again["allocs"] == 6


def test_events_for_unopened_devices_are_ignored():
    E.inject(40, 0x1000, 10)  # cuda:39 never measured
    assert E.totals(40) is None


def test_of_types_picks_the_exact_types():
    """The leak check's scan in C: the items of a list whose exact type is
    in a set, each held once by the result; bad arguments named."""
    import gc
    import sys

    class Mine(int):
        pass

    one, mine = object(), Mine(5)
    assert E.of_types([1, "a", 2.0, None, 3, mine], {int}) == [1, 3]
    assert E.of_types([1, "a", mine], {int, Mine}) == [1, mine]
    assert E.of_types(gc.get_objects(), set()) == []
    refs = sys.getrefcount(one)
    picked = E.of_types([one, 1], {object})
    held = sys.getrefcount(one)
    del picked
    after = sys.getrefcount(one)
    assert (held, after) == (refs + 1, refs)
    with pytest.raises(TypeError, match="of_types"):
        E.of_types((1, 2), {int})
    with pytest.raises(TypeError, match="of_types"):
        E.of_types([1, 2], [int])


def test_a_suspects_block_that_a_later_suspect_took_is_gone():
    """Leak suspects watch their blocks' addresses; a block freed and its
    address handed out again, to a test that leaves it too, belongs to that
    later suspect only (the watch, armed again by it, cannot tell)."""
    from injected_allocator import alloc, free

    from pytest_memlab.measuring.leak_suspects import LeakSuspects

    suspects = LeakSuspects()
    a, kept = alloc(1024), alloc(512)
    suspects.add("test_a", "cpu", [(a, 1024, 1, 0), (kept, 512, 1, 0)], 0)
    free(a, 1024)                      # a later test frees test_a's block ...
    E.inject(E.SLOT_CPU, a, 1024)      # ... and gets its address again, and leaves it
    suspects.add("test_b", "cpu", [(a, 1024, 2, 0)], 0)
    other = alloc(256)
    suspects.add("test_c", "cpu", [(other, 256, 3, 0)], 0)
    free(other, 256)                   # freed where the watch hears it
    suspects._drop_gone()
    assert [(s.nodeid, [b[0] for b in s.blocks]) for s in suspects.pending] == \
        [("test_a", [kept]), ("test_b", [a]), ("test_c", [])]
    free(a, 1024)
    free(kept, 512)
    E.unwatch(E.SLOT_CPU)


def test_referrers_are_gc_get_referrers_over_a_snapshot():
    """The holder search's referrers in C: what refers to any of the
    objects asked about, among a heap snapshot, as gc.get_referrers finds
    it (the snapshot and the list asked about aside); bad arguments named."""
    import gc

    class Box:
        pass

    a, b = [1], {"x": 2}
    box = Box()
    box.a = a
    holders = [[a], {"k": b}, (a, b)]     # box holds a too: itself, or through its __dict__
    heap = gc.get_objects()
    asked = [a, b]
    got = E.referrers(heap, asked)
    ids = [id(x) for x in got]
    assert len(ids) == len(set(ids))                     # each referrer once
    assert {id(h) for h in holders} <= set(ids)
    assert set(ids) == {id(x) for x in gc.get_referrers(a, b) if x is not heap and x is not asked}
    assert E.referrers(heap, []) == [] and E.referrers([], asked) == []
    with pytest.raises(TypeError, match="referrers"):
        E.referrers((a,), asked)
    with pytest.raises(TypeError, match="referrers"):
        E.referrers(heap, (a,))


def test_tensor_objects_finds_every_tensor_and_subclass():
    torch = pytest.importorskip("torch")
    from pytest_memlab.engine.heap import tensor_objects

    class Mine(torch.Tensor):
        pass

    holder = [torch.ones(3), torch.nn.Parameter(torch.ones(2)), torch.ones(4).as_subclass(Mine)]
    picked = tensor_objects(torch)
    assert all(any(p is t for p in picked) for t in holder)
    assert all(isinstance(p, torch.Tensor) for p in picked)


def test_links_is_fstats_link_count_and_a_bad_descriptor_an_os_error(tmp_path):
    import os

    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        assert E.links(fd) == os.fstat(fd).st_nlink
        (tmp_path / "b").rmdir()
        assert E.links(fd) == os.fstat(fd).st_nlink
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        E.links(fd)
    with pytest.raises(OSError):
        E.links(-1)
