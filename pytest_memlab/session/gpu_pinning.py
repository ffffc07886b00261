"""--memlab-gpus-per-worker: under pytest-xdist, each worker gets its own
GPUs before CUDA starts.

The controller lists the GPUs in an environment variable before xdist
starts its workers, which inherit it; each worker picks its own share and
sets CUDA_VISIBLE_DEVICES while pytest loads its initial conftests, before
any of them can start CUDA.
"""

from __future__ import annotations

import json
import os

GPUS_VARIABLE = "PYTEST_MEMLAB_WORKER_GPUS"


def visible_gpus() -> list[str] | None:
    """CUDA_VISIBLE_DEVICES's entries, None where it is unset."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return None if visible is None else [g.strip() for g in visible.split(",") if g.strip()]


def worker_gpus(worker: str) -> list[str] | None:
    """The GPUs the controller's plan gives worker ("gw3"); None where
    there is no plan (or the name is no xdist worker's)."""
    plan = os.environ.get(GPUS_VARIABLE)
    if not plan or not worker.startswith("gw"):
        return None
    try:
        plan = json.loads(plan)
        gpus, per, index = plan["gpus"], int(plan["per"]), int(worker[2:])
    except (ValueError, KeyError, TypeError):
        return None
    if not gpus:
        return None
    return [gpus[(index * per + k) % len(gpus)] for k in range(per)]


def pin_this_worker() -> None:
    """On a worker: CUDA_VISIBLE_DEVICES from the controller's plan, where
    there is one."""
    gpus = worker_gpus(os.environ.get("PYTEST_XDIST_WORKER", ""))
    if gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)


def plan_gpus(config, per: int) -> str:
    """Under pytest-xdist, on the controller: the GPUs the workers share
    out (the controller runs no test, so asking torch here changes no
    test's process).  Returns a note for the summary ("" when planned)."""
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist") \
            or not config.getoption("numprocesses", None):
        return "--memlab-gpus-per-worker works under pytest-xdist (-n N) only; this run has no workers"
    gpus = visible_gpus()
    if gpus is None:
        try:
            import torch

            gpus = [str(i) for i in range(torch.cuda.device_count())]
        except Exception:
            gpus = []
    if not gpus:
        return "--memlab-gpus-per-worker: no GPUs to share out; the workers run as they are"
    os.environ[GPUS_VARIABLE] = json.dumps({"gpus": gpus, "per": per})
    return ""
