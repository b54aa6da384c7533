"""Session fixtures for the slow suite: the CPU lane build and the embedded tiny model, made once.

They use the real workspace (``DGR_WORK`` or ``.work/``) so a build made by ``nox -s build-cpu`` or an
earlier test run is reused instead of rebuilt.  A fixture skips (with the reason) only while a stage's
module does not exist yet in this checkout; once it does, any failure of that stage fails the test.
"""

from __future__ import annotations

import importlib
import os
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from core.context import Context
from tests.unit.fake_stages import running as proc_alive  # a live, non-zombie process with this pid
from worker import stubs as stubs_mod
from worker.launcher import WorkerCommand

TINY_SET = "tiny-llama"
THREADS = int(os.environ.get("DGR_TEST_THREADS", "2"))

# The slow suite runs two tests at a time (noxfile: pytest-xdist), so a worker's two-thread ggml team
# often shares the cores with another test's processes.  libgomp spins 300000 times at every barrier
# before it sleeps, and a graph has a barrier after almost every node: with its partner thread off the
# core, a team spun out its time slice at each one: test_mtp_workers' two tests beside one busy loop
# took 438 s at libgomp's default and 10 s at 1000 (docs/measurements/issue-39/spin_ab-4f76a52.txt;
# worker/README.md, "Threads", has the same collapse with stages sharing cores).  A short
# spin keeps a quiet team nearly as fast and lets a crowded one sleep.  Only the workers' speed
# depends on it, never their results, and the speed gates' limits are not what this suite holds
# (dgr_cli.LOAD_BOUND_CHECKS).  Set before any worker starts; a value the caller set is kept.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")


def _module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        pytest.skip(f"{name} is not in this checkout yet; the slow suite needs it")


@dataclass(frozen=True, kw_only=True)
class TinyModel:
    first: Path  # the first split file, what --model takes
    files: tuple[Path, ...]


@pytest.fixture(scope="session")
def real_ctx() -> Context:
    return Context.from_env()


# What pytest_collection_finish's build of the CPU lane ended in: the build, or the exception it raised
# (which the first test that asks for the lane then reports as its own error).
PREBUILT_CPU = pytest.StashKey[object]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the CPU lane once after collection, before the first test that needs it, outside every
    test's timeout: a cold build on two cores takes longer than any one test may (the first
    ``cpu_build`` test timed out at 600 s on a machine without a warm ccache, and the fixture's cached
    error then failed every test after it).  The time it took is printed on its own line."""
    if session.config.option.collectonly or not any(
        "cpu_build" in getattr(item, "fixturenames", ()) for item in session.items
    ):
        return
    started = time.monotonic()
    try:
        with one_worker_at_a_time(session.config):
            built = importlib.import_module("lanes.build").ensure_build(Context.from_env(), "cpu")
            if under_xdist(session.config):
                _provision_shared_sets()
    except Exception as exc:  # reported by the first test that asks for the lane, not by collection
        built = exc
    session.config.stash[PREBUILT_CPU] = built
    say(session.config, f"CPU lane ready before the tests: {time.monotonic() - started:.0f} s")
    if not isinstance(built, Exception):
        _start_in_background(session)


# What the pytest-xdist workers said for the run's summary (a worker's own terminal is never shown).
WORKERS_SAID = pytest.StashKey[list[str]]()


def say(config: pytest.Config, line: str) -> None:
    """A line on the run's output: printed at once, or, in a pytest-xdist worker, sent to the controller
    with the worker's results (xdist's ``workeroutput``) and printed in the summary, worker named."""
    if under_xdist(config):
        worker = config.workerinput["workerid"]  # type: ignore[attr-defined]
        config.workeroutput.setdefault("said", []).append(f"{worker}: {line}")  # type: ignore[attr-defined]
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook, on the controller: a worker has finished
def pytest_testnodedown(node: Any, error: object) -> None:
    node.config.stash.setdefault(WORKERS_SAID, []).extend(getattr(node, "workeroutput", {}).get("said", []))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    for line in config.stash.get(WORKERS_SAID, []):
        terminalreporter.write_line(line)


# The generated sets the slow suite's certifications provision into the shared store.  Serially each
# test's `dgr certify` provisions its set on first use; two pytest-xdist workers doing so at once would
# meet on a file's lock (provisioning refuses a second writer at once), so the first worker makes them.
SHARED_SETS = (TINY_SET, "tiny-v4", "tiny-v4-mtp", "tiny-v4-mtp-only")


def _provision_shared_sets() -> None:
    provision = importlib.import_module("fetch.provision").provision
    for name in SHARED_SETS:
        provision(Context.from_env(), name)


def under_xdist(config: pytest.Config) -> bool:
    """True in a pytest-xdist worker: each one collects every test and makes its own session fixtures."""
    return hasattr(config, "workerinput")


def one_worker_at_a_time(config: pytest.Config) -> AbstractContextManager[object]:
    """Under pytest-xdist every worker prepares what the suite needs (fetch, patch, build, the tiny
    model): the first does it, the others wait on this lock and then find it made (each step's reuse
    is lock-free), instead of failing on the step's own lock, which refuses a second maker at once."""
    if not under_xdist(config):
        return nullcontext()
    from core.locks import hold

    root = Context.from_env().workspace.root
    root.mkdir(parents=True, exist_ok=True)
    return hold(root / "slow-suite-prepare.lock", what="the slow suite's preparation", wait_s=None)


# Session fixtures whose one run several tests read -> the pytest-xdist group of every test that uses
# them (`--dist loadgroup` runs a group's tests in one worker, so each run is still made once).
SHARED_RUNS = {
    "gemma_store": "gemma",
    "live_certification": "live-certification",
    "arch_generator": "architectures",
    "wan_certification": "wan",
    # test_certify_e2e's tightened certification: a module fixture, made once per worker that needs it;
    # its two tests on two workers made it twice, and the first worker's teardown removed the recipe's
    # report folder while the other still read its certificate (the quiet run on 2a79702)
    "tight_run": "tight-run",
}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The WAN test last: it reads the background run, which has then had the longest to finish. The
    # longest test first: collected last, the Vulkan lane's (a cold lane build, ~400 s) started on one
    # worker after the other had nearly finished, which then sat idle its last 318 s (the quiet run on
    # ed23305: 1,475 s against 1,160 s).
    items.sort(key=lambda item: (item.nodeid.startswith(WAN_TEST), not item.nodeid.startswith(LONGEST_TEST)))
    for item in items:
        names = getattr(item, "fixturenames", ())
        group = next((g for fixture, g in SHARED_RUNS.items() if fixture in names), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


# The WAN certification spends its minutes waiting on 20 ms seams, one thread per worker: it starts in
# the background once the lane is built and runs beside the CPU-bound tests before its own test, which
# then reads it (wan_certification).  Under pytest-xdist one worker starts it (the first to claim its
# folder) and the test, on either worker, reads the folder; a test waiting on it would hold one of the
# two workers for its three minutes while the cores sit idle (the quiet run on aa2fbad: 193 s of test
# time, 217 s beside two busy loops).  Certifications must pass on a loaded machine anyway (the speed
# gate's time limits aside, dgr_cli.LOAD_BOUND_CHECKS), so running beside other tests proves the same.
WAN_RECIPE = "tiny-llama-wan"
# `--tls`: every worker over mutual TLS (issue 43), each fabric's identities issued as it is made; on
# 20 ms links what TLS adds per crossing (tens of microseconds) is lost in the waiting
WAN_ARGS = ("--recipe", WAN_RECIPE, "--tls")
WAN_TEST = "tests/integration/test_certify_wan.py"
LONGEST_TEST = "tests/integration/test_vulkan_lane.py"
BACKGROUND = pytest.StashKey[dict[str, Any]]()


def wan_env() -> dict[str, str]:
    """A user's environment with one thread per worker: up to 12 workers share this machine's cores."""
    from tests.integration.dgr_cli import user_env

    return {**user_env("DGR_SEAMS"), "DGR_WORKER_THREADS": "1"}


def _shared_folder(config: pytest.Config) -> Path | None:
    """Under pytest-xdist, the background run's folder every worker of this run knows (named by the
    run's id); None in a run without workers."""
    if not under_xdist(config):
        return None
    uid = config.workerinput["testrunuid"]  # type: ignore[attr-defined]
    return Path(tempfile.gettempdir()) / f"dgr-wan-certify-{uid}"


def _start_in_background(session: pytest.Session) -> None:
    from pipeline import seams
    from tests.integration.dgr_cli import Started

    if not any(item.nodeid.startswith(WAN_TEST) for item in session.items):
        return
    if not seams.probe(wan_env()).available:
        return  # the test skips, naming the reason
    folder = _shared_folder(session.config)
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="dgr-wan-certify-"))
    else:
        try:
            folder.mkdir()  # the claim: one worker of the run starts it
        except FileExistsError:
            return
    session.config.stash[BACKGROUND] = {WAN_RECIPE: Started(wan_env(), WAN_ARGS, folder)}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A background certification no test here read: under pytest-xdist the other worker's test may
    still come for it, so a run that was not interrupted lets it end; otherwise it is stopped (the
    certifier signs nothing)."""
    for started in session.config.stash.get(BACKGROUND, {}).values():
        if under_xdist(session.config) and exitstatus != pytest.ExitCode.INTERRUPTED:
            started.wait(timeout=2400)
        started.stop()


@pytest.fixture(scope="session")
def wan_certification(request: pytest.FixtureRequest):
    """`dgr certify --recipe tiny-llama-wan`: the background run (started by this worker or, under
    pytest-xdist, by the other), or made here when none was started."""
    from tests.integration.dgr_cli import certified, finished

    started = request.config.stash.get(BACKGROUND, {}).pop(WAN_RECIPE, None)
    if started is not None:
        return started.result()
    shared = _shared_folder(request.config)
    if shared is not None and shared.is_dir():
        return finished(shared)
    return certified(wan_env(), *WAN_ARGS)


@pytest.fixture(scope="session")
def cpu_build(real_ctx: Context, request: pytest.FixtureRequest):
    build = request.config.stash.get(PREBUILT_CPU, None)
    if build is None:
        build = _module("lanes.build").ensure_build(real_ctx, "cpu")
    if isinstance(build, Exception):
        raise build
    assert build.worker is not None and build.worker.is_file(), "the CPU lane built no dgr-shard-worker"
    return build


@pytest.fixture(scope="session")
def tiny_model(real_ctx: Context, request: pytest.FixtureRequest) -> TinyModel:
    with one_worker_at_a_time(request.config):
        provisioned = _module("fetch.provision").provision(real_ctx, TINY_SET)
    return TinyModel(first=Path(provisioned.first), files=tuple(Path(f) for f in provisioned.files))


GEMMA_SET = "gemma3-270m-q4"


@dataclass(frozen=True, kw_only=True)
class GemmaStore:
    """gemma3-270m-q4 provisioned once a session into a store of its own that started empty: the
    provisioning test reads what it did, and every gemma certification and reference uses it."""

    path: Path
    provisioned: Any  # fetch.provision.Provisioned
    seconds: float  # download + rebuild + split + verify


@pytest.fixture(scope="session")
def gemma_store(real_ctx: Context, cpu_build, tmp_path_factory: pytest.TempPathFactory) -> GemmaStore:
    from fetch.provision import provision
    from lanes.build import fetch_tools

    store = tmp_path_factory.mktemp("gemma") / "store"
    started = time.monotonic()
    got = provision(real_ctx, GEMMA_SET, store=store, tools=fetch_tools(real_ctx))
    return GemmaStore(path=store, provisioned=got, seconds=time.monotonic() - started)


@pytest.fixture(scope="session")
def arch_generator(real_ctx: Context, cpu_build, tmp_path_factory) -> Path:
    """The pinned tree's model-fixture generator (tests/integration/arch_fixtures.py), built once."""
    from patches.stack import ensure_patched
    from tests.integration import arch_fixtures

    tree = ensure_patched(real_ctx).path
    return arch_fixtures.build_generator(tree, cpu_build.dir, tmp_path_factory.mktemp("archs") / "gen")


@pytest.fixture(scope="session")
def stubs(real_ctx: Context) -> stubs_mod.Stubs:
    return stubs_mod.load(real_ctx.workspace)


@pytest.fixture(scope="session")
def worker_command(cpu_build, tiny_model: TinyModel) -> WorkerCommand:
    return WorkerCommand(
        program=(os.fspath(cpu_build.worker),),
        model=tiny_model.first,
        threads=THREADS,
        ctx_size=512,
        lane="cpu",
    )


@pytest.fixture(scope="session")
def worker_env() -> dict[str, str]:
    return dict(os.environ)


@pytest.fixture(scope="session")
def live_certification():
    """``get(*args)``: `dgr certify ARGS` through the CLI as a user runs it (the live monolithic run
    included), made once per argument list per session.  The certify tests inspect it and the sealed-
    reference tests compare against it, so each model is certified live once, not once per suite."""
    from tests.integration.dgr_cli import Certified, certified, user_env

    made: dict[tuple[str, ...], Certified] = {}

    def get(*args: str) -> Certified:
        if args not in made:
            made[args] = certified(user_env(), *args)
        return made[args]

    return get


@pytest.fixture(scope="session")
def gemma_live(live_certification, gemma_store: GemmaStore):
    """`dgr certify --recipe gemma3-270m-q4` on the session's gemma store, made once: the certify test
    inspects it and the sealed-reference test compares against it."""
    return live_certification("--recipe", GEMMA_SET, "--lane", "cpu", "--store", os.fspath(gemma_store.path))


def live_workers(marker: str) -> list[int]:
    """Live shard workers whose command line mentions ``marker`` (a run's evidence folder): the workers
    of one certification, wherever they were re-parented, and none of another session's."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if marker in cmd and "--layers" in cmd and proc_alive(int(d.name)):
            pids.append(int(d.name))
    return pids


def running(binary: Path) -> dict[int, int]:
    """Live processes running ``binary``, pid to parent pid, whoever started them (a /proc scan: a
    process whose parent died is the init process's child by then)."""
    found = {}
    target = os.path.realpath(binary)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = os.readlink(entry / "exe")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if exe == target and proc_alive(int(entry.name)):
            found[int(entry.name)] = ppid
    return found


@contextmanager
def floor_deliveries(timeout: float = 600) -> Iterator[tuple[int, list[tuple[int, int, int]]]]:
    """A loopback port for ``dgr-ring-floor --deliver`` and the {round, position, token} records read
    from it, each as it comes (one thread): complete once the block ends, the tool having exited."""
    records: list[tuple[int, int, int]] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(timeout)

        def read() -> None:
            conn, _ = listener.accept()
            with conn, conn.makefile("rb") as stream:
                while len(record := stream.read(12)) == 12:
                    records.append(struct.unpack("<3i", record))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        yield listener.getsockname()[1], records
        reader.join(30)
        assert not reader.is_alive(), "the floor's last stage never closed its delivery connection"


def our_workers(binary: Path) -> list[int]:
    """Pids of live children of this test process running ``binary`` (so it also finds workers the
    launcher lost track of; other sessions' workers of the same binary are not ours)."""
    return [pid for pid, ppid in running(binary).items() if ppid == os.getpid()]
