"""What an inner pytest run's xdist worker process is, where it is forked
(tests/forked_pytest.py): run by execnet in place of the worker's
interpreter, as ``python -S forked_worker_client.py SOCKET -u [-B] -c CODE``.
It asks the starter at SOCKET to fork a child that runs CODE with this
process's stdin, stdout and stderr (execnet's channel), waits for that
child's end and exits with its status.  A signal to this process, or its
end, kills the child."""

import json
import os
import signal
import socket
import sys

path, argv = sys.argv[1], sys.argv[2:]
k = argv.index("-c")
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.connect(path)
request = {"code": argv[k + 1], "args": argv[:k], "cwd": os.getcwd(), "env": dict(os.environ)}
socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])


def kill(signum, frame):
    try:
        conn.sendall(b"kill")
    except OSError:
        pass


for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, kill)
buffer, status = b"", None
while status is None:
    part = conn.recv(4096)
    if not part:
        break
    buffer += part
    while b"\n" in buffer:
        line, buffer = buffer.split(b"\n", 1)
        answer = json.loads(line)
        if "returncode" in answer:
            status = int(answer["returncode"])
        elif "error" in answer:
            print(f"forked_worker_client: the starter failed: {answer['error']}", file=sys.stderr)
            status = 1
sys.exit(1 if status is None else (status if status >= 0 else 128 - status))
