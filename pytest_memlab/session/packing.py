"""--memlab-pack: pytest-xdist's tests packed by their measured memory.

A scheduler for pytest-xdist (``pytest_xdist_make_scheduler``) that lets a
test start on a worker only while what would then be held on that worker's
device fits the device's capacity: every running test's footprint (its own
peak plus its first use, from the baseline) plus what each worker keeps
between tests (the bytes its earlier tests kept past their teardown).

When the tests start.  xdist's own schedulers wait until every worker
has collected; here, with more than four workers and at least two tests
a worker, the tests start once the first has (a worker's start, importing
torch, is seconds, and eight start one beside the other), and each later
worker joins as its collection comes, checked against the first's.  A
worker not yet started counts its context on its device from the start,
so the card keeps room for it.

How a test starts.  An xdist worker runs the test at the head of its queue
only once another test (or the shutdown) is queued behind it: pytest needs
the next item to know which fixtures to tear down.  So a worker here holds
at most two: the test it runs and the one it runs next, and the one it runs
next starts at the moment the scheduler queues a third (or sends the
shutdown).  The memory gate is applied at that moment, to the test that is
about to start; a test whose start would overfill the device waits.  As a
worker's next test is fixed when its current one starts, it is chosen a
round ahead: to fit beside what the other workers run next.

A test without a figure in the baseline starts only on an empty device
(alone), and its figure is measured for the next run.  A test that runs
out of memory while another test ran beside it on its device is re-run at
the end, alone: the controller turns that first failure into a ``rerun``
report before any other plugin sees it (the worker says which failures
were out of memory), and the re-run's outcome stands.  The re-runs go to
an idle worker, or where every worker has ended to a new one, started the
way xdist replaces a crashed worker.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import time
from dataclasses import dataclass, field

from ..measuring.broad_fixtures import encloses, slot_of
from ..sizes import format_size
from .gpu_pinning import visible_gpus, worker_gpus

# What a GPU's default capacity leaves free: the card's free memory when the
# session starts, less this share of it, less each worker's CUDA context.
MARGIN_SHARE = 0.05
CONTEXT_BYTES = 600 * 2**20   # a CUDA context with cuBLAS's workspace, as this project measured on H100/H200
# What a packed worker's caching allocator may keep reserved between tests
# unreleased (counted in each worker's allowance): giving back less than
# this after every test costs a driver call per block for nothing.
KEPT_CACHE_BYTES = 256 * 2**20
# How many tests a worker may have queued at most (the one it runs
# included) where memory allows (PackScheduling._ahead): with three, it runs
# its next test as soon as its current one ends, without waiting for the
# controller to queue another (xdist's own schedulers queue several too).
AHEAD = 4
# The tests start when the first worker has collected (not the last) only
# with more workers than this: the first and the last collected 0.25 s apart
# at -n 4 and 1.7 s apart at -n 8 (H200 host, torch imported in each).  A
# worker's next test is fixed when its current one starts, so the first
# worker takes two tests that two workers might have run side by side, and
# which tests pair up then depends on when the others come: at -n 2 to 4
# that costs more than it saves.  (And at least two tests a worker.)
EARLY_START_WORKERS = 4


def gpu_free_memory() -> dict[str, int]:
    """Each visible GPU's free bytes, asked of nvidia-smi (the controller
    runs no test, and a CUDA context here would take memory from the card);
    {} where there is no nvidia-smi or no GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}
    try:
        out = subprocess.run([smi, "--query-gpu=index,memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    free = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            free[parts[0]] = int(parts[1]) * 2**20
    names = visible_gpus()
    if names is not None:
        free = {g: free[g] for g in names if g in free}
    return free


def held_at_once(peak: int, first_use: int | None) -> int:
    """A test's footprint: its own peak plus its first use (what it holds
    at once, counting what it fills into caches).  Not the reserved peak:
    that is the process's, and in a serial run it carries what earlier
    tests left in the caching allocator (every test after a 40 GiB one
    would count 40 GiB); a packed worker gives its cache back between tests,
    and each worker's allowance (KEPT_CACHE_BYTES) covers the allocator's
    rounding, or, where the card has room (roomy), keeps it, and its
    context counts the most the serial run held reserved."""
    return peak + (first_use or 0)


def footprints(tests: dict, kind: str) -> dict[str, int]:
    """Each test's footprint (held_at_once) on devices of kind ("cpu" or
    "cuda") from a baseline lane's entries: the largest of its devices of
    that kind; 0 for a test the lane measured that held nothing there (a
    CPU-only test in a CUDA suite)."""
    out = {}
    for nodeid, devices in tests.items():
        best = 0 if isinstance(devices, dict) else None
        for key, entry in devices.items():
            device = key.split("@", 1)[0]
            if device.split(":", 1)[0] != kind or not isinstance(entry, dict) or entry.get("peak") is None:
                continue
            held = held_at_once(int(entry["peak"]), int(entry.get("first_use") or 0))
            best = held if best is None else max(best, held)
        if best is not None:
            out[nodeid] = best
    return out


def fixture_needs(tests: dict, kind: str) -> dict[str, dict[str, int]]:
    """Each test's broader fixture instances on devices of kind, from a
    baseline lane's entries: {nodeid: {instance key: bytes}} (the most of
    its devices of that kind), for the tests that need any."""
    out: dict[str, dict[str, int]] = {}
    for nodeid, devices in tests.items():
        if not isinstance(devices, dict):
            continue
        for key, entry in devices.items():
            if key.split("@", 1)[0].split(":", 1)[0] != kind or not isinstance(entry, dict):
                continue
            needs = entry.get("fixtures")
            if not isinstance(needs, dict):
                continue
            mine = out.setdefault(nodeid, {})
            for name, n in needs.items():
                if isinstance(n, int) and n > 0:
                    mine[name] = max(n, mine.get(name, 0))
    return {k: v for k, v in out.items() if v}


@dataclass
class PackPlan:
    """What the scheduler packs by: the device kind, each device's
    capacity, each test's footprint, and which device a worker uses."""

    kind: str                                    # "cpu" or "cuda"
    capacity: dict[str, int]                     # device -> bytes ("cpu", or a GPU's index)
    footprint: dict[str, int]                    # nodeid -> bytes
    context: int = 0                             # what a worker holds on its device before any test
    worker_devices: dict[str, str] = field(default_factory=dict)   # "gw0" -> device, where pinned
    serial: dict[str, float] = field(default_factory=dict)         # nodeid -> seconds, in the last serial run
    kept_cache: int = 0                          # bytes of its caching allocator's blocks a worker keeps between
                                                 # tests where the card has room (0: it returns beyond KEPT_CACHE_BYTES)
    made: float = field(default_factory=time.monotonic)            # when the session started (the plan is made then)
    # nodeid -> {instance key: bytes}: the broader fixtures each test needs
    # (measuring.broad_fixtures); every worker holds its own copy of each
    fixtures: dict[str, dict[str, int]] = field(default_factory=dict)

    def workers_on(self, device: str, workers: int) -> int:
        """How many of workers (gw0 ...) this plan packs on device."""
        return sum(1 for i in range(workers) if self.device_of(f"gw{i}") == device)

    def device_of(self, worker: str) -> str:
        if self.kind == "cpu":
            return "cpu"
        device = self.worker_devices.get(worker)
        if device is None and self.worker_devices:
            # a worker xdist started later (one replacing a crashed worker):
            # pinned by the same plan as the first ones
            gpus = worker_gpus(worker)
            device = gpus[0] if gpus and gpus[0] in self.capacity else None
        return device or next(iter(self.capacity))


@dataclass
class PackStats:
    first_send: float | None = None
    last_done: float | None = None
    waited: set = field(default_factory=set)   # tests that were next on a worker and could not start for want of room
    alone: int = 0                  # tests without a figure, run alone
    test_time: float = 0.0          # the tests' own durations, summed
    tests: int = 0
    planned_peak: dict = field(default_factory=dict)   # device -> the most in use at once by known figures
    reruns: list = field(default_factory=list)          # (nodeid, why)
    over: dict = field(default_factory=dict)            # index -> bytes planned in use when it started, over the capacity


class _Stamped:
    """The scheduler's --debug log: each line with the seconds since the
    session started (when the workers' start and the tests' came)."""

    def __init__(self, log, since: float):
        self.log, self.since = log, since
        self.enabled = getattr(log, "enabled", True)

    def __call__(self, message: str) -> None:
        if self.enabled:
            self.log(f"+{time.monotonic() - self.since:.2f}s {message}")


class PackScheduling:
    """pytest-xdist's scheduler interface (as its LoadScheduling): nodes,
    collection_is_completed, tests_finished, has_pending, add_node,
    add_node_collection, mark_test_complete, mark_test_pending,
    remove_pending_tests_from_node, remove_node, schedule."""

    def __init__(self, config, plan: PackPlan, log=None, kept=None):
        from xdist.remote import Producer
        from xdist.workermanage import parse_tx_spec_config

        self.config = config
        self.numnodes = len(parse_tx_spec_config(config))
        self.plan = plan
        log = log.packsched if log is not None else Producer("packsched", enabled=False)
        # --debug: each decision with the seconds since the session started
        self.log = _Stamped(log, plan.made)
        self.kept = kept or (lambda nodeid, device: 0)   # bytes a finished test kept on a device
        self.node2collection: dict = {}
        self.node2pending: dict = {}                  # node -> [running (or next), next]
        self.started: dict = {}                       # node -> index of the test it runs now
        self.resident: dict = {}                      # node -> bytes its finished tests kept
        self.alive: dict = {}                         # node -> {instance key: bytes}: its broader fixtures now
        self.pending: list[int] = []
        self.alone_at_end: list[int] = []             # re-runs, each alone, at the end
        self.rerun: set[int] = set()                  # tests re-run (their first failure set aside)
        self.beside: set[int] = set()                 # tests that ran while another ran on their device
        self.set_aside: dict[str, str] = {}           # re-run tests whose first attempt's teardown is to come
        self.waiting: dict = {}                       # node -> when (a count) its next test first found no room
        self.began_at: dict = {}                      # node -> when (a tick) its current test began
        self.last_event: dict = {}                    # node -> when (a tick) a test of it last began or ended
        self.ticks = itertools.count()
        self.collection: list[str] | None = None
        self.stats = PackStats()
        # A worker for the re-runs when every worker has ended: xdist's own
        # replacement of a crashed worker (a new one, the same spec).  Where
        # this xdist has none, the last worker is kept instead: its last test
        # waits until no other runs one.
        self.dsession = getattr(getattr(config, "pluginmanager", None), "getplugin", lambda name: None)("dsession")
        self.clone_worker = getattr(self.dsession, "_clone_node", None)
        self.cloning = False
        self.spec_node = None                          # a worker whose spec a new one copies
        # the workers xdist starts with, until each is added (its context is
        # counted on its device meanwhile) or has ended
        self.to_come = {f"gw{i}" for i in range(self.numnodes)}
        self.replacing: list[str] = []                 # the device of each crashed worker xdist may replace
        self.strays: set = set()                       # workers that collected other tests than the first: none run here
        self.first: tuple[str, list] | None = None     # the first worker's id and collection: the one every worker must have
        self.largest = 0                               # the suite's largest footprint (known when scheduling begins)
        self.largest_fixtures = max(map(sum, map(dict.values, plan.fixtures.values())), default=0)

    # -- xdist's interface ----------------------------------------------------
    @property
    def nodes(self) -> list:
        return list(self.node2pending)

    @property
    def collection_is_completed(self) -> bool:
        """True once every worker has collected, or, with more than
        EARLY_START_WORKERS workers and at least two tests a worker, once
        the first has: the tests start then, and each later worker joins as
        its collection comes (xdist calls schedule again)."""
        if self.first is None:
            return False
        if len(self.node2collection) + len(self.strays) >= self.numnodes:
            return True
        return self.numnodes > EARLY_START_WORKERS and len(self.first[1]) >= 2 * self.numnodes

    @property
    def tests_finished(self) -> bool:
        if not self.collection_is_completed or self.pending or self.alone_at_end:
            return False
        return not any(self.node2pending.values())

    @property
    def has_pending(self) -> bool:
        return bool(self.pending or self.alone_at_end or any(self.node2pending.values()))

    def add_node(self, node) -> None:
        assert node not in self.node2pending
        self.node2pending[node] = []
        self.resident[node] = 0
        self.spec_node = node
        self.cloning = False
        if node.gateway.id in self.to_come:
            self.to_come.discard(node.gateway.id)
        elif self.replacing:   # a worker in place of a crashed one: its context is the one kept for it
            device = self.plan.device_of(node.gateway.id)
            self.replacing.remove(device if device in self.replacing else self.replacing[0])
        self.log(f"{node.gateway.id} ready")

    def add_node_collection(self, node, collection) -> None:
        assert node in self.node2pending
        collection = list(collection)
        if self.first is None:
            self.first = (node.gateway.id, collection)
        elif collection != self.first[1]:
            self._collection_differs(node, collection)
            return
        self.node2collection[node] = collection
        self.log(f"{node.gateway.id} collected {len(collection)} tests")

    def mark_test_complete(self, node, item_index: int, duration: float = 0) -> None:
        pending = self.node2pending[node]
        pending.remove(item_index)
        if self.started.get(node) == item_index:
            del self.started[node]
        self.stats.tests += 1
        self.stats.test_time += duration
        self.stats.last_done = time.monotonic()
        assert self.collection is not None
        self.resident[node] += max(0, self.kept(self.collection[item_index], self.plan.kind))
        since = self.began_at.get(node, -1)
        self.last_event[node] = next(self.ticks)
        if len(pending) >= 2 or (pending and node.shutting_down):
            # the worker started its next test itself (one was queued behind
            # it) when the last one ended, which the controller hears late:
            # a test another worker ran on the device since the last one began
            # may have run beside it too
            self._began(node, since=since)
            if self.log.enabled:
                self.log(f"{node.gateway.id} starts {self.collection[pending[0]]} ({self._mib(pending[0])}; "
                         f"queued ahead)")
        self._fill()

    def mark_test_pending(self, item: str) -> None:
        assert self.collection is not None
        self.pending.insert(0, self.collection.index(item))
        self._fill()

    def remove_pending_tests_from_node(self, node, indices) -> None:
        raise NotImplementedError()

    def remove_node(self, node) -> str | None:
        pending = self.node2pending.pop(node)
        was_running = self.started.pop(node, None) is not None or node.shutting_down
        self.resident.pop(node, None)
        self.alive.pop(node, None)
        self.waiting.pop(node, None)
        if not pending:
            self._fill()
            return None
        assert self.collection is not None
        # it went down with tests queued: xdist starts another worker in its
        # place (unless it stops), whose context is kept free meanwhile
        self.replacing.append(self.plan.device_of(node.gateway.id))
        # (a worker that waited for room had not started its test: it runs elsewhere)
        crashed = self.collection[pending.pop(0)] if was_running else None
        self.pending[:0] = pending
        self._fill()
        return crashed

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is None:
            assert self.first is not None
            self.collection = self.first[1]
            self.pending[:] = range(len(self.collection))
            # the largest footprint of the suite (those without a figure never go ahead)
            self.largest = max((n for n in map(self.footprint, self.pending) if n is not None), default=0)
        self._fill()

    def _collection_differs(self, node, collection) -> None:
        """A worker that collected other tests than the first: an error of
        the session, as under xdist's own schedulers (which find it before
        any test runs); the worker runs nothing, the others go on."""
        import pytest
        from xdist.report import report_collection_diff

        self.strays.add(node)
        node.shutdown()
        assert self.first is not None
        msg = report_collection_diff(self.first[1], collection, self.first[0], node.gateway.id)
        self.log(msg or f"{node.gateway.id} collected other tests than {self.first[0]}")
        if msg and self.config is not None and hasattr(self.config, "hook"):
            report = pytest.CollectReport(node.gateway.id, "failed", longrepr=msg, result=[])
            self.config.hook.pytest_collectreport(report=report)

    # -- what memlab adds -----------------------------------------------------
    def rerun_alone(self, nodeid: str, why: str) -> bool:
        """A test that ran out of memory beside others: run it again at the
        end, alone.  False where it cannot be (it ran alone, or it was a
        re-run already): its failure stands."""
        if self.collection is None or nodeid not in self.collection:
            return False
        index = self.collection.index(nodeid)
        if index not in self.beside or index in self.rerun:
            return False
        self.rerun.add(index)
        self.alone_at_end.append(index)
        self.stats.reruns.append((nodeid, why))
        return True

    def footprint(self, index: int) -> int | None:
        assert self.collection is not None
        if index in self.rerun:
            return None   # a re-run runs alone
        return self.plan.footprint.get(self.collection[index])

    def _after(self, alive: dict, index: int) -> dict:
        """A worker's broader fixture instances once index starts there:
        those whose scope the test lies in (pytest tore the others down
        before it) and those it needs (an instance for another param of
        a fixture replaces the one before: pytest tears that down first)."""
        nodeid = self.collection[index]
        out = {k: v for k, v in alive.items() if encloses(k, nodeid)}
        needs = self.plan.fixtures.get(nodeid)
        if needs:
            for key, n in needs.items():
                slot = slot_of(key)
                if key not in out and slot != key:   # (one of a fixture's params)
                    for old in [k for k in out if k != key and slot_of(k) == slot]:
                        del out[old]
                out[key] = n
        return out

    def _held_elsewhere(self, node) -> set:
        """The broader fixture instances the other live workers on node's
        device hold, or will once their queued tests start."""
        held = set()
        device = self.plan.device_of(node.gateway.id)
        for other, queue in self.node2pending.items():
            if other is node or other.shutting_down or self.plan.device_of(other.gateway.id) != device:
                continue
            alive = self.alive.get(other) or {}
            held.update(alive)
            for index in self._unstarted(other, queue):
                held.update(self.plan.fixtures.get(self.collection[index], ()))
        return held

    def _fixture_walk(self, node, then=(), from_now: bool = True) -> tuple[int, dict]:
        """node's broader fixtures while its tests in then run one after
        another (each its own copy: a worker builds every instance it
        needs): the most they hold at once (from_now: counting those alive
        there now, while its current test runs or until its next starts),
        and those alive once the last has started."""
        alive = self.alive.get(node) or {}
        most = sum(alive.values()) if from_now else 0
        for index in then:
            alive = self._after(alive, index)
            most = max(most, sum(alive.values()))
        return most, alive

    def _fixture_bytes(self, node, then=(), from_now: bool = True) -> int:
        """The most of _fixture_walk."""
        return self._fixture_walk(node, then, from_now)[0] if self.plan.fixtures else 0

    def _unstarted(self, node, indices) -> list:
        running = self.started.get(node)
        return [i for i in indices if i != running]

    def _running_on(self, device: str, leave_out=None) -> list:
        return [n for n in self.started if n is not leave_out and self.plan.device_of(n.gateway.id) == device]

    def _to_come_on(self, device: str) -> int:
        """The contexts of the workers not started yet that will use
        device (and of the one xdist starts in place of a crashed worker
        there): kept free for them."""
        return self.plan.context * (sum(1 for w in self.to_come if self.plan.device_of(w) == device)
                                    + self.replacing.count(device))

    def _approved(self, node) -> list:
        """The tests node may run without asking again: the one it runs and
        each queued with another behind it (a worker runs the head of its
        queue once a test or the shutdown follows it)."""
        queue = self.node2pending.get(node, [])
        approved = list(queue) if node.shutting_down else queue[:-1]
        if node in self.started and self.started[node] not in approved:
            approved.append(self.started[node])
        return approved

    def _held_by(self, node) -> int:
        """The most node may hold of its approved tests: they run one after
        another, and each may keep up to its footprint past its teardown
        before the next (which starts unasked) runs, so their footprints
        added up (one test: its footprint; a test without a figure: the
        whole device)."""
        held = 0
        approved = self._approved(node)
        for index in approved:
            need = self.footprint(index)
            if need is None:
                return self.plan.capacity[self.plan.device_of(node.gateway.id)]
            held += need
        return held + self._fixture_bytes(node, self._unstarted(node, approved))

    def _in_use(self, device: str, leave_out=None) -> int:
        """The bytes planned in use on device: each worker's context and
        what it keeps (a worker not started yet: its context), and the
        most it may hold of the tests it runs or may run without asking
        (_held_by)."""
        used = self._to_come_on(device)
        for node in self.node2pending:
            if node is leave_out or self.plan.device_of(node.gateway.id) != device:
                continue
            used += self.plan.context + self.resident.get(node, 0) + self._held_by(node)
        return used

    def _fits(self, node, index: int, reserve: int = 0) -> bool:
        """Whether index may start on node now, with reserve bytes kept
        free beside it.  A test starts on an idle device whatever its
        footprint (alone, it has the whole card)."""
        device = self.plan.device_of(node.gateway.id)
        beside = self._running_on(device, leave_out=node)
        if not beside and not reserve:
            return True
        need = self.footprint(index)
        if need is None or any(self.footprint(self.started[n]) is None for n in beside):
            return False   # (a test that runs alone has the device to itself, whatever fits beside it)
        mine = self.plan.context + self.resident.get(node, 0) + need \
            + self._fixture_bytes(node, [index], from_now=False)
        return self._in_use(device, leave_out=node) + mine + reserve <= self.plan.capacity[device]

    def _may_start(self, node, index: int) -> bool:
        """_fits, first come first served: the worker whose next test has
        waited longest for room on this device starts when it fits; another
        starts only if it leaves that test its room (else the small tests
        that keep arriving would starve a large one)."""
        device = self.plan.device_of(node.gateway.id)
        ahead = [n for n in sorted(self.waiting, key=self.waiting.get)
                 if n is not node and self.waiting[n] < self.waiting.get(node, float("inf"))
                 and self.plan.device_of(n.gateway.id) == device and n not in self.started]
        if not ahead:
            return self._fits(node, index)
        first = ahead[0]
        head = self.node2pending[first][0]
        need = self.footprint(head)
        if need is None:   # a test that runs alone waits for an idle device: nothing starts before it
            return False
        need += self._fixture_bytes(first, [head], from_now=False)
        return self._fits(node, index, reserve=self.plan.context + self.resident.get(first, 0) + need)

    def _planned(self, device: str, leave_out=None) -> int:
        """The bytes planned on device in the next round: each worker's
        context and what it keeps, and the footprint of the last test queued
        on it (the one it runs after its current test, else the one it runs
        or waits to run; a test without a figure: the whole device)."""
        used = self._to_come_on(device)
        for node, queue in self.node2pending.items():
            if node is leave_out or self.plan.device_of(node.gateway.id) != device:
                continue
            used += self.plan.context + self.resident.get(node, 0) \
                + self._fixture_bytes(node, self._unstarted(node, queue))
            if queue:   # (queued ahead: the most of what follows the one it runs)
                needs = [self.footprint(i) for i in (queue[1:] or queue)]
                used += self.plan.capacity[device] if None in needs else max(needs)
        return used

    def _next_for(self, node, only_fitting: bool = False) -> int | None:
        """The test node runs next (after its current one, or first): the
        first pending test (in collection order, which keeps a module's
        tests together) that fits beside what the other workers on its
        device will run next (their queued tests: a worker's next test is
        fixed when its current one starts, so the choice looks one round
        ahead); else the first pending, or with only_fitting None."""
        if not self.pending:
            return None
        device = self.plan.device_of(node.gateway.id)
        room = self.plan.capacity[device] - self._planned(device, leave_out=node) \
            - self.plan.context - self.resident.get(node, 0)
        if self.plan.fixtures:   # each candidate with the copies of broader fixtures it would build here
            queue = self._unstarted(node, self.node2pending.get(node, []))
            before, alive = self._fixture_walk(node, queue, from_now=False)
            needs = [None if need is None else need + max(before, sum(self._after(alive, i).values()))
                     for i, need in zip(self.pending[:64], map(self.footprint, self.pending[:64]))]
        else:
            needs = list(map(self.footprint, self.pending[:64]))
        fitting = [(need, -k) for k, need in enumerate(needs) if need is not None and need <= room]
        if fitting:
            best = 0 if fitting[0][1] == 0 else -max(fitting)[1]
            return self.pending.pop(best)
        if only_fitting:
            return None
        if self.plan.fixtures and self._live() != [node]:
            # Nothing fits now.  The first test that builds no copy of an
            # instance another worker holds (that worker runs it without
            # one, when it asks), and that fits beside what the other
            # workers keep between tests (their copies of broader fixtures
            # above all: a worker tears them down only when its next test
            # leaves their scope, or at its end, so the room this test
            # waits for may never come); where there is none, the worker
            # ends, and the others run what is left.
            # (an idle worker holds no copy: it has run no test yet; a
            # worker that has keeps its next test queued, or ends)
            held = self._held_elsewhere(node)
            alive = self.alive.get(node) or {}
            kept, copies = self._kept_elsewhere(node, device)
            kept += self.plan.context + self.resident.get(node, 0)
            queue = self._unstarted(node, self.node2pending.get(node, []))
            for k, index in enumerate(self.pending):
                needs = self.plan.fixtures.get(self.collection[index], {})
                if any(key in held and key not in alive for key in needs):
                    continue
                need = self.footprint(index)
                if need is not None and copies:
                    mine = need + self._fixture_bytes(node, queue + [index], from_now=False)
                    if kept + copies + mine > self.plan.capacity[device] >= kept + mine:
                        continue   # (too large beside the contexts alone: it runs alone, as without fixtures)
                return self.pending.pop(k)
            return None
        return self.pending.pop(0)

    def _kept_elsewhere(self, node, device: str) -> tuple[int, int]:
        """What the other workers on device hold between tests, at the
        most until their queued tests have run: their contexts (those not
        started yet too) and what their tests kept; and apart, the copies
        of broader fixtures of those that run or have a test queued (an
        idle worker holds none: it has run no test yet)."""
        kept, copies = self._to_come_on(device), 0
        for other, queue in self.node2pending.items():
            if other is node or other.shutting_down or self.plan.device_of(other.gateway.id) != device:
                continue
            kept += self.plan.context + self.resident.get(other, 0)
            if queue:   # (what it keeps once its queued tests have run: those tear down what lies outside them)
                copies += sum(self._fixture_walk(other, self._unstarted(other, queue))[1].values())
        return kept, copies

    def _mib(self, index: int) -> str:
        need = self.footprint(index)
        return "alone" if need is None else f"{need >> 20} MiB"

    def _send(self, node, index: int) -> None:
        self.node2pending[node].append(index)
        node.send_runtest_some([index])
        if self.stats.first_send is None:
            self.stats.first_send = time.monotonic()

    def _live(self) -> list:
        """The workers that run tests or will (one still collecting too)."""
        return [n for n in self.node2pending if not n.shutting_down and n not in self.strays]

    def _start(self, node) -> None:
        """The node's queued test starts: queue its next (a pending test, a
        re-run where this is the last live node), or shut the node down."""
        index = self.node2pending[node][0]
        device = self.plan.device_of(node.gateway.id)
        self._began(node)
        # what fits now goes to idle workers first: it starts now there, not
        # after this test
        self._assign_idle()
        follow = self._next_for(node)
        if follow is None and self.alone_at_end and self._live() == [node]:
            follow = self.alone_at_end.pop(0)
        if self.log.enabled:   # (--debug; the message is not built otherwise)
            self.log(f"{node.gateway.id} starts {self.collection[index]} ({self._mib(index)}; in use "
                     f"{self._in_use(device) >> 20} MiB, kept {self.resident.get(node, 0) >> 20} MiB); next "
                     + (f"{self.collection[follow]} ({self._mib(follow)})" if follow is not None else "none: shut down"))
        if follow is not None:
            self._send(node, follow)
        else:
            node.shutdown()
        self._note_peak(device)

    def _began(self, node, since: int | None = None) -> None:
        """The head of node's queue starts (sent its follow here, or started
        by the worker itself behind a test it ended: since, the tick its
        last test began at; any test another worker on the device began or
        ended after it may have run beside this one)."""
        index = self.node2pending[node][0]
        device = self.plan.device_of(node.gateway.id)
        beside = self._running_on(device, leave_out=node)
        if beside:
            self.beside.add(index)
            self.beside.update(self.started[n] for n in beside)
        elif since is not None and any(tick > since for n, tick in self.last_event.items()
                                       if n is not node and self.plan.device_of(n.gateway.id) == device):
            self.beside.add(index)
        self.started[node] = index
        if self.plan.fixtures:
            self.alive[node] = self._after(self.alive.get(node) or {}, index)
        self.began_at[node] = self.last_event[node] = next(self.ticks)
        if self.footprint(index) is None and index not in self.rerun:
            self.stats.alone += 1
        used = self._note_peak(device)
        if used is not None and used > self.plan.capacity[device]:
            # (it started where no other test ran, beside what the other
            # workers hold between tests: the summary names it)
            self.stats.over[index] = used

    def _note_peak(self, device: str) -> int | None:
        """The most planned in use on device, and what is planned now
        (None while a test without a figure runs: it counts as the
        device)."""
        if any(self.footprint(self.started[n]) is None for n in self._running_on(device)):
            return None
        used = self._in_use(device)
        if used > self.stats.planned_peak.get(device, 0):
            self.stats.planned_peak[device] = used
        return used

    def _ahead(self, node) -> bool:
        """Queue one more test on node, behind the one it runs next, where
        that one may then run without asking (the worker runs it as soon as
        its current test ends: no round trip to the controller between two
        tests).  Only where memory cannot run short on the device: every
        worker there could hold AHEAD - 1 of the suite's largest tests at
        once (its approved tests, each of which may keep up to its
        footprint before the next runs: a suite of small tests; where it
        could run short, each test's start stays the scheduler's, which a
        deeper queue would take from it); and while no test waits for room
        or runs alone there, every test involved has a figure, and enough
        tests are left that a deeper queue costs no balance."""
        queue = self.node2pending[node]
        live = self._live()
        depth = 2 + min(AHEAD - 2, len(self.pending) // max(1, len(live)))
        if node.shutting_down or node not in self.started or not 2 <= len(queue) < depth or self.alone_at_end:
            return False
        device = self.plan.device_of(node.gateway.id)
        if any(self.plan.device_of(n.gateway.id) == device for n in self.waiting):
            return False
        on_device = [n for n in self.node2pending if self.plan.device_of(n.gateway.id) == device]
        workers = len(on_device) + len(self.to_come) + len(self.replacing)
        # each worker's approved tests (all but its last queued) at the
        # suite's largest, added up (what each may keep before the next)
        worst = self._to_come_on(device) + workers * ((AHEAD - 1) * self.largest + self.largest_fixtures) \
            + sum(self.plan.context + self.resident.get(n, 0) for n in on_device)
        if worst > self.plan.capacity[device]:
            return False
        needs = [self.footprint(i) for i in queue]
        if None in needs or any(self.footprint(self.started[n]) is None for n in self._running_on(device)):
            return False
        mine = self.plan.context + self.resident.get(node, 0) + sum(needs) \
            + self._fixture_bytes(node, self._unstarted(node, queue))
        if self._in_use(device, leave_out=node) + mine > self.plan.capacity[device]:
            return False
        index = self._next_for(node, only_fitting=True)
        if index is None:
            return False
        if self.log.enabled:
            self.log(f"{node.gateway.id} queues {self.collection[index]} ({self._mib(index)}) behind "
                     f"{len(queue)}: may hold {sum(needs) >> 20} MiB")
        self._send(node, index)
        self._note_peak(device)
        return True

    def _idle(self, leave_out=None) -> list:
        """Live nodes with nothing queued: a node that never got a test (a
        worker runs its first test only once a second is queued)."""
        return [n for n, queue in self.node2pending.items()
                if n is not leave_out and not queue and not n.shutting_down and n in self.node2collection]

    def _assign_idle(self) -> None:
        """Each idle node gets a test that fits beside what the others will
        run (the first pending where nothing is queued on its device, a
        re-run where nothing runs there), or is shut down when there is
        nothing left for it; one idle node stays while tests run: the
        re-runs' worker."""
        for node, queue in self.node2pending.items():
            if node.shutting_down or queue or node not in self.node2collection:
                continue   # (a worker still collecting joins when its collection comes)
            device = self.plan.device_of(node.gateway.id)
            busy = any(q for n, q in self.node2pending.items() if self.plan.device_of(n.gateway.id) == device)
            index = self._next_for(node, only_fitting=busy)
            if index is None and not busy and self.alone_at_end:
                index = self.alone_at_end.pop(0)
            if index is not None:
                self.log(f"{node.gateway.id} idle: given {self.collection[index]} ({self._mib(index)})")
                self._send(node, index)
            elif not self.pending and not self.alone_at_end and (not busy or self._idle(leave_out=node)):
                node.shutdown()

    def _fill(self) -> None:
        """Idle nodes get a test where one fits beside what the others will
        run (so that the tests spread over the workers; an idle worker is
        kept idle rather than given a test that would wait: it can still
        take whichever test fits when room comes), then what fits starts.
        With nothing left to hand out, an idle node is kept for the re-runs
        (a test that runs out of memory beside others is re-run there,
        alone, once no other runs a test) where there is one; where every
        worker has ended, a new one is started for them (xdist's way of
        replacing a crashed worker)."""
        if self.collection is None:
            return
        progress = True
        while progress:
            progress = False
            self._assign_idle()
            # the longest waiting first
            order = sorted(self.node2pending, key=lambda n: self.waiting.get(n, float("inf")))
            for node in order:
                queue = self.node2pending[node]
                if node.shutting_down or node in self.started or not queue:
                    continue
                if self.clone_worker is None and not self.pending and self._live() == [node] and self.started:
                    continue   # the last worker: kept for the re-runs until the others are done
                if self._may_start(node, queue[0]):
                    self.waiting.pop(node, None)
                    self._start(node)
                    progress = True
                    break   # the order changed: judge the waiting again
                self.stats.waited.add(queue[0])
                self.waiting.setdefault(node, next(self.ticks))
        for node in list(self.node2pending):
            while self._ahead(node):
                pass
        stopping = getattr(self.dsession, "shuttingdown", False) or getattr(self.dsession, "shouldstop", False)
        if self.alone_at_end and not self._live() and not self.cloning and self.clone_worker is not None \
                and not stopping:   # (-x, --maxfail: xdist is stopping its workers; a new one would never stop)
            self.log(f"a new worker for {len(self.alone_at_end)} re-run(s): every worker had ended")
            self.cloning = True
            self.clone_worker(self.spec_node)

    # -- the summary ----------------------------------------------------------
    def summary(self, workers: int) -> list[str]:
        s, plan = self.stats, self.plan
        capacity = ", ".join(f"{format_size(c)}" + ("" if d == "cpu" else f" on GPU {d}")
                             for d, c in plan.capacity.items())
        peak = ", ".join(format_size(v) + ("" if d == "cpu" else f" on GPU {d}")
                         for d, v in sorted(s.planned_peak.items())) or "0 B"
        lines = [f"pytest-memlab pack ({plan.kind}, capacity {capacity}): {s.tests} test runs on "
                 f"{workers} workers; at most {peak} in use at once by the baseline's figures; "
                 f"{len(s.waited)} waited for room, {s.alone} ran alone (no figure in the baseline)"]
        if s.first_send is not None and s.last_done is not None:
            wall = s.last_done - s.first_send
            # the tests one after another: in the last serial run, where it ran
            # each of them (side by side, a test can take longer than alone)
            serial = None
            if self.collection is not None and all(n in plan.serial for n in self.collection):
                serial = sum(plan.serial[n] for n in self.collection)
            if serial:
                alone, what = serial, "these tests one after another in the last serial run"
            else:
                alone, what = s.test_time, "the tests' durations here added up"
            ratio = f" ({wall / alone:.2f}x)" if alone > 0 else ""
            lines.append(f"  wall {wall:.1f} s from the first test to the last, against {alone:.1f} s of {what}{ratio}")
            start = s.first_send - plan.made   # the workers' start: up to the first test (the first worker's collection)
            if alone > 0 and start + wall >= alone:
                lines.append(f"  -n did not pay here: the workers' start ({start:.1f} s) and the tests ({wall:.1f} s) "
                             f"took longer than {what} ({alone:.1f} s); run these tests without -n")
        if plan.fixtures:
            instances = {k: n for needs in plan.fixtures.values() for k, n in needs.items()}
            lines.append(f"  counted on every worker that needed it: its own copy of each of {len(instances)} "
                         f"broader fixture(s) (class, module, package or session scope; the largest "
                         f"{format_size(max(instances.values()))})")
        if plan.kept_cache:
            lines.append(f"  the workers kept their caching allocators' blocks between tests: the card has room for "
                         f"them (counted with each worker's context: {format_size(plan.context)})")
        for nodeid, why in s.reruns:
            lines.append(f"  re-run alone at the end: {nodeid} ran out of memory beside other tests ({why}); "
                         "the re-run's outcome stands")
        lines += self._too_large()
        lines += self._over()
        return lines

    def _over(self) -> list[str]:
        """Tests that started where nothing else ran on their device, yet
        what the other workers held between tests (their contexts, what
        their tests kept, their copies of broader fixtures) and the test
        came to more than the capacity: the test, alone, never waits for
        those, which only the workers' end gives back.  Those larger than
        the capacity alone are _too_large's."""
        if self.collection is None or not self.stats.over:
            return []
        big = {n for device in self.plan.capacity for n in self._larger_than_room(device)[1]}   # _too_large's
        over = [(self.collection[i], used) for i, used in self.stats.over.items() if self.collection[i] not in big]
        if not over:
            return []
        names = ", ".join(f"{n} ({format_size(used)})" for n, used in over[:3]) + (", ..." if len(over) > 3 else "")
        return [f"  {len(over)} test(s) started with no other test running on their device, yet with what the "
                f"workers there held between tests (contexts, what earlier tests kept, copies of broader fixtures, "
                f"its own worker's too) more than the capacity was planned in use: {names}"]

    def _larger_than_room(self, device: str) -> tuple[int, list]:
        """The device's capacity less every worker's context there, and the
        tests whose footprint is larger (in collection order)."""
        room = self.plan.capacity[device] - self.plan.workers_on(device, self.numnodes) * self.plan.context
        return room, [n for n in self.collection if self.plan.footprint.get(n, 0) > room]

    def _too_large(self) -> list[str]:
        """Tests larger than their device less every worker's context
        there: they ran alone, yet the other workers' contexts (and what
        they kept) were still on the card, so they may run out of memory
        packed where serially they would not.  On the CPU (no context):
        tests larger than the capacity itself."""
        if self.collection is None:
            return []
        lines = []
        for device, capacity in self.plan.capacity.items():
            workers = self.plan.workers_on(device, self.numnodes)
            room, big = self._larger_than_room(device)
            if not big:
                continue
            names = f"{', '.join(big[:3])}{', ...' if len(big) > 3 else ''}"
            if not self.plan.context:   # the CPU: no context a worker holds, the capacity alone
                lines.append(f"  {len(big)} test(s) need more than the capacity ({format_size(capacity)}) "
                             f"by the baseline's figures: each ran alone, and more than the capacity was in use "
                             f"while it ran: {names}")
                continue
            where = "" if device == "cpu" else f" on GPU {device}"
            lines.append(f"  {len(big)} test(s) need more than the card less {workers} workers' contexts "
                         f"({format_size(room)}{where}): they ran alone, but beside the other workers' "
                         f"contexts they may run out of memory where serially they would not (fewer workers, "
                         f"or without -n): {names}")
        return lines


CACHE_KEY = "memlab/pack-footprints"   # pytest's cache: footprints measured by runs, for tests not in the baseline
FIXTURES_KEY = "memlab/pack-fixtures"   # ... and the broader fixtures each needs
DURATIONS_KEY = "memlab/serial-durations"   # pytest's cache: each test's seconds in the last serial run that measured it


def make_plan(config, options, baseline) -> PackPlan:
    """The controller's plan, made when the session starts.  Raises
    pytest.UsageError where there is nothing to pack by."""
    import pytest

    free = gpu_free_memory()
    lanes = baseline.environments if baseline is not None else {}
    env = options.baseline_env or (next(iter(lanes)) if len(lanes) == 1 else ("cuda" if free else "cpu"))
    tests = lanes[env].tests if env in lanes else {}
    on_gpu = bool(free) and (not tests or any(key.startswith("cuda") for d in tests.values() for key in d))
    kind = "cuda" if on_gpu else "cpu"
    footprint = footprints(tests, kind)
    fixtures = fixture_needs(tests, kind)
    cache = getattr(config, "cache", None)
    if cache is not None:
        measured = cache.get(f"{CACHE_KEY}/{kind}", {})
        if isinstance(measured, dict):
            for nodeid, n in measured.items():
                if isinstance(n, int) and n >= 0:
                    footprint[nodeid] = max(n, footprint.get(nodeid, 0))
        needs = cache.get(f"{FIXTURES_KEY}/{kind}", {})
        if isinstance(needs, dict):
            for nodeid, known in needs.items():
                if nodeid not in fixtures and isinstance(known, dict):
                    known = {k: n for k, n in known.items() if isinstance(n, int) and n > 0}
                    if known:
                        fixtures[nodeid] = known
    serial = cache.get(DURATIONS_KEY, {}) if cache is not None else {}
    serial = {k: v for k, v in serial.items() if isinstance(v, (int, float))} if isinstance(serial, dict) else {}
    if kind == "cpu":
        if options.pack_capacity is None:
            raise pytest.UsageError(
                "--memlab-pack: no GPU here, and the CPU has no capacity of its own to pack by: "
                "give one with --memlab-pack-capacity=SIZE (for example 8GiB)")
        return PackPlan("cpu", {"cpu": options.pack_capacity}, footprint, serial=serial, fixtures=fixtures)
    if options.pack_capacity is not None:
        cap = {gpu: options.pack_capacity for gpu in free}
    else:
        cap = {gpu: int(n * (1 - MARGIN_SHARE)) for gpu, n in free.items()}
    count = int(getattr(config.option, "numprocesses", 0) or 0)
    workers = {}   # --memlab-gpus-per-worker's plan: each worker packed on its first GPU
    for i in range(count):
        gpus = worker_gpus(f"gw{i}")
        if gpus:
            workers[f"gw{i}"] = gpus[0]
    plan = PackPlan("cuda", cap, footprint, context=CONTEXT_BYTES + KEPT_CACHE_BYTES, worker_devices=workers,
                    serial=serial, fixtures=fixtures)
    cache_bound = max(KEPT_CACHE_BYTES, reserved_peak(tests))
    if roomy(plan, count, cache_bound):
        plan.kept_cache, plan.context = cache_bound, CONTEXT_BYTES + cache_bound
    return plan


def reserved_peak(tests: dict) -> int:
    """The most a serial run's caching allocator held reserved on a GPU,
    over a baseline lane's tests (the process's figure, which carries
    what earlier tests left cached): what one worker keeping its cache
    between tests holds at most, give or take the order of its tests."""
    return max((int(entry.get("reserved_peak") or 0) for devices in tests.values() if isinstance(devices, dict)
                for key, entry in devices.items() if key.startswith("cuda") and isinstance(entry, dict)),
               default=0)


def roomy(plan: PackPlan, workers: int, cache_bound: int) -> bool:
    """Whether every device has room for each of its workers' context,
    the whole cache a worker would keep (cache_bound) and AHEAD of the
    suite's largest tests besides: where it has, packed workers keep
    their caches as plain -n does (returning blocks after each test costs
    the next test its driver calls, for room nothing needs), and the
    scheduler counts each worker's context with that cache in it."""
    largest = max(plan.footprint.values(), default=0)
    if workers <= 0 or not plan.footprint:
        return False
    # a worker keeps its cache on every GPU it uses, and the scheduler
    # counts each worker on one: only where each worker has one GPU
    if plan.worker_devices:
        if any(len(worker_gpus(f"gw{i}") or ()) > 1 for i in range(workers)):
            return False
    elif len(plan.capacity) > 1:
        return False
    for device, capacity in plan.capacity.items():
        if plan.workers_on(device, workers) * (CONTEXT_BYTES + cache_bound + AHEAD * largest) > capacity:
            return False
    return True


def remember_footprints(config, results: dict, kinds=("cpu", "cuda")) -> None:
    """Each measured test's footprint on devices of each kind, kept in
    pytest's cache for the next packed run (a test the baseline does not
    have: one it skipped, one added since).  A measured test that held
    nothing of a kind (skipped, or CPU-only in a CUDA suite) is kept as 0
    there, so that it need not run alone."""
    cache = getattr(config, "cache", None)
    if cache is None or not results:
        return
    for kind in kinds:
        key = f"{CACHE_KEY}/{kind}"
        known = cache.get(key, {})
        if not isinstance(known, dict):
            known = {}
        fixtures_key = f"{FIXTURES_KEY}/{kind}"
        needs = cache.get(fixtures_key, {})
        if not isinstance(needs, dict):
            needs = {}
        for nodeid, result in results.items():
            held, mine = 0, {}
            for name, device in result.devices.items():
                if name.split(":", 1)[0] != kind or not device.measured or device.peak is None:
                    continue
                held = max(held, held_at_once(device.peak, device.first_use))
                for instance, n in (device.fixtures or {}).items():
                    mine[instance] = max(n, mine.get(instance, 0))
            known[nodeid] = held
            if mine:
                needs[nodeid] = mine
            else:
                needs.pop(nodeid, None)
        cache.set(key, known)
        cache.set(fixtures_key, needs)


def remember_serial_durations(config, durations: dict[str, float]) -> None:
    """Each test's seconds (setup, call and teardown) in this serial run,
    kept in pytest's cache: what a packed run's summary compares its wall
    with (tests side by side can each take longer than alone, so their
    durations there, added up, are not the serial time)."""
    cache = getattr(config, "cache", None)
    if cache is None or not durations:
        return
    known = cache.get(DURATIONS_KEY, {})
    if not isinstance(known, dict):
        known = {}
    known.update({k: round(v, 4) for k, v in durations.items()})
    cache.set(DURATIONS_KEY, known)


def set_aside_for_rerun(packing: PackScheduling, report) -> None:
    """On the controller, before any other plugin sees the report: a test
    that ran out of memory beside others (its worker said so) is re-run
    alone at the end, and this attempt's reports become ``rerun``: its
    failure neither counts nor shows as one; the re-run's outcome stands.
    A test that ran out of memory alone, or on its re-run, fails as it is."""
    nodeid = report.nodeid
    if report.when in ("setup", "call"):
        words = getattr(report, "memlab_out_of_memory", None)
        if report.failed and words and packing.rerun_alone(nodeid, words):
            report.outcome = "rerun"
            report.memlab_rerun = words
            packing.set_aside[nodeid] = words
    elif report.when == "teardown" and nodeid in packing.set_aside:
        words = packing.set_aside.pop(nodeid)
        report.memlab_rerun = words
        # --junitxml keeps a testcase for this attempt: it says it was set aside
        report.user_properties.append(("memlab.rerun", f"set aside, re-run alone at the end: {words}"))
        if report.failed:   # the attempt's teardown (a budget it broke): the re-run judges again
            report.outcome = "rerun"


def release_cached_gpu_memory(allowance: int = KEPT_CACHE_BYTES) -> None:
    """On a packed worker, after each test: where the caching allocator
    keeps more than allowance reserved beyond what is allocated
    (KEPT_CACHE_BYTES, or where the plan lets workers keep their caches,
    the most the serial run held reserved: what the scheduler counts for
    each worker), its free blocks go back to the driver, so that what the
    worker holds between tests is what its tests kept and at most that
    allowance, not what they once reserved (a test without a figure may
    reserve more than any the baseline knows).  Nothing where CUDA never
    started."""
    import sys

    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            for i in range(torch.cuda.device_count()):
                if torch.cuda.memory_reserved(i) - torch.cuda.memory_allocated(i) > allowance:
                    with torch.cuda.device(i):
                        torch.cuda.empty_cache()
    except Exception:   # never the test's trouble
        pass
