"""Issue 8: seams that behave like links, on this machine (network namespaces, shaped access links).

Every test makes its own fabric (namespaces, bridge, links, shapers) and checks afterwards that nothing
of it is left: no namespace, no root-side link, no shaper or worker process, no ownership marker.
Where the machine cannot make a fabric (not root, no iproute2) the tests skip with the probe's reason;
the probe's refusal itself is tested by running it as an unprivileged user.

This kernel has no sch_netem, so these tests exercise the userspace shaper backend; the netem backend's
command lines are held by tests/unit/test_seams_model.py.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from certify import measure
from manifests.recipe_model import Placement, Seam
from pipeline import drive, physics, routes, seam_model, seams
from pipeline.shaper import Link
from tests.integration.conftest import proc_alive
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
HEADER = struct.Struct("<Qd")  # payload length, sender's CLOCK_MONOTONIC (one clock for every namespace)
STAMPS = struct.Struct("<ddI")  # receiver's clock at the first and the last payload byte, crc32 of it
# A ratio above this, for a link slower than the machine, means the shaper (not TCP) is the bottleneck.
TRANSFER_FACTOR = 1.5
# Slow start, the shaper's select() wake-up and Python's scheduling on two busy cores add a little.
SLACK_S = 0.05

ECHO = textwrap.dedent("""
    import socket, struct, sys, time, zlib
    H, S = struct.Struct("<Qd"), struct.Struct("<ddI")
    srv = socket.socket(); srv.bind((sys.argv[1], 0)); srv.listen(1)
    print(srv.getsockname()[1], flush=True)
    conn, _ = srv.accept(); conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    def exact(n):
        buf = bytearray()
        while len(buf) < n:
            part = conn.recv(min(1 << 20, n - len(buf)))
            if not part: sys.exit(0)
            buf += part
        return buf
    while True:
        n, _sent = H.unpack(exact(H.size))
        got, first, crc = 0, None, 0
        while got < n:
            part = conn.recv(min(1 << 20, n - got))
            if not part: sys.exit(0)
            first = time.monotonic() if first is None else first
            got += len(part)
            crc = zlib.crc32(part, crc)
        conn.sendall(S.pack(first, time.monotonic(), crc))
""")


def seam_support(env) -> seams.SeamSupport:
    support = seams.probe({**env, "DGR_SEAMS_BACKEND": "shaper"})
    if not support.available:
        pytest.skip(f"no seam fabric on this machine: {support.reason}")
    return support


def left_over(tag: str) -> list[str]:
    """Anything of fabric ``tag`` still on the machine."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    found = [f"netns {line.split()[0]}" for line in out.splitlines() if line.startswith(f"dgr{tag}")]
    found += [f"link {n}" for n in os.listdir("/sys/class/net") if n.startswith(f"dgr{tag}")]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"pipeline.shaper" in cmd and f"dgr{tag}".encode() in cmd and proc_alive(int(entry.name)):
                found.append(f"shaper pid {entry.name}")
    if (seams.MARKERS / f"{tag}.json").exists():
        found.append("marker")
    return found


class Echo:
    """A stamping echo server inside stage ``k``'s namespace; the client is the driver (root namespace)."""

    def __init__(self, fabric: seams.Fabric, k: int) -> None:
        self.process = subprocess.Popen(
            ["ip", "netns", "exec", fabric.namespaces[k], sys.executable, "-c", ECHO, fabric.addresses[k]],
            stdout=subprocess.PIPE,
            text=True,
        )
        port = int(self.process.stdout.readline())
        self.sock = socket.create_connection((fabric.addresses[k], port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, payload: bytes) -> tuple[float, float, float]:
        """(one-way time to the last byte, one-way time to the first byte, round trip) in seconds."""
        sent = time.monotonic()
        self.sock.sendall(HEADER.pack(len(payload), sent) + payload)
        reply = b""
        while len(reply) < STAMPS.size:
            reply += self.sock.recv(STAMPS.size - len(reply))
        back = time.monotonic()
        first, last, crc = STAMPS.unpack(reply)
        assert crc == zlib.crc32(payload), "the payload arrived changed"
        return last - sent, first - sent, back - sent

    def close(self) -> None:
        self.sock.close()
        self.process.wait(timeout=10)
        self.process.stdout.close()


DRIVER = Link(delay_s=0.010, rate_bps=8e6)
SLOW = Link(delay_s=0.010, rate_bps=8e6)  # 1 MiB takes >= 1.05 s
FAST = Link(delay_s=0.005, rate_bps=100e6)  # 1 MiB takes >= 0.089 s


def test_shaped_links_meet_their_physical_bound_and_leave_nothing(worker_env) -> None:
    support = seam_support(worker_env)
    fabric = seams.Fabric(
        links=seam_model.Profiles(driver=DRIVER, stages=(SLOW, FAST)), support=support, env=worker_env
    )
    figures = {}
    with fabric:
        tag = fabric.tag
        assert fabric.describe()["backend"] == "shaper"
        for k, link in enumerate((SLOW, FAST)):
            echo = Echo(fabric, k)
            try:
                pings = [echo.send(b"x") for _ in range(10)]
                big = [echo.send(os.urandom(MiB)) for _ in range(2)]
            finally:
                echo.close()
            one_way = min(p[0] for p in pings)
            rtt = min(p[2] for p in pings)
            rtt_bound = seam_model.crossing_bound_s(1, link) + seam_model.crossing_bound_s(
                STAMPS.size, DRIVER
            )
            transfer = min(b[0] for b in big)
            bound = seam_model.crossing_bound_s(MiB, link)
            figures[k] = dict(
                one_way_ms=one_way * 1e3,
                one_way_bound_ms=seam_model.crossing_bound_s(1, link) * 1e3,
                rtt_ms=rtt * 1e3,
                rtt_bound_ms=rtt_bound * 1e3,
                transfer_s=transfer,
                transfer_bound_s=bound,
                ratio=transfer / bound,
            )
            print(f"stage {k} link {link}: {figures[k]}")
            assert one_way >= 0.95 * seam_model.crossing_bound_s(1, link)
            assert one_way <= seam_model.crossing_bound_s(1, link) * TRANSFER_FACTOR + SLACK_S
            assert rtt >= 0.95 * rtt_bound
            assert 0.95 * bound <= transfer <= bound * TRANSFER_FACTOR + SLACK_S
    assert left_over(tag) == []


def test_jitter_spreads_the_delay_and_keeps_the_byte_order(worker_env) -> None:
    support = seam_support(worker_env)
    shaky = Link(delay_s=0.010, jitter_s=0.004, rate_bps=50e6)
    with seams.Fabric(
        links=seam_model.Profiles(driver=Link(), stages=(shaky,)), support=support, env=worker_env
    ) as fabric:
        tag = fabric.tag
        echo = Echo(fabric, 0)
        try:
            one_way = [echo.send(b"y")[0] for _ in range(60)]
            # The payload arrives intact (crc checked).  TCP would repair reordered frames, so that the
            # shaper never reorders is held by tests/unit/test_shaper.py on its Schedule.
            payload = bytes(range(256)) * 1024
            transfer = echo.send(payload)[0]
        finally:
            echo.close()
    spread = max(one_way) - min(one_way)
    # The worst of 60 samples is the scheduler's on a loaded box (66 ms against 64 seen at load 11):
    # the upper bound holds the 90th percentile, so a shaper that adds more than its jitter still fails.
    p90 = sorted(one_way)[int(0.9 * len(one_way))]
    print(
        f"jitter 10 +- 4 ms: one-way min {min(one_way) * 1e3:.2f} p90 {p90 * 1e3:.2f} "
        f"max {max(one_way) * 1e3:.2f} ms; "
        f"256 KiB in {transfer * 1e3:.1f} ms "
        f"(bound {seam_model.crossing_bound_s(len(payload), shaky) * 1e3:.1f})"
    )
    assert min(one_way) >= 0.95 * shaky.min_delay_s
    assert p90 <= shaky.delay_s + shaky.jitter_s + SLACK_S
    assert spread > 0.003, "the jitter must really be applied"
    assert transfer >= 0.95 * seam_model.crossing_bound_s(len(payload), shaky)
    assert left_over(tag) == []


def _child(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


FABRIC_CHILD = """
    import os, signal, subprocess, sys, time
    from pipeline import seam_model, seams
    from cli.main import _terminate
    from pipeline.shaper import Link
    signal.signal(signal.SIGTERM, _terminate)
    link = Link(delay_s=0.002)
    support = seams.probe(dict(os.environ, DGR_SEAMS_BACKEND="shaper"))
    with seams.Fabric(links=seam_model.Profiles(driver=link, stages=(link, link, link)), support=support,
                      env=dict(os.environ)) as fabric:
        # something running inside a stage namespace that nobody stops politely
        subprocess.Popen(["ip", "netns", "exec", fabric.namespaces[1], "sleep", "600"],
                         start_new_session=True)
        print(fabric.tag, flush=True)
        time.sleep(600)
"""


def test_sigterm_unwinds_the_fabric(worker_env) -> None:
    seam_support(worker_env)
    child = _child(FABRIC_CHILD)
    tag = child.stdout.readline().strip()
    assert tag and left_over(tag), "the fabric is up"
    child.send_signal(signal.SIGTERM)
    child.wait(timeout=60)
    child.stdout.close()
    assert left_over(tag) == []


def test_a_killed_run_is_swept_by_the_next(worker_env) -> None:
    seam_support(worker_env)
    child = _child(FABRIC_CHILD)
    tag = child.stdout.readline().strip()
    child.kill()
    child.wait(timeout=30)
    child.stdout.close()
    assert any(x.startswith("shaper") for x in left_over(tag)), "SIGKILL leaves the fabric behind"
    assert tag in seams.sweep_stale(worker_env)
    assert left_over(tag) == []


def test_an_exception_inside_stops_workers_and_removes_the_fabric(worker_env, tmp_path) -> None:
    """With the Python fake worker (no build needed): a failure in the body leaves nothing behind."""
    from tests.unit.fake_stages import fake_command, fake_env, load_stubs

    support = seam_support(worker_env)
    stubs = load_stubs(tmp_path / "stubs")
    where = seams.NetnsPipelines(stubs=stubs, evidence=tmp_path / "ev", env=fake_env(stubs), support=support)
    placement = Placement(name="p", stages=((0, 4), (4, 8), (8, 12)), seams=(Seam(delay_ms=2),))
    with pytest.raises(KeyboardInterrupt):
        with where.start(fake_command(tmp_path), placement, "interrupted") as pipe:
            tag, pids = pipe.fabric.tag, pipe.pids
            assert [c.info().layer_begin for c in pipe.clients] == [0, 4, 8]
            raise KeyboardInterrupt
    assert left_over(tag) == [] and not any(proc_alive(p) for p in pids)
    assert (tmp_path / "ev" / "interrupted" / "stages.json").is_file()
    assert (tmp_path / "ev" / "interrupted" / "fabric.json").is_file()


PROBE = (
    "import os; from pipeline.seams import probe; s = probe(dict(os.environ)); "
    "print(s.backend); print(s.reason)"
)


@pytest.mark.parametrize(
    "how",
    [
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"],  # an ordinary user
        [
            "unshare",
            "--user",
            "--map-root-user",
        ],  # root of a user namespace: capabilities, but not the host's
    ],
)
def test_the_probe_says_in_one_line_why_not(how, worker_env) -> None:
    if os.geteuid() != 0:
        pytest.skip("dropping privileges needs root to start from")
    done = subprocess.run(
        [*how, sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0 and any(
        w in done.stderr for w in ("Permission denied", "ModuleNotFoundError", "unshare failed", "setpriv: ")
    ):
        # the interpreter or the checkout is not reachable as that user here: the probe never ran
        pytest.skip(f"cannot run Python as {how[0]} would: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    backend, reason = done.stdout.splitlines()
    print(how[0], "->", reason)
    assert backend == "None"
    assert reason.startswith(("needs root", "cannot create a network namespace")), reason
    assert "\n" not in reason and len(reason) < 160


# The real worker over a shaped fabric ----------------------------------------------------------------
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Once upon a time"]
N_DECODE = 12
WAN = Seam(delay_ms=5, rate_mbit=100)
TWO = ((0, 6), (6, 12))
FOUR = ((0, 3), (3, 6), (6, 9), (9, 12))


@pytest.fixture(scope="module")
def loopback(worker_command, stubs, worker_env, tmp_path_factory):
    """Prompts and the loopback (unshaped, one namespace) traces of the 2- and 4-stage placements."""
    evidence = tmp_path_factory.mktemp("loopback")
    traces = {}
    for name, stages in (("two", TWO), ("four", FOUR)):
        with launch(worker_command, stages, stubs=stubs, evidence=evidence / name, env=worker_env) as p:
            prompts = [p.clients[0].tokenize(t) for t in TEXTS]
            traces[name] = drive.run_placement(p.clients, prompts, N_DECODE)
    return prompts, traces


def _decode_steps(trace: drive.Trace) -> list[drive.Step]:
    return [step for pt in trace.prompts for step in pt.decode]


def test_real_worker_relayed_over_a_shaped_fabric(
    loopback, worker_command, stubs, worker_env, tmp_path
) -> None:
    support = seam_support(worker_env)
    prompts, ref = loopback
    placement = Placement(name="wan-2", stages=TWO, seams=(WAN,))
    where = seams.NetnsPipelines(stubs=stubs, evidence=tmp_path, env=worker_env, support=support)
    with where.start(worker_command, placement, "wan-2") as pipe:
        tag = pipe.fabric.tag
        pids = pipe.pids
        assert [a.split(":")[0] for a in pipe.addresses] == pipe.fabric.addresses
        # `ip netns exec` execs: the pid the launcher signals is the worker itself, in its namespace.
        worker = os.path.realpath(worker_command.program[0])
        assert all(os.readlink(f"/proc/{p}/exe") == worker for p in pids)
        assert [os.readlink(f"/proc/{p}/ns/net") for p in pids] == [
            f"net:[{os.stat(seams.NETNS_DIR / ns).st_ino}]" for ns in pipe.fabric.namespaces
        ]
        trace = drive.run_placement(pipe.clients, prompts, N_DECODE)
    assert left_over(tag) == [] and not any(proc_alive(p) for p in pids)
    assert [s.process.returncode for s in pipe.stages] == [0, 0], "SIGTERM reached the workers: clean exits"
    for got, want in zip(trace.prompts, ref["two"].prompts, strict=True):
        assert np.array_equal(got.logits, want.logits), "the seams must not change a single bit"
        assert got.tokens == want.tokens
    # Relayed seam 0 as the driver times it: the boundary into stage 1, then its logits row into the driver
    # (pipeline.physics counts the same).
    link = seam_model.link_of(WAN)
    logits_bytes = trace.infos[-1].n_vocab * 4
    steps = _decode_steps(trace)
    bound = seam_model.crossing_bound_s(steps[0].seam_bytes[0], link) + seam_model.crossing_bound_s(
        logits_bytes, link
    )
    measured = sorted(s.seam_seconds[0] for s in steps)
    median = measured[len(measured) // 2]
    print(
        f"relayed 2-stage over {WAN}: seam bytes {steps[0].seam_bytes[0]}, logits {logits_bytes} B, "
        f"bound {bound * 1e3:.3f} ms, measured min {measured[0] * 1e3:.3f} median {median * 1e3:.3f} ms, "
        f"ratio {median / bound:.3f}"
    )
    assert measured[0] >= bound
    assert median <= bound * TRANSFER_FACTOR + SLACK_S
    assert (tmp_path / "wan-2" / "fabric.json").is_file()


def test_real_worker_chained_over_a_shaped_fabric(
    loopback, worker_command, stubs, worker_env, tmp_path
) -> None:
    """4 stages, each boundary forwarded stage to stage and the logits to the driver's sink, all through
    the shaped links (the sink is bound on the driver's fabric address, behind the driver's link)."""
    support = seam_support(worker_env)
    prompts, ref = loopback
    placement = Placement(name="wan-4-chained", stages=FOUR, seams=(WAN,), forwarding="chained")
    where = seams.NetnsPipelines(stubs=stubs, evidence=tmp_path, env=worker_env, support=support)
    with where.start(worker_command, placement, placement.name) as pipe:
        tag = pipe.fabric.tag
        pids = pipe.pids
        trace = drive.run_placement(
            pipe.clients,
            prompts,
            N_DECODE,
            route=routes.Chained(),
            reach=measure.reach(pipe),
        )
    assert left_over(tag) == [] and not any(proc_alive(p) for p in pids)
    for got, want in zip(trace.prompts, ref["four"].prompts, strict=True):
        assert np.array_equal(got.logits, want.logits), "chained over shaped seams: the same bits"
        assert got.tokens == want.tokens
    link = seam_model.link_of(WAN)
    steps = _decode_steps(trace)
    assert all(s.forwarding == "chained" and s.crossings == 5 for s in steps)
    parts = physics.crossings(
        placement, routes.Chained(), boundary_bytes=list(steps[0].seam_bytes), n_vocab=trace.infos[-1].n_vocab
    )
    for k in range(placement.n_stages - 1):
        bound = physics.seam_bound(routes.Chained(), k, parts)
        payload = steps[0].seam_bytes[k] + physics.TOKEN_BYTES  # the token ids ride with the boundary
        measured = sorted(s.seam_seconds[k] for s in steps)
        median = measured[len(measured) // 2]
        print(
            f"chained seam {k} over {WAN}: {payload} B, bound {bound * 1e3:.3f} ms, "
            f"measured min {measured[0] * 1e3:.3f} median {median * 1e3:.3f} ms, "
            f"ratio {median / bound:.3f}"
        )
        assert bound == seam_model.crossing_bound_s(payload, link)
        assert measured[0] >= bound
        assert median <= bound * TRANSFER_FACTOR + SLACK_S
    walls = sorted(s.wall_seconds for s in steps)
    # one crossing into each stage and one into the driver's sink, each at least the link's delay
    assert walls[0] >= 5 * link.delay_s
    print(
        f"chained 4-stage decode step: min {walls[0] * 1e3:.2f} ms, "
        f"median {walls[len(walls) // 2] * 1e3:.2f} ms"
    )


# Tokens/s against the bound and chained against relayed (4 and 12 stages) are figures of the machine's
# load: tests/bench/test_bench_seams.py (`nox -s bench`).
