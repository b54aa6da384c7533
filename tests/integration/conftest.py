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
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.context import Context
from tests.unit.fake_stages import running
from worker import stubs as stubs_mod
from worker.launcher import WorkerCommand

TINY_SET = "tiny-llama"
THREADS = int(os.environ.get("DGR_TEST_THREADS", "2"))


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
        built = importlib.import_module("lanes.build").ensure_build(Context.from_env(), "cpu")
    except Exception as exc:  # reported by the first test that asks for the lane, not by collection
        built = exc
    session.config.stash[PREBUILT_CPU] = built
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"CPU lane ready before the tests: {time.monotonic() - started:.0f} s")


@pytest.fixture(scope="session")
def cpu_build(real_ctx: Context, request: pytest.FixtureRequest):
    build = request.config.stash.get(PREBUILT_CPU, None) or _module("lanes.build").ensure_build(real_ctx, "cpu")
    if isinstance(build, Exception):
        raise build
    assert build.worker is not None and build.worker.is_file(), "the CPU lane built no dgr-shard-worker"
    return build


@pytest.fixture(scope="session")
def tiny_model(real_ctx: Context) -> TinyModel:
    provisioned = _module("fetch.provision").provision(real_ctx, TINY_SET)
    return TinyModel(first=Path(provisioned.first), files=tuple(Path(f) for f in provisioned.files))


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
    return WorkerCommand(program=(os.fspath(cpu_build.worker),), model=tiny_model.first, threads=THREADS,
                         ctx_size=512, lane="cpu")


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


proc_alive = running  # a live, non-zombie process with this pid (a /proc read)


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
