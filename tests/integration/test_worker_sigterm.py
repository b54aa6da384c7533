"""Issue 14 item 3: a worker stops within the launcher's grace after SIGTERM, whatever its sockets do.

The cause of "stage 1 ignored SIGTERM for 5.0 s" (test_seams, relayed over a shaped link, under load):
when a reply write meets a full socket buffer, gRPC 1.51's TCP layer starts a backup poller on its
executor thread, an epoll_wait of up to 10 s.  The worker's exit ran gRPC's global shutdown, which
joins that thread (main -> ~ServerBuilder -> grpc_shutdown -> grpc_iomgr_shutdown ->
Executor::ShutdownAll -> pthread_join), and a send stuck on a peer that stops reading completed only
when that poll ended, so Server::Shutdown's 2 s deadline did not bound it either.

Here a proxy between the client and the worker stops reading the worker's replies: the condition is
made on purpose, on loopback, without load or a shaped link.
"""

from __future__ import annotations

import signal
import socket
import threading
import time

import pytest

from worker.client import StageClient
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

GRACE_S = 5.0  # worker.launcher: Pipeline.stop's SIGTERM-to-SIGKILL grace
PROMPT = "Once upon a time there was a little fox who lived in the forest"


class StallingProxy:
    """Forwards client -> worker always, worker -> client until ``stall()``: then it stops reading, and
    (its receive buffer kept small) the worker's writes soon meet a full socket."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.stalled = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        down, _ = self.listener.accept()
        up = socket.socket()
        up.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        host, port = self.worker.rsplit(":", 1)
        up.connect((host, int(port)))
        self.sockets += [down, up]
        threading.Thread(target=self._pump, args=(down, up, None), daemon=True).start()
        threading.Thread(target=self._pump, args=(up, down, self.stalled), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, gate: threading.Event | None) -> None:
        try:
            while gate is None or not gate.is_set():
                data = src.recv(1 << 16)
                if not data:
                    return
                dst.sendall(data)
            while gate.is_set():  # stalled: leave the bytes where they are
                time.sleep(0.01)
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            return

    def close(self) -> None:
        for s in [self.listener, *self.sockets]:
            s.close()


@pytest.fixture
def stalled(worker_command, stubs, worker_env, tmp_path):
    """A 1-stage worker with two large replies on the way to a client that reads none of them."""
    with launch(
        worker_command, [(0, 12)], stubs=stubs, evidence=tmp_path / "ev", env=worker_env, grace=60.0
    ) as pipe:
        proxy = StallingProxy(pipe.stages[0].address)
        client = StageClient(proxy.address, stubs.pb2, stubs.pb2_grpc, stage=0, layers=(0, 12), deadline=60)
        tokens = (client.tokenize(PROMPT) * 8)[:128]
        positions = list(range(len(tokens)))
        for i in range(6):  # 16 MB of logits rows: the HTTP/2 windows grow past the socket buffers
            client.forward(f"warm-{i}", 0, positions, tokens=tokens, all_logits=True)
            client.reset(f"warm-{i}")
        proxy.stalled.set()
        pending = [  # noqa: F841  (kept alive: a dropped future cancels its call)
            client._stub.Forward.future(
                stubs.pb2.ForwardRequest(
                    session_id=f"stuck-{i}", epoch=0, positions=positions, tokens=tokens, all_logits=True
                ),
                timeout=120,
            )
            for i in range(2)
        ]
        time.sleep(1.5)  # computed long since; the replies sit in full socket buffers
        yield pipe.stages[0].process
        client.close()
        proxy.close()


def _stop(process) -> float:
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except Exception:
        process.kill()
        raise
    return time.monotonic() - started


def test_sigterm_with_replies_stuck_on_a_peer_that_stopped_reading(stalled) -> None:
    process = stalled
    took = _stop(process)
    print(f"\nworker exit {process.returncode} {took:.2f} s after SIGTERM, 2 replies stuck in flight")
    assert process.returncode == 0 and took < GRACE_S
