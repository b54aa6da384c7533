"""One self-contained folder for a GPU box with no network: everything `scripts/device-cuda.sh` needs.

Made here, off the device (docs/device.md)::

    <bundle>/BUNDLE.json        size + sha256 of every file below (device.manifest), and what is where
    <bundle>/project/           `git archive HEAD` of this checkout (device.snapshot)
    <bundle>/src/               the pinned llama.cpp tree as `dgr fetch` left it, with its provenance record
    <bundle>/store/<set>/<v>/   artifact sets whose origin the device cannot reach (the package index)
    <bundle>/wheels/cpXY/       wheels for each CPython version, and requirements.txt (device.wheels)
    <bundle>/sysroot/usr/       Debian 12's gRPC/protobuf, for a box without libgrpc++-dev (device.sysroot)

Sets that the pinned tree's gguf-py regenerates from a seed (tiny-llama, tiny-v4) travel as their
generator inputs, which are the tree and the manifests already in the bundle, not as files (unless
named in ``carry_generated``).  Recipes and artifact manifests are read from the snapshot, so what is
carried is what the snapshot's manifests seal even when the checkout has uncommitted edits.  An
optional archive (``--archive xz``) packs the folder into one file, cut into parts of at most
``--split-mib`` MiB for transports with a size limit.
"""

from __future__ import annotations

import os
import platform
import shutil
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core import proc
from core.canonical import sha256_file
from core.context import Context
from core.errors import ConfigurationError
from core.workspace import PROJECT_ROOT
from device import manifest, snapshot, sysroot, wheels

RECIPES: tuple[str, ...] = ("tiny-llama", "tiny-v4", "gemma3-270m-q4")
SCRIPT = "scripts/device-cuda.sh"
ARCHIVES = ("none", "tar", "xz")


@dataclass(frozen=True, kw_only=True)
class Options:
    out: Path
    pythons: tuple[str, ...] = wheels.DEFAULT_PYTHONS
    recipes: tuple[str, ...] = RECIPES
    allow_dirty: bool = False
    carry_generated: tuple[str, ...] = ()  # generated sets whose files travel all the same
    omit_wheels: tuple[str, ...] = ()
    with_sysroot: bool = True
    archive: str = "none"
    split_mib: int | None = None
    repo: Path = PROJECT_ROOT


@dataclass(frozen=True, kw_only=True)
class Bundle:
    path: Path
    manifest: dict[str, Any]
    seconds: float
    archive: tuple[Path, ...] = field(default_factory=tuple)  # the archive file, or its parts in order


def build(ctx: Context, options: Options, *, log: Callable[[str], None] = print) -> Bundle:
    """Assemble the bundle at ``options.out`` (which must not exist); publish it by rename when whole."""
    started = time.monotonic()
    if options.archive not in ARCHIVES:
        raise ConfigurationError(f"--archive must be one of {', '.join(ARCHIVES)}")
    out = Path(os.path.abspath(options.out))
    if out.exists():
        raise ConfigurationError(f"{out} exists", hint="remove it or name another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        meta = _assemble(ctx, options, tmp, log)
        log("device bundle: hashing every file into the manifest")
        doc = manifest.write(tmp, meta)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    parts = _archive(out, options, log) if options.archive != "none" else ()
    return Bundle(path=out, manifest=doc, seconds=time.monotonic() - started, archive=parts)


def _assemble(ctx: Context, options: Options, root: Path, log: Callable[[str], None]) -> dict[str, Any]:
    snap = snapshot.export(options.repo, root / "project", ctx.env, allow_dirty=options.allow_dirty, warn=log)
    log(f"device bundle: project at commit {snap.commit}")
    if not (root / "project" / SCRIPT).is_file():
        raise ConfigurationError(
            f"commit {snap.commit[:12]} has no {SCRIPT}: the device would have no script to run",
            hint=f"commit {SCRIPT} first",
        )
    return {
        "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "made_on": {
            "system": platform.system(),
            "machine": platform.machine(),
            "python": platform.python_version(),
        },
        "project": {"commit": snap.commit, "dirty": list(snap.dirty), "dir": "project"},
        "script": f"project/{SCRIPT}",
        "llama": _tree(ctx, root, log),
        "recipes": list(options.recipes),
        "artifacts": [_artifacts(ctx, name, root, options, log) for name in options.recipes],
        "wheels": _wheels(ctx, root, options, log),
        "sysroot": _sysroot(ctx, root, log) if options.with_sysroot else None,
    }


def _tree(ctx: Context, root: Path, log: Callable[[str], None]) -> dict[str, Any]:
    from fetch.source import ensure_pristine

    pristine = ensure_pristine(ctx)
    src = root / "src"
    src.mkdir()
    log(f"device bundle: pinned llama.cpp tree {pristine.provenance['tree']} from {pristine.path}")
    # copy2 keeps mtimes, so the record's stamp still describes the copy (`fetch --reverify` rehashes)
    shutil.copytree(pristine.path, src / pristine.path.name, symlinks=True)
    shutil.copy2(pristine.provenance_path, src / pristine.provenance_path.name)
    prov = pristine.provenance
    return {
        "commit": prov["commit"],
        "tree": prov["tree"],
        "source": prov.get("source"),
        "dir": f"src/{pristine.path.name}",
        "provenance": f"src/{pristine.provenance_path.name}",
    }


def _artifacts(
    ctx: Context, recipe_name: str, root: Path, options: Options, log: Callable[[str], None]
) -> dict[str, Any]:
    from fetch.provision import provision
    from lanes.build import fetch_tools
    from manifests import recipe_model as recipes
    from manifests.artifact_sets import load_set

    manifests = root / "project" / "manifests"
    recipe_file = manifests / "recipes" / f"{recipe_name}.json"
    if not recipe_file.is_file():
        raise ConfigurationError(f"the snapshot has no recipe {recipe_name!r} ({recipe_file.name})")
    recipe = recipes.load_file(recipe_file)
    aset = load_set(recipe.artifacts, root=manifests / "artifacts")
    kinds = sorted({o.kind for o in aset.origins})
    entry: dict[str, Any] = {
        "recipe": recipe.name,
        "set": aset.name,
        "variant": recipe.variant,
        "origins": kinds,
    }
    if kinds == ["generated"] and aset.name not in options.carry_generated:
        log(f"device bundle: {aset.name}/{recipe.variant} is regenerated on the device from the carried tree")
        return {**entry, "carried": False}
    done = provision(
        ctx, aset.name, variant=recipe.variant, manifests=manifests / "artifacts", tools=fetch_tools(ctx)
    )
    dest = root / "store" / aset.name / recipe.variant
    dest.mkdir(parents=True)
    for f in (*done.files, done.provenance_path):
        _link_or_copy(Path(f), dest / Path(f).name)
    size = sum(Path(f).stat().st_size for f in done.files)
    log(f"device bundle: {aset.name}/{recipe.variant} carried ({len(done.files)} files, {size >> 20} MiB)")
    return {
        **entry,
        "carried": True,
        "dir": f"store/{aset.name}/{recipe.variant}",
        "files": [Path(f).name for f in done.files],
        "bytes": size,
    }


def _link_or_copy(src: Path, dest: Path) -> None:
    """A hard link where the store shares the filesystem (no 250 MB copy); the manifest holds the hash."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def _wheels(ctx: Context, root: Path, options: Options, log: Callable[[str], None]) -> dict[str, Any]:
    reqs = wheels.requirements(options.repo / "pyproject.toml")
    top = root / "wheels"
    top.mkdir()
    (top / wheels.REQUIREMENTS).write_text("".join(f"{r}\n" for r in reqs), encoding="utf-8")
    sets: dict[str, Any] = {}
    for version in options.pythons:
        cache = wheels.cached(ctx.workspace.cache, ctx.env, version, reqs, log=log)
        carried = wheels.carry(cache, top / wheels.tag(version), omit=options.omit_wheels)
        if not any(w["name"] == "pip" for w in carried):
            raise ConfigurationError(
                "the wheels carry no pip: the device could not install them", hint="do not omit pip"
            )
        sets[wheels.tag(version)] = {"python": version, "wheels": carried}
        log(f"device bundle: {len(carried)} wheels for CPython {version}")
    return {
        "requirements": list(reqs),
        "omitted": list(options.omit_wheels),
        "platforms": list(wheels.PLATFORMS),
        "sets": sets,
    }


def _sysroot(ctx: Context, root: Path, log: Callable[[str], None]) -> dict[str, Any]:
    from lanes import toolchains

    tc = toolchains.load(sysroot.TOOLCHAIN)
    usr = sysroot.provision(ctx, log=log)
    fixed = sysroot.carry(usr, root / "sysroot")
    found = sysroot.check(root / "sysroot", ctx.env)
    log(
        f"device bundle: gRPC/protobuf sysroot {dict(found.versions)} (Debian {tc.suite}); "
        f"libdir fixed in {len(fixed)} .pc files"
    )
    return {
        "dir": "sysroot",
        "toolchain": tc.name,
        "version": tc.version,
        "suite": tc.suite,
        "manifest_digest": tc.digest,
        "packages": [f"{f.package}={f.version}" for f in tc.files],
        "pc_libdir_fixed": fixed,
        "pkg_config": dict(found.versions),
    }


def _archive(out: Path, options: Options, log: Callable[[str], None]) -> tuple[Path, ...]:
    tar_path = out.with_name(f"{out.name}.tar")
    log(f"device bundle: archiving into {tar_path}")
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(out, arcname=out.name)
    path = tar_path
    if options.archive == "xz":
        proc.run(["xz", "-T0", "-6", "-f", str(tar_path)])  # xz -T0: every core, GNU tar's -J is one
        path = tar_path.with_name(tar_path.name + ".xz")
    if options.split_mib is None:
        return (path,)
    return split(path, options.split_mib << 20)


def split(path: Path, part_bytes: int) -> tuple[Path, ...]:
    """Cut ``path`` into ``path.partNNN`` files (``cat`` joins them) and write ``path.sha256``."""
    if part_bytes < 1 << 20:
        raise ConfigurationError("--split-mib must be at least 1")
    parts = []
    with open(path, "rb") as src:
        while chunk := src.read(part_bytes):
            part = path.with_name(f"{path.name}.part{len(parts):03d}")
            part.write_bytes(chunk)
            parts.append(part)
    lines = [f"{sha256_file(p)}  {p.name}\n" for p in parts]
    lines.append(f"{sha256_file(path)}  {path.name}\n")
    path.with_name(f"{path.name}.sha256").write_text("".join(lines), encoding="utf-8")
    path.unlink()
    return tuple(parts)


def describe(bundle: Bundle) -> Sequence[str]:
    doc = bundle.manifest
    lines = [
        f"device bundle: {bundle.path} ({doc['total_bytes'] >> 20} MiB, {len(doc['files'])} files, "
        f"{bundle.seconds:.1f} s)"
    ]
    lines += [f"device bundle: archive {p} ({p.stat().st_size >> 20} MiB)" for p in bundle.archive]
    lines.append(f"device bundle: on the device: bash {bundle.path.name}/{doc['script']} --out OUT")
    return lines
