"""Start one shard worker per stage of a placement on loopback, and always stop them.

A placement is a list of contiguous layer ranges ``[(0, 4), (4, 12)]``.  Each stage runs
``<worker> --model M --layers b:e --listen 127.0.0.1:0 --threads T ...``; the worker picks a free port
and announces it with one stdout line ``DGR-WORKER-LISTENING host:port``.  The launcher waits for that
line and for Health, with a deadline, and keeps every worker's stdout and stderr in the run's evidence
folder.  ``launch`` is a context manager: on any exit (an exception, KeyboardInterrupt, a gate failure)
every worker gets SIGTERM, then SIGKILL after a grace period.

``placed`` (optional, one ``Placed`` per stage) runs a stage elsewhere on this machine: behind a command
prefix that execs the worker (``ip netns exec NS``: the pid we hold and signal is still the worker's)
and listening on a given host (a network namespace's address; pipeline.seams uses it).  Without it the
command line and the loopback address are exactly as before.

Long-running workers are the one place where we do not use ``core.proc.run`` (which runs a command
to completion); the program is still resolved through ``proc.resolve`` so a missing binary fails early.
"""

from __future__ import annotations

import atexit
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from core import proc, redact
from core.canonical import write_json
from core.errors import ConfigurationError
from worker.client import StageClient, StageFailed
from worker.stubs import Stubs
from worker.tls import Identity

log = redact.logger("dgr.launcher")

LISTENING = re.compile(r"^DGR-WORKER-LISTENING (\S+):(\d+)\s*$", re.MULTILINE)
POLL_SECONDS = 0.02

# Every worker we ever started and have not yet reaped: the last line of defence is an atexit hook,
# for callers that bypass the context manager or a process that exits without unwinding.
_LIVE: set[subprocess.Popen[bytes]] = set()


def _kill_leftovers() -> None:
    for p in list(_LIVE):
        if p.poll() is None:
            p.kill()
            p.wait()
        _LIVE.discard(p)


atexit.register(_kill_leftovers)

# (pid, read end, write end): a pipe whose write end only this process holds (os.pipe's ends are not
# inherited, and Popen closes every other descriptor).  Each worker gets the read end as stdin and
# --stop-on-stdin-eof: when this process dies, even by SIGKILL where no atexit hook runs, the kernel
# closes the write end and every worker sees the end of its stdin and stops.
_LAUNCHER_PIPE: tuple[int, int, int] | None = None


def launcher_pipe() -> int:
    """The read end of this process's launcher pipe (a forked child makes its own)."""
    global _LAUNCHER_PIPE
    if _LAUNCHER_PIPE is None or _LAUNCHER_PIPE[0] != os.getpid():
        read_end, write_end = os.pipe()
        _LAUNCHER_PIPE = (os.getpid(), read_end, write_end)
    return _LAUNCHER_PIPE[1]


@dataclass(frozen=True, kw_only=True)
class WorkerCommand:
    """How to start a worker; ``program`` is the binary (or an interpreter plus a script, in tests)."""

    program: tuple[str, ...]
    model: Path
    threads: int = 2
    ctx_size: int | None = None
    batch: int | None = None  # --batch, the most positions one Forward carries (one ubatch); None: its own
    max_sessions: int | None = None
    max_rewind: int | None = None  # speculative decoding: positions a Forward may take back
    mtp: bool = False  # the placement's last stage drafts with the nextn block (--mtp; docs/mtp.md)
    mtp_model: Path | None = None  # with mtp: the block's MTP-only file (--mtp-model) instead of the model's
    identity: Path | None = None
    lane: str | None = None
    # --cpus per stage, a CPU list each ("0", "2-3"): stage k takes cpus[k % len(cpus)]; () leaves every
    # stage free to run anywhere (worker/README.md, "CPU affinity")
    cpus: tuple[str, ...] = ()
    load: str | None = None  # --load, llama.cpp's load mode name; None: the worker's default
    census: bool = False  # --census: the workers count the compressed state their passes fill
    tls: Path | None = None  # --tls: the worker's identity folder (mutual TLS); None: plaintext
    driver_tls: Identity | None = None  # with tls: the identity the driver reaches these workers with
    # with tls, where the run made its own CA (worker.tls_ca): the folder that may issue more identities
    # (a seam fabric's addresses); None where the identities came from elsewhere (a placement file)
    tls_ca: Path | None = None
    # with tls, the pass ports' frames: "tls" records (encrypted) or "mac", authenticated frames where both
    # stages of a seam allow them (--pass-frames; worker/src/mac_frames.h)
    pass_frames: str = "tls"
    extra: tuple[str, ...] = ()

    def argv(
        self, layers: tuple[int, int], listen: str = "127.0.0.1:0", *, last: bool = False, stage: int = 0
    ) -> list[str]:
        args = [
            *self.program,
            "--model",
            os.fspath(self.model),
            "--layers",
            f"{layers[0]}:{layers[1]}",
            "--listen",
            listen,
            "--threads",
            str(self.threads),
        ]
        if self.cpus:
            args += ["--cpus", self.cpus[stage % len(self.cpus)]]
        if self.load is not None:
            args += ["--load", self.load]
        if self.ctx_size is not None:
            args += ["--ctx", str(self.ctx_size)]
        if self.batch is not None:
            args += ["--batch", str(self.batch)]
        if self.max_sessions is not None:
            args += ["--max-sessions", str(self.max_sessions)]
        args += self.rewind_args()
        if self.identity is not None:
            args += ["--identity", os.fspath(self.identity)]
        if self.lane is not None:
            args += ["--lane", self.lane]
        if self.tls is not None:
            args += ["--tls", os.fspath(self.tls)]
        if self.pass_frames != "tls":
            args += ["--pass-frames", self.pass_frames]
        if self.census:
            args += ["--census"]
        if last:
            args += self.drafting_args()
        return args + list(self.extra)

    def rewind_args(self) -> list[str]:
        """What every stage of a speculative run is started with: the positions a pass may take back."""
        return ["--max-rewind", str(self.max_rewind)] if self.max_rewind is not None else []

    def drafting_args(self) -> list[str]:
        """What the last stage adds with MTP on: --mtp, or --mtp-model with the block's own file."""
        if not self.mtp:
            return []
        return ["--mtp-model", os.fspath(self.mtp_model)] if self.mtp_model else ["--mtp"]


@dataclass(frozen=True, kw_only=True)
class Placed:
    """Where one stage's worker runs: a command prefix (``("ip", "netns", "exec", NS)``) and the host it
    listens on (port 0: its own pick).  The default, no Placed at all, is 127.0.0.1 in our namespace."""

    prefix: tuple[str, ...] = ()
    host: str | None = None
    # the host is reachable from this machine only (namespaces the certifier made): a worker without
    # --tls may serve plaintext there, and says so (--insecure; Info's transport)
    private: bool = False


def check_placement(placement: Sequence[tuple[int, int]], n_layer: int | None = None) -> None:
    """A placement covers [0, n_layer) with contiguous, non-empty ranges, in order."""
    if not placement:
        raise ConfigurationError("a placement needs at least one stage")
    expect = 0
    for k, (begin, end) in enumerate(placement):
        if begin != expect or end <= begin:
            raise ConfigurationError(
                f"placement {list(map(list, placement))}: stage {k} is {begin}:{end}, "
                f"expected it to start at {expect} and own at least one layer"
            )
        expect = end
    if n_layer is not None and expect != n_layer:
        raise ConfigurationError(f"placement ends at layer {expect} but the model has {n_layer} layers")


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_bytes()[-8192:].decode("utf-8", "replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())


@dataclass(kw_only=True, eq=False)
class Stage:
    """One running worker."""

    index: int
    layers: tuple[int, int]
    argv: list[str]
    process: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path
    stdout_offset: int = 0  # the evidence files append: a reused folder keeps older runs' lines
    host: str | None = None  # the address asked for (None: loopback, whatever the worker announces)
    address: str | None = None
    client: StageClient | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def ended(self) -> tuple[str, str] | None:
        """None while the worker runs; once it has ended, how, and the last lines of its stderr."""
        code = self.process.poll()
        if code is None:
            return None
        return _describe_exit(code), _tail(self.stderr_path, 3)

    def exit_description(self) -> str | None:
        ended = self.ended()
        if ended is None:
            return None
        how, tail = ended
        return how + (f"; last stderr: {tail}" if tail else "")

    def failure(self, code: str, detail: str) -> StageFailed:
        return StageFailed(self.index, self.layers, code, detail)


class Pipeline:
    """The running stages of one placement, in order, on this machine's loopback."""

    addresses = None  # the stages reach each other at their clients' own addresses
    sink_host = "127.0.0.1"  # where a driver's sink listens for the last stage
    fabric = None  # no shaped network between them

    def __init__(self, stages: list[Stage], evidence: Path) -> None:
        self.stages = stages
        self.evidence = evidence

    @property
    def clients(self) -> list[StageClient]:
        return [s.client for s in self.stages if s.client is not None]

    @property
    def pids(self) -> list[int]:
        return [s.pid for s in self.stages]

    def check_alive(self) -> None:
        """Raise StageFailed for the first stage whose worker has exited."""
        for s in self.stages:
            died = s.exit_description()
            if died is not None:
                raise s.failure("DIED", f"worker {died}")

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every worker, wait up to ``grace`` seconds in all, SIGKILL what is left, reap all."""
        for s in self.stages:
            if s.client is not None:
                s.client.close()
        for s in self.stages:
            if s.process.poll() is None:
                try:
                    s.process.terminate()
                except ProcessLookupError:
                    pass
        until = time.monotonic() + grace
        for s in self.stages:
            try:
                s.process.wait(timeout=max(0.0, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("stage %d (pid %d) ignored SIGTERM for %.1f s; killing it", s.index, s.pid, grace)
                s.process.kill()
                s.process.wait()
            _LIVE.discard(s.process)
        self._record()

    def _record(self) -> None:
        write_json(
            self.evidence / "stages.json",
            {
                "stages": [
                    {
                        "index": s.index,
                        "layers": list(s.layers),
                        "argv": s.argv,
                        "pid": s.pid,
                        "address": s.address,
                        "returncode": s.process.returncode,
                        "stdout": s.stdout_path.name,
                        "stderr": s.stderr_path.name,
                    }
                    for s in self.stages
                ]
            },
        )


def _spawn(
    cmd: WorkerCommand,
    index: int,
    layers: tuple[int, int],
    evidence: Path,
    env: Mapping[str, str],
    placed: Placed | None = None,
    *,
    last: bool = False,
) -> Stage:
    host = placed.host if placed is not None else None
    listen = "127.0.0.1:0" if host is None else f"{host}:0"
    argv = cmd.argv(layers, listen=listen, last=last, stage=index)
    if placed is not None and placed.private and cmd.tls is None:
        argv.append("--insecure")
    argv[0] = proc.resolve(argv[0], env)
    if placed is not None and placed.prefix:
        # e.g. `ip netns exec NS`: it execs the worker, so the pid we hold (and signal) is the worker's.
        prefix = list(placed.prefix)
        prefix[0] = proc.resolve(prefix[0], env)
        argv = prefix + argv
    argv.append("--stop-on-stdin-eof")  # with the launcher pipe as stdin: our death is the worker's stop
    stem = f"stage-{index}-layers-{layers[0]}-{layers[1]}"
    out_path, err_path = evidence / f"{stem}.stdout", evidence / f"{stem}.stderr"
    log.info("$ %s", shlex.join(argv))
    # Output goes to files, not pipes: nobody has to drain them, and they are the evidence.
    # A session of its own keeps a terminal's Ctrl-C away from workers: we stop them ourselves.
    with open(out_path, "ab") as out, open(err_path, "ab") as err:
        offset = out.tell()
        process = subprocess.Popen(
            argv, stdin=launcher_pipe(), stdout=out, stderr=err, env=dict(env), start_new_session=True
        )
    _LIVE.add(process)
    return Stage(
        index=index,
        layers=layers,
        argv=argv,
        process=process,
        stdout_path=out_path,
        stderr_path=err_path,
        stdout_offset=offset,
        host=host,
    )


def _wait_listening(stage: Stage, until: float, timeout: float) -> str:
    while True:
        try:
            with open(stage.stdout_path, "rb") as fh:
                fh.seek(stage.stdout_offset)
                found = LISTENING.search(fh.read().decode("utf-8", "replace"))
        except OSError:
            found = None
        if found:
            host, port = found.group(1), found.group(2)
            host = "127.0.0.1" if host in ("0.0.0.0", "[::]", "::", "localhost") else host
            if stage.host is not None:  # we chose the address; the port is the worker's pick
                host = stage.host
            return f"{host}:{port}"
        died = stage.exit_description()
        if died is not None:
            raise stage.failure("DIED", f"worker {died} before listening")
        if time.monotonic() > until:
            raise stage.failure("START_TIMEOUT", f"no DGR-WORKER-LISTENING line within {timeout:.0f} s")
        time.sleep(POLL_SECONDS)


def _wait_healthy(stage: Stage, until: float, timeout: float) -> None:
    assert stage.client is not None
    last = "no answer"
    while True:
        remaining = until - time.monotonic()
        if remaining <= 0:
            raise stage.failure("START_TIMEOUT", f"not serving within {timeout:.0f} s ({last})")
        try:
            serving, status = stage.client.health(deadline=min(remaining, 5.0))
        except StageFailed as exc:
            if exc.code == "DIED":
                raise
            last = exc.detail
        else:
            if serving:
                return
            last = f"health says not serving: {status}"
        time.sleep(POLL_SECONDS * 5)


@contextmanager
def launch(
    cmd: WorkerCommand,
    placement: Sequence[tuple[int, int]],
    *,
    stubs: Stubs,
    evidence: Path,
    env: Mapping[str, str],
    start_timeout: float = 120.0,
    call_deadline: float = 120.0,
    grace: float = 5.0,
    placed: Sequence[Placed] | None = None,
) -> Iterator[Pipeline]:
    """Start a worker per stage, wait until each listens and is healthy, yield the Pipeline, stop all.

    Workers start together (model loading overlaps), then each is awaited in turn against one shared
    deadline.  ``call_deadline`` bounds every later RPC (a hung worker is a failure, not a wait).
    ``placed[k]`` (optional) says where stage k runs: a command prefix and the address it listens on.
    Workers started with ``cmd.tls`` are reached with ``cmd.driver_tls`` (mutual TLS).
    """
    check_placement(placement)
    if placed is not None and len(placed) != len(placement):
        raise ConfigurationError(f"{len(placement)} stages but {len(placed)} places to run them")
    evidence.mkdir(parents=True, exist_ok=True)
    pipeline = Pipeline([], evidence)
    try:
        for k, layers in enumerate(placement):
            where = placed[k] if placed is not None else None
            pipeline.stages.append(
                _spawn(
                    cmd,
                    k,
                    (int(layers[0]), int(layers[1])),
                    evidence,
                    env,
                    where,
                    last=k == len(placement) - 1,
                )
            )
        until = time.monotonic() + start_timeout
        for stage in pipeline.stages:
            stage.address = _wait_listening(stage, until, start_timeout)
            stage.client = StageClient(
                stage.address,
                stubs.pb2,
                stubs.pb2_grpc,
                stage=stage.index,
                layers=stage.layers,
                deadline=call_deadline,
                liveness=stage.ended,
                tls=cmd.driver_tls,
            )
        for stage in pipeline.stages:
            _wait_healthy(stage, until, start_timeout)
        yield pipeline
    finally:
        pipeline.stop(grace)
