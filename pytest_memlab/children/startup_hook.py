"""The start-up hook: one line in a ``.pth`` file in the interpreter's
site-packages, which Python runs at every start (as coverage.py's
``process_startup`` is armed).  Inert unless the test's environment
variable is set: then it imports :mod:`.startup`, and nothing else.

Written by the plugin at the start of a session that measures (only when
absent or different), into the site-packages of the Python running pytest:
the one its children run, as sys.executable.
"""

from __future__ import annotations

import os
import sysconfig

from .startup import ENV

FILE_NAME = "pytest_memlab_children.pth"
LINE = (f"import os; '{ENV}' in os.environ and "
        "__import__('pytest_memlab.children.startup', fromlist=['_']).process_startup()\n")


def hook_path() -> str:
    return os.path.join(sysconfig.get_paths()["purelib"], FILE_NAME)


def ensure() -> str:
    """Installs the hook where it is missing or stale; returns "" or why
    children cannot be measured."""
    path = hook_path()
    try:
        with open(path) as f:
            if f.read() == LINE:
                return ""
    except OSError:
        pass
    try:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(LINE)
        os.replace(tmp, path)
    except OSError as exc:
        return (f"child processes are not measured: the start-up hook could not be written to {path} "
                f"({exc.strerror or exc})")
    return ""
