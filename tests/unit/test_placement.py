"""The placement file (schema, addresses, ranges, the recipe it serves) and the identity comparison a
worker's Info must pass before it is trusted: every mismatching field is exit 2 with a line naming it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from certify import attach
from certify.verdict import Status
from core.errors import ConfigurationError
from manifests import placement_file as pfile
from manifests import recipe_model as recipes
from pipeline import worker_identity as wi
from worker.client import Memory, StageInfo

RECIPE = recipes.load("tiny-llama", {})
A, B, C, D = "10.0.0.1:7001", "10.0.0.2:7001", "[fd00::3]:7001", "gpu-4.rack.example:7001"


def doc(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "schema_version": 1,
        "recipe": "tiny-llama",
        "placements": {
            "mono": {"stages": [{"address": A, "layers": [0, 12]}]},
            "three-first-middle": {
                "stages": [
                    {"address": B, "layers": [0, 1]},
                    {"address": C, "layers": [1, 6]},
                    {"address": D, "layers": [6, 12]},
                ]
            },
        },
    }
    base.update(over)
    return base


def write(tmp: Path, data: dict[str, Any]) -> Path:
    path = tmp / "placement.json"
    path.write_text(json.dumps(data))
    return path


def load(tmp: Path, data: dict[str, Any]) -> pfile.PlacementFile:
    return pfile.load_file(write(tmp, data))


# The file --------------------------------------------------------------------------------------------
def test_a_good_file_loads_and_restricts_the_recipe(tmp_path: Path) -> None:
    pf = load(tmp_path, doc(driver={"sink_host": "10.0.0.9"}, lane="cpu"))
    assert pf.placements["three-first-middle"][1] == pfile.AttachedStage(address=C, layers=(1, 6))
    assert pf.sink_host == "10.0.0.9" and len(pf.sha256) == 64
    recipe, skipped = attach.restrict(pf, RECIPE, "cpu", cross_lane=False)
    assert set(recipe.placements) == {"mono", "three-first-middle"} and recipe.digest == RECIPE.digest
    assert {r.name for r in skipped} == {f"placement/{n}" for n in RECIPE.placements} - {
        "placement/mono",
        "placement/three-first-middle",
    }
    assert all(r.status is Status.SKIPPED and "not listed in the placement file" in r.reason for r in skipped)


def test_pins_and_the_drivers_tls_folder_are_read(tmp_path: Path) -> None:
    pin = "sha256:" + "ab" * 32
    data = doc(driver={"tls": "ca/hosts/driver"})
    data["placements"]["mono"]["stages"][0]["fingerprint"] = pin
    got = load(tmp_path, data)
    assert got.placements["mono"][0].fingerprint == pin
    assert got.placements["three-first-middle"][0].fingerprint is None
    assert got.driver_tls == tmp_path / "ca" / "hosts" / "driver"  # relative to the file
    assert load(tmp_path, doc()).driver_tls is None


@pytest.mark.parametrize(
    "pin", ["ab" * 32, "sha256:" + "AB" * 32, "sha256:" + "ab" * 31, "sha1:" + "ab" * 20]
)
def test_a_malformed_pin_is_refused_with_its_pointer(tmp_path: Path, pin: str) -> None:
    data = doc()
    data["placements"]["mono"]["stages"][0]["fingerprint"] = pin
    with pytest.raises(ConfigurationError) as err:
        load(tmp_path, data)
    assert err.value.exit_code == 2 and "/placements/mono/stages/0/fingerprint" in err.value.message


@pytest.mark.parametrize(
    ("address", "words"),
    [
        ("10.0.0.1", "is not host:port"),
        ("10.0.0.1:0", "port in 1-65535"),
        ("10.0.0.1:70000", "port in 1-65535"),
        ("10.0.0.1:http", "is not host:port"),
        ("fd00::1:7001", "IPv6 host in brackets"),
        ("0.0.0.0:7001", "unspecified address"),
        ("bad_host:7001", "not an IP address or host name"),
        ("10.0.0.300:7001", "not an IP address or host name"),
        ("[nonsense]:7001", "not an IP address or host name"),
    ],
)
def test_a_bad_address_is_refused_with_its_pointer(tmp_path: Path, address: str, words: str) -> None:
    data = doc()
    data["placements"]["mono"]["stages"][0]["address"] = address
    with pytest.raises(ConfigurationError, match=words) as err:
        load(tmp_path, data)
    assert err.value.exit_code == 2 and "/placements/mono/stages/0/address" in err.value.message


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (
            lambda d: d.update(placments=d.pop("placements")),
            "unknown key 'placments' (did you mean 'placements'?)",
        ),
        (
            lambda d: d["placements"]["mono"]["stages"][0].update(adress=A),
            "unknown key 'adress' (did you mean 'address'?)",
        ),
        (lambda d: d.update(driver={"sink": "x"}), "unknown key 'sink' (did you mean 'sink_host'?)"),
    ],
)
def test_unknown_keys_are_named_with_a_hint(tmp_path: Path, mutate: Any, words: str) -> None:
    data = doc()
    mutate(data)
    with pytest.raises(ConfigurationError) as err:
        load(tmp_path, data)
    assert words in err.value.message


@pytest.mark.parametrize(
    ("ranges", "words"),
    [
        ([[0, 1], [2, 6], [6, 12]], "/stages/1/layers: [2, 6] does not continue"),  # a gap
        ([[0, 2], [1, 6], [6, 12]], "/stages/1/layers: [1, 6] does not continue"),  # an overlap
        ([[1, 2], [2, 6], [6, 12]], "/stages/0/layers: [1, 2] does not continue"),  # not from layer 0
        ([[0, 1], [1, 1], [1, 12]], "/stages/1/layers: [1, 1]"),  # empty
    ],
)
def test_ranges_must_tile(tmp_path: Path, ranges: list[list[int]], words: str) -> None:
    data = doc()
    for stage, r in zip(data["placements"]["three-first-middle"]["stages"], ranges, strict=True):
        stage["layers"] = r
    with pytest.raises(ConfigurationError) as err:
        load(tmp_path, data)
    assert words in err.value.message


def test_one_worker_is_one_stage_and_one_range(tmp_path: Path) -> None:
    data = doc()
    data["placements"]["three-first-middle"]["stages"][2]["address"] = B
    with pytest.raises(ConfigurationError, match="is also stage 0; one worker is one stage"):
        load(tmp_path, data)
    data = doc()
    data["placements"]["two-middle"] = {
        "stages": [{"address": A, "layers": [0, 6]}, {"address": D, "layers": [6, 12]}]
    }
    with pytest.raises(ConfigurationError, match=r"owns layers \[0, 12\] in mono but \[0, 6\] in two-middle"):
        load(tmp_path, data)
    # The same worker may serve two placements that give it the same range (two-middle and its f16 twin).
    data["placements"]["two-middle"]["stages"][0]["address"] = "10.0.0.5:7001"
    data["placements"]["two-middle-f16"] = data["placements"]["two-middle"]
    pf = load(tmp_path, data)
    assert pf.placements["two-middle"] == pf.placements["two-middle-f16"]


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (lambda d: d.update(recipe="tiny-v4"), "the file is for recipe 'tiny-v4', not 'tiny-llama'"),
        (lambda d: d.update(lane="cuda"), "the file's workers run lane cuda, not --lane cpu"),
        (
            lambda d: d["placements"].update(two_midle={"stages": [{"address": "h:1", "layers": [0, 12]}]}),
            "no placement 'two_midle' (did you mean 'two-middle'?)",
        ),
        (
            lambda d: d["placements"].update(
                {
                    "two-middle": {
                        "stages": [
                            {"address": "h:1", "layers": [0, 5]},
                            {"address": "h:2", "layers": [5, 12]},
                        ]
                    }
                }
            ),
            "layers [[0, 5], [5, 12]] are not the recipe's [[0, 6], [6, 12]]",
        ),
        (lambda d: d["placements"].pop("mono"), "mono must be listed"),
        (lambda d: d["placements"].pop("three-first-middle"), "three-first-middle must be listed"),
    ],
)
def test_the_file_must_fit_the_recipe(tmp_path: Path, mutate: Any, words: str) -> None:
    data = doc()
    mutate(data)
    with pytest.raises(ConfigurationError) as err:
        attach.restrict(load(tmp_path, data), RECIPE, "cpu", cross_lane=False)
    assert words in err.value.message and err.value.exit_code == 2


def test_a_cross_lane_class_needs_reference_workers(tmp_path: Path) -> None:
    pf = load(tmp_path, doc())
    with pytest.raises(ConfigurationError, match='list its workers under "reference"'):
        attach.restrict(pf, RECIPE, "vulkan", cross_lane=True)
    pf = load(tmp_path, doc(reference={"stages": [{"address": "10.0.0.8:7001", "layers": [0, 12]}]}))
    recipe, _ = attach.restrict(pf, RECIPE, "vulkan", cross_lane=True)
    assert pf.reference == (pfile.AttachedStage(address="10.0.0.8:7001", layers=(0, 12)),)


# Identity --------------------------------------------------------------------------------------------
IDENTITY = {
    "source": {
        "commit": "4df29be4f4c3673f428170fda944a5b19f743bb8",
        "tree": "5664c498dbf10292801ec319c7d677ec73c562d9",
    },
    "patches": {"digest": "d8658658a2b8dd113d02b005409ca01ea1287a03"},
    "build": {"key": "b" * 64, "lane": "cpu"},
    "artifacts": {"set": "tiny-llama", "variant": "f32", "manifest_digest": "a" * 64},
}


def info(identity: Any, **over: Any) -> StageInfo:
    fields: dict[str, Any] = {
        "worker_version": "0.1.0",
        "llama_commit": IDENTITY["source"]["commit"],
        "lane": "cpu",
        "backend_devices": "CPU",
        "model_path": "/models/m.gguf",
        "architecture": "llama",
        "n_layer": 12,
        "layer_begin": 6,
        "layer_end": 12,
        "first_stage": False,
        "last_stage": True,
        "n_embd": 256,
        "boundary_width": 256,
        "needs_token_sideband": False,
        "n_vocab": 32000,
        "n_ctx": 256,
        "n_threads": 2,
        "n_batch": 256,
        "memory": Memory(
            weight_bytes=1, kv_bytes=1, compute_bytes=1, has_token_embedding=False, has_output_head=True
        ),
        "identity_json": identity if isinstance(identity, str) else json.dumps(identity),
    }
    fields.update(over)
    return StageInfo(**fields)


WANT = wi.Expect(
    identity=wi.stable_identity(RECIPE, "cpu", IDENTITY),
    placement="two-middle",
    stage=1,
    n_stages=2,
    layers=(6, 12),
    architecture="llama",
    n_layer=12,
    n_embd=256,
    n_vocab=32000,
    min_ctx=256,
)


def test_the_stable_identity_has_no_run_id_and_records_the_build() -> None:
    doc = wi.stable_identity(RECIPE, "cpu", {**IDENTITY, "run_id": "x"})
    assert "run_id" not in json.dumps(doc) and doc["build"] == {"lane": "cpu", "key": "b" * 64}
    assert (
        doc["recipe"] == {"name": "tiny-llama", "digest": RECIPE.digest} and len(doc["worker_source"]) == 64
    )


def test_a_matching_worker_passes_and_its_build_key_may_differ() -> None:
    theirs = {**WANT.identity, "build": {"lane": "cpu", "key": "c" * 64}}  # built on another host
    wi.check_worker(info(theirs), WANT, B)
    assert wi.mismatches(info(theirs), WANT) == []


def _mutated(path: str, value: Any) -> dict[str, Any]:
    doc = json.loads(json.dumps(WANT.identity))
    *head, last = path.split(".")
    node = doc
    for part in head:
        node = node[part]
    node[last] = value
    return doc


@pytest.mark.parametrize(
    ("field", "identity", "over", "expected", "got"),
    [
        (
            "identity.artifacts.manifest_digest",
            _mutated("artifacts.manifest_digest", "f" * 64),
            {},
            "aaaaaaaaaaaaaaaa…",
            "ffffffffffffffff…",
        ),
        ("identity.artifacts.set", _mutated("artifacts.set", "tiny-v4"), {}, "tiny-llama", "tiny-v4"),
        ("identity.artifacts.variant", _mutated("artifacts.variant", "q8"), {}, "f32", "q8"),
        (
            "identity.source.commit",
            _mutated("source.commit", "1" * 40),
            {},
            "4df29be4f4c3673f…",
            "1111111111111111…",
        ),
        (
            "identity.source.tree",
            _mutated("source.tree", "2" * 40),
            {},
            "5664c498dbf10292…",
            "2222222222222222…",
        ),
        (
            "identity.patches.digest",
            _mutated("patches.digest", "3" * 40),
            {},
            "d8658658a2b8dd11…",
            "3333333333333333…",
        ),
        (
            "identity.recipe.digest",
            _mutated("recipe.digest", "4" * 64),
            {},
            RECIPE.digest[:16] + "…",
            "4444444444444444…",
        ),
        (
            "identity.recipe.name",
            _mutated("recipe.name", "gemma3-270m-q4"),
            {},
            "tiny-llama",
            "gemma3-270m-q4",
        ),
        ("identity.lane", _mutated("lane", "cuda"), {}, "cpu", "cuda"),
        (
            "identity.worker_source",
            _mutated("worker_source", "5" * 64),
            {},
            WANT.identity["worker_source"][:16] + "…",
            "5555555555555555…",
        ),
        ("identity.kind", _mutated("kind", "other"), {}, "dgr.worker-identity", "other"),
        ("identity", "", {}, "a dgr.worker-identity document (dgr certify --write-identity)", "none"),
        ("identity", "{not json", {}, "a dgr.worker-identity document", "not a JSON object"),
        ("lane", None, {"lane": "vulkan"}, "cpu", "vulkan"),
        ("llama_commit", None, {"llama_commit": "9" * 40}, "4df29be4f4c3673f…", "9999999999999999…"),
        ("architecture", None, {"architecture": "deepseek4"}, "llama", "deepseek4"),
        ("n_layer", None, {"n_layer": 43}, "12", "43"),
        ("n_embd", None, {"n_embd": 512}, "256", "512"),
        ("n_vocab", None, {"n_vocab": 129280}, "32000", "129280"),
        ("layers", None, {"layer_begin": 5}, "6:12", "5:12"),
        ("layers", None, {"layer_end": 11, "last_stage": False}, "6:12", "6:11"),
        ("first_stage", None, {"first_stage": True}, "false", "true"),
        ("last_stage", None, {"last_stage": False}, "true", "false"),
        ("n_ctx", None, {"n_ctx": 128}, ">= 256", "128"),
    ],
)
def test_each_mismatching_field_is_exit_2_naming_it(
    field: str, identity: Any, over: dict[str, Any], expected: str, got: str
) -> None:
    theirs = WANT.identity if identity is None else identity
    with pytest.raises(ConfigurationError) as err:
        wi.check_worker(info(theirs, **over), WANT, B)
    line = err.value.one_line()
    assert err.value.exit_code == 2 and "\n" not in line
    assert f"attached worker {B} (placement two-middle, stage 1) does not match the recipe: " in line
    assert f"{field}: expected {expected}" in line and f"got {got}" in line


def test_every_mismatch_is_listed_after_the_first() -> None:
    with pytest.raises(ConfigurationError) as err:
        wi.check_worker(info(WANT.identity, architecture="gemma3", n_layer=18, n_embd=640), WANT, B)
    assert "architecture: expected llama, got gemma3 (also: n_layer, n_embd)" in err.value.message


def test_the_model_shape_comes_from_the_gguf_header(tmp_path: Path) -> None:
    from tests.unit import ggufmaker as g

    path = tmp_path / "m.gguf"
    kvs = [
        g.kv("general.architecture", g.STRING, "llama"),
        g.kv("llama.embedding_length", g.U32, 64),
        g.kv_string_array("tokenizer.ggml.tokens", ["a", "b", "c"]),
    ]
    path.write_bytes(g.gguf_bytes(kvs, [("token_embd.weight", 8)]))
    assert wi.model_shape(path) == {"n_embd": 64, "n_vocab": 3}


def test_expect_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        WANT.stage = 0  # type: ignore[misc]
