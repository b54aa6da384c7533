"""Artifact-set manifests: schema, unsafe names (RELIABILITY 13), unsealed sets, deterministic sealing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main
from core.context import Context
from core.errors import ConfigurationError, IntegrityError
from fetch.provision import provision
from fetch.seal import hash_file, seal
from manifests.artifact_sets import check_file_name, load_set, parse_set
from tests.unit.ggufmaker import split_set, write_set


def minimal(files: list[dict[str, object]], **extra: object) -> dict[str, object]:
    return {
        "schema_version": 1,
        "name": "t",
        "description": "",
        "storage": "any",
        "origins": [{"kind": "local", "path": "/nowhere"}],
        "default_variant": "v",
        "variants": {
            "v": {
                "chunk_size": 65536,
                "chunk_digest": "blake3",
                "gguf": {"architecture": "llama", "block_count": 1},
                "files": files,
            }
        },
        **extra,
    }


BAD_NAMES = [
    "../x.gguf",
    "a/../b.gguf",
    "/etc/passwd",
    "C:\\x.gguf",
    "C:x.gguf",
    "\\\\server\\share\\x",
    "a\\b.gguf",
    "a\x00b.gguf",
    "a\nb.gguf",
    "a\x7fb",
    ".hidden.gguf",
    "a//b.gguf",
    "./a.gguf",
    "",
    "a b.gguf",
    "é.gguf",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_unsafe_names_rejected_on_load(name: str) -> None:
    with pytest.raises(IntegrityError, match="artifact file name"):
        parse_set(minimal([{"name": name}]), source="test")


@pytest.mark.parametrize("name", ["m-00001-of-00003.gguf", "sub/dir/m.gguf", "Q4_K_M+x.gguf"])
def test_safe_names_accepted(name: str) -> None:
    assert check_file_name(name) == name
    assert parse_set(minimal([{"name": name}]), source="test").variant(None).files[0].name == name


def test_unknown_key_named_with_hint() -> None:
    data = minimal([{"name": "a.gguf"}], storaeg="any")
    with pytest.raises(ConfigurationError, match="unknown key 'storaeg'"):
        parse_set(data, source="test")


def test_partial_digests_rejected() -> None:
    with pytest.raises(ConfigurationError, match="sha256"):
        parse_set(
            minimal([{"name": "a.gguf", "size": 3, "blake3": "0" * 64, "chunks": ["0" * 64]}]), source="t"
        )


def test_chunk_count_must_match_size() -> None:
    entry = {"name": "a.gguf", "size": 65537, "sha256": "0" * 64, "blake3": "0" * 64, "chunks": ["0" * 64]}
    with pytest.raises(ConfigurationError, match="1 chunk digests for 65537 bytes"):
        parse_set(minimal([entry]), source="t")


def test_case_insensitive_duplicate_names_rejected() -> None:
    with pytest.raises(IntegrityError, match="twice"):
        parse_set(minimal([{"name": "A.gguf"}, {"name": "a.gguf"}]), source="t")


def test_shipped_sets_load() -> None:
    tiny = load_set("tiny-llama")
    assert tiny.variant("f32").sealed and tiny.variant("q8_0").sealed
    assert [f.name for f in tiny.variant("f32").files] == [
        f"tiny-llama-f32-0000{i}-of-00003.gguf" for i in (1, 2, 3)
    ]
    real = load_set("deepseek-v4-flash-q4")
    assert real.storage == "mounted" and not real.variant("Q4_K_M").sealed
    assert real.variant(None).gguf.block_count == 43


def test_unsealed_set_refused_naming_the_set_and_how_to_seal(ctx: Context, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as err:
        provision(ctx, "deepseek-v4-flash-q4", store=tmp_path / "store")
    assert err.value.exit_code == 2
    assert "'deepseek-v4-flash-q4' variant 'Q4_K_M' is not sealed" in err.value.message
    assert "dgr seal --artifacts deepseek-v4-flash-q4 --from DIR" in (err.value.hint or "")
    assert not (tmp_path / "store").exists()


def test_unknown_set_is_a_configuration_error(ctx: Context, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="unknown artifact set 'nope'"):
        provision(ctx, "nope", store=tmp_path)


def test_cli_exit_codes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DGR_WORK", str(tmp_path / "work"))
    assert main(["provision", "--artifacts", "nope", "--store", str(tmp_path / "s")]) == 2
    assert main(["provision", "--recipe", "v4-q4", "--store", str(tmp_path / "s")]) == 2
    assert "dgr seal --artifacts deepseek-v4-flash-q4" in capsys.readouterr().err


def test_seal_writes_real_digests_and_is_deterministic(tmp_path: Path) -> None:
    blobs = split_set(3, [20000, 30000, 10000])
    write_set(
        tmp_path / "src",
        tmp_path / "m",
        "s",
        blobs,
        chunk_size=65536,
        origins=[{"kind": "local", "path": "/x"}],
    )
    path = tmp_path / "m" / "s.json"
    data = json.loads(path.read_text())
    v = data["variants"]["v"]
    v["files"] = [{"name": f["name"]} for f in v["files"]]
    del v["gguf"]["split_count"], v["gguf"]["tensor_counts"]
    path.write_text(json.dumps(data))
    seal("s", tmp_path / "src", root=tmp_path / "m")
    first = path.read_bytes()
    seal("s", tmp_path / "src", root=tmp_path / "m")
    assert path.read_bytes() == first
    sealed = load_set("s", root=tmp_path / "m").variant(None)
    assert sealed.sealed and sealed.gguf.split_count == 3 and sealed.gguf.tensor_counts == (1, 1, 1)
    for f in sealed.files:
        real = hash_file(tmp_path / "src" / f.name, 65536)
        assert (f.size, f.sha256, f.blake3, list(f.chunks or ())) == (
            real["size"],
            real["sha256"],
            real["blake3"],
            real["chunks"],
        )


def test_seal_refuses_headers_that_contradict_the_manifest(tmp_path: Path) -> None:
    blobs = split_set(2, [20000, 10000], arch="qwen2")
    write_set(
        tmp_path / "src",
        tmp_path / "m",
        "s",
        blobs,
        chunk_size=65536,
        origins=[{"kind": "local", "path": "/x"}],
    )
    with pytest.raises(IntegrityError, match="architecture 'qwen2', the manifest expects 'llama'"):
        seal("s", tmp_path / "src", root=tmp_path / "m")
