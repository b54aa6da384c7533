"""Wheels for the device's Python: the project's dependencies, binary only, for each CPython version.

The requirements are pyproject's ``[project].dependencies``, nothing else, so the device resolves the
same set as a checkout here.  ``pip download --only-binary :all: --python-version X.Y`` with the
manylinux platforms below fetches them, pure-Python dependencies included, from the package index.
Each version's download is cached under ``$DGR_CACHE/device-wheels/<tag>-<digest>`` (the digest
covers the requirements and platforms) and reused without the network while its stamp matches.

``unmet`` is what the device script asks first: does this interpreter already satisfy every
requirement?  Standard library only (it runs before anything is installed), and the specifier
subset it reads is the one pyproject uses (``== != >= <= > < ~=``, comma-joined, no markers).
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import tempfile
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from core.canonical import canonical_digest, read_json, sha256_file, write_json
from core.errors import ConfigurationError

# glibc 2.17 (manylinux2014) up to 2.35 (Ubuntu 22.04; Debian 12 has 2.36): what a target box runs.
PLATFORMS: tuple[str, ...] = (
    *(f"manylinux_2_{n}_x86_64" for n in (35, 34, 31, 28, 27, 24, 17)),
    "manylinux2014_x86_64",
)
DEFAULT_PYTHONS: tuple[str, ...] = ("3.11", "3.12", "3.13")
REQUIREMENTS = "requirements.txt"
STAMP = ".dgr-wheels.json"
DOWNLOAD_NO_OUTPUT_S = 300.0

_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*?)\s*$")
_SPEC = re.compile(r"^(===|==|!=|>=|<=|~=|>|<)\s*([0-9][0-9A-Za-z.*+!-]*)$")


def requirements(pyproject: Path) -> tuple[str, ...]:
    with open(pyproject, "rb") as fh:
        data = tomllib.load(fh)
    return tuple(data["project"]["dependencies"])


def tag(version: str) -> str:
    """ "3.12" -> "cp312"."""
    m = re.fullmatch(r"3\.(\d+)", version.strip())
    if not m:
        raise ConfigurationError(f"not a CPython 3.x version: {version!r}", hint="give versions like 3.12")
    return f"cp3{m.group(1)}"


# --- is this interpreter enough? -------------------------------------------------------------------


def _release(version: str) -> tuple[int, ...]:
    m = re.match(r"^v?(\d+(?:\.\d+)*)", version.strip())
    return tuple(int(p) for p in m.group(1).split(".")) if m else ()


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


def _prerelease(version: str) -> bool:
    return bool(re.search(r"(a|b|rc|dev)\d*", version.split("+", 1)[0].lower()))


def matches(installed: str, spec: str) -> bool:
    """``installed`` satisfies ``spec`` (one clause like ">=1.85.1")."""
    m = _SPEC.match(spec.strip())
    if not m:
        raise ConfigurationError(f"unsupported version specifier {spec!r}")
    op, want = m.groups()
    have = _release(installed)
    if want.endswith(".*"):
        prefix = _release(want[:-2])
        same = have[: len(prefix)] == prefix
        return same if op == "==" else (not same if op == "!=" else False)
    c = _cmp(have, _release(want))
    if c == 0 and _prerelease(installed) and not _prerelease(want):
        if op == "<":
            return False  # PEP 440: "<1.86" excludes 1.86's own pre-releases
        c = -1  # 1.86.0rc1 comes before 1.86
    if op in ("==", "==="):
        return c == 0
    if op == "!=":
        return c != 0
    if op == ">=":
        return c >= 0
    if op == "<=":
        return c <= 0
    if op == ">":
        return c > 0
    if op == "<":
        return c < 0
    # "~=X.Y.Z": >= X.Y.Z and == X.Y.*
    base = _release(want)
    return c >= 0 and have[: len(base) - 1] == base[:-1]


def unmet(reqs: Sequence[str], version_of: Callable[[str], str] | None = None) -> list[str]:
    """One line per requirement this interpreter does not satisfy (missing or wrong version)."""
    lookup = version_of or importlib.metadata.version
    out = []
    for req in reqs:
        m = _REQ.match(req.split(";", 1)[0])
        if not m:
            raise ConfigurationError(f"cannot read the requirement {req!r}")
        name, _extras, specs = m.groups()
        try:
            have = lookup(name)
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{name}: not installed (need {specs or 'any version'})")
            continue
        bad = [s for s in specs.split(",") if s.strip() and not matches(have, s)]
        if bad:
            out.append(f"{name} {have} does not satisfy {specs}")
    return out


# --- downloading --------------------------------------------------------------------------------------


def _pip_argv(env: Mapping[str, str], version: str, reqs_file: Path, into: Path) -> list[str]:
    from lanes.toolchains import pip_command

    argv = [
        *pip_command(env),
        "download",
        "--only-binary",
        ":all:",
        "--implementation",
        "cp",
        "--python-version",
        version,
        "--dest",
        str(into),
        "-r",
        str(reqs_file),
    ]
    for platform in PLATFORMS:
        argv += ["--platform", platform]
    return argv


def cached(
    cache: Path,
    env: Mapping[str, str],
    version: str,
    reqs: Sequence[str],
    *,
    log: Callable[[str], None] = print,
) -> Path:
    """The cache folder holding every wheel ``reqs`` needs on CPython ``version`` (downloaded once)."""
    from core import proc

    key = canonical_digest({"requirements": list(reqs), "platforms": list(PLATFORMS), "python": version})
    where = cache / "device-wheels" / f"{tag(version)}-{key[:16]}"
    if _stamp_ok(where, key):
        return where
    where.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{where.name}-", dir=where.parent))
    try:
        reqs_file = scratch / REQUIREMENTS
        reqs_file.write_text("".join(f"{r}\n" for r in reqs), encoding="utf-8")
        got = scratch / "wheels"
        got.mkdir()
        log(f"device bundle: wheels for CPython {version} ({tag(version)}) from the package index")
        run_env = dict(env, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
        proc.run(_pip_argv(env, version, reqs_file, got), env=run_env, no_output_timeout=DOWNLOAD_NO_OUTPUT_S)
        wheels = sorted(p.name for p in got.iterdir())
        if not wheels or any(not w.endswith(".whl") for w in wheels):
            raise ConfigurationError(f"pip download for CPython {version} gave {wheels}, not only wheels")
        write_json(got / STAMP, {"key": key, "files": {w: sha256_file(got / w) for w in wheels}})
        if where.exists():
            shutil.rmtree(where)  # no matching stamp: never trusted
        got.rename(where)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return where


def _stamp_ok(where: Path, key: str) -> bool:
    try:
        stamp = read_json(where / STAMP)
    except (OSError, ValueError):
        return False
    if not isinstance(stamp, dict) or stamp.get("key") != key:
        return False
    files = stamp.get("files") or {}
    present = {p.name for p in where.glob("*.whl")}
    return bool(files) and present == set(files)


def carry(cache_dir: Path, dest: Path, *, omit: Sequence[str] = ()) -> list[dict[str, str]]:
    """Copy a cached set into ``dest`` (checked against the stamp's sha256), leaving out ``omit``."""
    stamp = read_json(cache_dir / STAMP)
    dest.mkdir(parents=True)
    dropped = {_norm(n) for n in omit}
    carried = []
    for name, digest in sorted(stamp["files"].items()):
        dist, version = name.split("-")[:2]
        if _norm(dist) in dropped:
            continue
        if sha256_file(cache_dir / name) != digest:
            shutil.rmtree(cache_dir)
            raise ConfigurationError(
                f"the cached wheel {cache_dir / name} changed; the cache was dropped",
                hint="run the bundle again to download it afresh",
            )
        shutil.copy2(cache_dir / name, dest / name)
        carried.append({"name": _norm(dist), "version": version, "file": name, "sha256": digest})
    return carried


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
