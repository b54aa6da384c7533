"""Issue 44, bring your own GGUF, on a roster fixture: `dgr seal --artifacts NAME --from DIR` describes
and seals a set nobody wrote a manifest for, `dgr recipe init` writes its recipe, and `dgr certify`
certifies it with the real CPU worker, each the command a user runs.

The model is upstream's own llama fixture (lanes/arch_fixtures.py: 2 layers, every optional scale,
rope_freqs, biases) given a vocabulary and split over two files (fetch/arch_fixture.py): the
generator writes no tokenizer, and certify tokenizes its prompts with the model's.  Two layers allow
one cut, so the recipe has the monolithic reference and two stages, and says why it has no more.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fetch import source
from fetch.arch_fixture import with_vocabulary
from tests.integration import arch_fixtures
from tests.integration.dgr_cli import certified, run_dgr, user_env, verified

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NAME = "roster-llama"


@pytest.fixture(scope="module")
def roster_model(real_ctx, arch_generator, tmp_path_factory) -> tuple[Path, Path]:
    """(the generator's own llama-dense file, the same model with a vocabulary over two files' folder)."""
    folder = tmp_path_factory.mktemp("roster")
    dense = arch_fixtures.generate(arch_generator, "llama", folder / "generated")["dense"]
    tree = source.ensure_pristine(real_ctx).path
    with_vocabulary(dense, folder / "byo", tree, split=2)
    return dense, folder / "byo"


def _env(tmp: Path) -> dict[str, str]:
    """A user's shell: the shared workspace (its CPU build), a manifests folder and store of the test's."""
    env = user_env("DGR_MANIFESTS_DIR", "DGR_STORE")
    env.update(DGR_MANIFESTS_DIR=str(tmp / "manifests"), DGR_STORE=str(tmp / "store"))
    return env


def _ok(env: dict[str, str], *argv: str) -> str:
    done = run_dgr(env, *argv, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_seal_recipe_init_and_certify_a_roster_fixture(roster_model, tmp_path: Path) -> None:
    _, folder = roster_model
    env = _env(tmp_path)
    out = _ok(env, "seal", "--artifacts", NAME, "--from", str(folder))
    manifest = tmp_path / "manifests" / "artifacts" / f"{NAME}.json"
    assert f"-> {manifest}" in out
    variant = json.loads(manifest.read_text())["variants"]["f32"]
    assert variant["gguf"]["architecture"] == "llama" and variant["gguf"]["block_count"] == 2
    assert variant["gguf"]["split_count"] == 2 and len(variant["files"]) == 2
    assert variant["gguf"]["tensor_counts"] == [32, 32]

    out = _ok(env, "recipe", "init", "--artifacts", NAME)
    recipe_file = tmp_path / "manifests" / "recipes" / f"{NAME}.json"
    assert f"wrote recipe {NAME} -> {recipe_file}" in out
    recipe = json.loads(recipe_file.read_text())
    assert recipe["placements"] == {
        "mono": {"description": "monolithic reference: one worker owns every layer", "stages": [[0, 2]]},
        "two-balanced": {
            "description": "2 stages cut by decode cost (as `dgr balance --stages 2` cuts)",
            "stages": [[0, 1], [1, 2]],
        },
    }
    assert "No 3-, 4- or 10-stage placement: the model has 2 layers." in recipe["description"]

    run = certified(env, "--recipe", NAME, "--lane", "cpu")
    verified(env, run)  # PASS, or a FAIL from load-bound speed checks alone, and `dgr verify` agrees
    print(f"\ncertify --recipe {NAME}: {run.predicate['verdict']['status']} in {run.wall_s:.1f} s")
    assert run.predicate["recipe"]["name"] == NAME
    assert {r["name"] for r in run.predicate["results"]} >= {
        "staging-parity/two-balanced",
        "speed/two-balanced",
    }


def test_the_fixture_as_generated_is_refused_for_want_of_a_tokenizer(roster_model, tmp_path: Path) -> None:
    """Sealing takes any GGUF; a recipe is refused, in one line, for a model whose prompts nothing can
    tokenize (llama.cpp aborts on a tokenize call against a vocabulary-less model)."""
    dense, _ = roster_model
    env = _env(tmp_path)
    alone = tmp_path / "generated"
    alone.mkdir()
    (alone / dense.name).write_bytes(dense.read_bytes())  # the generator's folder also holds its MoE
    _ok(env, "seal", "--artifacts", "roster-llama-raw", "--from", str(alone))
    done = run_dgr(env, "recipe", "init", "--artifacts", "roster-llama-raw")
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1, done.stdout + done.stderr
    assert "has no tokenizer (tokenizer.ggml.model 'no_vocab')" in err[0]
