"""The process's environment, written through the engine's own buffers
(``csrc/environ_buffer.c``) where glibc's ``setenv`` (``os.putenv``) would
keep a copy of every distinct value for the life of the process: the
children's variable takes a new value in every measured test.

``put(name, value)`` (bytes) sets the variable in the process's
environment only; the caller keeps ``os.environ``'s table alike
(``children/gathering.py``).
"""

from .._engine import environ_put as put

__all__ = ["put"]
