"""Lane toolchain parts provisioned into the workspace from pinned package files.

Some lanes need a piece this OS does not ship or ships too old: cuBLAS for a CUDA toolkit that came
without it, Vulkan headers/glslc newer than Debian 12's.  Instead of asking for root, the lane takes
the exact package files named in ``manifests/toolchains/<name>.json`` from the package index (pip
for wheels, apt-get download for .deb files), checks each file's size and sha256 against the pin
(a mismatch is an integrity error and the file is discarded), extracts them into a fresh temp dir and
renames it to ``.work/toolchains/<name>-<version>``.  A stamp holding the manifest digest makes the
next run a no-op; a directory without a matching stamp is never trusted.

Pins are regenerated, never hand-edited: ``python -m lanes.toolchains refresh NAME`` downloads the
files the manifest names (package + version) and rewrites their sizes and digests.
"""

from __future__ import annotations

import os
import platform
import shutil
import stat
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from core import proc
from core.canonical import canonical_digest, read_json, sha256_file, write_json
from core.errors import (
    CommandFailed,
    CommandTimeout,
    ConfigurationError,
    IntegrityError,
    ToolchainMissing,
)
from core.locks import hold
from core.workspace import MANIFESTS, Workspace, refuse_links_below

TOOLCHAINS = MANIFESTS / "toolchains"
STAMP = ".dgr-toolchain.json"
# A package-index download that prints nothing for this long is stuck, not slow.
DOWNLOAD_NO_OUTPUT_S = 300.0
# Extraction caps: a pinned file is trusted by digest, but a wrong pin must not fill the disk.
MAX_MEMBERS = 20_000
MAX_BYTES = 4 << 30


@dataclass(frozen=True, kw_only=True)
class PinnedFile:
    package: str
    version: str
    filename: str
    size: int
    sha256: str


@dataclass(frozen=True, kw_only=True)
class Toolchain:
    schema_version: int
    name: str
    version: str
    kind: str  # "wheel" (pip download) or "deb" (apt-get download)
    lane: str
    description: str
    root: str  # the directory inside the install the lane points at (nvidia/cu13, usr)
    files: tuple[PinnedFile, ...]
    machine: str | None = None  # platform.machine() the files are for; None: any
    suite: str | None = None  # .deb files: the Debian suite they come from (trixie)

    @property
    def digest(self) -> str:
        # Unset optional fields stay out, so adding one to the schema does not orphan every install.
        return canonical_digest({k: v for k, v in asdict(self).items() if v is not None})


def load(name: str, *, directory: Path | None = None) -> Toolchain:
    from manifests.loader import build, load_json

    path = (directory or TOOLCHAINS) / f"{name}.json"
    data = load_json(path, "toolchain")
    if data["name"] != name:
        raise ConfigurationError(f"{path} names toolchain {data['name']!r}, expected {name!r}")
    return build(Toolchain, data, where=str(path))


def workspace(env: Mapping[str, str]) -> Workspace:
    """The workspace whose toolchains a probe looks at (the same one `dgr build` provisions into)."""
    return Workspace.from_env(env)


def install_dir(workspace: Workspace, tc: Toolchain) -> Path:
    return workspace.root / "toolchains" / f"{tc.name}-{tc.version}"


def installed(workspace: Workspace, tc: Toolchain) -> Path | None:
    """The install's root dir when its stamp matches this exact pin (cheap: no re-hash)."""
    where = install_dir(workspace, tc)
    try:
        stamp = read_json(where / STAMP)
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or stamp.get("manifest_digest") != tc.digest:
        return None
    root = where / tc.root
    return root if root.is_dir() and not root.is_symlink() else None


# --- downloading ------------------------------------------------------------------------------------

Download = Callable[[Mapping[str, str], Toolchain, PinnedFile, Path], None]


def pip_download(env: Mapping[str, str], tc: Toolchain, pinned: PinnedFile, into: Path) -> None:
    """The exact wheel by the running interpreter's pip: no deps, binary only, the pin's platform."""
    tags = pinned.filename[: -len(".whl")].split("-")
    argv = [
        *pip_command(env),
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--platform",
        tags[-1],
        f"{pinned.package}=={pinned.version}",
        "-d",
        str(into),
    ]
    run_env = dict(env, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    proc.run(argv, env=run_env, no_output_timeout=DOWNLOAD_NO_OUTPUT_S)


def pip_command(env: Mapping[str, str]) -> list[str]:
    """This interpreter's pip; a venv made by uv (nox's default here) has none, so then the PATH's."""
    import importlib.util

    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    for name in ("pip3", "pip"):
        found = shutil.which(name, path=env.get("PATH", os.defpath))
        if found:
            return [found]
    raise ToolchainMissing(
        "pip is needed to download pinned wheels", hint="python -m ensurepip, or install pip"
    )


def apt_download(env: Mapping[str, str], tc: Toolchain, pinned: PinnedFile, into: Path) -> None:
    """The exact .deb by ``apt-get download`` from the pin's suite (nothing installed, no root needed).

    The suite (Debian 13 for a Debian 12 box) is not in the machine's apt sources and must not be
    added there (mixing suites is the root surprise we avoid): apt runs with a private source list
    and state under ``into``'s parent, on the machine's own Debian mirror and archive keyring.
    """
    state = into.parent / "apt"
    options = _apt_options(state, env, tc)
    apt_get = proc.resolve("apt-get", env)
    if not (state / "updated").exists():
        proc.run([apt_get, *options, "update"], env=env, no_output_timeout=DOWNLOAD_NO_OUTPUT_S)
        (state / "updated").touch()
    argv = [apt_get, *options, "download", f"{pinned.package}={pinned.version}"]
    proc.run(argv, cwd=into, env=env, no_output_timeout=DOWNLOAD_NO_OUTPUT_S)


APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def debian_mirror(env: Mapping[str, str], sources: tuple[Path, ...] = APT_SOURCES) -> tuple[str, str] | None:
    """(URI, keyring) of the Debian main archive this machine's apt already uses; DGR_DEBIAN_MIRROR wins.

    The archive entry is the one whose suites hold a bare codename (not -security / -updates).
    """
    if env.get("DGR_DEBIAN_MIRROR", "").strip():
        return env["DGR_DEBIAN_MIRROR"].strip(), DEBIAN_KEYRING
    files: list[Path] = []
    for src in sources:
        files += sorted(src.glob("*.sources")) + sorted(src.glob("*.list")) if src.is_dir() else [src]
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for uri, suites, keyring in _apt_entries(text, deb822=path.suffix == ".sources"):
            if uri.rstrip("/").endswith("/debian") and any("-" not in s for s in suites):
                return uri, keyring or DEBIAN_KEYRING
    return None


def _apt_entries(text: str, *, deb822: bool) -> Iterator[tuple[str, list[str], str | None]]:
    if deb822:
        for stanza in text.split("\n\n"):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if ":" in line and not line.lstrip().startswith("#"):
                    k, v = line.split(":", 1)
                    fields[k.strip().lower()] = v.strip()
            if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
                for uri in fields.get("uris", "").split():
                    yield uri, fields.get("suites", "").split(), fields.get("signed-by")
        return
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) >= 3 and words[0] == "deb":
            rest, opts = words[1:], []
            if rest[0].startswith("["):  # deb [opt=v opt=v] URI suite components
                end = next((i for i, w in enumerate(rest) if w.endswith("]")), len(rest) - 1)
                opts, rest = [w.strip("[]") for w in rest[: end + 1]], rest[end + 1 :]
            keyring = next((o.split("=", 1)[1] for o in opts if o.startswith("signed-by=")), None)
            if len(rest) >= 2:
                yield rest[0], [rest[1]], keyring


def _apt_options(state: Path, env: Mapping[str, str], tc: Toolchain) -> list[str]:
    mirror = debian_mirror(env)
    if mirror is None or not tc.suite:
        raise ToolchainMissing(
            f"{tc.lane} lane: no Debian archive in this machine's apt sources to take {tc.name} from",
            hint=f"install {tc.description} by hand, or set DGR_DEBIAN_MIRROR to a Debian mirror URI",
        )
    uri, keyring = mirror
    (state / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (state / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    (state / "sources.d").mkdir(exist_ok=True)
    (state / "sources.d" / f"{tc.suite}.sources").write_text(
        f"Types: deb\nURIs: {uri}\nSuites: {tc.suite}\nComponents: main\nSigned-By: {keyring}\n",
        encoding="utf-8",
    )
    (state / "status").touch()
    return [
        "-o",
        "Dir::Etc::SourceList=/dev/null",
        "-o",
        f"Dir::Etc::SourceParts={state / 'sources.d'}",
        "-o",
        f"Dir::State::Lists={state / 'lists'}",
        "-o",
        f"Dir::Cache={state / 'cache'}",
        "-o",
        f"Dir::State::status={state / 'status'}",
        "-o",
        "Debug::NoLocking=1",
    ]


DOWNLOADERS: dict[str, Download] = {"wheel": pip_download, "deb": apt_download}


def _fetch_verified(
    env: Mapping[str, str], tc: Toolchain, pinned: PinnedFile, scratch: Path, download: Download
) -> Path:
    into = scratch / "download"
    into.mkdir(exist_ok=True)
    try:
        download(env, tc, pinned, into)
    except (CommandFailed, CommandTimeout, ToolchainMissing) as exc:
        raise ToolchainMissing(
            f"{tc.lane} lane: could not download {pinned.package}=={pinned.version} for {tc.name}: "
            f"{exc.message}",
            hint=f"install {tc.description} by hand, or make the package index reachable",
        ) from None
    # apt-get download spells an epoch "1:2.3" as "1%3a2.3" in the file name; the pin keeps that name.
    got = into / pinned.filename
    if not got.is_file() or got.is_symlink():
        names = sorted(p.name for p in into.iterdir())
        raise IntegrityError(f"{tc.name}: the download gave {names}, not {pinned.filename}")
    size = got.stat().st_size
    actual = sha256_file(got)
    if size != pinned.size or actual != pinned.sha256:
        got.unlink()
        raise IntegrityError(
            f"{tc.name}: {pinned.filename} from the package index has size {size} sha256 {actual}, "
            f"the pin says size {pinned.size} sha256 {pinned.sha256}; the file was discarded"
        )
    return got


# --- extracting -------------------------------------------------------------------------------------


def _safe_member(name: str, where: str) -> str:
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or any(p in ("..",) for p in parts) or "\0" in name:
        raise IntegrityError(f"{where}: unsafe member name {name!r}")
    return name


def extract_wheel(path: Path, dest: Path) -> None:
    """A wheel is a zip of plain files: refuse links, special files, odd names, absurd totals."""
    where = path.name
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        if len(infos) > MAX_MEMBERS or sum(i.file_size for i in infos) > MAX_BYTES:
            raise IntegrityError(f"{where}: more members or bytes than a toolchain wheel may hold")
        for info in infos:
            _safe_member(info.filename, where)
            kind = stat.S_IFMT(info.external_attr >> 16)  # 0: no type recorded (a plain file)
            if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                raise IntegrityError(f"{where}: {info.filename} is not a plain file")
        for info in infos:
            target = dest / info.filename
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "xb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            os.chmod(target, 0o755 if (info.external_attr >> 16) & 0o111 else 0o644)


def extract_deb(path: Path, dest: Path, env: Mapping[str, str]) -> None:
    """dpkg-deb -x into ``dest`` (a fresh temp dir), then refuse any link that points outside it."""
    proc.run([proc.resolve("dpkg-deb", env), "-x", str(path), str(dest)], env=env)
    for link in [p for p in dest.rglob("*") if p.is_symlink()]:
        target = os.readlink(link)
        resolved = Path(os.path.normpath(link.parent / target))
        if os.path.isabs(target) or not resolved.is_relative_to(dest):
            raise IntegrityError(f"{path.name}: link {link.relative_to(dest)} -> {target} leaves the tree")


# --- the one entry point ----------------------------------------------------------------------------


def ensure(
    workspace: Workspace,
    env: Mapping[str, str],
    tc: Toolchain,
    *,
    download: Download | None = None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """The install root of ``tc`` (``.work/toolchains/<name>-<version>/<root>``), provisioning it once."""
    found = installed(workspace, tc)
    if found is not None:
        return found
    if tc.machine and tc.machine != platform.machine():
        raise ToolchainMissing(
            f"{tc.lane} lane: the pinned {tc.name} is for {tc.machine}, this machine is {platform.machine()}",
            hint=f"install {tc.description} by hand",
        )
    where = install_dir(workspace, tc)
    refuse_links_below(workspace.root, where.parent)
    where.parent.mkdir(parents=True, exist_ok=True)
    download = download or DOWNLOADERS[tc.kind]
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    with _locked(where):
        found = installed(workspace, tc)  # another run may have finished it while we waited
        if found is not None:
            return found
        scratch = Path(tempfile.mkdtemp(prefix=f".{where.name}-", dir=where.parent))
        try:
            tree = scratch / "tree"
            tree.mkdir()
            for pinned in tc.files:
                origin = f"Debian {tc.suite}" if tc.kind == "deb" else "the package index"
                say(f"toolchain {tc.name}: {pinned.package}=={pinned.version} from {origin}")
                got = _fetch_verified(env, tc, pinned, scratch, download)
                if tc.kind == "wheel":
                    extract_wheel(got, tree)
                else:
                    extract_deb(got, tree, env)
                got.unlink()
            if not (tree / tc.root).is_dir():
                raise IntegrityError(f"{tc.name}: the pinned files hold no {tc.root}/")
            write_json(tree / STAMP, {"manifest_digest": tc.digest, "manifest": asdict(tc)})
            if where.exists():
                shutil.rmtree(where)  # no matching stamp: never trusted, replaced whole
            os.replace(tree, where)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    say(f"toolchain {tc.name}: verified and installed at {where}")
    return where / tc.root


def _locked(where: Path) -> AbstractContextManager[Path]:
    # a second run waits: provisioning takes seconds, not hours
    return hold(where.parent / f"{where.name}.lock", what=f"the toolchain install {where}")


# --- regenerating a pin -----------------------------------------------------------------------------


def refresh(name: str, env: Mapping[str, str], *, directory: Path | None = None) -> dict[str, Any]:
    """Download each file the manifest names (package==version) and rewrite its size and sha256."""
    from manifests.loader import load_json

    path = (directory or TOOLCHAINS) / f"{name}.json"
    data = load_json(path, "toolchain")
    tc = load(name, directory=directory)
    download = DOWNLOADERS[tc.kind]
    files = []
    with tempfile.TemporaryDirectory() as tmp:
        for pinned in tc.files:
            into = Path(tmp) / pinned.package
            into.mkdir()
            download(env, tc, pinned, into)
            (got,) = [p for p in into.iterdir() if p.suffix in (".whl", ".deb")]
            files.append(
                {
                    **asdict(pinned),
                    "filename": got.name,
                    "size": got.stat().st_size,
                    "sha256": sha256_file(got),
                }
            )
    data["files"] = files
    write_json(path, data)
    return data


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "refresh":
        print("usage: python -m lanes.toolchains refresh NAME", file=sys.stderr)
        return 2
    data = refresh(args[1], os.environ)
    for f in data["files"]:
        print(f"{f['filename']} {f['size']} {f['sha256']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
