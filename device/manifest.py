"""The bundle's manifest: size, sha256 and mode of every file, and the target of every link, below it.

Written last by ``device.bundle``, checked first on the device (``python -m device verify``) before
anything in the bundle is trusted, so a truncated or altered copy stops the run with one line per
problem.  Standard library only (plus core.canonical, itself standard library only): on the device
it runs before any wheel is installed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.canonical import read_json, sha256_file, write_json
from core.errors import ConfigurationError, IntegrityError

MANIFEST = "BUNDLE.json"
KIND = "dgr.device-bundle"
SCHEMA_VERSION = 1


def inventory(root: Path) -> dict[str, dict[str, Any]]:
    """relative path -> {size, sha256, executable} for files, {link} for symbolic links."""
    entries: dict[str, dict[str, Any]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        here = Path(dirpath)
        # os.walk lists a link to a directory among dirnames and does not descend into it
        for name in sorted(filenames) + [d for d in dirnames if (here / d).is_symlink()]:
            path = here / name
            rel = path.relative_to(root).as_posix()
            if rel == MANIFEST:
                continue
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                entries[rel] = {"link": os.readlink(path)}
            elif stat.S_ISREG(st.st_mode):
                entries[rel] = {
                    "size": st.st_size,
                    "sha256": sha256_file(path),
                    "executable": bool(st.st_mode & stat.S_IXUSR),
                }
            else:
                raise IntegrityError(f"{path} is neither a file, a directory nor a link: not bundled")
    return entries


def write(root: Path, meta: Mapping[str, Any]) -> dict[str, Any]:
    files = inventory(root)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        **dict(meta),
        "total_bytes": sum(e.get("size", 0) for e in files.values()),
        "files": files,
    }
    write_json(root / MANIFEST, doc)
    return doc


def load(root: Path) -> dict[str, Any]:
    path = root / MANIFEST
    if not path.is_file():
        raise ConfigurationError(
            f"{root} has no {MANIFEST}: it is not a device bundle",
            hint="make one with `nox -s device-bundle` (docs/device.md)",
        )
    doc = read_json(path)
    if doc.get("kind") != KIND or doc.get("schema_version") != SCHEMA_VERSION:
        raise ConfigurationError(
            f"{path} is not a schema {SCHEMA_VERSION} device bundle manifest "
            f"(kind {doc.get('kind')!r}, schema {doc.get('schema_version')!r})",
            hint="make the bundle again with this checkout's `nox -s device-bundle`",
        )
    return doc


def problems(root: Path, doc: Mapping[str, Any] | None = None) -> list[str]:
    """Every way the bundle on disk differs from its manifest; empty when it is intact."""
    doc = doc if doc is not None else load(root)
    want: Mapping[str, Mapping[str, Any]] = doc["files"]
    have = inventory(root)
    out = [f"missing: {rel}" for rel in sorted(set(want) - set(have))]
    out += [f"not in the manifest: {rel}" for rel in sorted(set(have) - set(want))]
    for rel in sorted(set(want) & set(have)):
        w, h = want[rel], have[rel]
        if "link" in w or "link" in h:
            if w.get("link") != h.get("link"):
                out.append(f"link changed: {rel} -> {h.get('link')} (manifest: {w.get('link')})")
        elif w["size"] != h["size"]:
            out.append(f"size changed: {rel} has {h['size']} bytes, the manifest says {w['size']}")
        elif w["sha256"] != h["sha256"]:
            out.append(f"content changed: {rel} sha256 {h['sha256'][:16]}…, manifest {w['sha256'][:16]}…")
        elif w["executable"] != h["executable"]:
            out.append(f"mode changed: {rel} executable={h['executable']}, manifest {w['executable']}")
    return out


def verify(root: Path) -> dict[str, Any]:
    """The manifest of an intact bundle; IntegrityError naming the first problems otherwise."""
    doc = load(root)
    found = problems(root, doc)
    if found:
        shown = "; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
        raise IntegrityError(
            f"the bundle at {root} does not match its manifest: {shown}",
            hint="copy the bundle again (a transfer may have been cut short)",
        )
    return doc
