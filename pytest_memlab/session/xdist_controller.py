"""The session's side on the pytest-xdist controller (and in a run without
workers, where it hears nothing): what each worker sent at its end, and
the run's environment and backend as the workers measured them (the
controller measures nothing)."""

from __future__ import annotations


class ControllerSide:
    def __init__(self, session):
        self.session = session
        self.workers: dict[str, dict] = {}    # worker id -> what it sent at its end

    def node_down(self, node) -> None:
        output = getattr(node, "workeroutput", None) or {}
        sent = output.get("memlab")
        if isinstance(sent, dict):
            self.workers[str(node.gateway.id)] = sent
            session = self.session
            session.collected.update(sent.get("collected", ()))
            if session.env is None and sent.get("env"):
                session.env = sent["env"]
            session.late.update(sent.get("late") or {})
            session.caches += sent.get("caches") or []
            if sent.get("built") and sent["built"] not in session.notes:   # a worker built the bridge
                session.notes.append(sent["built"])

    def environment(self) -> dict:
        """This run's environment: a worker's (a GPU worker's first), else
        this process's."""
        sent = [w["info"] for w in self.workers.values() if w.get("info")]
        gpu = [i for i in sent if i.get("device") not in (None, "cpu")]
        return (gpu or sent or [self.session.own_environment()])[0]

    def backend(self) -> str:
        return self.session.backend or next((w["backend"] for w in self.workers.values() if w.get("backend")), "")

    def gpu_lines(self) -> list[str]:
        gpus = {w: sent.get("gpus") for w, sent in sorted(self.workers.items()) if sent.get("gpus") is not None}
        if not gpus:
            return []
        return ["GPUs per worker (CUDA_VISIBLE_DEVICES): " + ", ".join(f"{w} -> {g}" for w, g in gpus.items())]
