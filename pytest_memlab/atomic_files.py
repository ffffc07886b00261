"""Files written whole or not at all (the baseline, the JSON and HTML
reports, snapshots), and the lock that serialises a baseline's updaters."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class NotARegularFile(OSError):
    """The path names something a report or a baseline must not replace."""


def write_atomic(path: Path, text: str) -> None:
    """A temporary file in the same folder, fsync, rename over ``path``
    (then fsync the folder): an interruption leaves either file whole.  A
    symbolic link is written through, atomically at its target; a path
    that is neither a regular file nor absent (a FIFO, a device, a folder)
    is refused, never replaced."""
    path = Path(os.path.realpath(path))
    if path.exists() and not path.is_file():
        raise NotARegularFile(f"{path} is not a regular file; memlab writes only regular files")
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.chmod(tmp, path.stat().st_mode & 0o777)
        except FileNotFoundError:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dirfd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dirfd)
    except OSError:
        pass
    finally:
        os.close(dirfd)


def lock(path: Path):
    """The lock that serialises updates of ``path``: ``.NAME.lock`` beside
    it (hidden), held while a process re-reads, merges and writes the file."""
    from filelock import FileLock

    path = Path(path)
    return FileLock(str(path.parent / f".{path.name}.lock"), timeout=300)
