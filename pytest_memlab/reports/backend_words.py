"""How a run was measured, in the words a user reads in passing.

The session keeps the chosen backend as ``NAME: REASON`` (``bridge: torch
bridge memlab_bridge-....so``), which the JSON report keeps as it is and
``-v`` shows; the terminal's head line and the HTML report's header say
what it means instead: through torch's own allocators, or only from
torch.cuda's counters, and why.
"""

from __future__ import annotations


def backend_words(backend: str, torch_version: str | None = None) -> str:
    """``measured through torch's allocators (torch 2.13.0)``, with what
    the backend's reason adds that a user must know (a CPU heard on the
    measuring threads only); ``""`` for no backend."""
    if not backend:
        return ""
    name, _, reason = backend.partition(": ")
    version = f" (torch {torch_version})" if torch_version else ""
    if name == "bridge":
        # The reason names the bridge's library first; what follows a
        # "; " is a limit of the measurement, said in words already.
        _, _, limit = reason.partition("; ")
        return f"measured through torch's allocators{version}" + (f"; {limit}" if limit else "")
    if name == "counters":
        return f"measured from torch.cuda's counters only, no line attribution{version}: {reason}"
    return f"not measured: {reason}" if reason else "not measured"
