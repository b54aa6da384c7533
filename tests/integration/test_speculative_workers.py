"""Speculative pipeline decoding on the real worker (CPU lane): tiny-llama and the sealed tiny-v4.

Verify passes of k+1 positions with known drafts (pipeline/speculative.py) through the monolithic
worker and a three-stage cut, relayed and chained:
- the tokens are the plain greedy run's at acceptance 1.0 and 0.5 (the logits' largest difference
  from the plain run is printed: a batch of k+1 rows need not round like k+1 single rows);
- a rejected draft leaves no trace on any stage: two runs that fed different rejected tokens at the
  same places give bitwise the same logits and tokens (on tiny-v4 the rewinds cross its compressor's
  4-token blocks, so the rolled-back compressed and indexer state is covered too);
- a worker refuses a rewind deeper than its --max-rewind, and one started without it refuses any;
- a stage SIGKILLed while verify passes run ends the run within a bound, naming it (DIED).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fetch.provision import provision
from pipeline import drive, routes, speculative
from tests.integration.conftest import our_workers, proc_alive
from worker.client import StageFailed
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TEXT = "The quick brown fox jumps over the lazy dog."
N_DECODE = 20
K = 3
PLACEMENTS = {"monolithic": [(0, 12)], "3-stages": [(0, 4), (4, 8), (8, 12)]}
KILL_BOUND_S = 10.0  # generous for a loaded 2-core box; the measured time is printed


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-v4"])
def model(request, real_ctx, tiny_model) -> Path:
    return tiny_model.first if request.param == "tiny-llama" else Path(provision(real_ctx, "tiny-v4").first)


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_verify_passes_choose_the_plain_greedy_tokens(
    model, placement, worker_command, stubs, worker_env, tmp_path
) -> None:
    command = dataclasses.replace(worker_command, model=model, max_rewind=K, ctx_size=256)
    with launch(command, PLACEMENTS[placement], stubs=stubs, evidence=tmp_path, env=worker_env) as p:
        prompt = p.clients[0].tokenize(TEXT, add_special=True)
        plain = drive.run_placement(p.clients, [prompt], N_DECODE, all_logits=False).prompts[0]
        n_vocab = p.clients[-1].info().n_vocab
        for forwarding in ("relayed", "chained"):
            for acceptance in (1.0, 0.5):
                got = speculative.run(
                    p.clients,
                    prompt,
                    N_DECODE,
                    k=K,
                    route=routes.spec_named(forwarding),
                    drafter=speculative.KnownDrafter(
                        plain.tokens, acceptance=acceptance, n_vocab=n_vocab, seed=1
                    ),
                )
                diff = float(np.abs(got.logits - plain.logits).max())
                print(
                    f"{model.name} {placement} {forwarding} acceptance {acceptance}: measured "
                    f"{got.acceptance_rate:.2f}, {got.tokens_per_pass:.2f} tokens/pass, "
                    f"{got.crossings_per_token:.2f} crossings/token, max |logit - plain| {diff:.3g}"
                )
                assert got.tokens == plain.tokens, (forwarding, acceptance)
                if acceptance == 1.0:
                    assert got.acceptance_rate == 1.0
        runs = [
            speculative.run(
                p.clients,
                prompt,
                N_DECODE,
                k=K,
                drafter=speculative.KnownDrafter(
                    plain.tokens, acceptance=0.4, n_vocab=n_vocab, seed=5, wrong_by=by
                ),
            )
            for by in (1, 2)
        ]
    a, b = runs
    assert any(q.rewound for q in a.passes), "no draft was rejected: the rollback went untested"
    assert [q.fed for q in a.passes] != [q.fed for q in b.passes]
    assert np.array_equal(a.logits, b.logits) and a.tokens == b.tokens == plain.tokens


def test_rewinds_beyond_the_workers_limit_are_refused(worker_command, stubs, worker_env, tmp_path) -> None:
    for limit in (0, 2):
        command = dataclasses.replace(worker_command, max_rewind=limit or None, ctx_size=256)
        with launch(command, [(0, 12)], stubs=stubs, evidence=tmp_path / str(limit), env=worker_env) as p:
            stage = p.clients[0]
            assert stage.info().max_rewind == limit
            session = drive.new_session("rewind")
            stage.forward(session, 1, [0, 1, 2, 3, 4], tokens=[1, 2, 3, 4, 5])
            with pytest.raises(StageFailed) as caught:
                stage.forward(session, 1, [2], tokens=[9], rewind=True)
            assert caught.value.code == "FAILED_PRECONDITION"
            wanted = "--max-rewind" if limit == 0 else "at most 2"
            assert wanted in caught.value.detail, caught.value
            if limit:
                assert stage.forward(session, 1, [3], tokens=[9], rewind=True).logits is not None
                with pytest.raises(StageFailed, match="out of order"):
                    stage.forward(session, 1, [3], tokens=[9])
            stage.reset(session)


class _KillingDrafter(speculative.KnownDrafter):
    """Known drafts; at the ``at``-th proposal a thread SIGKILLs ``process``, so the kill lands while
    the verify pass just proposed is on its way through the stages."""

    def __init__(self, *args, process, at: int, **kw) -> None:
        super().__init__(*args, **kw)
        self.process, self.at, self.calls, self.killed_at = process, at, 0, None

    def propose(self, chosen, k):
        self.calls += 1
        if self.calls == self.at:
            self.killed_at = time.monotonic()
            threading.Thread(target=self.process.kill, daemon=True).start()
        return super().propose(chosen, k)


@pytest.mark.parametrize("victim", [1, 2], ids=["middle", "last"])
@pytest.mark.parametrize("forwarding", ["relayed", "chained"])
def test_a_stage_killed_during_verify_passes_is_named(
    victim, forwarding, worker_command, stubs, worker_env, tmp_path
) -> None:
    command = dataclasses.replace(worker_command, max_rewind=K, ctx_size=256)
    with launch(command, PLACEMENTS["3-stages"], stubs=stubs, evidence=tmp_path, env=worker_env) as p:
        prompt = p.clients[0].tokenize(TEXT, add_special=True)
        drafter = _KillingDrafter(
            [1] * 200,
            acceptance=0.5,
            n_vocab=p.clients[-1].info().n_vocab,
            process=p.stages[victim].process,
            at=5,
        )
        with pytest.raises(StageFailed) as caught:
            speculative.run(p.clients, prompt, 200, k=K, drafter=drafter, route=routes.spec_named(forwarding))
        took = time.monotonic() - drafter.killed_at
        pids = p.pids
    print(
        f"\n[speculative] stage {victim} of 3 killed at verify pass 5 ({forwarding}): {caught.value} "
        f"(ended {took:.2f} s after the kill)"
    )
    assert caught.value.stage == victim and caught.value.code == "DIED", caught.value
    assert took < KILL_BOUND_S
    assert not any(proc_alive(pid) for pid in pids)
    assert our_workers(worker_command.program[0]) == []
