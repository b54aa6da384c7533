"""Nox sessions: each installs the project and calls one `dgr` subcommand; no logic lives here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = False
nox.options.sessions = ["tests"]
# A failed requirement (a missing system package in `deps`) stops the run: nothing is fetched after it.
nox.options.stop_on_first_error = True

LANES = ("cpu", "cuda", "rocm", "vulkan", "metal")


# One pinned clang-format for worker/'s C++: another version lays out the same code differently, and
# Debian 12's own (14) cannot read worker/.clang-format's options at all.
CLANG_FORMAT = "clang-format==23.1.5"


def _worker_cpp() -> list[str]:
    """worker/'s C++ sources and headers (src, tools), relative to the checkout, sorted."""
    root = Path(__file__).parent
    return sorted(
        p.relative_to(root).as_posix() for p in (root / "worker").rglob("*") if p.suffix in (".cpp", ".h")
    )


def _install(session: nox.Session, *extras: str) -> None:
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", spec)


def _posargs(session: nox.Session) -> list[str]:
    """Arguments after `--` belong to the session the user named, not to the ones it requires."""
    requested = getattr(getattr(session, "_runner", None), "global_config", None)
    named = getattr(requested, "sessions", None) or []
    if named and session.name not in named:
        return []
    return list(session.posargs)


@nox.session(venv_backend="none")
def deps(session: nox.Session) -> None:
    """Install the CPU lane's missing system packages (apt-get, as root or with passwordless sudo).

    Runs before the project is installed (lanes.packages needs only the standard library). Without
    the rights it prints the exact `apt-get install` line and nox exits 4, as `dgr build` would.
    """
    code = subprocess.run(
        [sys.executable, "-m", "lanes.packages", "ensure", "cpu"], cwd=Path(__file__).parent, check=False
    ).returncode
    if code:
        raise SystemExit(code)  # nox would say 1 for any failed session; 4 says "toolchain missing"


@nox.session
def fetch(session: nox.Session) -> None:
    """Fetch llama.cpp at the pinned commit (git, else the package-index sdist mirror)."""
    _install(session)
    session.run("dgr", "fetch", *_posargs(session))


@nox.session(requires=["fetch"])
def patch(session: nox.Session) -> None:
    """Apply patches/series onto a copy of the pristine tree."""
    _install(session)
    session.run("dgr", "patch", *_posargs(session))


@nox.session(requires=["patch"])
def upstream(session: nox.Session) -> None:
    """The patch stack as mails `git am` applies onto the pin, checked to give the patched tree
    (`.work/upstream/`; docs/upstream/)."""
    _install(session)
    session.run("dgr", "upstream", *_posargs(session))


def _build_session(lane: str) -> None:
    @nox.session(name=f"build-{lane}", requires=["deps", "patch"])
    def build(session: nox.Session) -> None:
        _install(session)
        session.run("dgr", "build", "--lane", lane, *_posargs(session))

    build.__doc__ = f"Build the {lane} lane: patched libllama + dgr-shard-worker."


for _lane in LANES:
    _build_session(_lane)


@nox.session(requires=["fetch"])
def provision(session: nox.Session) -> None:
    """Provision a recipe's artifact set into the store (default: the embedded tiny model)."""
    _install(session)
    session.run("dgr", "provision", *_posargs(session))


@nox.session(requires=["fetch"])
def seal(session: nox.Session) -> None:
    """Seal an artifact set: `nox -s seal -- --artifacts NAME --from DIR`."""
    _install(session)
    session.run("dgr", "seal", *_posargs(session))


@nox.session(requires=["deps", "build-cpu", "provision"])
def certify(session: nox.Session) -> None:
    """Certify a recipe on a lane (default: the embedded tiny-llama recipe on the CPU lane)."""
    _install(session)
    session.run("dgr", "certify", *_posargs(session))


@nox.session(requires=["deps", "build-cpu", "provision"])
def reference(session: nox.Session) -> None:
    """`nox -s reference -- --recipe R --lane L`: make and seal a recipe's monolithic reference
    (`dgr certify --reference <set>.json` then certifies against it with no monolithic worker)."""
    _install(session)
    session.run("dgr", "reference", *_posargs(session))


@nox.session(name="device-bundle")
def device_bundle(session: nox.Session) -> None:
    """The offline bundle for a GPU box (docs/device.md): `nox -s device-bundle -- [--out DIR] ...`."""
    _install(session)
    session.run("python", "-m", "device", "bundle", *_posargs(session))


@nox.session
def verify(session: nox.Session) -> None:
    """Verify a certificate: `nox -s verify -- PATH`."""
    _install(session)
    session.run("dgr", "verify", *_posargs(session))


@nox.session
def report(session: nox.Session) -> None:
    """Rebuild the report index."""
    _install(session)
    session.run("dgr", "report", *_posargs(session))


@nox.session
def catalog(session: nox.Session) -> None:
    """Write the signed catalog of what is certified (`dgr catalog`: the reports folder's certificates)."""
    _install(session)
    session.run("dgr", "catalog", *_posargs(session))


@nox.session(requires=["deps", "build-cpu"])
def roster(session: nox.Session) -> None:
    """Stage every architecture the pinned tree's fixture generator writes, at every cut, bitwise against
    the monolithic worker: a signed table (`dgr roster`; `nox -s report` shows the latest)."""
    _install(session)
    session.run("dgr", "roster", *_posargs(session))


@nox.session
def matrix(session: nox.Session) -> None:
    """Print the CI matrix as JSON."""
    _install(session)
    session.run("dgr", "matrix", *_posargs(session))


@nox.session(requires=["deps"])
def tests(session: nox.Session) -> None:
    """Fast unit tests first, then the slow integration suite (real build, real workers; `-- --quick`:
    only its inner-loop subset), each on one pytest-xdist worker per core; then each suite's time and
    the ten slowest tests (tests/durations.py)."""
    _install(session, "test")
    # Each test starts `dgr` and fake workers as fresh interpreters; where the environment forbids
    # writing bytecode, every one of them recompiled the project (a third of a fake certify's time).
    session.env["PYTHONDONTWRITEBYTECODE"] = ""
    args = _posargs(session)
    results = Path(session.create_tmp())
    fast, slow = results / "fast.xml", results / "slow.xml"
    for stale in (fast, slow):
        stale.unlink(missing_ok=True)
    try:
        # worksteal: a worker that finds its queue empty takes tests queued on the other (under load one
        # worker crawled through its last tests while the other sat idle: the busy run on 18de092)
        fast_args = ("-m", "not slow", "-n", "auto", "--dist", "worksteal", f"--junitxml={fast}")
        session.run("pytest", *fast_args, *args)
        # two at a time as well: run one at a time, the slow tests kept the 2 cores about 55% busy (a
        # staged pass computes on one stage at a time; worker starts, seams), sampled in
        # docs/measurements/issue-39; the tests that read one shared run stay in one worker (loadgroup)
        session.run("pytest", "-m", "slow", "-n", "auto", "--dist", "loadgroup", f"--junitxml={slow}", *args)
    finally:
        session.run("python", "-m", "tests.durations", str(fast), str(slow), success_codes=[0, 1])


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff over the project (lint, then format), the import contracts (one-way layers, no cycles),
    pyright over the product code (pyproject.toml), then clang-format over worker/'s C++
    (worker/.clang-format; fails on any file it would change)."""
    _install(session)  # pyright resolves the third-party imports in this session's environment
    session.install("ruff", "import-linter>=2.1", "pyright>=1.1.414", CLANG_FORMAT)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports", env={"PYTHONPATH": str(Path(__file__).parent)})
    session.run("pyright", "--pythonpath", str(Path(session.bin) / "python"))
    session.run("clang-format", "--dry-run", "--Werror", *_worker_cpp())


@nox.session
def fuzz(session: nox.Session) -> None:
    """libFuzzer on each untrusted-input parser (`-- --seconds S [TARGET ...]`): inputs, findings per target.

    The Python parsers under atheris; the worker's C++ readers (the pass port's frames, a Forward's
    checks) built from worker/fuzz with clang, which is installed first where it is missing."""
    _install(session, "test")
    session.install("atheris")
    session.run("python", "-m", "tests.fuzz.run", *_posargs(session))


@nox.session
def sanitize(session: nox.Session) -> None:
    """The worker's tests against a CPU lane built with ASan and UBSan (`-- [PYTEST ARGS]`): a build of
    its own key, every report in a file under the workspace's sanitize/ folder, any report a failure
    (tests/sanitized.py)."""
    _install(session, "test")
    session.env["PYTHONDONTWRITEBYTECODE"] = ""
    session.run("python", "-m", "tests.sanitized", *_posargs(session))


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks that report figures (hashing, download, re-verify, decode speed)."""
    _install(session, "test")
    session.run("pytest", "tests/bench", "--benchmark-only", "-p", "no:cacheprovider", *_posargs(session))
