"""Issue 44, Build 4: the full certifier on roster fixtures, one shipped recipe per side-band kind.

- roster-qwen3next (hybrid recurrent: gated delta-net and attention layers, each stage keeping the
  recurrent state of its own layers) and roster-qwen2vl (M-RoPE: a later stage's positions cross the cut);
- their sets regenerate byte for byte from a generator built anew (not the roster's cached one), so
  the sealed digests are the generator's, not typed in;
- `dgr certify --recipe NAME`: a signed PASS (or a FAIL from load-bound speed checks alone) that
  `dgr verify` accepts; every unshaped placement bitwise (max abs logit difference 0, boundary NMSE 0 at
  every cut), the route change, depth, KV-at-depth gates run and pass;
- the hybrid's stages hold the recurrent state of their own layers only: their memory adds up to the
  monolithic worker's, a stage of one recurrent layer holds the same bytes at twice the context (the
  state does not grow with it) while a stage of one attention layer holds twice its KV.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from manifests.artifact_sets import ARTIFACTS
from tests.integration.dgr_cli import certify_and_verify, user_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

RECIPES = ("roster-qwen3next", "roster-qwen2vl")
ENV = user_env()


@pytest.mark.parametrize("name", RECIPES)
def test_the_generator_reproduces_the_sealed_set(name: str, real_ctx, cpu_build, tmp_path: Path) -> None:
    from fetch import arch_fixture, source
    from lanes import arch_fixtures
    from patches.stack import ensure_patched

    doc = json.loads((ARTIFACTS / f"{name}.json").read_text())
    params = doc["origins"][0]["parameters"]
    tree = ensure_patched(real_ctx).path

    def models(arch: str, n_layer: int, seed: int):  # a generator of the test's own, built here
        return arch_fixtures.models(tmp_path / "gen", tree, cpu_build.dir, arch, n_layer, seed=seed)

    pristine = source.ensure_pristine(real_ctx).path
    paths = arch_fixture.generate(tmp_path / "set", params, "f32", tree=pristine, models=models)
    files = doc["variants"]["f32"]["files"]
    assert [p.name for p in paths] == [f["name"] for f in files]
    for path, entry in zip(paths, files, strict=True):
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"], path.name


def _bitwise_where_unshaped(predicate: dict) -> list[dict]:
    """Every staged placement that ran: bitwise against the monolithic worker (f32 seams), each cut's
    boundary NMSE 0; shaped placements are SKIPPED where the run cannot make namespaces."""
    ran = [p for p in predicate["figures"]["placements"] if p["role"] != "reference" and "parity" in p]
    for p in ran:
        par = p["parity"]
        nmse = {int(k.split("@")[1]): v for k, v in par.items() if k.startswith("boundary_nmse@")}
        how = p.get("forwarding", "relayed")
        print(f"  {p['name']:22s} {how:8s} max |logit diff| {par['max_abs_logit_diff']}")
        assert par["bitwise_logits"] and par["max_abs_logit_diff"] == 0.0 and par["greedy_match"] == 1.0
        assert sorted(nmse) == sorted(p["cuts"]) and all(v == 0.0 for v in nmse.values())
    return ran


def _recurrent_state_stays_with_its_layers(predicate: dict) -> None:
    """three-single-kinds: stage 0 is recurrent layer 0 alone, stage 1 attention layer 1 alone."""
    figures = predicate["figures"]
    placed = {p["name"]: p for p in figures["placements"]}
    at_depth = {p["name"]: p for p in figures["depth"]["placements"]}
    mono, split, deep = placed["mono"], placed["three-single-kinds"], at_depth["three-single-kinds"]
    assert sum(split["kv_bytes"]) == mono["kv_bytes"][0]
    assert sum(deep["kv_bytes"]) == deep["kv_bytes_monolithic"] and deep["kv_bytes_difference"] == 0
    growth = deep["n_ctx"][0] / split["n_ctx"][0]
    assert growth == 2
    recurrent, attention = split["kv_bytes"][0], split["kv_bytes"][1]
    assert deep["kv_bytes"][0] == recurrent, "a recurrent layer's state does not grow with the context"
    assert deep["kv_bytes"][1] == attention * growth, "an attention layer's KV cache does"


@pytest.mark.parametrize("name", RECIPES)
def test_certify_a_fixture_recipe(name: str) -> None:
    started = time.monotonic()
    _, predicate = certify_and_verify(ENV, name)
    wall = time.monotonic() - started
    print(f"\ncertify --recipe {name}: {predicate['verdict']['status']} in {wall:.1f} s")
    ran = _bitwise_where_unshaped(predicate)
    assert {p["n_stages"] for p in ran} >= {2, 3, 4}
    statuses = {r["name"]: r["status"] for r in predicate["results"]}
    route = predicate["figures"]["route_change"]
    assert statuses[f"route-change/{route['placement']}"] == "PASS" and route["switched_equals_uninterrupted"]
    for placement in (p["name"] for p in predicate["figures"]["depth"]["placements"]):
        assert statuses[f"depth-parity/{placement}"] == statuses[f"kv-at-depth/{placement}"] == "PASS"
    if name == "roster-qwen3next":
        _recurrent_state_stays_with_its_layers(predicate)
