"""Issue 14: the project as a wheel. Its data files ship inside it and are found through the installed
packages (importlib.resources), and `dgr` works from a folder that is not the checkout.

The wheel is built without an isolated build environment (setuptools comes with the test extra) and
installed with --no-deps into a fresh venv that borrows this environment's dependencies through a
.pth line, so nothing is downloaded but the pinned llama.cpp sdist, once (the archive cache is shared).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

from core.workspace import Workspace

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
PACKAGES = (
    "core",
    "manifests",
    "fetch",
    "patches",
    "lanes",
    "worker",
    "pipeline",
    "certify",
    "reports",
    "cli",
)
EVIDENCE = REPO / "evidence" / "tiny-llama-wan-cpu"
SKIP = shutil.ignore_patterns(
    ".git",
    ".work",
    ".nox",
    "__pycache__",
    "build",
    "dist",
    "*.egg-info",
    ".pytest_cache",
    ".benchmarks",
    "tests",
    "evidence",
    "docs",
)


def data_files() -> set[str]:
    """Every file of the packages that is not Python: what the wheel must carry."""
    found = set()
    for package in PACKAGES:
        for path in (REPO / package).rglob("*"):
            rel = path.relative_to(REPO)
            if path.is_file() and "__pycache__" not in rel.parts and path.suffix not in (".py", ".pyc"):
                found.add(rel.as_posix())
    return found


def run(argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    tail = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{tail}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source") / "dgr-certify"
    shutil.copytree(REPO, source, ignore=SKIP, symlinks=True)
    out = tmp_path_factory.mktemp("wheel")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(out),
            str(source),
        ]
    )
    (built,) = out.glob("dgr_certify-*.whl")
    return built


def test_the_wheel_carries_every_data_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(data_files() - names)
    assert not missing, f"not in {wheel.name}: {missing}"
    for must in (
        "manifests/recipes/tiny-llama.json",
        "manifests/schemas/recipe.schema.json",
        "patches/series",
        "worker/CMakeLists.txt",
        "worker/proto/shard.proto",
        "worker/src/main.cpp",
        "reports/templates/report.html.j2",
        "lanes/packages.py",
    ):
        assert must in names
    assert not [n for n in names if n.startswith(("tests/", ".work/", "evidence/"))]


def install(wheel: Path, venv: Path) -> Path:
    """A fresh venv with the wheel installed (no index, no deps: this environment's borrowed); returns
    its site-packages folder."""
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(run([str(python), "-c", purelib]).stdout.strip())
    # this environment's dependencies (numpy, grpcio, ...) and pip, after the venv's own packages; a path
    # line is not processed as a site dir, so the checkout's editable install stays out
    borrowed = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (site / "borrowed-deps.pth").write_text("\n".join(borrowed) + "\n")
    run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--ignore-installed",
            "--disable-pip-version-check",
            str(wheel),
        ]
    )
    return site


def user_shell(venv: Path, home: Path) -> dict[str, str]:
    """A user's environment: a home of its own, the venv's `dgr` first on PATH, no DGR_ variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DGR_", "PYTHON", "XDG_"))}
    env.update(
        HOME=str(home),
        PATH=f"{venv / 'bin'}:{env.get('PATH', os.defpath)}",
        # the pinned sdist from the cache this checkout's tests already share; git stays unused
        DGR_CACHE=str(Workspace.from_env(os.environ).cache),
        DGR_FETCH_SOURCES="sdist",
    )
    return env


def test_installed_dgr_runs_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    site = install(wheel, venv)
    python = venv / "bin" / "python"

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    home = tmp_path / "home"
    env = user_shell(venv, home)
    where = run(
        [
            str(python),
            "-c",
            "import core.workspace as w, lanes.packages; "
            "print(w.MANIFESTS, w.WORKER, w.CHECKOUT, w.Workspace.from_env({}).root)",
        ],
        cwd=outside,
        env=env,
    ).stdout.split()
    assert all(Path(p).is_relative_to(site) for p in where[:2]), where
    per_user = str(home / ".local" / "share" / "dgr-certify")  # platformdirs' rule on Linux
    assert where[2:] == ["None", per_user], "installed: the workspace is per user"

    dgr = str(venv / "bin" / "dgr")
    doctor = run([dgr, "doctor"], cwd=outside, env=env).stdout
    assert doctor.splitlines()[1].split()[:2] == ["cpu", "ok"], doctor

    provision = run([dgr, "provision"], cwd=outside, env=env).stdout
    workspace = home / ".local" / "share" / "dgr-certify"
    assert f"in {workspace / 'store' / 'tiny-llama' / 'f32'}" in provision

    verify = run(
        [dgr, "verify", str(EVIDENCE / "certificate.json"), "--key", str(EVIDENCE / "signing-key.pub.pem")],
        cwd=outside,
        env=env,
    ).stdout
    assert "verified: tiny-llama-wan on cpu, verdict PASS" in verify
    assert verify.count("blake3 + sha256 match") == 3, "the provisioned files are the certified ones"
    assert not (outside / ".work").exists() and list(outside.iterdir()) == []


ROSTER_SET = "roster-llama"


def ccache_dir() -> str | None:
    """This machine's ccache folder, which a test's own home would not find: the installed run's lane
    build then hits what the checkout's builds compiled (CCACHE_BASEDIR is each run's workspace)."""
    if os.environ.get("CCACHE_DIR"):
        return os.environ["CCACHE_DIR"]
    ccache = shutil.which("ccache")
    if ccache is None:
        return None
    return subprocess.run(
        [ccache, "-k", "cache_dir"], capture_output=True, text=True, check=False
    ).stdout.strip()


@pytest.mark.timeout(1800)
def test_installed_dgr_brings_its_own_gguf_to_a_pass(
    wheel: Path, tmp_path: Path, real_ctx, arch_generator
) -> None:
    """Issue 44 from an installed wheel, outside any checkout: `dgr seal --from DIR` on a roster fixture
    (tests/integration/test_byo_gguf.py has the same steps in the checkout), `dgr recipe init`, `dgr
    certify --recipe NAME`: PASS.  The set and the recipe land in the user's folders, never in the
    installed package.  The run has a workspace of its own, so certify fetches, patches and builds the
    CPU lane there first (ccache shared); each step's time is printed."""
    from fetch import source
    from fetch.arch_fixture import with_vocabulary
    from tests.integration import arch_fixtures
    from tests.integration.dgr_cli import load_bound_misses

    dense = arch_fixtures.generate(arch_generator, "llama", tmp_path / "generated")["dense"]
    model = tmp_path / "model"
    with_vocabulary(dense, model, source.ensure_pristine(real_ctx).path, split=2)
    venv = tmp_path / "venv"
    site = install(wheel, venv)
    outside, user = tmp_path / "elsewhere", tmp_path / "user"
    outside.mkdir()
    (user / "recipes").mkdir(parents=True)
    env = user_shell(venv, tmp_path / "home")
    env.update(
        DGR_WORK=str(user / "work"),
        DGR_MANIFESTS_DIR=str(user / "manifests"),
        DGR_RECIPES_DIR=str(user / "recipes"),
        **({"CCACHE_DIR": cache} if (cache := ccache_dir()) else {}),
    )
    dgr, took = str(venv / "bin" / "dgr"), {}

    def step(*argv: str) -> subprocess.CompletedProcess[str]:
        started = time.monotonic()
        done = subprocess.run(
            [dgr, *argv], cwd=outside, env=env, capture_output=True, text=True, timeout=1500
        )
        took[argv[0]] = time.monotonic() - started
        assert done.returncode in ((0, 5) if argv[0] == "certify" else (0,)), done.stdout + done.stderr
        return done

    step("seal", "--artifacts", ROSTER_SET, "--from", str(model))
    assert (user / "manifests" / "artifacts" / f"{ROSTER_SET}.json").is_file()
    step("recipe", "init", "--artifacts", ROSTER_SET)
    assert (user / "recipes" / f"{ROSTER_SET}.json").is_file()
    done = step("certify", "--recipe", ROSTER_SET, "--lane", "cpu")
    certificate = Path(done.stdout.split("certificate: ", 1)[1].split()[0])
    predicate = json.loads(base64.b64decode(json.loads(certificate.read_text())["payload"]))["predicate"]
    status = predicate["verdict"]["status"]
    assert (status == "PASS") == (done.returncode == 0) == (not load_bound_misses(predicate)), done.stdout
    assert certificate.is_relative_to(user / "work")
    verify = step("verify", str(certificate)).stdout
    assert f"verified: {ROSTER_SET} on cpu, verdict {status}" in verify
    print(f"\ninstalled: {', '.join(f'{k} {v:.1f} s' for k, v in took.items())}; certify says {status}")
    for folder in ("artifacts", "recipes"):
        assert not (site / "manifests" / folder / f"{ROSTER_SET}.json").exists()
    assert list(outside.iterdir()) == []
