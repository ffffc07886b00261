"""The process's environment, written through the engine's own buffers
(``csrc/environ_buffer.c``) where glibc's ``setenv`` (``os.putenv``) would
keep a copy of every distinct value for the life of the process: the
children's variable takes a new value in every measured test.

``put(name, value)`` (bytes) sets the variable in the process's
environment only; the caller keeps ``os.environ``'s table alike
(``children/gathering.py``).

``links(fd)``: the link count of an open folder (``os.fstat``'s
``st_nlink`` without the ``stat_result``, whose times are most of its
cost): the children's root, looked at after every measured test, counts
one link more for each test folder a child made.
"""

from .._engine import environ_put as put
from .._engine import links

__all__ = ["links", "put"]
