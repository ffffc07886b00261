"""What each rank of torch's multi-process test harness reads itself, for
bench/check_rank_figures.py: imported by the carried copies of a
third-party distributed suite (``import rank_probe`` at their top, never
committed), it does nothing unless MEMLAB_RANK_PROBE names a folder.  There,
after each test's body in each rank (MultiProcessTestCase.run_test), it
writes ``TEST-rankR.json``: the rank's ``torch.cuda.max_memory_allocated``
over its life (the most it read before any reset_peak_memory_stats the test
made, and after), its device, and the GPUs on which this process holds a
CUDA context (nvidia-smi's compute processes)."""

from __future__ import annotations

import json
import os
import subprocess

FOLDER = os.environ.get("MEMLAB_RANK_PROBE")


def gpus_with_a_context(pid: int) -> list[int]:
    try:
        uuids = dict(line.split(", ") for line in subprocess.run(
            ["nvidia-smi", "--query-gpu=uuid,index", "--format=csv,noheader"],
            capture_output=True, text=True, check=True).stdout.strip().splitlines())
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                              capture_output=True, text=True, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.CalledProcessError, ValueError):
        return []
    return sorted(int(uuids[u]) for p, u in (a.split(", ") for a in apps if ", " in a) if int(p) == pid)


if FOLDER:
    import torch
    from torch.testing._internal import common_distributed

    _most = {}   # device index -> the most allocated before a reset

    _reset = torch.cuda.reset_peak_memory_stats

    def _reset_peak(device=None):
        if torch.cuda.is_initialized():
            index = torch.cuda.current_device() if device is None else torch.device("cuda", device).index \
                if isinstance(device, int) else torch.device(device).index
            index = torch.cuda.current_device() if index is None else index
            _most[index] = max(_most.get(index, 0), torch.cuda.max_memory_allocated(index))
        return _reset(device)

    torch.cuda.reset_peak_memory_stats = _reset_peak
    _run_test = common_distributed.MultiProcessTestCase.run_test

    def _run_and_record(self, test_name, parent_pipe):
        try:
            return _run_test(self, test_name, parent_pipe)
        finally:
            try:
                index = torch.cuda.current_device() if torch.cuda.is_initialized() else None
                most = None if index is None else max(_most.get(index, 0), torch.cuda.max_memory_allocated(index))
                record = {"rank": self.rank, "device": index, "max_memory_allocated": most,
                          "memory_allocated": torch.cuda.memory_allocated(index) if index is not None else None,
                          "gpus": gpus_with_a_context(os.getpid())}
                record["memlab"] = _memlab_now(index)
                with open(os.path.join(FOLDER, f"{test_name}-rank{self.rank}.json"), "w") as f:
                    json.dump(record, f)
            except Exception as exc:   # the probe's trouble, never the test's
                print("rank_probe:", exc)

    def _memlab_now(index):
        """Where memlab measures this process: its figures so far on the device."""
        try:
            from pytest_memlab.children import startup
        except ImportError:
            return None
        child = startup._child
        meter = child.measurement.meters.get(f"cuda:{index}") if child is not None and index is not None else None
        if meter is None:
            return None
        s = meter.stats()
        return {"peak": s.peak, "peak_total": s.peak_total, "live": s.live, "start_total": s.start_total,
                "allocs": s.allocs, "frees": s.frees}

    common_distributed.MultiProcessTestCase.run_test = _run_and_record
