"""Issue 20 items 2 and 4: one bounded JSON reader for every file the tool reads.

Deep nesting, oversize files, duplicate keys, NaN / Infinity and numbers that overflow to infinity are
refused with one line (exit 2 for configuration, 3 for certificates), through the real command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.canonical import BadJson, BadSignedJson, BadText, parse_json, read_json, read_text
from core.errors import ConfigurationError, IntegrityError
from core.workspace import PROJECT_ROOT

DEEP = "[" * 1000 + "]" * 1000  # 2 KB; plain json.loads raises RecursionError on it

HOSTILE = {
    "deep": DEEP,
    "deep-object": '{"a":' * 500 + "1" + "}" * 500,
    "duplicate": '{"name": "x", "name": "y"}',
    "nan": '{"x": NaN}',
    "infinity": '{"x": Infinity}',
    "minus-infinity": '{"x": -Infinity}',
    "overflow": '{"x": 1e999}',
    "long-int": '{"x": ' + "9" * 5000 + "}",
    "not-utf8": b'{"x": "\xff"}',
    "encoded-surrogate": b'{"x": "\xed\xb2\x80"}',  # UTF-8 forbids surrogates even when encoded
    "lone-surrogate": '{"x": "\\udc80"}',  # a \u escape naming half a character
    "lone-surrogate-key": '{"a": [{"\\ud800": 1}]}',
    "truncated": '{"x": [1, 2',
}


def _dgr(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "certify", *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    import os

    e = {k: v for k, v in os.environ.items() if not k.startswith(("DGR_", "GIT_"))}
    e.update(DGR_WORK=str(tmp_path / "work"), DGR_CACHE=str(tmp_path / "cache"))
    return e


def _one_line(done: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert done.returncode == code, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_bounded_reader_refuses_with_a_typed_error(case: str, tmp_path: Path) -> None:
    data = HOSTILE[case]
    path = tmp_path / "x.json"
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    with pytest.raises(BadJson) as caught:
        read_json(path)
    assert isinstance(caught.value, ConfigurationError) and isinstance(caught.value, ValueError)
    assert str(path) in caught.value.message
    with pytest.raises(BadSignedJson) as signed:
        parse_json(data, source="the payload", signed=True)
    assert isinstance(signed.value, IntegrityError) and signed.value.exit_code == 3


def test_reader_names_the_duplicate_key_and_the_limits(tmp_path: Path) -> None:
    with pytest.raises(BadJson, match="duplicate key 'name'"):
        parse_json(HOSTILE["duplicate"], source="r.json")
    with pytest.raises(BadJson, match="nested deeper than 64"):
        parse_json(DEEP, source="r.json")
    with pytest.raises(BadJson, match="larger than 100 bytes"):
        parse_json("[" + "1," * 100 + "1]", source="r.json", max_bytes=100)
    big = tmp_path / "big.json"
    big.write_text(json.dumps(["x" * 1000] * 10))
    with pytest.raises(BadJson, match="larger than"):
        read_json(big, max_bytes=5000)
    # what we write ourselves still reads back, a surrogate pair (one character) included
    assert parse_json('{"a": [1, 2.5, {"b": null, "c": "[{\\ud83d\\ude00"}]}', source="ok") == {
        "a": [1, 2.5, {"b": None, "c": "[{\U0001f600"}]
    }
    with pytest.raises(BadJson, match=r"lone surrogate '\\udc80' at /a/0/b"):
        parse_json('{"a": [{"b": "x\\udc80"}]}', source="r.json")


@pytest.mark.parametrize("case", ["deep", "duplicate", "nan"])
def test_recipe_file_is_refused_before_anything_runs(env: dict[str, str], tmp_path: Path, case: str) -> None:
    recipe = tmp_path / "r.json"
    recipe.write_text(HOSTILE[case])
    done = _dgr(env, "certify", "--recipe-file", str(recipe))
    _one_line(done, 2, str(recipe))
    assert not (tmp_path / "work" / "build").exists()


def test_recipe_with_infinite_threshold_or_duplicate_key_exits_2_naming_it(
    env: dict[str, str], tmp_path: Path
) -> None:
    text = (PROJECT_ROOT / "manifests" / "recipes" / "tiny-llama.json").read_text()
    infinite = tmp_path / "inf.json"
    infinite.write_text(text.replace('"decode_tok_s_min":', '"decode_tok_s_min": Infinity, "_x":', 1))
    _one_line(_dgr(env, "certify", "--recipe-file", str(infinite)), 2, "Infinity")
    dup = tmp_path / "dup.json"
    dup.write_text(text.replace('"name":', '"name": "other", "name":', 1))
    _one_line(_dgr(env, "certify", "--recipe-file", str(dup)), 2, "duplicate key 'name'")


@pytest.mark.parametrize(
    "field, value",
    [("decode_tokens", 10**9), ("prompt_tokens", 10**9), ("repetitions", 10**9), ("warmup", 10**6)],
)
def test_unbounded_measure_numbers_are_refused_at_load(tmp_path: Path, field: str, value: int) -> None:
    from manifests import recipe_model as recipes

    doc = json.loads((recipes.RECIPES / "tiny-llama.json").read_text())
    doc["measure"][field] = value
    path = tmp_path / "tiny-llama.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigurationError, match=f"measure/{field}"):
        recipes.load_file(path)


def _tiny_llama_with(tmp_path: Path, old: str, new: str) -> Path:
    text = (PROJECT_ROOT / "manifests" / "recipes" / "tiny-llama.json").read_text()
    assert old in text
    path = tmp_path / "tiny-llama.json"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize(
    "old, new",
    [
        ('"description": "Embedded', '"description": "\\udc80 Embedded'),
        ('"mono": {', '"mono\\udc80": {'),
    ],
    ids=["in a string", "in a key"],
)
def test_a_lone_surrogate_in_a_recipe_exits_2_with_one_line(
    env: dict[str, str], tmp_path: Path, old: str, new: str
) -> None:
    """Once a UnicodeEncodeError traceback (exit 1) when the recipe's digest was taken."""
    path = _tiny_llama_with(tmp_path, old, new)
    _one_line(_dgr(env, "certify", "--recipe-file", str(path)), 2, str(path), "lone surrogate '\\udc80'")
    assert not (tmp_path / "work" / "build").exists()


def test_a_lone_surrogate_in_an_artifact_manifest_is_refused(tmp_path: Path) -> None:
    from manifests.artifact_sets import load_set

    text = (PROJECT_ROOT / "manifests" / "artifacts" / "tiny-llama.json").read_text()
    (tmp_path / "tiny-llama.json").write_text(text.replace('"description": "', '"description": "\\udc80', 1))
    with pytest.raises(ConfigurationError, match="lone surrogate '\\\\udc80' at /description"):
        load_set("tiny-llama", root=tmp_path)


@pytest.mark.parametrize(
    "old, new, pointer",
    [
        ('"n_decode": 32', '"n_decode": 32.0', "/n_decode"),
        ('"repetitions": 7', '"repetitions": 7.0', "/measure/repetitions"),
        ('"stages": [[0, 12]]', '"stages": [[0, 12.0]]', "/placements/mono/stages/0/1"),
    ],
)
def test_a_whole_number_float_where_a_recipe_says_integer_exits_2(
    env: dict[str, str], tmp_path: Path, old: str, new: str, pointer: str
) -> None:
    """jsonschema's "integer" takes 32.0, so the recipe loaded with floats: `dgr certify` built the lane
    and ran workers before a TypeError traceback.  `dgr matrix` loads the recipe and stops, so this
    test costs no build even when it fails."""
    path = _tiny_llama_with(tmp_path, old, new)
    done = _dgr(dict(env, DGR_RECIPES_DIR=str(path.parent)), "matrix", "--recipe", "tiny-llama")
    _one_line(done, 2, str(path), f"at {pointer}: ", "is not of type 'integer'")


@pytest.mark.parametrize(
    "old, new, pointer",
    [
        ('"chunk_size": 4194304', '"chunk_size": 4194304.0', "/variants/f32/chunk_size"),
        ('"size": 46085280', '"size": 46085280.0', "/variants/f32/files/0/size"),
        ('"block_count": 12', '"block_count": 12.0', "/variants/f32/gguf/block_count"),
    ],
)
def test_a_whole_number_float_where_an_artifact_manifest_says_integer_is_refused(
    tmp_path: Path, old: str, new: str, pointer: str
) -> None:
    from manifests.artifact_sets import load_set

    text = (PROJECT_ROOT / "manifests" / "artifacts" / "tiny-llama.json").read_text()
    assert old in text
    (tmp_path / "tiny-llama.json").write_text(text.replace(old, new, 1))
    with pytest.raises(ConfigurationError, match=f"at {pointer}: .* is not of type 'integer'") as caught:
        load_set("tiny-llama", root=tmp_path)
    assert caught.value.exit_code == 2


def test_placement_file_is_refused(env: dict[str, str], tmp_path: Path) -> None:
    placement = tmp_path / "p.json"
    placement.write_text(DEEP)
    from manifests import placement_file as placement_mod

    with pytest.raises(ConfigurationError, match="nested deeper"):
        placement_mod.load_file(placement)
    done = _dgr(env, "certify", "--placement-file", str(placement))
    _one_line(done, 2, str(placement))


def test_artifact_manifest_is_refused(tmp_path: Path) -> None:
    from manifests.artifact_sets import load_set

    (tmp_path / "evil.json").write_text(DEEP)
    with pytest.raises(ConfigurationError, match="nested deeper"):
        load_set("evil", root=tmp_path)
    (tmp_path / "dup.json").write_text('{"name": "dup", "name": "dup"}')
    with pytest.raises(ConfigurationError, match="duplicate key 'name'"):
        load_set("dup", root=tmp_path)


@pytest.mark.parametrize("case", ["deep", "duplicate", "not-utf8", "lone-surrogate"])
def test_verify_on_a_hostile_file_exits_3_with_one_line(
    env: dict[str, str], tmp_path: Path, case: str
) -> None:
    path = tmp_path / "certificate.json"
    data = HOSTILE[case]
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    _one_line(_dgr(env, "verify", str(path)), 3, str(path))


def test_verify_on_a_fifo_exits_3_with_one_line(env: dict[str, str], tmp_path: Path) -> None:
    """A FIFO with no writer: open() once waited forever (the subprocess timeout is only a guard)."""
    fifo = tmp_path / "certificate.json"
    os.mkfifo(fifo)
    _one_line(_dgr(env, "verify", str(fifo)), 3, str(fifo), "is not a regular file (a FIFO)")


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_the_readers_refuse_what_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    """Every file the tool reads is a regular file: a FIFO blocks, a device never ends (/dev/zero)."""
    path = {"fifo": tmp_path / "f", "directory": tmp_path, "device": Path("/dev/zero")}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    with pytest.raises(BadJson, match="is not a regular file"):
        read_json(path)
    with pytest.raises(BadSignedJson, match="is not a regular file"):
        read_json(path, signed=True)
    with pytest.raises(BadText, match="is not a regular file"):
        read_text(path)


def test_workspace_records_that_do_not_read_are_treated_as_absent(tmp_path: Path) -> None:
    """Records we wrote ourselves (sidecar, ledger, provenance) are rebuilt, not trusted, not a crash."""
    from fetch import ledger

    (tmp_path / ledger.SIDECAR).write_text(DEEP)
    assert ledger.read_sidecar(tmp_path, "m" * 64).files == {}


@pytest.mark.parametrize("case", ["deep", "duplicate", "nan", "overflow"])
def test_a_workers_identity_json_is_read_bounded(case: str) -> None:
    """A worker's Info.identity_json is the worker's own words: deep nesting (a RecursionError under
    plain json.loads) or a duplicate key is a mismatch the operator is told about, never a crash."""
    from pipeline import worker_identity as wi
    from tests.unit.test_placement import WANT, info

    found = dict((f, got) for f, _, got in wi.mismatches(info(HOSTILE[case]), WANT))
    assert found.get("identity") == "not a JSON object", found


@pytest.mark.parametrize("case", ["deep", "duplicate", "nan", "not-utf8", "lone-surrogate"])
def test_the_probe_report_is_read_bounded(case: str) -> None:
    """dgr-topk-probe's report goes through the bounded reader: refused as RuntimeFailure (exit 6)."""
    from core.errors import RuntimeFailure
    from fetch.conditioning import parse_report

    with pytest.raises(RuntimeFailure, match="wrote no valid JSON"):
        parse_report(HOSTILE[case])
