"""What an inner pytest run's xdist worker process is, where it is forked
(tests/forked_pytest.py): run by execnet in place of the worker's
interpreter, as ``python -S forked_worker_client.py SOCKET -u [-B] -c CODE``.
It asks the starter at SOCKET to fork a child that runs CODE with this
process's stdin, stdout and stderr (execnet's channel), waits for that
child's end and exits with its status.  A signal to this process, or its
end, kills the child."""

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from forked_pytest import ask  # noqa: E402  (the starter's protocol, stdlib only)

path, argv = sys.argv[1], sys.argv[2:]
k = argv.index("-c")
run = ask(path, {"code": argv[k + 1], "args": argv[:k], "cwd": os.getcwd(), "env": dict(os.environ)}, [0, 1, 2])
if run is None:
    sys.exit("forked_worker_client: the starter did not take the worker")
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, lambda signum, frame: run.kill())
try:
    status = run.wait()
except RuntimeError as exc:   # the starter failed or went away
    sys.exit(f"forked_worker_client: {exc}")
sys.exit(status if status >= 0 else 128 - status)
