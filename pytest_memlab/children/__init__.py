"""A measured test's child processes, measured too.

The parent side (:mod:`.gathering`) arms each measured test's run with an
environment variable naming a folder of the test's own; the start-up hook
(:mod:`.startup_hook`, a ``.pth`` file in the interpreter's site-packages,
as coverage.py measures subprocesses) runs :func:`.startup.process_startup`
in every Python process started while the variable is set, and a fork of
the test's process measures itself through ``os.register_at_fork``.  Each
child writes its figures into the folder when it exits; the parent reads
them after the test's teardown.  Nothing here imports torch or pytest at
start-up.
"""
