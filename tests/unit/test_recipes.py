"""Recipes: load, identity, and refusal of bad ones with a pointer to the key (RELIABILITY 22)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigurationError
from core.workspace import PROJECT_ROOT
from manifests import recipe_model as recipes


def _doc(name: str = "tiny-llama") -> dict[str, Any]:
    return json.loads((recipes.RECIPES / f"{name}.json").read_text())


def _write(tmp: Path, doc: dict[str, Any], name: str | None = None) -> Path:
    path = tmp / f"{name or doc['name']}.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("name", ["tiny-llama", "v4-q4"])
def test_shipped_recipes_load(name: str) -> None:
    r = recipes.load(name, {})
    assert r.name == name and len(r.digest) == 64 and r.mtp is False
    assert r.monolithic.stages == ((0, r.n_layer),)
    counts = {p.n_stages for p in r.staged}
    # Certification scenarios: 2, 3 and 4 stages, and a 10+ stage layout.
    assert {2, 3, 4} <= counts and max(counts) >= 10
    cuts = {c for p in r.staged for c in p.cuts}
    assert {1, r.n_layer - 1} <= cuts and cuts & {r.n_layer // 2, (r.n_layer + 1) // 2}


def test_default_recipe_is_tiny_llama_on_cpu() -> None:
    r = recipes.load(recipes.DEFAULT_RECIPE, {})
    assert r.name == "tiny-llama" and "cpu" in r.lanes
    assert r.hardware_class("cpu", 2).name == "cpu-ci"
    assert r.measure.repetitions >= 5


def test_v4_q4_names_its_set_and_classes() -> None:
    r = recipes.load("v4-q4", {})
    assert r.artifacts == "deepseek-v4-flash-q4" and r.architecture == "deepseek4" and r.n_layer == 43
    assert r.hardware_class("cuda", 16, ("NVIDIA H200",)).name == "h200"
    assert r.hardware_class("cuda", 16, ("NVIDIA H100 80GB HBM3",)).name == "h100"
    with pytest.raises(ConfigurationError, match="no hardware class matches lane cuda"):
        r.hardware_class("cuda", 16, ("NVIDIA GeForce GTX 1080",))
    assert {p.boundary_dtype for p in r.placements.values()} >= {"f16"}


def test_digest_is_canonical_and_follows_thresholds(tmp_path: Path) -> None:
    doc = _doc()
    a = recipes.load_file(_write(tmp_path, doc))
    # Same content, other formatting and key order: same identity.
    (tmp_path / "b").mkdir()
    pretty = tmp_path / "b" / "tiny-llama.json"
    pretty.write_text(json.dumps(dict(reversed(list(doc.items()))), indent=4))
    assert recipes.load_file(pretty).digest == a.digest
    doc["hardware_classes"][0]["staging_parity"]["kl_mean_max"] = 2e-9
    (tmp_path / "c").mkdir()
    assert recipes.load_file(_write(tmp_path / "c", doc)).digest != a.digest


def test_unknown_key_names_key_and_typo(tmp_path: Path) -> None:
    doc = _doc()
    limits = doc["hardware_classes"][0]["staging_parity"]
    limits["kl_mean_maxx"] = limits.pop("kl_mean_max")
    with pytest.raises(ConfigurationError) as err:
        recipes.load_file(_write(tmp_path, doc))
    text = err.value.message
    assert (
        "/hardware_classes/0/staging_parity" in text
        and "'kl_mean_maxx'" in text
        and "did you mean 'kl_mean_max'" in text
    )


def test_unknown_top_level_key(tmp_path: Path) -> None:
    doc = _doc()
    doc["n_decod"] = 4
    with pytest.raises(ConfigurationError, match=r"unknown key 'n_decod' \(did you mean 'n_decode'\?\)"):
        recipes.load_file(_write(tmp_path, doc))


def test_mtp_on_is_refused_with_its_key(tmp_path: Path) -> None:
    doc = _doc()
    doc["mtp"] = True
    with pytest.raises(ConfigurationError, match=r"at /mtp: multi-token prediction is off \(false\) unless"):
        recipes.load_file(_write(tmp_path, doc))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-v4", "v4-q4"])
def test_an_alpha_recipe_turning_mtp_on_is_refused_without_a_nextn_block(tmp_path: Path, name: str) -> None:
    doc = _doc(name)
    doc["mtp"] = {"draft_tokens": 3}
    with pytest.raises(ConfigurationError, match=r"at /mtp: artifact set \S+ \(\S+\) holds no nextn block"):
        recipes.load_file(_write(tmp_path, doc))


def test_the_mtp_recipe_turns_it_on_explicitly() -> None:
    r = recipes.load("tiny-v4-mtp", {})
    assert r.mtp == recipes.Mtp(draft_tokens=3) and r.artifacts == "tiny-v4-mtp"
    for name in ("tiny-llama", "tiny-llama-wan", "gemma3-270m-q4", "tiny-v4", "v4-q4"):
        assert recipes.load(name, {}).mtp is False, name


def test_the_mtp_file_recipes_name_the_block_s_own_set() -> None:
    """V4 Flash's block comes as an MTP-only file: the recipe names its set, the main set holds none."""
    for name, main, block in (
        ("v4-q4-mtp", "deepseek-v4-flash-q4", "deepseek-v4-flash-q4-mtp"),
        ("tiny-v4-mtp-file", "tiny-v4", "tiny-v4-mtp-only"),
    ):
        r = recipes.load(name, {})
        assert r.artifacts == main and r.mtp == recipes.Mtp(draft_tokens=3, artifacts=block), name


def test_an_mtp_set_without_a_nextn_block_is_refused_at_its_key(tmp_path: Path) -> None:
    doc = _doc("tiny-v4-mtp-file")
    doc["mtp"] = {"draft_tokens": 3, "artifacts": "tiny-v4"}
    expect = r"at /mtp/artifacts: artifact set tiny-v4 \(default variant\) holds no nextn block"
    with pytest.raises(ConfigurationError, match=expect):
        recipes.load_file(_write(tmp_path, doc))


@pytest.mark.parametrize(
    "bad",
    [
        {"draft_tokens": 0},
        {"draft_tokens": 9},
        {},
        {"draft_tokens": 3, "k": 1},
        {"draft_tokens": 3, "variant": "f32"},
    ],
)
def test_a_bad_mtp_section_is_refused_at_its_key(tmp_path: Path, bad: dict) -> None:
    doc = _doc("tiny-v4-mtp")
    doc["mtp"] = bad
    with pytest.raises(ConfigurationError, match=r"/mtp"):
        recipes.load_file(_write(tmp_path, doc))


def test_missing_threshold_is_named(tmp_path: Path) -> None:
    doc = _doc()
    del doc["hardware_classes"][0]["speed"]["decode_tok_s_min"]
    with pytest.raises(
        ConfigurationError, match=r"/hardware_classes/0/speed: 'decode_tok_s_min' is a required"
    ):
        recipes.load_file(_write(tmp_path, doc))


def test_repetitions_below_five_refused(tmp_path: Path) -> None:
    doc = _doc()
    doc["measure"]["repetitions"] = 3
    with pytest.raises(ConfigurationError, match=r"/measure/repetitions"):
        recipes.load_file(_write(tmp_path, doc))


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ([[0, 6], [7, 12]], r"/placements/bad/stages/1: stage starts at layer 7, expected 6"),
        ([[0, 6], [6, 11]], r"stages end at layer 11, the model has 12"),
        ([[0, 6], [6, 6], [6, 12]], r"/stages/1: stage starts|empty range"),
    ],
)
def test_placements_must_tile_the_layers(tmp_path: Path, stages: list[list[int]], message: str) -> None:
    doc = _doc()
    doc["placements"]["bad"] = {"stages": stages}
    with pytest.raises(ConfigurationError, match=message):
        recipes.load_file(_write(tmp_path, doc))


def test_exactly_one_monolithic_reference(tmp_path: Path) -> None:
    doc = _doc()
    doc["placements"]["mono2"] = {"stages": [[0, 12]]}
    with pytest.raises(ConfigurationError, match="exactly one single-stage"):
        recipes.load_file(_write(tmp_path, doc))


def test_f16_placement_needs_f16_limits(tmp_path: Path) -> None:
    doc = copy.deepcopy(_doc())
    del doc["hardware_classes"][0]["staging_parity_f16_boundary"]
    missing = r"/hardware_classes/0: staging_parity_f16_boundary is missing"
    with pytest.raises(ConfigurationError, match=missing):
        recipes.load_file(_write(tmp_path, doc))


def test_seams_count_checked(tmp_path: Path) -> None:
    doc = _doc()
    doc["placements"]["four-even"]["seams"] = [{"delay_ms": 1}, {"delay_ms": 2}]
    with pytest.raises(ConfigurationError, match="give 1 entry"):
        recipes.load_file(_write(tmp_path, doc))
    doc["placements"]["four-even"]["seams"] = [{"delay_ms": 1, "rate_mbit": 10000}]
    (tmp_path / "unbounded").mkdir()
    with pytest.raises(ConfigurationError, match="seam_bound_factor_max, bound_efficiency_min missing"):
        recipes.load_file(_write(tmp_path / "unbounded", doc))
    for hc in doc["hardware_classes"]:
        hc["speed"].update(seam_bound_factor_max=3, bound_efficiency_min=0.3)
    (tmp_path / "ok").mkdir()
    r = recipes.load_file(_write(tmp_path / "ok", doc))
    assert r.placements["four-even"].seam(2).delay_ms == 1
    assert r.hardware_class("cpu", 2).speed.seam_bound_factor_max == 3


def test_ratio_override_by_stage_count() -> None:
    speed = recipes.load("tiny-llama", {}).hardware_class("cpu", 2).speed
    assert speed.ratio_min(2) == speed.staged_mono_decode_ratio_min
    assert speed.ratio_min(12) == speed.ratio_min_by_stages["10"]


def test_recipes_dir_and_typo_hint(tmp_path: Path) -> None:
    doc = _doc()
    doc["name"] = "tiny-tight"
    _write(tmp_path, doc)
    env = {"DGR_RECIPES_DIR": str(tmp_path)}
    assert recipes.load("tiny-tight", env).name == "tiny-tight"
    assert "tiny-tight" in recipes.available(env)
    with pytest.raises(ConfigurationError) as err:
        recipes.load("tiny-lama", {})
    assert "did you mean 'tiny-llama'" in err.value.one_line()
    _write(tmp_path, doc, name="other")
    with pytest.raises(ConfigurationError, match="/name is 'tiny-tight'"):
        recipes.load("other", env)


def _dgr(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "certify", *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_cli_refuses_mtp_and_unknown_key_with_exit_2(tmp_path: Path) -> None:
    doc = _doc()
    doc["mtp"] = True
    done = _dgr("certify", "--recipe-file", str(_write(tmp_path, doc)))
    assert done.returncode == 2, done.stderr
    assert "at /mtp" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    doc = _doc()
    doc["placements"]["two-middle"]["stagez"] = doc["placements"]["two-middle"].pop("stages")
    (tmp_path / "k").mkdir()
    done = _dgr("certify", "--recipe-file", str(_write(tmp_path / "k", doc)))
    assert done.returncode == 2 and "did you mean 'stages'" in done.stderr, done.stderr


def test_a_lane_the_recipe_does_not_list_is_refused_with_its_lanes() -> None:
    r = recipes.load("tiny-llama", {})
    r.require_lane(r.lanes[0])
    with pytest.raises(ConfigurationError, match="not certified on lane no-such-lane") as caught:
        r.require_lane("no-such-lane")
    assert caught.value.hint == f"its lanes: {', '.join(r.lanes)}"


def test_any_architecture_loads_and_a_malformed_name_is_exit_2_before_any_work(tmp_path: Path) -> None:
    """Issue 44: every architecture is staged by 0002's stage cut (or refused by its worker, naming what a
    stage lacks), so a recipe names any; issue 20 item 16 refused qwen2 here, when its graph could not
    be staged. A name that is no GGUF architecture name is still refused at load, naming the field."""
    doc = _doc()
    doc["architecture"] = "qwen2"
    assert recipes.from_document(doc, source="test").architecture == "qwen2"
    doc["architecture"] = "Qwen 2"
    done = _dgr("certify", "--recipe-file", str(_write(tmp_path, doc)))
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and "at /architecture" in line and "Qwen 2" in line, line
