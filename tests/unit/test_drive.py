"""pipeline/drive.py over real loopback workers (the Python fake speaking the real proto)."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path

import numpy as np
import pytest

from core.errors import ConfigurationError
from pipeline import drive
from tests.unit.fake_stages import TOY, fake_command, fake_env, load_stubs
from worker.client import StageFailed
from worker.launcher import launch

PROMPTS = [[1, 5, 9, 2], [7], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3]]
N_DECODE = 6
CUTS = list(range(1, 12))


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory):
    return load_stubs(tmp_path_factory.mktemp("stubs"))


@pytest.fixture(scope="module")
def reference(stubs, tmp_path_factory: pytest.TempPathFactory) -> drive.Trace:
    tmp = tmp_path_factory.mktemp("mono")
    with launch(fake_command(tmp), [(0, 12)], stubs=stubs, evidence=tmp / "ev", env=fake_env(stubs)) as p:
        return drive.run_placement(p.clients, PROMPTS, N_DECODE, capture=CUTS)


def _run(stubs, tmp_path: Path, placement, **kw) -> drive.Trace:
    with launch(
        fake_command(tmp_path), placement, stubs=stubs, evidence=tmp_path / "ev", env=fake_env(stubs)
    ) as p:
        return drive.run_placement(p.clients, PROMPTS, N_DECODE, **kw)


def test_reference_trace_shapes(reference: drive.Trace) -> None:
    assert reference.placement == ((0, 12),) and reference.cuts == ()
    for prompt, t in zip(PROMPTS, reference.prompts, strict=True):
        rows = len(prompt) + N_DECODE - 1
        assert t.logits.shape == (rows, TOY["n_vocab"]) and t.logits.dtype == np.float32
        assert t.logit_positions == tuple(range(rows))
        assert len(t.tokens) == N_DECODE
        assert sorted(t.captures) == CUTS and t.captures[5].shape == (rows, TOY["n_embd"])
        assert t.tokens[0] == int(np.argmax(t.logits[len(prompt) - 1]))
        assert t.prefill.n_tokens == len(prompt) and len(t.decode) == N_DECODE - 1
    assert reference.seam_bytes() == ()


@pytest.mark.parametrize(
    "placement",
    [
        [(0, 6), (6, 12)],
        [(0, 1), (1, 11), (11, 12)],
        [(k, k + 1) for k in range(12)],
    ],
)
def test_staged_equals_monolithic(stubs, tmp_path: Path, reference: drive.Trace, placement) -> None:
    trace = _run(stubs, tmp_path, placement)
    assert trace.cuts == tuple(b for b, _ in placement[1:])
    for ref, got in zip(reference.prompts, trace.prompts, strict=True):
        assert np.array_equal(ref.logits, got.logits)
        assert got.tokens == ref.tokens
        for cut in trace.cuts:
            assert np.array_equal(got.boundaries[cut], ref.captures[cut]), cut
    rows = sum(len(p) + N_DECODE - 1 for p in PROMPTS)
    assert trace.seam_bytes() == tuple([rows * TOY["n_embd"] * 4] * len(trace.cuts))
    assert len(trace.stage_compute_seconds()) == len(placement)
    step = trace.prompts[0].decode[0]
    assert len(step.seam_seconds) == len(placement) - 1 and all(s >= 0 for s in step.seam_seconds)


def test_f16_seams_halve_bytes_and_stay_close(stubs, tmp_path: Path, reference: drive.Trace) -> None:
    trace = _run(stubs, tmp_path, [(0, 6), (6, 12)], boundary_dtype="f16")
    f32_rows = sum(len(p) + N_DECODE - 1 for p in PROMPTS)
    assert trace.seam_bytes() == (f32_rows * TOY["n_embd"] * 2,)
    ref = reference.prompts[0]
    assert np.allclose(trace.prompts[0].boundaries[6], ref.captures[6], rtol=2e-3, atol=2e-3)


def test_capture_on_a_staged_run_routes_to_the_owner(stubs, tmp_path: Path, reference: drive.Trace) -> None:
    trace = _run(stubs, tmp_path, [(0, 6), (6, 12)], capture=[3, 9], all_logits=False)
    got, ref = trace.prompts[2], reference.prompts[2]
    for layer in (3, 9):
        assert np.array_equal(got.captures[layer], ref.captures[layer])
    assert got.logits.shape == (N_DECODE, TOY["n_vocab"]) and got.tokens == ref.tokens
    # One logits row instead of all rows is a different matmul shape: close, not necessarily bitwise.
    assert np.allclose(got.logits, ref.logits[len(PROMPTS[2]) - 1 :], rtol=1e-5, atol=1e-3)


def test_long_prompts_are_prefilled_in_n_batch_chunks(stubs, tmp_path: Path, reference: drive.Trace) -> None:
    env = fake_env(stubs, DGR_FAKE_N_BATCH="3")
    with launch(
        fake_command(tmp_path), [(0, 6), (6, 12)], stubs=stubs, evidence=tmp_path / "ev", env=env
    ) as p:
        assert p.clients[0].info().n_batch == 3
        trace = drive.run_placement(p.clients, PROMPTS, N_DECODE, capture=[2, 8])
    for ref, got in zip(reference.prompts, trace.prompts, strict=True):
        assert got.tokens == ref.tokens and got.logit_positions == ref.logit_positions
        assert got.prefill.n_tokens == len(got.prompt)
        assert np.array_equal(got.boundaries[6], ref.captures[6])
        for layer in (2, 8):
            assert np.array_equal(got.captures[layer], ref.captures[layer])
        # The head's matmul over 3 rows instead of 10 rounds differently: close, not bitwise.
        assert np.allclose(got.logits, ref.logits, rtol=1e-5, atol=1e-3)


def test_speed_samples(stubs, tmp_path: Path) -> None:
    with launch(
        fake_command(tmp_path), [(0, 6), (6, 12)], stubs=stubs, evidence=tmp_path / "ev", env=fake_env(stubs)
    ) as p:
        speed = drive.measure_speed(p.clients, PROMPTS[0], 8, repetitions=5, warmup=1)
    assert len(speed.decode_tok_s) == 5 and all(v > 0 for v in speed.decode_tok_s + speed.prefill_tok_s)
    assert speed.seam_bytes_per_token == (TOY["n_embd"] * 4,)
    assert len(speed.seam_seconds[0]) == 1 and len(speed.stage_compute_per_token[0]) == 2


def test_route_change_reprefills_to_the_same_tokens(stubs, tmp_path: Path) -> None:
    with (
        launch(
            fake_command(tmp_path),
            [(0, 6), (6, 12)],
            stubs=stubs,
            evidence=tmp_path / "a",
            env=fake_env(stubs),
        ) as first,
        launch(
            fake_command(tmp_path),
            [(0, 4), (4, 12)],
            stubs=stubs,
            evidence=tmp_path / "b",
            env=fake_env(stubs),
        ) as second,
    ):
        same = drive.route_change(first.clients, PROMPTS[0], 10, 4)
        moved = drive.route_change(first.clients, PROMPTS[0], 10, 4, after=second.clients)
        # the uninterrupted session given (a depth trace's) is not run again: the switch is the same
        given = drive.route_change(first.clients, PROMPTS[0], 10, 4, uninterrupted=same.reference)
        with pytest.raises(ConfigurationError, match="an uninterrupted session of 10 tokens, got 9"):
            drive.route_change(first.clients, PROMPTS[0], 10, 4, uninterrupted=same.reference[:9])
    assert given == dataclasses.replace(same, reprefill_seconds=given.reprefill_seconds)
    assert same.identical and moved.identical and same.reference == moved.reference
    assert same.reprefill_tokens == len(PROMPTS[0]) + 4
    assert same.cache_miss == "FAILED_PRECONDITION" and moved.cache_miss == "NOT_FOUND"


def test_wrong_boundary_width_is_refused_by_the_stage(stubs, tmp_path: Path) -> None:
    with launch(
        fake_command(tmp_path), [(0, 6), (6, 12)], stubs=stubs, evidence=tmp_path / "ev", env=fake_env(stubs)
    ) as p:
        with pytest.raises(StageFailed, match=r"stage 1 \(layers 6:12\) failed: INVALID_ARGUMENT") as caught:
            p.clients[1].forward("s", 1, [0], boundary=np.zeros((1, TOY["n_embd"] + 1), np.float32))
        assert caught.value.code == "INVALID_ARGUMENT"
        with pytest.raises(StageFailed, match="NOT_FOUND: Forward: unknown session"):
            p.clients[0].forward("never-seen", 1, [5], tokens=[1])


def test_stage_killed_mid_run_names_stage_and_layers(stubs, tmp_path: Path) -> None:
    env = fake_env(stubs, DGR_FAKE_FAULT="die-after-forwards:3", DGR_FAKE_FAULT_BEGIN="4")
    with launch(
        fake_command(tmp_path), [(0, 4), (4, 8), (8, 12)], stubs=stubs, evidence=tmp_path / "ev", env=env
    ) as p:
        died = r"stage 1 \(layers 4:8\) failed: DIED: worker was killed by SIGKILL"
        with pytest.raises(StageFailed, match=died):
            drive.run_placement(p.clients, PROMPTS, N_DECODE)
        pids = p.pids
    assert all(not Path(f"/proc/{pid}").exists() or _zombie(pid) for pid in pids)


def test_placement_in_the_wrong_order_is_refused(stubs, tmp_path: Path) -> None:
    with launch(
        fake_command(tmp_path), [(0, 6), (6, 12)], stubs=stubs, evidence=tmp_path / "ev", env=fake_env(stubs)
    ) as p:
        with pytest.raises(StageFailed, match="WRONG_STAGE"):
            drive.run_placement(list(reversed(p.clients)), PROMPTS, 2)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_interrupt_mid_run_leaves_no_worker(stubs, tmp_path: Path) -> None:
    # Python's own ^C handler, whatever this process inherited: a shell's background job (`cmd &`)
    # starts with SIGINT ignored, and then raise_signal(SIGINT) would raise nothing.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    pids: list[int] = []
    try:
        _interrupt_a_running_launch(stubs, tmp_path, pids)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert pids and all(not Path(f"/proc/{pid}").exists() or _zombie(pid) for pid in pids)


def _interrupt_a_running_launch(stubs, tmp_path: Path, pids: list[int]) -> None:
    with pytest.raises(KeyboardInterrupt):
        with launch(
            fake_command(tmp_path),
            [(0, 6), (6, 12)],
            stubs=stubs,
            evidence=tmp_path / "ev",
            env=fake_env(stubs),
        ) as p:
            pids.extend(p.pids)
            signal.raise_signal(signal.SIGINT)


def test_teacher_forcing_feeds_the_given_tokens(stubs, tmp_path: Path, reference: drive.Trace) -> None:
    # Fed its own greedy tokens, a run reproduces the free-running one row for row; fed others, each
    # decode row is the logits after the forced token, not after the run's own argmax.
    own = [list(t.tokens) for t in reference.prompts]
    (tmp_path / "same").mkdir()
    (tmp_path / "other").mkdir()
    same = _run(stubs, tmp_path / "same", [(0, 12)], forced=own)
    for ref, got in zip(reference.prompts, same.prompts, strict=True):
        assert np.array_equal(ref.logits, got.logits) and got.tokens == ref.tokens
    other = [[(tok + 1) % TOY["n_vocab"] for tok in t] for t in own]
    forced = _run(stubs, tmp_path / "other", [(0, 12)], forced=other)
    for prompt, ref, got, fed in zip(PROMPTS, reference.prompts, forced.prompts, other, strict=True):
        assert got.tokens == tuple(fed)
        n = len(prompt)
        assert np.array_equal(ref.logits[:n], got.logits[:n])  # the prompt rows do not depend on it
        assert not np.array_equal(ref.logits[n:], got.logits[n:])


def test_teacher_forcing_needs_one_full_continuation_per_prompt(stubs, tmp_path: Path) -> None:
    from core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="one continuation per prompt"):
        _run(stubs, tmp_path, [(0, 12)], forced=[[1] * N_DECODE])
    with pytest.raises(ConfigurationError, match=f"needs {N_DECODE} tokens"):
        _run(stubs, tmp_path, [(0, 12)], forced=[[1]] * len(PROMPTS))
