"""The two parity gates on synthetic traces: staging parity (a placement against its lane's monolithic
run) and backend agreement (a lane's monolithic run against the CPU reference, teacher-forced).

The traces are built here from seeded random logits and residuals, so each test states exactly which
difference it plants and which gate must see it."""

from __future__ import annotations

import numpy as np

from certify import gates, measure
from certify.verdict import Status
from manifests.recipe_model import BackendAgreement, StagingParity
from pipeline import drive
from tests.unit.test_gates import RECIPE

CUTS = (3, 6, 9)
N_VOCAB, WIDTH, PROMPT, N_DECODE = 64, 16, 5, 6
ROWS = PROMPT + N_DECODE - 1
AGREEMENT = BackendAgreement(
    top1_margin_min=0.01,
    top1_agreement_min=1.0,
    kl_mean_max=1e-5,
    kl_max_max=1e-4,
    logits_nmse_max=1e-4,
    boundary_nmse_max=1e-4,
)
STAGING = StagingParity(
    top1_agreement_min=1.0,
    kl_mean_max=1e-9,
    kl_max_max=1e-7,
    logits_nmse_max=1e-10,
    boundary_nmse_max=1e-10,
    greedy_match_min=1.0,
)
STEP = drive.Step(
    n_tokens=1, wall_seconds=1.0, stage_wall=(1.0,), stage_compute=(1.0,), seam_bytes=(), seam_seconds=()
)


def _prompt(
    logits: np.ndarray, captures: dict[int, np.ndarray], boundaries: dict[int, np.ndarray]
) -> drive.PromptTrace:
    return drive.PromptTrace(
        prompt=tuple(range(PROMPT)),
        tokens=tuple(int(t) for t in logits[PROMPT - 1 :].argmax(axis=-1)),
        logit_positions=tuple(range(ROWS)),
        logits=logits.astype(np.float32),
        boundaries={c: b.astype(np.float32) for c, b in boundaries.items()},
        captures={c: v.astype(np.float32) for c, v in captures.items()},
        prefill=STEP,
        decode=(STEP,) * (N_DECODE - 1),
    )


def _trace(prompts: list[drive.PromptTrace], cuts: tuple[int, ...]) -> drive.Trace:
    return drive.Trace(placement=(), cuts=cuts, boundary_dtype="f32", infos=(), prompts=tuple(prompts))


def _reference(seed: int = 7) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 1.0, (ROWS, N_VOCAB))
    residuals = {c: rng.normal(0.0, 0.5, (ROWS, WIDTH)) for c in CUTS}
    return logits, residuals


def _noisy(x: np.ndarray, nmse: float, seed: int) -> np.ndarray:
    """``x`` plus white noise of the given NMSE (power of the noise over the power of ``x``)."""
    rng = np.random.default_rng(seed)
    return x + rng.normal(0.0, np.sqrt(nmse * np.mean(np.square(x))), x.shape)


def _agreement(lane_logits: np.ndarray, lane_residuals: dict[int, np.ndarray]):
    logits, residuals = _reference()
    ref = _trace([_prompt(logits, residuals, {})], ())
    forced = _trace([_prompt(lane_logits, lane_residuals, {})], ())
    figures = measure.agreement_figures(ref, forced, forced, margin=AGREEMENT.top1_margin_min)
    return figures, gates.evaluate_agreement("cuda", AGREEMENT, CUTS, figures)


def test_small_noise_passes_backend_agreement() -> None:
    logits, residuals = _reference()
    lane = _noisy(logits, 1e-6, 1)
    figures, result = _agreement(lane, {c: _noisy(r, 1e-6, 2 + c) for c, r in residuals.items()})
    assert 5e-7 < figures["logits_nmse"] < 2e-6
    assert figures["clear_rows"] >= ROWS - 2 and figures["top1_agreement_clear"] == 1.0
    assert result.status is Status.PASS, result.reason
    assert result.details["divergence_starts_at"] is None


def test_a_jump_from_one_cut_on_fails_backend_agreement_naming_that_cut() -> None:
    logits, residuals = _reference()
    # The lane's layers before 6 agree; from layer 6 on its residual is another one (a flipped
    # selection inside layers 3..5), and so are its logits.
    lane_res = {c: (_noisy(r, 1e-7, c) if c < 6 else _noisy(r, 1e-2, c)) for c, r in residuals.items()}
    figures, result = _agreement(_noisy(logits, 1e-2, 1), lane_res)
    assert result.status is Status.FAIL
    assert result.name == "backend-agreement/cuda-vs-cpu"
    assert result.details["divergence_starts_at"] == 6
    assert "divergence starts before layer 6" in result.reason
    assert "boundary NMSE at layer 3" not in result.reason and "boundary NMSE at layer 6" in result.reason

    # The same lane's placements equal its own monolithic run: staging parity holds.
    lane_mono = _trace([_prompt(_noisy(logits, 1e-2, 1), lane_res, {})], ())
    staged = _trace([_prompt(_noisy(logits, 1e-2, 1), {}, {6: lane_res[6]})], (6,))
    parity = measure.staging_parity_figures(lane_mono, staged)
    placement = RECIPE.placements["two-middle"]
    held = gates.evaluate(
        gates.STAGING_PARITY, placement.name, gates.staging_parity_checks(STAGING, placement), parity
    )
    assert parity["bitwise_logits"] and parity["boundary_nmse@6"] == 0.0
    assert held.status is Status.PASS, held.reason


def test_a_staging_difference_fails_staging_parity_naming_the_placement() -> None:
    logits, residuals = _reference()
    mono = _trace([_prompt(logits, residuals, {})], ())
    # The second stage starts from a boundary that is not the residual the monolithic run had.
    staged = _trace([_prompt(_noisy(logits, 1e-6, 3), {}, {6: _noisy(residuals[6], 1e-6, 4)})], (6,))
    placement = RECIPE.placements["two-middle"]
    result = gates.evaluate(
        gates.STAGING_PARITY,
        placement.name,
        gates.staging_parity_checks(STAGING, placement),
        measure.staging_parity_figures(mono, staged),
    )
    assert result.status is Status.FAIL
    assert result.name == "staging-parity/two-middle"
    assert "logits NMSE" in result.reason and "boundary NMSE at layer 6" in result.reason


def test_near_ties_are_not_counted_for_top1_and_an_empty_count_fails() -> None:
    logits, residuals = _reference()
    tied = logits.copy()
    top = tied.argmax(axis=-1)
    second = np.argsort(tied, axis=-1)[:, -2]
    tied[np.arange(ROWS), second] = tied[np.arange(ROWS), top] - 1e-4  # every row a near-tie
    lane = tied.copy()
    lane[np.arange(ROWS), second] += 2e-4  # flips every argmax by rounding-sized moves
    ref = _trace([_prompt(tied, residuals, {})], ())
    forced = _trace([_prompt(lane, residuals, {})], ())
    figures = measure.agreement_figures(ref, forced, forced, margin=AGREEMENT.top1_margin_min)
    assert figures["top1_agreement"] == 0.0 and figures["clear_rows"] == 0
    result = gates.evaluate_agreement("cuda", AGREEMENT, CUTS, figures)
    assert result.status is Status.FAIL and "rows with a clear top-1 margin" in result.reason
