"""fetch/arch_fixture.py and fetch/generated.py without a build: a bad origin is refused before any
generator runs, and a set whose generator comes from no build says which program it needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigurationError, ToolchainMissing
from fetch import arch_fixture, generated
from fetch.tools import NO_TOOLS


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
    params = {"architecture": "qwen2vl", "n_layer": 8, "file_stem": "x"}
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
