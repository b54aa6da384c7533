"""DeepSeek-V4 pieces that need no build: the synthetic generator's parameters, the boundary-vs-capture
comparison for hyper-connection boundaries, the physical model's sideband, the tiny-v4 and v4-q4 recipes,
and `dgr certify --recipe v4-q4` stopping at its unsealed artifact set (exit 2, one line)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from certify import measure
from cli.main import main
from core.errors import ConfigurationError
from fetch import tinymodel, tinymodel_v4
from manifests import recipe_model as recipes
from manifests.artifact_sets import ARTIFACTS


def test_boundary_residual_is_the_mean_of_the_hc_copies_in_graph_order() -> None:
    rng = np.random.default_rng(7)
    n, n_embd, hc = 5, 8, 4
    boundary = rng.standard_normal((n, hc * n_embd)).astype(np.float32)
    got = measure.boundary_residual(boundary, n_embd)
    copies = [boundary[:, s * n_embd : (s + 1) * n_embd] for s in range(hc)]
    want = (((copies[0] + copies[1]) + copies[2]) + copies[3]) * np.float32(0.25)
    assert got.dtype == np.float32 and got.shape == (n, n_embd)
    assert np.array_equal(got, want)  # bitwise: a bitwise-equal boundary gives NMSE exactly 0
    # a dense boundary is the capture itself
    assert measure.boundary_residual(copies[0], n_embd) is copies[0]
    with pytest.raises(ValueError, match="not a multiple"):
        measure.boundary_residual(boundary[:, :-1], n_embd)


def test_physical_model_adds_the_token_sideband() -> None:
    recipe = recipes.load("tiny-v4", {})
    speed = {"seam_bytes_per_token": [1024]}
    placements = [
        {
            "name": "mono",
            "boundary_dtype": "f32",
            "boundary_width": 256,
            "speed": {"seam_bytes_per_token": []},
        },
        {
            "name": "a",
            "boundary_dtype": "f32",
            "boundary_width": 256,
            "speed": speed,
            "token_sideband_stages": [1],
        },
        {
            "name": "b",
            "boundary_dtype": "f16",
            "boundary_width": 256,
            "speed": {"seam_bytes_per_token": [512]},
            "token_sideband_stages": [],
        },
    ]
    rows = measure.physical_model(recipe, placements)
    measured = {r["dtype"]: r for r in rows if r["label"].startswith("measured:")}
    assert measured["f32"]["bytes_per_token"] == 1024 + 4 and measured["f32"]["sideband_bytes_per_token"] == 4
    assert measured["f16"]["bytes_per_token"] == 512 and measured["f16"]["sideband_bytes_per_token"] == 0
    flash = {r["dtype"]: r["bytes_per_token"] for r in rows if r["label"] == "DeepSeek V4 Flash"}
    assert flash == {"f32": 4 * 4096 * 4 + 4, "f16": 4 * 4096 * 2 + 4}


def _sealed_params() -> tuple[dict, dict]:
    doc = json.loads((ARTIFACTS / "tiny-v4.json").read_text())
    variant = doc["variants"]["f32"]
    return {**doc["origins"][0]["parameters"], **variant["parameters"]}, variant


def test_sealed_set_matches_the_generator() -> None:
    params, variant = _sealed_params()
    assert params["architecture"] == "deepseek4"
    assert tinymodel_v4.file_names(params, "f32") == [f["name"] for f in variant["files"]]
    assert sum(variant["gguf"]["tensor_counts"]) == tinymodel_v4._tensor_count(
        {**tinymodel_v4.DEFAULTS, **params}
    )
    assert all(len(f["sha256"]) == 64 and f["size"] > 0 for f in variant["files"])
    kv = variant["gguf"]["kv"]
    assert kv["deepseek4.hyper_connection.count"] == 4 and kv["deepseek4.hash_layer_count"] == 3


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        ({"n_embd_typo": 1}, "unknown parameter"),
        ({"compress_ratios": [0] * 11}, "compress_ratios"),
        ({"compress_ratios": [0] * 11 + [8]}, "compress_ratios"),
        ({"hash_layer_count": 12}, "hash_layer_count"),
        ({"o_groups": 3}, "o_groups"),
        ({"ftype": "q4_k"}, "ftype"),
    ],
)
def test_generator_refuses_bad_parameters(tmp_path: Path, change: dict, expect: str) -> None:
    # refused before the pinned tree is even looked at
    with pytest.raises(ConfigurationError, match=expect):
        tinymodel.generate(tmp_path, {"architecture": "deepseek4", **change}, "f32", tree=tmp_path / "none")
    assert list(tmp_path.iterdir()) == []


def test_tiny_v4_recipe_cuts_around_the_hash_routed_layers() -> None:
    r = recipes.load("tiny-v4", {})
    assert r.architecture == "deepseek4" and r.artifacts == "tiny-v4" and r.n_layer == 12 and not r.mtp
    cuts = {c for p in r.staged for c in p.cuts}
    assert {1, 2, 3} <= cuts  # inside the hash-routed block (layers 0-2) and right after it
    assert max(p.n_stages for p in r.staged) >= 10
    assert {r.dtype_of(p) for p in r.staged} == {"f32", "f16"}
    assert r.physical_model is not None and r.physical_model.boundary_width == 4 * 4096
    assert r.n_decode >= 32


def test_v4_q4_recipe_is_complete() -> None:
    r = recipes.load("v4-q4", {})
    assert r.artifacts == "deepseek-v4-flash-q4" and r.n_layer == 43 and not r.mtp
    assert {2, 3, 4} <= {p.n_stages for p in r.staged} and max(p.n_stages for p in r.staged) >= 10
    assert {r.dtype_of(p) for p in r.staged} == {"f32", "f16"}
    assert {1, 3} & {c for p in r.staged for c in p.cuts}, "a cut next to the hash-routed layers 0-2"
    assert r.physical_model is not None
    assert (r.physical_model.boundary_width, r.physical_model.sideband_bytes_per_token) == (16384, 4)
    assert {"h200", "h100"} <= {hc.name for hc in r.hardware_classes}


def test_certify_v4_q4_stops_at_its_unsealed_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DGR_WORK", str(tmp_path / "work"))
    monkeypatch.delenv("DGR_RECIPES_DIR", raising=False)
    assert main(["certify", "--recipe", "v4-q4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "'deepseek-v4-flash-q4' variant 'Q4_K_M' is not sealed" in err[0]
    assert "manifests/artifacts/deepseek-v4-flash-q4.json" in err[0]
    assert "dgr seal --artifacts deepseek-v4-flash-q4 --from DIR" in err[0]
    assert not (tmp_path / "work" / "runs").exists()
