"""A fork server for the Python fake shard worker: the fast suite's fake workers without the imports.

Why: a fake worker spends about 0.9 s of CPU importing numpy and grpc before it listens, and the fast
suite starts several hundred of them (a fake certification starts about 25), so on a 2-core machine
those imports were over half of the suite's time.  A zygote imports them once; each fake worker the
launcher starts is still a real process with its own pid, stdin, stdout and stderr files and exit
status, but it asks the zygote to fork the worker instead of importing everything itself.

The process the launcher holds (the *stub*, fake_shard_worker.py run as a script) stays the worker as
far as anyone can see: it hands the zygote its argv, environment, working directory and its three
standard descriptors; forwards every catchable signal to the forked worker; exits with the worker's
exit status (or dies of the worker's signal).  If the stub is killed by SIGKILL, the zygote sees its
connection close and kills the worker with SIGKILL too.  The zygote stops (killing what it forked)
when the test process that started it goes away (its stdin reaches end of file).

A stub runs the worker itself, as before, when no zygote is named in its environment or when it is in
another network namespace than the zygote (``ip netns exec``: a forked worker would listen in the
zygote's namespace).
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ZYGOTE_ENV = "FAKE_SHARD_ZYGOTE"  # the zygote's socket path (not DGR_: test contexts drop those)
NETNS_ENV = "FAKE_SHARD_ZYGOTE_NETNS"  # the zygote's network namespace (/proc/self/ns/net)
READY = "FAKE-ZYGOTE-READY"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
STATUS = struct.Struct("!qq")  # (pid, 0) when forked, then (pid, wait status) when it ended
MAX_REQUEST = 1 << 20


def _netns() -> str:
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return ""


# ---- the stub's side: called first thing by fake_shard_worker.py when run as a script ----


def run_forked_if_possible(script: str) -> None:
    """Have the zygote run ``script`` as this process's worker and exit as it exits; return at once
    (the caller runs the worker itself) when there is no zygote for this process to use."""
    path = os.environ.get(ZYGOTE_ENV)
    if not path or os.environ.get(NETNS_ENV) != _netns():
        return
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        return
    pending: list[int] = []
    worker: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if worker:
            os.kill(worker[0], signum)
        else:
            pending.append(signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    env = {k: v for k, v in os.environ.items() if k not in (ZYGOTE_ENV, NETNS_ENV)}
    request = json.dumps(
        {"script": os.path.abspath(script), "argv": sys.argv, "env": env, "cwd": os.getcwd()}
    ).encode()
    socket.send_fds(conn, [request], [0, 1, 2])
    pid, _ = STATUS.unpack(conn.recv(STATUS.size))
    worker.append(pid)
    for signum in pending:
        os.kill(pid, signum)
    _exit_as(STATUS.unpack(conn.recv(STATUS.size))[1])


def _exit_as(status: int) -> None:
    """End this process the way the worker's wait status says it ended."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        if signum not in (signal.SIGKILL, signal.SIGSTOP):  # these two can be neither caught nor reset
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


# ---- the zygote's side ----


def _preload() -> None:
    """What every fake worker imports (the stubs themselves differ per workspace: the child imports them)."""
    import argparse  # noqa: F401
    import concurrent.futures  # noqa: F401
    import queue  # noqa: F401

    import google.protobuf.descriptor_pool  # noqa: F401
    import grpc  # noqa: F401
    import numpy  # noqa: F401


def _run_child(request: dict, fds: list[int], closing: list) -> None:
    """In the forked child: become the stub's worker, run the script as __main__, never return."""
    import runpy
    import traceback

    code = 1
    try:
        for s in closing:
            s.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        for signum in (*FORWARDED, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the worker's own stdout, for good
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        runpy.run_path(request["script"], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the worker's own crash, reported as Python would
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:
                pass
        os._exit(code)


class _Zygote:
    def __init__(self, path: str) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        self.listener.listen(64)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(0, selectors.EVENT_READ, "parent")
        self.children: dict[int, socket.socket] = {}  # worker pid -> its stub's connection

    def serve(self) -> None:
        while True:
            for key, _ in self.selector.select(timeout=0.05):
                if key.data == "accept":
                    self._fork_one()
                elif key.data == "parent":
                    if not os.read(0, 256):
                        self._stop()
                        return
                else:
                    self._stub_went_away(key.fileobj, key.data)
            self._reap()

    def _fork_one(self) -> None:
        conn, _ = self.listener.accept()
        try:
            data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
            request = json.loads(data)
        except (OSError, ValueError):
            conn.close()
            return
        pid = os.fork()
        if pid == 0:
            _run_child(request, fds, [self.selector, self.listener, conn, *self.children.values()])
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ, pid)
        self._send(conn, pid, 0)

    def _stub_went_away(self, conn: socket.socket, pid: int) -> None:
        """The stub's connection is readable only when it closed: the stub died; so does its worker."""
        self.selector.unregister(conn)
        if pid in self.children:
            os.kill(pid, signal.SIGKILL)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            self._send(conn, pid, status)
            try:
                self.selector.unregister(conn)
            except KeyError:
                pass
            conn.close()

    @staticmethod
    def _send(conn: socket.socket, pid: int, status: int) -> None:
        try:
            conn.send(STATUS.pack(pid, status))
        except OSError:
            pass  # the stub is gone; _stub_went_away kills the worker

    def _stop(self) -> None:
        for pid in list(self.children):
            os.kill(pid, signal.SIGKILL)
        while self.children:
            pid, _ = os.waitpid(-1, 0)
            self.children.pop(pid, None)


def serve(path: str) -> None:
    """The zygote process: preload, listen, say so, fork workers until our parent goes away."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")  # no BLAS threads in a process that forks
    _preload()
    zygote = _Zygote(path)
    print(READY, flush=True)
    zygote.serve()


# ---- the test process's side ----

_STARTED: dict[int, dict[str, str]] = {}
_LOCK = threading.Lock()


def ensure() -> dict[str, str]:
    """This test process's zygote (started on first use); the environment a fake worker needs to use it.
    With DGR_TEST_NO_ZYGOTE=1 in the environment, none: every fake worker imports for itself."""
    if os.environ.get("DGR_TEST_NO_ZYGOTE") == "1":
        return {}
    with _LOCK:
        if os.getpid() not in _STARTED:
            _STARTED[os.getpid()] = _start()
        return dict(_STARTED[os.getpid()])


def _start() -> dict[str, str]:
    folder = Path(tempfile.mkdtemp(prefix="dgr-fake-zygote-"))
    path = folder / "socket"
    proc = subprocess.Popen(
        [sys.executable, os.fspath(Path(__file__)), os.fspath(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    if line != READY:
        proc.kill()
        raise RuntimeError(f"the fake worker zygote did not start (said {line!r}, exit {proc.wait()})")

    def stop() -> None:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        path.unlink(missing_ok=True)
        folder.rmdir()

    atexit.register(stop)
    return {ZYGOTE_ENV: os.fspath(path), NETNS_ENV: _netns()}


if __name__ == "__main__":
    serve(sys.argv[1])
