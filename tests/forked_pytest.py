"""Inner pytest runs forked from a process that imported torch once.

Most of this suite's time on a 2-core machine went to starting inner pytest
processes (pytester's ``runpytest_subprocess``, the zoo's and the docs'
runs), each importing torch anew: 1.1 s of CPU on Python 3.11, 1.5 s on
3.12, about a hundred times a lane.  A *starter* process per test process
imports torch once (nothing else of note: not pytest, not pytest-memlab,
and it never runs a torch operation, starts CUDA or a thread pool) and forks
a child for each run.  The child becomes what ``python -m pytest ARGS``
would be: its working directory, its environment, its ``sys.path`` from
PYTHONPATH, its argv, stdin from /dev/null, stdout and stderr into the
caller's files; at its end the ``atexit`` handlers and the non-daemon
threads run as at an interpreter's exit.  What differs from a new process:
torch (and what it imports) is imported before pytest starts, as a
conftest that imports torch would have it, and environment variables that
torch reads while importing are the starter's.  Tests that need a new
interpreter (what a process imports, variables read at torch's import)
run with ``MEMLAB_TEST_FORK=0`` or call ``subprocess`` themselves.

An inner run's xdist workers are forked too: in the child, execnet's popen
gateway runs ``forked_worker_client.py`` (``python -S``, no torch) in place
of the worker's interpreter; it asks the starter for a child that runs the
worker's bootstrap with its stdin, stdout and stderr, and exits with that
child's status.  The starter serves several runs at once (an inner run and
its workers).  ``MEMLAB_TEST_FORK_WORKERS=0`` starts the workers anew.

``popen(args, cwd, env, stdout, stderr)`` returns an object with Popen's
``wait(timeout)``, ``kill()``, ``returncode``, ``stdin`` (None) and
``pid``, or None where the run cannot be forked (then the caller starts a
process as before).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

ENABLED = os.environ.get("MEMLAB_TEST_FORK", "1") != "0"
# the inner runs' xdist workers forked as well (MEMLAB_TEST_FORK_WORKERS=0: new interpreters)
WORKERS_ENABLED = ENABLED and os.environ.get("MEMLAB_TEST_FORK_WORKERS", "1") != "0"
WORKERS_CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forked_worker_client.py")

# The starter: run as `python -c STARTER SOCKET_PATH`.
STARTER = r'''
import json, os, select, signal, socket, sys, warnings
try:
    import torch  # noqa: F401  (the point of this process)
except Exception:
    pass
# pytest itself (not its plugins, not pytest-memlab): its import reads no
# environment, and each child starts from this process's untouched copy
import _pytest.config  # noqa: E402,F401
import pytest  # noqa: E402,F401
path = sys.argv[1]
base_path = [p for p in sys.path[1:] if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(4)
print("ready", flush=True)


def fork_xdist_workers(client):
    """In an inner pytest run: the xdist workers it starts (execnet's popen
    gateways of this interpreter) are forked from this starter too, through
    CLIENT, a small process that stands in for the worker's interpreter."""
    try:
        import execnet.gateway_io as gateway_io
    except ImportError:
        return
    original = gateway_io.popen_args

    def popen_args(spec):
        args = original(spec)
        if not spec.python and args[:1] == [sys.executable]:
            args[0:1] = [sys.executable, "-S", client, path]
        return args

    gateway_io.popen_args = popen_args


def child(request, fds):
    """Becomes `python -m pytest ARGS` (or `python -c CODE`); never returns."""
    import atexit, runpy, threading, traceback
    code = 1
    try:
        warnings.filters[:] = filters
        warnings._filters_mutated()
        server.close()
        for conn, run in runs.items():   # the other runs' ends belong to the starter
            conn.close()
            if run[1] is not None:
                os.close(run[1])
        os.setpgid(0, 0)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if len(fds) == 3:   # an xdist worker: its stdin is execnet's channel
            stdin, out, err = fds
        else:
            stdin = os.open(os.devnull, os.O_RDONLY)
            out, err = fds
        os.dup2(stdin, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in {stdin, *fds}:
            os.close(fd)
        encoding = sys.stdout.encoding
        sys.stdin = open(0, "r", encoding=encoding, closefd=False)
        sys.stdout = open(1, "w", encoding=encoding, closefd=False)
        sys.stderr = open(2, "w", encoding=encoding, errors="backslashreplace", closefd=False,
                          buffering=1)
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
        pythonpath = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [request["cwd"], *pythonpath, *base_path]
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if request.get("workers_client"):
            fork_xdist_workers(request["workers_client"])
        try:
            if "code" in request:   # `python -u [-B] -c CODE`: an xdist worker's bootstrap
                sys.argv = ["-c", *request["args"]]
                sys.dont_write_bytecode = "-B" in request["args"] or sys.dont_write_bytecode
                exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
            else:
                sys.argv = [request["module"], *request["args"]]
                runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        threading._shutdown()
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


parent = os.getppid()
runs = {}   # conn -> [pid, pidfd (None: polled), killed]: runs at once (an inner run and its workers)
while True:
    # the test process that started this one may end without a word (killed):
    # then this one ends too
    watch = [server] + [c for c, r in runs.items() if not r[2]] + [r[1] for r in runs.values() if r[1] is not None]
    polled = any(r[1] is None or r[2] for r in runs.values())
    ready, _, _ = select.select(watch, [], [], 0.05 if polled else 2.0)
    if not ready and not runs and os.getppid() != parent:
        os._exit(0)
    if server in ready:
        conn, _ = server.accept()
        try:
            msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            request = json.loads(msg.decode())
            filters = list(warnings.filters)
            with warnings.catch_warnings():   # 3.12 warns of forking beside torch's one idle thread
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                conn.close()
                child(request, fds)
            for fd in fds:
                os.close(fd)
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            try:   # the child's end wakes select (Linux 5.3+); else it is polled
                pidfd = os.pidfd_open(pid)
            except (AttributeError, OSError):
                pidfd = None
            runs[conn] = [pid, pidfd, False]
        except Exception as exc:   # a bad request: said to the caller, the starter goes on
            try:
                conn.sendall(json.dumps({"error": repr(exc)}).encode() + b"\n")
            except OSError:
                pass
            conn.close()
    for conn, run in runs.items():
        if conn in ready and not run[2]:
            try:
                word = conn.recv(16)
            except OSError:
                word = b""
            if word.startswith(b"kill") or not word:   # killed, or its caller went away
                run[2] = True
                try:
                    os.killpg(run[0], signal.SIGKILL)
                except ProcessLookupError:
                    pass
    for conn, (pid, pidfd, _) in list(runs.items()):
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            if pidfd is not None:
                os.close(pidfd)
            try:
                conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(raw)}).encode() + b"\n")
            except OSError:
                pass
            conn.close()
            del runs[conn]
'''


class _Starter:
    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="memlab-fork-")
        self.path = os.path.join(self.folder, "s")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
        self.proc = subprocess.Popen([sys.executable, "-c", STARTER, self.path], stdout=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        assert self.proc.stdout is not None
        self.ready = self.proc.stdout.readline().strip() == b"ready"
        atexit.register(self.close)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


_starter: _Starter | None = None


class ForkedRun:
    """What pytester and subprocess.run need of a Popen."""

    stdin = None

    def __init__(self, conn: socket.socket, pid: int) -> None:
        self.conn, self.pid = conn, pid
        self.returncode: int | None = None
        self._buffer = b""

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        self.conn.settimeout(timeout)
        try:
            while b"\n" not in self._buffer:
                part = self.conn.recv(4096)
                if not part:
                    raise RuntimeError("the forking starter went away during a run")
                self._buffer += part
        except socket.timeout:
            raise subprocess.TimeoutExpired(f"pytest (forked, pid {self.pid})", timeout) from None
        answer = json.loads(self._buffer.split(b"\n", 1)[0])
        if "returncode" not in answer:
            raise RuntimeError(f"the forking starter failed: {answer.get('error')}")
        self.returncode = int(answer["returncode"])
        self.conn.close()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                self.conn.sendall(b"kill")
            except OSError:
                pass

    def poll(self) -> int | None:
        return self.returncode


def ask(path: str, request: dict, fds: list[int]) -> ForkedRun | None:
    """A run from the starter at path (its request, and the descriptors it
    writes to: stdout and stderr, or stdin, stdout and stderr), or None
    where the starter did not take it."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        socket.send_fds(conn, [json.dumps(request).encode()], fds)
        line = b""
        while not line.endswith(b"\n"):
            part = conn.recv(4096)
            if not part:
                conn.close()
                return None
            line += part
        answer = json.loads(line)
    except OSError:
        conn.close()
        return None
    if "pid" not in answer:
        conn.close()
        return None
    return ForkedRun(conn, answer["pid"])


def popen(module: str, args: list[str], cwd: str, env: dict, stdout, stderr) -> ForkedRun | None:
    """`python -m module ARGS` forked from the starter, or None (the caller
    starts a process itself)."""
    global _starter
    if not ENABLED or sys.platform != "linux" or not hasattr(os, "pidfd_open"):
        return None
    if _starter is None:
        _starter = _Starter()
    if not _starter.ready or _starter.proc.poll() is not None:
        return None
    request = {"module": module, "args": [os.fspath(a) for a in args], "cwd": os.fspath(cwd), "env": dict(env)}
    if WORKERS_ENABLED:
        request["workers_client"] = WORKERS_CLIENT
    return ask(_starter.path, request, [stdout.fileno(), stderr.fileno()])


def run_captured(cmd: list[str], cwd, env: dict, timeout: float | None = None) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True): forked where
    cmd is `sys.executable -m pytest ...`."""
    if len(cmd) >= 3 and cmd[0] == sys.executable and cmd[1] == "-m" and cmd[2] == "pytest":
        with tempfile.TemporaryFile("w+", encoding="utf-8") as out, \
                tempfile.TemporaryFile("w+", encoding="utf-8") as err:
            run = popen("pytest", list(cmd[3:]), cwd, env, out, err)
            if run is not None:
                try:
                    code = run.wait(timeout)
                except subprocess.TimeoutExpired:
                    run.kill()
                    run.wait()
                    raise
                out.seek(0)
                err.seek(0)
                return subprocess.CompletedProcess(cmd, code, out.read(), err.read())
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
