"""Shared fixtures: a private workspace + cache per test, and a small real upstream git repository.

Stage-specific fixtures live in conftest files of their own folders.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.context import Context


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        help="of the slow tests, run only those marked quick (a contributor's inner loop)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--quick`` deselects the slow tests not marked ``quick``; the fast ones all stay."""
    if not config.getoption("--quick"):
        return
    kept = [i for i in items if i.get_closest_marker("quick") or not i.get_closest_marker("slow")]
    dropped = [i for i in items if i not in kept]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


# When each test ran and on which pytest-xdist worker, for the JUnit file (`tests.durations` reads them
# into each worker's busy and idle time: where two workers' wall went, not only each test's length).
SETUP_STARTED = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = (yield).get_result()
    if call.when == "setup":
        item.stash[SETUP_STARTED] = call.start
    elif call.when == "teardown":  # the JUnit writer reads a test's properties from its teardown report
        report.user_properties.append(("started", f"{item.stash.get(SETUP_STARTED, call.start):.3f}"))
        report.user_properties.append(("ended", f"{call.stop:.3f}"))
        report.user_properties.append(("worker", os.environ.get("PYTEST_XDIST_WORKER") or "main"))


@pytest.fixture(scope="session")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA with the workers' and the driver's loopback identities (worker.tls_ca.loopback), for the TLS
    tests and bench; a module of its own may make a CA of its own under the same name."""
    from worker import tls_ca

    folder = tmp_path_factory.mktemp("ca")
    tls_ca.loopback(folder)
    return folder


@pytest.fixture
def ctx(tmp_path: Path) -> Context:
    """A Context whose workspace and archive cache are private to the test."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DGR_", "GIT_"))}
    env.update(DGR_WORK=str(tmp_path / "work"), DGR_CACHE=str(tmp_path / "cache"))
    return Context.from_env(env)


def git(*args: str, cwd: Path | None = None) -> str:
    """Test-side git with a fixed identity and no user config (fixtures must not depend on ~/.gitconfig)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_GLOBAL="/dev/null",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@localhost",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@localhost",
    )
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@dataclass(frozen=True, kw_only=True)
class Upstream:
    url: str  # file:// URL of a bare repository
    commit: str  # the commit a pin would name
    tree: str  # its git tree id
    other_commit: str  # a later commit with a different tree
    work: Path  # the non-bare clone it was made from


@pytest.fixture
def upstream(tmp_path: Path) -> Upstream:
    """A tiny llama.cpp stand-in: a .gitignore hiding a committed file, an executable, a symlink."""
    work = tmp_path / "upstream-work"
    (work / "src").mkdir(parents=True)
    (work / "src" / "model.cpp").write_text("int layers() { return 4; }\n")
    (work / "src" / "model.h").write_text("int layers();\n")
    (work / "README.md").write_text("tiny upstream\n")
    (work / ".gitignore").write_text("*.gen\n")
    (work / "src" / "table.gen").write_text("committed although ignored\n")
    (work / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (work / "run.sh").chmod(0o755)
    (work / "docs").symlink_to("src")
    git("init", "-q", "-b", "main", str(work))
    git("add", "-A", "-f", cwd=work)
    git("commit", "-q", "-m", "first", cwd=work)
    commit = git("rev-parse", "HEAD", cwd=work)
    tree = git("rev-parse", "HEAD^{tree}", cwd=work)
    (work / "README.md").write_text("tiny upstream, changed\n")
    git("commit", "-q", "-am", "second", cwd=work)
    other = git("rev-parse", "HEAD", cwd=work)
    bare = tmp_path / "upstream.git"
    git("clone", "-q", "--bare", str(work), str(bare))
    return Upstream(url=bare.as_uri(), commit=commit, tree=tree, other_commit=other, work=work)


@pytest.fixture
def upstream_pin(upstream: Upstream):
    """A pin naming the fixture upstream's first commit; git is its only source."""
    from fetch.source import Pin, SdistPin, SourcesPin

    sdist = SdistPin(
        package="tiny", version="1.0", filename="tiny-1.0.tar.gz", sha256="0" * 64, subtree="vendor/tiny"
    )
    return Pin(
        schema_version=1,
        upstream=upstream.url,
        commit=upstream.commit,
        tree=upstream.tree,
        sources=SourcesPin(order=("git",), sdist=sdist),
    )
