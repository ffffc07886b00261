"""A session run once per rank (``torchrun --nproc-per-node N -m pytest``):
each rank measures its own process; rank 0 gathers every rank's figures of
each test through files in a run folder shared by the ranks (never through
the user's process group), judges each rank's budgets beside its own, and
is the one that writes the reports and the baseline.

The run folder: ``--memlab-rank-dir``, else one under the system's temp
folder named after the torchrun run (TORCHELASTIC_RUN_ID, and the launching
agent's pid, which the ranks of one node share and no other run has).
Several nodes need a folder every node sees: give ``--memlab-rank-dir``.

Each rank writes, after a measured test's teardown, its figures into the
test's subfolder (``rank<R>.json``, the format of a measured child's file);
rank 0 waits for the other ranks' files at its own teardown, at most
``--memlab-rank-timeout`` seconds, and says which rank did not report.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time

from ..children.gathering import ChildFigures, read, read_devices
from ..children.startup import devices_record, write_record


def rank_environment() -> tuple[int, int] | None:
    """(rank, world size) under torchrun (or any launcher that sets RANK and
    WORLD_SIZE), when there are several ranks; else None."""
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return (rank, world) if world > 1 and 0 <= rank < world else None


def default_folder() -> str:
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if not run or run == "none":
        run = f"{os.environ.get('MASTER_ADDR', 'local')}-{os.environ.get('MASTER_PORT', '')}"
    run = "".join(c if c.isalnum() or c in "-_." else "_" for c in run)
    return os.path.join(tempfile.gettempdir(), f"memlab-ranks-{run}-{os.getppid()}")


class RankSide:
    """This rank's part in the per-test exchange."""

    def __init__(self, rank: int, world: int, folder: str, timeout: float, top: int):
        self.rank = rank
        self.world = world
        self.folder = folder
        self.timeout = timeout
        self.top = top
        self.gatherer = rank == 0
        self._runs: dict[str, int] = {}      # nodeid -> its runs so far (a rerun is its own exchange)
        self._silent: set[int] = set()       # ranks that missed a deadline: waited for briefly after
        os.makedirs(folder, exist_ok=True)

    def _test_folder(self, nodeid: str) -> str:
        n = self._runs[nodeid] = self._runs.get(nodeid, 0) + 1
        digest = hashlib.sha1(nodeid.encode("utf-8", "surrogatepass")).hexdigest()[:20]
        return os.path.join(self.folder, f"{digest}-{n}")

    def share(self, run) -> None:
        """A rank other than 0: its figures of the test, for rank 0."""
        folder = self._test_folder(run.nodeid)
        os.makedirs(folder, exist_ok=True)
        # A rank whose measurement could not start says so (rank 0 would
        # otherwise wait for it in vain).
        state = "done" if run.measurement is not None else "unmeasured"
        devices = devices_record(run.figures or {}, self.top)
        write_record(os.path.join(folder, f"rank{self.rank}.json"), state, devices, run.error,
                     f"rank {self.rank}", self.rank)

    def gather(self, run) -> list[ChildFigures]:
        """Rank 0: every other rank's figures of the test, waited for at
        most the timeout (a rank that missed one deadline gets a second
        only: the run must not hang on a rank that is gone)."""
        folder = self._test_folder(run.nodeid)
        others = [r for r in range(self.world) if r != self.rank]
        paths = {r: os.path.join(folder, f"rank{r}.json") for r in others}
        deadline = time.monotonic() + self.timeout
        pending = set(others)
        while pending:
            pending = {r for r in pending if not os.path.exists(paths[r])}
            if not pending:
                break
            limit = deadline if not pending <= self._silent else min(deadline, time.monotonic() + 1.0)
            if time.monotonic() >= limit:
                break
            time.sleep(0.01)
        gathered = []
        for r in others:
            if r in pending:
                self._silent.add(r)
                gathered.append(ChildFigures(0, f"rank {r}", r, state="missing",
                                             why=f"rank {r} did not report its figures of this test within "
                                                 f"{self.timeout:g} s (--memlab-rank-timeout)"))
                continue
            self._silent.discard(r)
            child = read(paths[r])
            child.label, child.rank = f"rank {r}", r
            gathered.append(child)
        shutil.rmtree(folder, ignore_errors=True)
        return gathered

    def own(self, run) -> ChildFigures:
        """Rank 0's own figures, as the reports list every rank."""
        child = ChildFigures(os.getpid(), f"rank {self.rank}", self.rank, own=True)
        read_devices(child, devices_record(run.figures or {}, self.top))
        return child

    def close(self) -> None:
        if self.gatherer:
            shutil.rmtree(self.folder, ignore_errors=True)
