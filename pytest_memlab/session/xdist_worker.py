"""The session's side on a pytest-xdist worker: it measures and sends, at
its end, what the controller needs to write the one baseline and the one
report (the figures themselves travel on each test's report)."""

from __future__ import annotations

import os


class WorkerSide:
    def __init__(self, config, session):
        self.config = config
        self.session = session

    def finish(self) -> None:
        session = self.session
        self.config.workeroutput["memlab"] = {
            "collected": sorted(session.collected), "env": session.env, "info": session.own_environment(),
            "backend": session.backend,
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES") if session.options.gpus_per_worker else None,
            "late": session.late, "caches": session.caches, "built": session.built_note,
        }
