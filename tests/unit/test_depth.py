"""The depth scenario without workers: its recipe key, its generated prompts, and the two gates' figures
(the run itself, with real workers, is tests/integration/test_depth.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from certify import depth, depth_prompt
from certify.verdict import Status
from core.errors import ConfigurationError
from manifests import recipe_model as recipes
from manifests.recipe_model import Placement
from pipeline.depth import DepthTrace
from pipeline.drive import fits
from worker.client import Memory


def _words(text: str) -> list[int]:
    """A stand-in tokenizer: BOS, then one id per word (what matters is that it is deterministic)."""
    return [1] + [sum(map(ord, w)) for w in text.split()]


def test_the_same_seed_gives_the_same_passage_and_another_seed_another() -> None:
    assert depth_prompt.passage(7, 500) == depth_prompt.passage(7, 500)
    assert depth_prompt.passage(7, 500) != depth_prompt.passage(8, 500)
    assert len(depth_prompt.passage(7, 500).split()) == 500


def test_every_length_is_cut_from_the_longest_prompt() -> None:
    got = depth_prompt.prompts(3, (10, 300, 4000), _words)
    assert {n: len(p) for n, p in got.items()} == {10: 10, 300: 300, 4000: 4000}
    assert got[300] == got[4000][:300] and got[10] == got[4000][:10]
    assert got[4000][0] == 1  # the tokenizer's BOS leads


def test_a_tokenizer_that_never_gives_enough_tokens_is_named() -> None:
    with pytest.raises(ConfigurationError, match="fewer than the 50 asked for"):
        depth_prompt.long_prompt(1, 50, lambda text: [1, 2, 3])


def _depth_doc(**depth_keys: Any) -> dict[str, Any]:
    doc = json.loads((recipes.RECIPES / "tiny-llama.json").read_text())
    doc["depth"] = {"context": 1024, "prompt_tokens": [256, 900], "ubatch": 64, "decode_tokens": 8, "seed": 5}
    doc["depth"].update(depth_keys)
    return doc


def _load(tmp_path: Path, doc: dict[str, Any]) -> recipes.Recipe:
    path = tmp_path / "tiny-llama.json"
    path.write_text(json.dumps(doc))
    return recipes.load_file(path)


def test_the_scenario_is_in_the_recipe_digest(tmp_path: Path) -> None:
    a = _load(tmp_path, _depth_doc())
    b = _load(tmp_path, _depth_doc(ubatch=32))
    assert a.depth is not None and a.depth.longest == 900 and a.depth.ubatch == 64
    assert a.digest != b.digest


def test_by_default_every_f32_staged_placement_runs_at_depth(tmp_path: Path) -> None:
    r = _load(tmp_path, _depth_doc())
    assert r.at_depth == tuple(p for p in r.staged if r.dtype_of(p) == "f32") and r.at_depth
    named = _load(tmp_path, _depth_doc(placements=[r.staged[0].name]))
    assert named.at_depth == (r.staged[0],)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"placements": ["nowhere"]}, r"at /depth/placements/0: 'nowhere' is not a staged placement"),
        ({"placements": ["mono"]}, r"'mono' is not a staged placement"),
        ({"prompt_tokens": [1020]}, r"longest prompt \(1020\) plus 8 decoded tokens does not fit"),
        ({"ubatch": 2048}, r"at /depth/ubatch: 2048 is larger than the context"),
        ({"ubatch": 0}, r"at /depth/ubatch"),
        ({"sede": 1}, r"unknown key 'sede' \(did you mean 'seed'\?\)"),
    ],
)
def test_a_scenario_that_cannot_run_is_refused_at_its_key(
    tmp_path: Path, keys: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        _load(tmp_path, _depth_doc(**keys))


def _trace(rows: np.ndarray, tokens: tuple[int, ...]) -> DepthTrace:
    return DepthTrace(
        prompt_tokens=100,
        positions=tuple(range(rows.shape[0])),
        logits=rows,
        tokens=tokens,
        prefill_passes=rows.shape[0] - len(tokens) + 1,
        prefill_seconds=1.0,
        decode_seconds=1.0,
    )


def test_identical_runs_are_bitwise_and_a_divergence_stops_the_rows_compared() -> None:
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((6, 32)).astype(np.float32)  # 3 prefill rows + 3 decoded ones
    same = depth.parity_figures({100: _trace(rows, (1, 2, 3, 4))}, {100: _trace(rows.copy(), (1, 2, 3, 4))})
    assert same["bitwise_logits"] and same["greedy_match"] == 1.0 and same["rows_compared"] == 6
    other = rows.copy()
    other[5] += 1.0  # after the divergence: that row was fed another token and is not compared
    diverged = depth.parity_figures({100: _trace(rows, (1, 2, 3, 4))}, {100: _trace(other, (1, 2, 9, 9))})
    assert diverged["rows_compared"] == 5 and diverged["bitwise_logits"] and diverged["greedy_match"] == 0.5


def test_a_prefill_row_off_by_one_ulp_is_not_bitwise() -> None:
    rows = np.ones((4, 8), dtype=np.float32)
    off = rows.copy()
    off[1, 3] = np.nextafter(np.float32(1), np.float32(2))
    got = depth.parity_figures({100: _trace(rows, (1, 2))}, {100: _trace(off, (1, 2))})
    assert not got["bitwise_logits"] and got["max_abs_logit_diff"] > 0


class _Info:
    def __init__(self, kv: int, begin: int = 0, end: int = 1, n_ctx: int = 512) -> None:
        # an older worker's figures: no memory by layer, so only the sum is judged (test_kv_stages.py)
        self.memory = Memory(
            weight_bytes=0, kv_bytes=kv, compute_bytes=0, has_token_embedding=False, has_output_head=False
        )
        self.layer_begin, self.layer_end, self.n_ctx = begin, end, n_ctx


def test_stages_whose_kv_sums_to_the_monolithic_workers_pass() -> None:
    p = Placement(name="two", stages=((0, 2), (2, 4)))
    mono: list[Any] = [_Info(4000)]
    staged: list[Any] = [_Info(1000), _Info(3000)]
    kv = {**depth.kv_figures(mono, staged), "kv_bytes": depth.kv_bytes_of(staged)}
    assert kv["kv_bytes"] == [1000, 3000] and kv["kv_bytes_difference"] == 0
    assert depth.kv_result(p, kv, None).status is Status.PASS


def test_a_stage_holding_more_kv_fails_and_every_stage_is_listed() -> None:
    p = Placement(name="two", stages=((0, 2), (2, 4)))
    mono: list[Any] = [_Info(4000)]
    staged: list[Any] = [_Info(1000), _Info(5000)]
    kv = {**depth.kv_figures(mono, staged), "kv_bytes": depth.kv_bytes_of(staged)}
    result = depth.kv_result(p, kv, None)
    assert result.status is Status.FAIL and result.name == "kv-at-depth/two"
    assert "6000 bytes of KV, the monolithic worker 4000" in result.reason
    assert "stage 0 (layers 0:2) 1000 bytes, stage 1 (layers 2:4) 5000 bytes" in result.reason


def test_a_stage_too_small_for_the_scenario_is_named() -> None:
    infos: list[Any] = [_Info(0, 0, 2, n_ctx=8192), _Info(0, 2, 4, n_ctx=4096)]
    fits(infos, 4096)
    needs = r"stage 1 \(layers 2:4\) holds 4096 positions, the run needs 4100"
    with pytest.raises(ConfigurationError, match=needs):
        fits(infos, 4100)


def test_the_depth_charts_draw_one_line_per_run_through_each_prompt_length() -> None:
    from reports.depth import depth_charts

    def run(name: str, held: list[int]) -> dict[str, Any]:
        prompts = [
            {"tokens": n, "held_bytes": [h, h], "decode_tok_s": 100.0 - n / 100}
            for n, h in zip((512, 2048), held, strict=True)
        ]
        return {"name": name, "prompts": prompts}

    figures = {
        "applies": True,
        "monolithic": run("monolithic", [1, 4]),
        "placements": [run("two-middle", [2, 8])],
    }
    held, decode = depth_charts(figures)
    assert held.count("<polyline") == decode.count("<polyline") == 2
    assert "two-middle" in held and ">512<" in held and ">2,048<" in held and "tok/s" in decode
    assert depth_charts({"applies": False}) == []
