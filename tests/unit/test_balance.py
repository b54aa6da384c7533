"""pipeline.balance: the bytes a token reads and a stage holds, from GGUF headers, and the cut whose slowest
stage is fastest (among those that fit a limit on the bytes held)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from core.errors import ConfigurationError
from fetch.gguf_header import Header, TensorInfo
from pipeline.balance import StageBytes, balanced_stages, decode_cost, even_stages, held_bytes


def _header(tensors: dict[str, int], **kv: object) -> Header:
    """A header of f32 tensors given as name -> bytes (the shape's last dimension is 4 rows)."""
    infos = tuple(
        TensorInfo(name=name, shape=(nbytes // 16, 4), ggml_type=0, offset=0, nbytes=nbytes)
        for name, nbytes in tensors.items()
    )
    return Header(
        path=Path("m.gguf"),
        version=3,
        kv={"general.architecture": "llama", **kv},
        tensors=infos,
        alignment=32,
        data_offset=0,
        file_size=0,
    )


def _llama(n_layer: int, layer_bytes: int, head_bytes: int, *, tied: bool = False) -> Header:
    tensors = {
        f"blk.{i}.{part}.weight": layer_bytes // 2 for i in range(n_layer) for part in ("attn_q", "ffn_up")
    }
    tensors |= {"token_embd.weight": head_bytes, "output_norm.weight": 64}
    if not tied:
        tensors["output.weight"] = head_bytes
    return _header(tensors, **{"llama.block_count": n_layer})


def test_the_head_goes_on_the_last_stage_and_one_row_of_the_embedding_on_the_first() -> None:
    cost = decode_cost([_llama(3, 1000, 6400)])
    assert cost.layers == (1000, 1000, 1000)
    assert cost.first == 6400 // 4  # one row of four
    assert cost.last == 6400 + 64
    assert cost.stage(0, 3) == 3000 + 1600 + 6464
    assert cost.stage(1, 2) == 1000


def test_a_tied_head_reads_the_whole_embedding_on_the_last_stage() -> None:
    assert decode_cost([_llama(2, 100, 800, tied=True)]).last == 800 + 64


def test_a_token_reads_only_its_share_of_the_experts() -> None:
    tensors = {"blk.0.ffn_up_exps.weight": 6400, "blk.0.attn_q.weight": 100, "blk.1.attn_q.weight": 100}
    experts = {"llama.expert_count": 64, "llama.expert_used_count": 4}
    header = _header(tensors, **{"llama.block_count": 2, **experts})
    assert decode_cost([header]).layers == (100 + 6400 * 4 // 64, 100)


def test_the_tensors_of_a_split_set_add_up_and_blocks_past_the_last_layer_are_no_stages() -> None:
    first = _header({"blk.0.attn_q.weight": 10, "token_embd.weight": 40}, **{"llama.block_count": 2})
    second = _header({"blk.1.attn_q.weight": 20, "blk.2.attn_q.weight": 999, "output.weight": 40})
    cost = decode_cost([first, second])
    assert cost.layers == (10, 20)
    assert cost.last == 40


def test_a_header_without_a_block_count_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="block_count"):
        decode_cost([_header({"blk.0.attn_q.weight": 10})])


def test_a_heavy_head_gets_a_stage_of_one_layer_instead_of_the_even_split() -> None:
    """The tiny model's shape: the head reads about ten layers' worth."""
    cost = StageBytes(layers=(10,) * 12, first=0, last=104)
    stages = balanced_stages(cost, 4)
    assert stages[-1] == (11, 12)
    assert sorted(end - start for start, end in stages[:-1]) == [3, 4, 4]
    assert max(cost.stage(*s) for s in stages) == 114 < cost.stage(9, 12)


def test_without_a_head_the_cut_is_even() -> None:
    even = [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert balanced_stages(StageBytes(layers=(5,) * 12, first=0, last=0), 4) == even
    assert balanced_stages(StageBytes(layers=(5,) * 3, first=0, last=0), 1) == [(0, 3)]


@pytest.mark.parametrize("seed", range(40))
def test_the_cut_is_the_best_of_every_cut_by_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    n_layer = rng.randint(1, 9)
    n_stages = rng.randint(1, n_layer)
    cost = StageBytes(
        layers=tuple(rng.randint(1, 50) for _ in range(n_layer)),
        first=rng.randint(0, 30),
        last=rng.randint(0, 200),
    )

    def score(cut: list[tuple[int, int]]) -> tuple[int, int]:
        costs = [cost.stage(a, b) for a, b in cut]
        return max(costs), sum(c * c for c in costs)

    every = [
        list(zip((0, *inner), (*inner, n_layer), strict=True))
        for inner in itertools.combinations(range(1, n_layer), n_stages - 1)
    ]
    chosen = balanced_stages(cost, n_stages)
    assert [b for _, b in chosen][-1] == n_layer and all(a < b for a, b in chosen)
    assert score(chosen) == min(score(cut) for cut in every)


@pytest.mark.parametrize("n_stages", [0, 4])
def test_more_stages_than_layers_or_none_is_a_configuration_error(n_stages: int) -> None:
    with pytest.raises(ConfigurationError, match="cannot cut 3 layers"):
        balanced_stages(StageBytes(layers=(1, 1, 1), first=0, last=0), n_stages)


def test_the_even_cut_gives_the_earlier_stages_the_remainder() -> None:
    assert even_stages(12, 4) == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert even_stages(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert even_stages(3, 3) == [(0, 1), (1, 2), (2, 3)]
    with pytest.raises(ConfigurationError, match="cannot cut 3 layers into 4"):
        even_stages(3, 4)


def test_a_stage_holds_its_layers_whole_the_embedding_on_the_first_and_the_head_on_the_last() -> None:
    held = held_bytes([_llama(3, 1000, 6400)])
    assert held.layers == (1000, 1000, 1000)
    assert (held.first, held.last, held.every) == (6400, 6400 + 64, 0)
    assert held.stage(0, 1) == 1000 + 6400 and held.stage(2, 3) == 1000 + 6464


def test_a_tied_embedding_is_the_last_stages_head_and_held_once_by_a_stage_that_is_both() -> None:
    held = held_bytes([_llama(2, 100, 800, tied=True)])
    assert held.stage(0, 1) == 100 + 800 and held.stage(1, 2) == 100 + 800 + 64
    assert held.total == 200 + 800 + 64


def test_a_stage_holds_every_expert_and_the_nextn_blocks_only_where_mtp_loads_them() -> None:
    tensors = {
        "blk.0.ffn_up_exps.weight": 6400,
        "blk.1.attn_q.weight": 100,
        "blk.2.attn_q.weight": 70,
        "rope_freqs.weight": 8,
        "output.weight": 40,
    }
    experts = {"llama.expert_count": 64, "llama.expert_used_count": 4}
    header = _header(tensors, **{"llama.block_count": 2, **experts})
    assert held_bytes([header]).layers == (6400, 100)
    assert held_bytes([header]).stage(1, 2) == 100 + 40 + 8  # a tensor of no layer: on every stage
    assert held_bytes([header], mtp=True).stage(1, 2) == 100 + 40 + 8 + 70
    assert held_bytes([header], mtp=True).stage(0, 1) == 6400 + 8


@pytest.mark.parametrize("seed", range(40))
def test_under_a_limit_the_cut_is_the_best_of_the_cuts_that_fit_by_brute_force(seed: int) -> None:
    rng = random.Random(1000 + seed)
    n_layer = rng.randint(1, 9)
    n_stages = rng.randint(1, n_layer)
    cost = StageBytes(
        layers=tuple(rng.randint(1, 50) for _ in range(n_layer)),
        first=rng.randint(0, 30),
        last=rng.randint(0, 200),
    )
    held = StageBytes(
        layers=tuple(rng.randint(1, 500) for _ in range(n_layer)),
        first=rng.randint(0, 300),
        last=rng.randint(0, 300),
        every=rng.randint(0, 20),
    )
    every = [
        list(zip((0, *inner), (*inner, n_layer), strict=True))
        for inner in itertools.combinations(range(1, n_layer), n_stages - 1)
    ]
    limit = rng.choice(sorted({max(held.stage(*s) for s in cut) for cut in every}))  # some cut fits
    fitting = [cut for cut in every if all(held.stage(*s) <= limit for s in cut)]

    def score(cut: list[tuple[int, int]]) -> tuple[int, int]:
        costs = [cost.stage(a, b) for a, b in cut]
        return max(costs), sum(c * c for c in costs)

    chosen = balanced_stages(cost, n_stages, held=held, limit=limit)
    assert chosen in fitting
    assert score(chosen) == min(score(cut) for cut in fitting)
    least = min(max(held.stage(*s) for s in cut) for cut in every)
    with pytest.raises(ConfigurationError, match=f"the least any cut needs is {least} bytes$"):
        balanced_stages(cost, n_stages, held=held, limit=least - 1)


def test_a_limit_without_the_held_bytes_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="needs the held bytes"):
        balanced_stages(StageBytes(layers=(1, 1), first=0, last=0), 2, limit=10)


def test_nextn_blocks_counted_in_block_count_are_no_layer_of_a_stage() -> None:
    """A set carrying its MTP block counts it in block_count (tiny-v4-mtp: 13 blocks, 12 layers); a
    cut of 13 "layers" would hand a worker a range llama refuses."""
    tensors = {
        "blk.0.attn_q.weight": 10,
        "blk.1.attn_q.weight": 10,
        "blk.2.nextn.eh_proj.weight": 7,
        "blk.2.attn_q.weight": 5,
        "output.weight": 40,
    }
    kv = {"llama.block_count": 3, "llama.nextn_predict_layers": 1}
    header = _header(tensors, **kv)
    assert decode_cost([header]).layers == (10, 10)
    assert held_bytes([header]).stage(1, 2) == 10 + 40
    assert held_bytes([header], mtp=True).stage(1, 2) == 10 + 40 + 12
    # without the block's first tensor the key is not taken at its word (llama's loader does the same)
    del tensors["blk.2.nextn.eh_proj.weight"]
    assert decode_cost([_header(tensors, **kv)]).layers == (10, 10, 5)
