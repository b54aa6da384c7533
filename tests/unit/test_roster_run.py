"""`dgr roster`'s run (certify/roster_run.py) over the Python fake worker, through the real launcher and
driver: the placements it makes of a model's layers, a placement judged PASS, FAIL on other logits
(the prompt and position named), refused with the worker's own line when it exits at load, FAIL when a
worker dies in a pass; the worker's line read from llama's log; a name the tree does not know."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from certify import roster_run
from certify.roster import Row, Status
from core.errors import ConfigurationError
from pipeline import drive
from pipeline.routes import Step
from tests.unit.fake_stages import TOY, fake_command, fake_env, load_stubs
from worker.launcher import check_placement

PROMPTS = ((1, 5, 9, 17, 33, 2, 7), (3, 14, 15, 9))  # the toy's vocabulary has 40 tokens


def test_two_stages_at_every_cut_then_one_placement_of_up_to_four() -> None:
    assert roster_run.placements(4) == [
        ((0, 1), (1, 4)),
        ((0, 2), (2, 4)),
        ((0, 3), (3, 4)),
        ((0, 1), (1, 2), (2, 3), (3, 4)),
    ]
    assert roster_run.placements(3)[-1] == ((0, 1), (1, 2), (2, 3))
    assert roster_run.placements(2) == [((0, 1), (1, 2))]  # too shallow for three stages
    assert roster_run.placements(1) == []
    twelve = roster_run.placements(12)
    assert len(twelve) == 12 and twelve[-1] == ((0, 3), (3, 6), (6, 9), (9, 12))
    for n in range(1, 30):
        for stages in roster_run.placements(n):
            check_placement(stages, n)  # each tiles the model


def _trace(logits: np.ndarray, tokens: tuple[int, ...]) -> drive.PromptTrace:
    step = Step(n_tokens=1, wall_seconds=0.0, stage_wall=(), stage_compute=(), seam_bytes=(), seam_seconds=())
    return drive.PromptTrace(
        prompt=(1, 2, 3),
        tokens=tokens,
        logit_positions=tuple(range(logits.shape[0])),
        logits=logits,
        boundaries={},
        captures={},
        prefill=step,
        decode=(),
    )


def test_a_mismatch_names_the_prompt_and_first_position_bit_for_bit() -> None:
    ref = np.arange(20, dtype=np.float32).reshape(5, 4)
    same = _trace(ref.copy(), (1, 2))
    assert roster_run.mismatch([_trace(ref, (1, 2))] * 2, [same, same]) is None
    moved = ref.copy()
    moved[3, 1] = np.nextafter(moved[3, 1], np.float32(100))  # one ulp
    moved[4, 0] = 0.5
    got = roster_run.mismatch([_trace(ref, (1, 2))] * 2, [same, _trace(moved, (1, 2))])
    assert got is not None and got.startswith("prompt 1, position 3: logits differ") and "2 of 5 rows" in got
    zero = np.zeros((1, 2), dtype=np.float32)
    assert roster_run.mismatch([_trace(zero, (1,))], [_trace(-zero, (1,))]) is not None  # -0.0 is other bits
    assert roster_run.mismatch([_trace(ref, (1, 2))], [_trace(ref, (1, 3))]) == (
        "prompt 0: greedy token 1 is 3, the monolithic worker's 2"
    )


LLAMA_LOG = """llama_model_loader: loaded meta data with 40 key-value pairs
load: adding 128 dummy tokens
llama_model_load: error loading model: architecture qwen2 does not support loading a layer range
llama_model_load_from_file_impl: failed to load model
dgr-shard-worker: failed to load layers 0:2 of m.gguf (see the llama log above)
"""


def test_the_refusal_is_llamas_own_line_else_the_workers() -> None:
    assert roster_run.refusal(LLAMA_LOG) == "architecture qwen2 does not support loading a layer range"
    assert (
        roster_run.refusal("a\ndgr-shard-worker: --layers 5:2 is empty\nstopping\n")
        == "--layers 5:2 is empty"
    )
    assert roster_run.refusal("only this\n") == "only this"
    cut = (
        "sched_reserve: reserving ...\n"
        "llama_init_from_model: failed to initialize the context: layers [1, 4) of "
        "talkie read inp_embd (first stage only), which this stage does not hold\n"
        "dgr-shard-worker: could not create a session context (n_ctx 128) before listening\n"
    )
    assert roster_run.refusal(cut) == (
        "layers [1, 4) of talkie read inp_embd (first stage only), which this stage does not hold"
    )
    assert roster_run.refusal("") == "no output"


@pytest.fixture
def workers(tmp_path: Path) -> roster_run.Workers:
    stubs = load_stubs(tmp_path)
    return roster_run.Workers(
        command=fake_command(tmp_path),
        stubs=stubs,
        env=fake_env(stubs),
        evidence=tmp_path / "evidence",
        prompts=PROMPTS,
        n_decode=3,
    )


def _judge(workers: roster_run.Workers, stages, **faults: str) -> tuple[Status, str]:
    ref = roster_run.run_prompts(workers, workers.command, ((0, 12),), workers.evidence / "ref")
    run = dataclasses.replace(workers, env={**workers.env, **faults})
    got, sideband = roster_run.placed(run, workers.command, stages, ref, workers.evidence / "p")
    assert sideband == () and got.stages == stages
    return got.status, got.detail


def test_a_placement_bitwise_with_the_monolithic_run_passes(workers: roster_run.Workers) -> None:
    assert _judge(workers, ((0, 5), (5, 9), (9, 12))) == (Status.PASS, "")


def test_other_weights_fail_the_placement_at_the_first_position(
    workers: roster_run.Workers, tmp_path: Path
) -> None:
    ref = roster_run.run_prompts(workers, workers.command, ((0, 12),), tmp_path / "ref")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**TOY, "seed": TOY["seed"] + 1}))
    command = dataclasses.replace(workers.command, model=other)
    got, _ = roster_run.placed(workers, command, ((0, 6), (6, 12)), ref, tmp_path / "p")
    assert got.status is Status.FAIL and got.detail.startswith("prompt 0, position 0: logits differ")


def test_a_worker_that_exits_at_load_refuses_with_its_own_line(workers: roster_run.Workers) -> None:
    got = _judge(workers, ((0, 6), (6, 12)), DGR_FAKE_FAULT="exit-at-start", DGR_FAKE_FAULT_BEGIN="6")
    assert got == (Status.REFUSED, "fake worker: refusing to start")


def test_a_worker_that_dies_in_a_pass_fails_the_placement(workers: roster_run.Workers) -> None:
    status, detail = _judge(
        workers, ((0, 6), (6, 12)), DGR_FAKE_FAULT="die-after-forwards:0", DGR_FAKE_FAULT_BEGIN="6"
    )
    assert status is Status.FAIL and detail.startswith("stage 1 (6:12) ")


@pytest.mark.parametrize(
    ("fault", "status", "said"),
    [
        ("die-after-forwards:0", Status.FAIL, "0:12 (the whole model): stage 0 (0:12) "),
        ("exit-at-start", Status.REFUSED, "0:12 (the whole model): fake worker: refusing to start"),
    ],
)
def test_a_whole_model_that_crashes_fails_and_one_that_refuses_is_refused(
    workers: roster_run.Workers, monkeypatch: pytest.MonkeyPatch, fault: str, status: Status, said: str
) -> None:
    """The monolithic reference's own failure: a worker that crashed in a pass is a FAIL (minimax-01's
    whole model aborts now and then), never a refusal, which is a worker exiting at load by itself."""
    monkeypatch.setattr(roster_run, "_n_layer", lambda model: 12)  # the toy has 12 layers and no GGUF header
    faulty = {**workers.env, "DGR_FAKE_FAULT": fault, "DGR_FAKE_FAULT_BEGIN": "0"}
    run = dataclasses.replace(workers, env=faulty)
    row = roster_run.stage_fixture(run, "toy", workers.command.model)
    assert row.status is status and row.reason.startswith(said), row


def test_an_architecture_the_tree_does_not_know_is_one_line_with_the_closest() -> None:
    known = ("gemma3", "llama", "qwen2")
    assert roster_run.select(known, []) == known
    assert roster_run.select(known, ["qwen2", "llama", "qwen2"]) == ("llama", "qwen2")
    with pytest.raises(ConfigurationError) as caught:
        roster_run.select(known, ["lama"])
    assert caught.value.exit_code == 2
    said = "--arch lama: the pinned tree knows no such architecture (did you mean llama?)"
    assert caught.value.one_line() == f"dgr: configuration error: {said}"


def test_the_progress_line_says_status_cuts_time_and_reason() -> None:
    row = Row(arch="qwen2", status=Status.NOT_GENERATED, reason="test-llama-archs: TODO vocab")
    assert roster_run.progress(3, 144, row) == (
        "roster [  3/144] qwen2                      not generated  test-llama-archs: TODO vocab"
    )
