"""The kv-at-depth gate names the stage whose memory is wrong (certify/kv_stages.py), from the figures a
worker reports by layer (worker/src/memory_layers.h; the real workers' figures are checked in
tests/integration/test_kv_gate_fault.py)."""

from __future__ import annotations

from typing import Any

from certify import depth, kv_stages
from certify.verdict import Status
from manifests.recipe_model import Placement
from worker.client import Memory

PER_LAYER = {0: 100, 1: 100, 2: 250, 3: 250}


class _Info:
    def __init__(self, begin: int, end: int, by_layer: dict[int, int], unread: int = 0) -> None:
        self.layer_begin, self.layer_end, self.n_ctx = begin, end, 512
        self.memory = Memory(
            weight_bytes=0,
            kv_bytes=sum(by_layer.values()) + unread,
            compute_bytes=0,
            has_token_embedding=False,
            has_output_head=False,
            kv_bytes_by_layer=by_layer,
            kv_unread_bytes=unread,
        )


def _layers(b: int, e: int) -> dict[int, int]:
    return {il: PER_LAYER[il] for il in range(b, e)}


def _result(staged: list[Any]) -> Any:
    p = Placement(name="two", stages=tuple((s.layer_begin, s.layer_end) for s in staged))
    mono: list[Any] = [_Info(0, 4, _layers(0, 4))]
    kv = {**depth.kv_figures(mono, staged), "kv_bytes": depth.kv_bytes_of(staged)}
    return depth.kv_result(p, kv, None)


def test_stages_holding_the_monolithic_workers_memory_of_their_own_layers_pass() -> None:
    assert _result([_Info(0, 1, _layers(0, 1)), _Info(1, 4, _layers(1, 4))]).status is Status.PASS


def test_a_stage_holding_memory_no_layer_of_it_reads_is_named_and_the_other_is_not() -> None:
    result = _result([_Info(0, 3, _layers(0, 3)), _Info(3, 4, _layers(3, 4), unread=450)])
    assert result.status is Status.FAIL
    assert result.reason.startswith(
        "stage 1 (layers 3:4): 450 bytes allocated that none of its layers reads (the monolithic worker: 0)"
    )
    assert "stage 0 (layers 0:3):" not in result.reason


def test_an_owned_layer_sized_wrong_is_named_even_when_the_sums_agree() -> None:
    # stage 0's layer 1 is 50 bytes short and stage 1's layer 2 50 bytes long: the sum hides both
    short = {0: 100, 1: 50}
    long = {2: 300, 3: 250}
    result = _result([_Info(0, 2, short), _Info(2, 4, long)])
    assert result.status is Status.FAIL
    assert "stage 0 (layers 0:2): layer 1 holds 50 bytes, the monolithic worker 100" in result.reason
    assert "stage 1 (layers 2:4): layer 2 holds 300 bytes, the monolithic worker 250" in result.reason


def test_memory_read_for_a_layer_the_stage_does_not_own_is_named() -> None:
    mono: Any = _Info(0, 4, _layers(0, 4))
    staged: list[Any] = [_Info(0, 2, {**_layers(0, 2), 3: 250})]
    faults = kv_stages.stage_faults(mono, staged)
    assert faults == ["stage 0 (layers 0:2): reads memory of layers it does not own: 3"]


def test_an_older_worker_without_layers_is_judged_by_the_sum_alone() -> None:
    mono: Any = _Info(0, 4, {}, unread=700)
    staged: list[Any] = [_Info(0, 2, {}, unread=9)]
    assert kv_stages.stage_faults(mono, staged) == []
