"""The MTP gate's figures (docs/mtp.md): speculative pipeline decoding with the last stage's nextn
block, held to the placement's own plain greedy run.

Per placement, on the workers the placement already runs (the last stage started with --mtp):
- every prompt decoded with verify passes of k drafts + 1 (pipeline.speculative, NextnDrafter) must
  choose the tokens the plain run chose (MTP on == MTP off, exact on the CPU);
- rollback leaves no trace: two runs of the first prompt with known drafts that miss at the same
  places but with different wrong tokens must give bitwise the same logits and tokens (every stage
  took the rejected positions back, the MTP context included);
- the acceptance rate, tokens per pass and seam crossings per token are reported, not gated (a
  random nextn block accepts almost nothing).
A ring placement is verified on the ring (its last stage drafts, verifies and starts the next pass
itself: pipeline/ring.py with ``draft``); only the rollback check runs chained there, since its known
drafts come from the driver, which is off a ring's path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from certify import gates
from certify.gates import AtLeast, Check
from certify.verdict import Result
from pipeline import drive, speculative
from pipeline.routes import LOOPBACK, Reach, RouteSpec
from worker.client import StageClient

ROLLBACK_ACCEPTANCE = 0.4  # known drafts that miss often enough for every pass to reject some
ROLLBACK_SEED = 5


def mtp_figures(
    clients: Sequence[StageClient],
    prompts: Sequence[Sequence[int]],
    plain: drive.Trace,
    k: int,
    n_decode: int,
    *,
    boundary_dtype: str,
    route: RouteSpec,
    reach: Reach = LOOPBACK,
) -> dict[str, Any]:
    """What the MTP gate and the report read, for one placement."""
    runs = [
        speculative.run(
            clients,
            prompt,
            n_decode,
            k=k,
            drafter=speculative.NextnDrafter(),
            route=route,
            reach=reach,
            boundary_dtype=boundary_dtype,
        )
        for prompt in prompts
    ]
    same = sum(r.tokens == p.tokens for r, p in zip(runs, plain.prompts, strict=True))
    # known drafts live in the driver: they go through the same stages on a route the driver feeds
    rollback = _rollback_leaves_no_trace(
        clients,
        prompts[0],
        plain.prompts[0].tokens,
        k,
        n_decode,
        route=route.driver_fed(),
        reach=reach,
        boundary_dtype=boundary_dtype,
    )
    return {
        "draft_tokens": k,
        "prompts": len(runs),
        "prompts_identical": same,
        "identical_fraction": same / len(runs),
        "rollback_identical": 1.0 if rollback else 0.0,
        **_pass_figures(runs),
        "forwarding": route.name,
    }


def _pass_figures(runs: Sequence[speculative.SpeculativeRun]) -> dict[str, float]:
    """How the verify passes of every prompt did together: drafts accepted, tokens and crossings per
    pass, the median decode rate."""
    passes = [q for r in runs for q in r.passes]
    decoded = sum(len(q.chosen) for q in passes)
    return {
        "acceptance_rate": sum(q.accepted for q in passes) / max(1, sum(q.drafted for q in passes)),
        "tokens_per_pass": decoded / len(passes) if passes else 0.0,
        "crossings_per_token": sum(q.step.crossings for q in passes) / decoded if decoded else 0.0,
        "decode_tok_s": float(np.median([r.decode_tok_s for r in runs])),
    }


def _rollback_leaves_no_trace(
    clients: Sequence[StageClient],
    prompt: Sequence[int],
    truth: Sequence[int],
    k: int,
    n_decode: int,
    *,
    route: RouteSpec,
    reach: Reach,
    boundary_dtype: str,
) -> bool:
    n_vocab = drive.describe(clients)[-1].n_vocab

    def known(by: int) -> speculative.KnownDrafter:
        return speculative.KnownDrafter(
            truth, acceptance=ROLLBACK_ACCEPTANCE, n_vocab=n_vocab, seed=ROLLBACK_SEED, wrong_by=by
        )

    a, b = (
        speculative.run(
            clients,
            prompt,
            n_decode,
            k=k,
            drafter=known(by),
            route=route,
            reach=reach,
            boundary_dtype=boundary_dtype,
        )
        for by in (1, 2)
    )
    rewound = any(q.rewound for q in a.passes)
    return rewound and a.tokens == b.tokens and bool(np.array_equal(a.logits, b.logits))


def mtp_checks() -> list[Check]:
    return [
        AtLeast(
            name="MTP on == MTP off (greedy tokens, every prompt)", metric="identical_fraction", limit=1.0
        ),
        AtLeast(name="rejected drafts leave no trace (bitwise)", metric="rollback_identical", limit=1.0),
    ]


def mtp_result(placement: str, figures: dict[str, Any]) -> Result:
    """The MTP gate of one placement (gate "mtp")."""
    numeric = {
        k: float(v) for k, v in figures.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    return gates.evaluate("mtp", placement, mtp_checks(), numeric)
