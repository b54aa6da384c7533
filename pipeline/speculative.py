"""Speculative pipeline decoding: k drafted tokens and the next one verified in one pass.

A plain decode step carries one token through every stage, so every token pays every seam once
(twice relayed).  A verify pass feeds the last chosen token and k drafts at k+1 positions through
every stage at once; the last stage returns the logits of every row.  Greedy acceptance keeps the
drafts up to the first one that differs from the argmax of the row before it, then adds that argmax
(the bonus token): one pass yields 1..k+1 tokens, and they are the tokens a plain greedy decode
chooses, whatever the drafter proposed.  The positions of the rejected drafts stay in every stage's
KV until the next pass, which starts right after the last accepted token with ``rewind`` set: each
stage takes them back before it computes, so the rollback costs no round trip of its own.  The
workers must be started with ``--max-rewind`` >= k (the drafts one pass can reject).

Drafted tokens travel as token ids, in the pass's own token list; only the boundary crosses a seam.
Where the drafts come from is a ``Drafter``: ``KnownDrafter`` offers a known continuation with a
chosen acceptance (the mechanism's ceiling at 1.0, and what it gives below); ``NextnDrafter`` takes
the drafts the last stage made with DeepSeek-V4's nextn block after the pass before (workers started
with ``--mtp``, docs/mtp.md), and holds its own count of accepted drafts to the stage's.

Relayed and chained routes carry verify passes the driver sends.  On a ring (``routes.Ring()``)
the last stage drafts, verifies and starts the next pass itself (pipeline/ring.py with ``draft=k``), so
only the nextn drafter can run there: a ``KnownDrafter`` lives in the driver, which is off the path.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from core.errors import ConfigurationError
from pipeline import drive
from pipeline.ring import RingRoute, RingRun
from pipeline.routes import LOOPBACK, RELAYED, Reach, Route, RouteSpec, ring_pass
from worker.client import StageClient, StageInfo


class Drafter(Protocol):
    on_last_stage: bool  # the last stage drafts (each pass asks it for k drafts after itself)

    def propose(self, chosen: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens to follow ``chosen`` (the continuation so far, its last token included)."""
        ...

    def received(self, drafts: Sequence[int]) -> None:
        """What the last stage drafted after the pass just made (nothing unless ``on_last_stage``)."""
        ...


@dataclass
class NextnDrafter:
    """The last stage's nextn block drafts: each pass asks it for k tokens to follow the accepted ones,
    and the next pass verifies them."""

    on_last_stage = True
    pending: list[int] = field(default_factory=list[int])
    # every pass's drafts, in order
    history: list[tuple[int, ...]] = field(default_factory=list[tuple[int, ...]])

    def propose(self, chosen: Sequence[int], k: int) -> list[int]:
        return self.pending[:k]

    def received(self, drafts: Sequence[int]) -> None:
        self.pending = [int(t) for t in drafts]
        self.history.append(tuple(self.pending))


@dataclass
class KnownDrafter:
    """Drafts from a known continuation (a plain greedy decode of the same prompt): each drafted token
    is the true next one with probability ``acceptance`` and a wrong one otherwise (seeded, so a run
    is repeatable).  At acceptance 1.0 every draft is accepted: the mechanism's ceiling."""

    continuation: Sequence[int]
    acceptance: float = 1.0
    n_vocab: int = 0
    seed: int = 0
    wrong_by: int = 1  # a wrong draft is the true token + this (mod n_vocab)
    on_last_stage = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.acceptance <= 1.0:
            raise ConfigurationError(f"acceptance {self.acceptance} is not within 0..1")
        self._rng = random.Random(self.seed)

    def propose(self, chosen: Sequence[int], k: int) -> list[int]:
        truth = list(self.continuation[len(chosen) : len(chosen) + k])
        return [t if self._rng.random() < self.acceptance else self._wrong(t) for t in truth]

    def _wrong(self, token: int) -> int:
        return (token + self.wrong_by) % self.n_vocab if self.n_vocab else token + self.wrong_by

    def received(self, drafts: Sequence[int]) -> None:
        pass


@dataclass(frozen=True, kw_only=True)
class VerifyPass:
    """One pass: the tokens fed (the last chosen one, then the drafts) and what greedy acceptance kept."""

    first_position: int
    fed: tuple[int, ...]
    accepted: int  # drafts kept (0..len(fed) - 1)
    chosen: tuple[int, ...]  # the tokens this pass adds: the accepted drafts, then the bonus token
    rewound: int  # positions the stages took back before computing it (the last pass's rejected drafts)
    step: drive.Step

    @property
    def drafted(self) -> int:
        return len(self.fed) - 1


@dataclass(frozen=True, kw_only=True)
class SpeculativeRun:
    prompt: tuple[int, ...]
    k: int
    tokens: tuple[int, ...]  # the continuation: n_decode tokens, the first from the prefill
    logits: np.ndarray  # [n_decode, n_vocab]: the row that chose each token
    prefill: drive.Step
    passes: tuple[VerifyPass, ...]

    @property
    def acceptance_rate(self) -> float:
        """Drafted tokens accepted over drafted tokens (nan when nothing was drafted)."""
        drafted = sum(p.drafted for p in self.passes)
        return sum(p.accepted for p in self.passes) / drafted if drafted else float("nan")

    @property
    def tokens_per_pass(self) -> float:
        return sum(len(p.chosen) for p in self.passes) / len(self.passes) if self.passes else float("nan")

    @property
    def crossings_per_token(self) -> float:
        decoded = sum(len(p.chosen) for p in self.passes)
        return sum(p.step.crossings for p in self.passes) / decoded if decoded else float("nan")

    @property
    def decode_tok_s(self) -> float:
        """Tokens the verify passes added per second of their wall time (the plain decode's figure:
        there, one token per pass)."""
        seconds = sum(p.step.wall_seconds for p in self.passes)
        return sum(len(p.chosen) for p in self.passes) / seconds if seconds > 0 else float("nan")


def accept(rows: np.ndarray, drafts: Sequence[int]) -> tuple[int, int]:
    """Greedy acceptance: (drafts kept, the bonus token).  Row j chose the token after fed[j]; draft j
    stands while it is row j's argmax."""
    kept = 0
    while kept < len(drafts) and int(np.argmax(rows[kept])) == int(drafts[kept]):
        kept += 1
    return kept, int(np.argmax(rows[kept]))


def decode(
    route: Route,
    prompt: Sequence[int],
    n_decode: int,
    *,
    k: int,
    drafter: Drafter,
    session: str,
    epoch: int = 1,
    boundary_dtype: str = "f32",
) -> SpeculativeRun:
    """Prefill ``prompt``, then verify passes until ``n_decode`` tokens are chosen.  The caller resets
    the session (and drains the route)."""
    _check(route.infos, prompt, n_decode, k, route.ring, drafter)
    ask = k if drafter.on_last_stage else 0
    verifying = _Verifying(
        route=route, drafter=drafter, session=session, epoch=epoch, boundary_dtype=boundary_dtype, ask=ask
    )
    if route.ring is not None:
        return _on_ring(verifying, route.ring, prompt, n_decode, k)
    first = drive.prefill(
        route, prompt, session=session, epoch=epoch, boundary_dtype=boundary_dtype, draft=ask
    )
    drafter.received(first.draft)
    chosen, rows = [int(np.argmax(first.logits[-1]))], [first.logits[-1]]
    held = len(prompt)  # positions every stage's KV holds for the session
    passes: list[VerifyPass] = []
    while len(chosen) < n_decode:
        position = len(prompt) + len(chosen) - 1  # where the last chosen token goes
        verify, kept_rows = verifying.one(chosen, position, held, min(k, n_decode - len(chosen) - 1))
        passes.append(verify)
        chosen += verify.chosen
        rows += list(kept_rows)
        held = position + len(verify.fed)
    return SpeculativeRun(
        prompt=tuple(int(t) for t in prompt),
        k=k,
        tokens=tuple(chosen),
        logits=np.stack(rows),
        prefill=first.step,
        passes=tuple(passes),
    )


@dataclass(kw_only=True)
class _Verifying:
    """One session's verify passes as the driver sends them (a route that does not decode by itself)."""

    route: Route
    drafter: Drafter
    session: str
    epoch: int
    boundary_dtype: str
    ask: int  # drafts the last stage makes after each pass (the nextn drafter), else 0

    def one(
        self, chosen: Sequence[int], position: int, held: int, n_drafts: int
    ) -> tuple[VerifyPass, np.ndarray]:
        """Feed the last chosen token and up to ``n_drafts`` drafts at ``position`` (taking back what the
        stages hold from there on); the pass and the logits rows of the tokens it chose."""
        drafts = [int(t) for t in self.drafter.propose(chosen, n_drafts)]
        fed = [chosen[-1], *drafts]
        done = drive.forward_pass(
            self.route,
            range(position, position + len(fed)),
            fed,
            session=self.session,
            epoch=self.epoch,
            boundary_dtype=self.boundary_dtype,
            rewind=held > position,
            draft=self.ask,
            drafted=len(drafts) if self.ask else 0,
        )
        kept, bonus = accept(done.logits, drafts)
        if self.ask and done.accepted != kept:
            raise self.route.stages[-1].failure(
                "BAD_REPLY",
                f"the last stage counts {done.accepted} accepted drafts of {drafts}, "
                f"the logits it sent {kept}",
            )
        self.drafter.received(done.draft)
        verify = VerifyPass(
            first_position=position,
            fed=tuple(fed),
            accepted=kept,
            chosen=(*drafts[:kept], bonus),
            rewound=held - position,
            step=done.step,
        )
        return verify, done.logits[: kept + 1]


def _on_ring(
    verifying: _Verifying, ring: RingRoute, prompt: Sequence[int], n_decode: int, k: int
) -> SpeculativeRun:
    """``decode`` on a ring: the prefill as a chained pass asking for the first drafts, then one ring of
    n_decode - 1 tokens whose last stage drafts (k a pass) and verifies on its own."""
    route, drafter, session, epoch = verifying.route, verifying.drafter, verifying.session, verifying.epoch
    boundary_dtype = verifying.boundary_dtype
    first = drive.prefill(route, prompt, session=session, epoch=epoch, boundary_dtype=boundary_dtype, draft=k)
    drafter.received(first.draft)
    chosen, rows = [int(np.argmax(first.logits[-1]))], [first.logits[-1:]]
    passes: list[VerifyPass] = []
    if n_decode > 1:
        run = ring.decode(
            session,
            epoch,
            len(prompt),
            chosen[0],
            n_decode - 1,
            boundary_dtype=boundary_dtype,
            draft=k,
            drafts=drafter.propose(chosen, min(k, n_decode - 2)),
        )
        if len(run.tokens) != n_decode - 1:
            raise route.stages[-1].failure(
                "BAD_REPLY", f"the ring ended ({run.end}) after {len(run.tokens)} of {n_decode - 1} tokens"
            )
        passes, delivered = _ring_passes(ring, run, len(prompt), drafter)
        rows += delivered
        chosen += run.tokens
    return SpeculativeRun(
        prompt=tuple(int(t) for t in prompt),
        k=k,
        tokens=tuple(chosen),
        logits=np.concatenate(rows),
        prefill=first.step,
        passes=tuple(passes),
    )


def _ring_passes(
    ring: RingRoute, run: RingRun, n_prompt: int, drafter: Drafter
) -> tuple[list[VerifyPass], list[np.ndarray]]:
    """A drafting ring's deliveries as verify passes (the positions each was fed at and took back)
    and their logits rows; the drafter hears each delivery's drafts."""
    passes: list[VerifyPass] = []
    rows: list[np.ndarray] = []
    position, held = n_prompt, n_prompt
    for got, done in zip(run.passes, run.drafted, strict=True):
        step = ring_pass(ring, got, len(done.fed), len(done.chosen)).step
        passes.append(
            VerifyPass(
                first_position=position,
                fed=done.fed,
                accepted=done.accepted,
                chosen=done.chosen,
                rewound=held - position,
                step=step,
            )
        )
        drafter.received(got.draft)
        held, position = position + len(done.fed), position + len(done.chosen)
        rows.append(got.logits)
    return passes, rows


def run(
    stages: Sequence[StageClient],
    prompt: Sequence[int],
    n_decode: int,
    *,
    k: int,
    drafter: Drafter,
    route: RouteSpec = RELAYED,
    reach: Reach = LOOPBACK,
    boundary_dtype: str = "f32",
) -> SpeculativeRun:
    """One fresh session decoded speculatively (``decode``), reset afterwards, its route drained."""
    infos = drive.describe(stages)
    session = drive.new_session("spec")
    with route.open(stages, infos, reach) as opened:
        try:
            done = decode(
                opened, prompt, n_decode, k=k, drafter=drafter, session=session, boundary_dtype=boundary_dtype
            )
            opened.drain()  # every pass's ack in before the session goes
        except BaseException:
            opened.drain(quiet=True)
            drive.abandon_session(stages, session)
            raise
        drive.reset_session(stages, session)
    return done


def _check(
    infos: Sequence[StageInfo],
    prompt: Sequence[int],
    n_decode: int,
    k: int,
    ring: RingRoute | None,
    drafter: Drafter,
) -> None:
    if ring is not None and not drafter.on_last_stage:
        raise ConfigurationError(
            "a ring runs only the last stage's nextn drafter (NextnDrafter): the "
            "driver is off the ring's path, so its own drafts cannot reach a pass",
            hint="run known drafts relayed or chained",
        )
    if k < 1:
        raise ConfigurationError(f"speculative decoding needs k >= 1 drafted tokens per pass, got {k}")
    if n_decode < 1:
        raise ConfigurationError("decode length must be at least 1")
    short = [i.layer_begin for i in infos if i.max_rewind < k]
    if short:
        raise ConfigurationError(
            f"k={k} drafts per pass need workers that take back {k} positions; "
            f"the stages starting at layers {short} take back fewer",
            hint=f"start the workers with --max-rewind {k}",
        )
    if drafter.on_last_stage and not infos[-1].mtp:
        raise ConfigurationError(
            "the nextn drafter needs a last stage that drafts",
            hint="start the last stage with --mtp, on a model with a nextn block",
        )
    drive.fits(infos, len(prompt) + n_decode)  # drafts never run past the last position decoded
