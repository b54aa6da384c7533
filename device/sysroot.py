"""gRPC C++ and protobuf for a GPU box whose OS has none: Debian 12's packages as a sysroot.

The .deb files are pinned in ``manifests/toolchains/grpc-debian12.json`` (size + sha256, refreshed with
``python -m lanes.toolchains refresh grpc-debian12``), downloaded with ``apt-get download`` (through
``lanes.toolchains``) into ``$DGR_CACHE/device-debs`` and checked against the pin.  They are unpacked
here rather than by ``lanes.toolchains.ensure``: zlib1g puts ``libz.so.1`` under ``/lib`` and
zlib1g-dev links ``libz.so`` to it by an absolute path, which that extractor rightly refuses.  A
sysroot is merged-/usr: ``lib/`` moves under ``usr/lib/`` and every absolute link that names a place
inside the sysroot becomes relative; any other link is refused.

The bundle's copy leaves out static libraries and documentation, and fixes one thing: Debian's
``grpc*.pc`` and ``gpr.pc`` say ``libdir=${exec_prefix}/lib`` although their libraries live in
``lib/x86_64-linux-gnu`` (fine on Debian, whose linker searches the multiarch directory anyway; in a
sysroot, ``-L<sysroot>/usr/lib`` holds nothing).

``check`` asks the carried pkg-config, confined to the sysroot, for ``grpc++`` and ``protobuf`` and
holds every ``-I``, ``-L`` and ``-l`` it prints to a directory or library inside the sysroot.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from core import proc
from core.canonical import read_json, sha256_file, write_json
from core.context import Context
from core.errors import IntegrityError

TOOLCHAIN = "grpc-debian12"
MULTIARCH = "x86_64-linux-gnu"
MODULES = ("grpc++", "protobuf")
PROGRAMS = ("protoc", "grpc_cpp_plugin", "pkg-config")
# Libraries the compiler driver or glibc provides on every box (pkg-config names them with -l).
SYSTEM_LIBS = frozenset({"atomic", "rt", "pthread", "m", "dl", "c"})
STAMP = ".dgr-sysroot.json"
_LIBDIR = re.compile(r"^libdir=(\$\{(?:exec_)?prefix\})/lib\s*$", re.MULTILINE)


def provision(ctx: Context, *, log: Callable[[str], None] = print) -> Path:
    """``usr/`` of the pinned Debian 12 packages, unpacked once under ``.work/device/``."""
    from lanes import toolchains

    tc = toolchains.load(TOOLCHAIN)
    where = ctx.workspace.root / "device" / f"sysroot-{tc.digest[:16]}"
    try:
        if read_json(where / STAMP).get("manifest_digest") == tc.digest:
            return where / "usr"
    except (OSError, ValueError, AttributeError):
        pass
    where.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{where.name}-", dir=where.parent))
    try:
        tree = scratch / "tree"
        tree.mkdir()
        for pinned in tc.files:
            deb = _deb(ctx, tc, pinned, log)
            proc.run([proc.resolve("dpkg-deb", ctx.env), "-x", str(deb), str(tree)], env=ctx.env)
        merge_usr(tree)
        write_json(tree / STAMP, {"manifest_digest": tc.digest, "packages": [asdict(f) for f in tc.files]})
        if where.exists():
            shutil.rmtree(where)  # no matching stamp: never trusted
        os.rename(tree, where)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return where / "usr"


def _deb(ctx: Context, tc: Any, pinned: Any, log: Callable[[str], None]) -> Path:
    """The pinned .deb from the cache, else from apt; its size and sha256 checked either way."""
    from lanes import toolchains

    cache = ctx.workspace.cache / "device-debs"
    got = cache / pinned.filename
    if not (got.is_file() and got.stat().st_size == pinned.size and sha256_file(got) == pinned.sha256):
        cache.mkdir(parents=True, exist_ok=True)
        log(f"device bundle: {pinned.package}={pinned.version} from Debian {tc.suite}")
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            into = Path(tmp) / "download"
            into.mkdir()
            toolchains.apt_download(ctx.env, tc, pinned, into)
            fresh = into / pinned.filename
            size = fresh.stat().st_size if fresh.is_file() else None
            if size != pinned.size or sha256_file(fresh) != pinned.sha256:
                raise IntegrityError(
                    f"{pinned.filename} from Debian {tc.suite} does not match the pin in "
                    f"manifests/toolchains/{tc.name}.json; it was discarded"
                )
            os.replace(fresh, got)
    return got


def merge_usr(tree: Path) -> None:
    """Move ``lib*/`` under ``usr/``; absolute links into the tree become relative, others are refused."""
    for top in sorted(p for p in tree.iterdir() if p.name.startswith("lib") and not p.is_symlink()):
        for item in sorted(top.rglob("*")):
            if item.is_dir() and not item.is_symlink():
                continue
            dest = tree / "usr" / item.relative_to(tree)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(item, dest)
        shutil.rmtree(top)
    for link in sorted(p for p in tree.rglob("*") if p.is_symlink()):
        target = os.readlink(link)
        if os.path.isabs(target):
            inside = target[len("/usr/") :] if target.startswith("/usr/") else target.lstrip("/")
            target = os.path.relpath(tree / "usr" / inside, link.parent)
            link.unlink()
            link.symlink_to(target)
        resolved = Path(os.path.normpath(link.parent / target))
        if not resolved.is_relative_to(tree) or not resolved.exists():
            raise IntegrityError(
                f"sysroot link {link.relative_to(tree)} -> {target} leaves the tree or names nothing in it"
            )


def _skip(directory: str, names: list[str]) -> set[str]:
    here = Path(directory)
    skipped = {n for n in names if n.endswith(".a") and not (here / n).is_symlink()}
    if here.name == "share":
        skipped |= {"doc", "man", "lintian", "bug"}
    return skipped


def carry(usr: Path, root: Path) -> list[str]:
    """Copy ``usr`` to ``root/usr`` (links kept, static libraries and docs left out), fix the .pc files."""
    shutil.copytree(usr, root / "usr", symlinks=True, ignore=_skip)
    return fix_pc(root)


def fix_pc(root: Path) -> list[str]:
    """Point ``libdir=${exec_prefix}/lib`` at the multiarch directory where the libraries are."""
    libs = root / "usr" / "lib" / MULTIARCH
    fixed = []
    for pc in sorted((libs / "pkgconfig").glob("*.pc")):
        text = pc.read_text(encoding="utf-8")
        m = _LIBDIR.search(text)
        if m is None:
            continue
        new = _LIBDIR.sub(lambda m: f"libdir={m.group(1)}/lib/{MULTIARCH}", text)
        pc.write_text(new, encoding="utf-8")
        fixed.append(pc.name)
    return fixed


@dataclass(frozen=True, kw_only=True)
class Found:
    versions: Mapping[str, str]  # module -> version
    include_dirs: tuple[str, ...]
    lib_dirs: tuple[str, ...]
    libs: tuple[str, ...]


def environment(root: Path, env: Mapping[str, str]) -> dict[str, str]:
    """pkg-config confined to the sysroot; its programs first on PATH (what the device script sets)."""
    libs = root / "usr" / "lib" / MULTIARCH
    out = dict(env)
    out.pop("PKG_CONFIG_PATH", None)
    out.update(
        PKG_CONFIG_SYSROOT_DIR=str(root),
        PKG_CONFIG_LIBDIR=f"{libs / 'pkgconfig'}:{root / 'usr' / 'share' / 'pkgconfig'}",
        PATH=f"{root / 'usr' / 'bin'}:{env.get('PATH', os.defpath)}",
        LD_LIBRARY_PATH=":".join(filter(None, [str(libs), env.get("LD_LIBRARY_PATH")])),
    )
    return out


def check(root: Path, env: Mapping[str, str]) -> Found:
    """IntegrityError unless the carried pkg-config resolves every module to files inside ``root``."""
    run_env = environment(root, env)
    pkg_config = str(root / "usr" / "bin" / "pkg-config")
    for program in PROGRAMS:
        if not (root / "usr" / "bin" / program).exists():
            raise IntegrityError(f"the sysroot at {root} has no usr/bin/{program}")
    versions = proc.run([pkg_config, "--modversion", *MODULES], env=run_env).output.split()
    flags = proc.run([pkg_config, "--cflags", "--libs", *MODULES], env=run_env).output.split()
    inc = tuple(dict.fromkeys(f[2:] for f in flags if f.startswith("-I")))
    lib_dirs = tuple(dict.fromkeys(f[2:] for f in flags if f.startswith("-L")))
    libs = tuple(dict.fromkeys(f[2:] for f in flags if f.startswith("-l")))
    problems = [
        f"{d} is outside the sysroot or missing"
        for d in (*inc, *lib_dirs)
        if not (Path(d).is_dir() and Path(d).resolve().is_relative_to(root.resolve()))
    ]
    if not lib_dirs:
        problems.append("pkg-config printed no -L for the sysroot's libraries")
    for name in libs:
        if name in SYSTEM_LIBS:
            continue
        if not any((Path(d) / f"lib{name}.so").exists() for d in lib_dirs):
            problems.append(f"-l{name}: no lib{name}.so (or its target) in {', '.join(lib_dirs) or 'no -L'}")
    if problems:
        raise IntegrityError(
            f"the sysroot at {root} does not resolve {' '.join(MODULES)}: " + "; ".join(problems[:6])
        )
    return Found(
        versions=dict(zip(MODULES, versions, strict=False)), include_dirs=inc, lib_dirs=lib_dirs, libs=libs
    )
