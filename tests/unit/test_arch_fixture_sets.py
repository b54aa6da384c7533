"""fetch/arch_fixture.py and fetch/generated.py without a build: the shipped sets of roster fixtures are
what the generated origin writes (names, layers, sealed), a bad origin is refused before any generator
runs, a set whose generator comes from no build says which program it needs, and the vocabulary written
into a fixture is the one the recipes' prompts tokenize with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.errors import ConfigurationError, ToolchainMissing
from fetch import arch_fixture, generated
from fetch.tinygguf import split_names
from fetch.tools import NO_TOOLS
from manifests import recipe_model
from manifests.artifact_sets import ARTIFACTS, load_set

SETS = {"roster-qwen3next": ("qwen3next", "moe"), "roster-qwen2vl": ("qwen2vl", "dense")}


@pytest.mark.parametrize("name", sorted(SETS))
def test_the_shipped_sets_are_the_generators_sealed_output(name: str) -> None:
    aset = load_set(name)
    (origin,) = aset.origins
    assert origin.kind == "generated" and origin.generator == "test-llama-archs"
    params = dict(origin.parameters)
    arch, fixture = SETS[name]
    assert (params["architecture"], params["fixture"], params["seed"]) == (arch, fixture, 1)
    variant = aset.variant(None)
    assert variant.sealed and variant.gguf.architecture == arch
    assert variant.gguf.block_count == params["n_layer"] == recipe_model.load(name).n_layer
    stem = f"{params['file_stem']}-{aset.default_variant}"
    assert [f.name for f in variant.files] == split_names(stem, params["splits"])


def _never(arch: str, n_layer: int, seed: int):
    raise AssertionError("the generator ran before the parameters were checked")


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        ({"n_layer": None}, "missing n_layer"),
        ({"layers": 8}, "unknown layers"),
    ],
)
def test_a_bad_origin_is_refused_before_any_generator_runs(change: dict, expect: str, tmp_path: Path) -> None:
    params = json.loads((ARTIFACTS / "roster-qwen2vl.json").read_text())["origins"][0]["parameters"]
    params = {k: v for k, v in {**params, **change}.items() if v is not None}
    with pytest.raises(ConfigurationError, match=expect):
        arch_fixture.generate(tmp_path, params, "f32", tree=tmp_path, models=_never)


def test_a_fixture_kind_the_generator_does_not_write_names_what_it_wrote(tmp_path: Path) -> None:
    params = {"architecture": "qwen2vl", "n_layer": 8, "file_stem": "x", "fixture": "moe"}
    with pytest.raises(ConfigurationError, match="no moe model of qwen2vl") as caught:
        arch_fixture.generate(tmp_path, params, "f32", tree=tmp_path, models=lambda *_: {"dense": tmp_path})
    assert "it writes: dense" in (caught.value.hint or "")


def test_without_a_build_the_set_says_it_needs_the_fixture_generator(tmp_path: Path) -> None:
    params = {"architecture": "qwen2vl", "n_layer": 8, "file_stem": "x"}
    with pytest.raises(ToolchainMissing, match="fixture generator"):
        generated.generate("test-llama-archs", tmp_path, params, "f32", tree=tmp_path, tools=NO_TOOLS)


def test_the_vocabulary_spells_the_recipes_prompts() -> None:
    """Every character of the fixture recipes' prompts is a token (sentencepiece spells the space '▁'),
    so no prompt falls back to <unk>."""
    tokens, scores, types = arch_fixture.vocabulary()
    assert len(tokens) == len(scores) == len(types) == arch_fixture.N_VOCAB
    for name in SETS:
        for text in recipe_model.load(name).prompts.texts:
            assert set(text.replace(" ", "▁")) <= set(tokens), text
