"""The driver's check of a drafting ring's deliveries (``Ring.draft`` > 0, docs/mtp.md).

In a drafting ring the last stage (started with ``--mtp``) verifies the drafts its nextn block made
after the pass before, chooses the accepted drafts and the bonus token, drafts again and starts the
next pass itself.  The driver is off the path, so it holds every delivery to what it can recompute:
each chosen token is the argmax of the row delivered for it; the accepted ones are the drafts the
last delivery announced, in order, and exactly as many as the stage says stood (the row after the
last of them rejects the next draft); a pass yields one token more than it accepted unless a stop
token or the budget cut it.  What it returns is what pipeline/speculative.py reports per pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.sink import ChainedPass
from worker import wire
from worker.client import StageClient


@dataclass(frozen=True, kw_only=True)
class DraftedPass:
    """One verify pass of the ring, as the driver checked it."""

    fed: tuple[int, ...]  # the last chosen token, then the drafts the pass verified
    accepted: int
    chosen: tuple[int, ...]  # the accepted drafts, then the bonus token (cut by a stop token or budget)


class DraftedPasses:
    """Checks a drafting ring's deliveries in order; knows the drafts each pass was fed."""

    def __init__(self, last: StageClient, token: int, drafts: Sequence[int], k: int) -> None:
        self._last = last
        self._k = k
        self._fed = (int(token), *(int(t) for t in drafts))

    def take(self, ring: wire.RingToken, passed: ChainedPass, end: str) -> DraftedPass:
        """The tokens one delivery chose, checked; raises BAD_REPLY against the last stage."""
        fed, drafts = self._fed, self._fed[1:]
        chosen = tuple(int(t) for t in ring.tokens)
        if not chosen or int(ring.token) != chosen[-1] or int(ring.drafted) != len(drafts):
            self._bad(
                f"a drafting ring pass delivered tokens {list(chosen)} (token {ring.token}, "
                f"{ring.drafted} drafted) for a pass fed {list(fed)}"
            )
        if passed.logits.shape[0] != len(chosen):
            self._bad(f"{passed.logits.shape[0]} logits rows for {len(chosen)} chosen tokens")
        picks = [int(np.argmax(row)) for row in passed.logits]
        if picks != list(chosen):
            self._bad(f"the ring chose {list(chosen)}, but the argmax of the rows it delivered is {picks}")
        accepted = int(passed.accepted)
        kept = next(
            (j for j, (c, d) in enumerate(zip(chosen, drafts, strict=False)) if c != d),
            min(len(chosen), len(drafts)),
        )
        cut = end in ("stop_token", "budget")
        if (
            not 0 <= accepted <= len(drafts)
            or kept != min(accepted, len(chosen))
            or len(chosen) > accepted + 1
            or (not cut and len(chosen) != accepted + 1)
        ):
            self._bad(
                f"the last stage counts {accepted} accepted drafts of {list(drafts)}, the tokens it "
                f"chose {list(chosen)} ({end})"
            )
        if len(passed.draft) > self._k:
            self._bad(f"{len(passed.draft)} drafts for the next pass, the ring drafts {self._k}")
        self._fed = (chosen[-1], *(int(t) for t in passed.draft))
        return DraftedPass(fed=fed, accepted=accepted, chosen=chosen)

    def _bad(self, detail: str) -> None:
        raise self._last.failure("BAD_REPLY", detail)
