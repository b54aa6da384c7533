"""A ring that drafts (docs/mtp.md, worker/README.md "Ring decode"): the C++ worker on tiny-v4-mtp.

The last stage (--mtp) verifies the drafts its nextn block made after the pass before, chooses the
accepted drafts and the bonus token, drafts k more and starts the next pass at stage 0 itself; the
driver only reads and checks (pipeline/ring_drafts.py).  On the monolithic worker and three stages:
- the tokens equal MTP off's (plain greedy on workers without --mtp), and every pass is fed exactly
  what the chained speculative path feeds (same drafts, same acceptance);
- the budget and a stop token end the ring at the right token inside a pass whose drafts all stood
  (the first pass's drafts come from the driver: the true continuation); the stages stop there and
  take the unused drafts back on the next call, the nextn block's state included (its drafts there
  equal those of a session that never went past);
- a full context ends it with every position used;
- a drafting ring is refused at its first pass without --mtp on the last stage or with too small a
  --max-rewind, and a driver-side drafter is refused on a ring;
- a stage SIGKILLed mid-ring ends the run, named, within a bound;
- the MTP gate (certify/mtp.py) verifies a ring placement on the ring.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from certify import mtp
from core.errors import ConfigurationError
from fetch.provision import provision
from pipeline import drive, ring, routes, speculative
from tests.integration.conftest import our_workers, proc_alive
from tests.integration.test_ring import killed_mid_ring
from worker.client import StageFailed
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TEXT = "The quick brown fox jumps over the lazy dog."
N_DECODE = 16
K = 3
CTX = 128
PLACEMENTS = {"monolithic": [(0, 12)], "3-stages": [(0, 4), (4, 8), (8, 12)]}
THREE = PLACEMENTS["3-stages"]
KILL_BOUND_S = 10.0  # generous for a loaded 2-core box; the measured time is printed


@pytest.fixture(scope="module")
def mtp_command(real_ctx, worker_command):
    model = Path(provision(real_ctx, "tiny-v4-mtp").first)
    return dataclasses.replace(worker_command, model=model, max_rewind=K, ctx_size=CTX, mtp=True)


@pytest.fixture(scope="module")
def reference(mtp_command, stubs, worker_env, tmp_path_factory):
    """MTP off, monolithic: the prompt and its plain greedy continuation."""
    off = dataclasses.replace(mtp_command, mtp=False)
    with launch(off, [(0, 12)], stubs=stubs, evidence=tmp_path_factory.mktemp("off"), env=worker_env) as p:
        prompt = p.clients[0].tokenize(TEXT, add_special=True)
        trace = drive.run_placement(p.clients, [prompt], N_DECODE, all_logits=False).prompts[0]
    return prompt, trace.tokens


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_a_drafting_ring_chooses_the_tokens_mtp_off_chooses(
    placement, reference, mtp_command, stubs, worker_env, tmp_path
) -> None:
    prompt, off = reference
    n = len(PLACEMENTS[placement])
    with launch(mtp_command, PLACEMENTS[placement], stubs=stubs, evidence=tmp_path, env=worker_env) as p:
        runs = {
            f: speculative.run(
                p.clients,
                prompt,
                N_DECODE,
                k=K,
                drafter=speculative.NextnDrafter(),
                route=routes.spec_named(f),
            )
            for f in ("ring", "chained")
        }
    got, chained = runs["ring"], runs["chained"]
    for name, r in runs.items():
        print(
            f"{placement} {name}: acceptance {r.acceptance_rate:.2f}, {r.tokens_per_pass:.2f} tokens/pass, "
            f"{r.crossings_per_token:.2f} crossings/token, {len(r.passes)} passes"
        )
    assert got.tokens == off == chained.tokens
    assert [q.fed for q in got.passes] == [q.fed for q in chained.passes]
    assert [q.accepted for q in got.passes] == [q.accepted for q in chained.passes]
    assert sum(q.drafted for q in got.passes) > 0, "the ring verified no draft"
    assert [int(t) for t in np.argmax(got.logits, axis=1)] == list(got.tokens)
    assert all(q.step.forwarding == "ring" and q.step.crossings == n for q in got.passes)
    assert got.crossings_per_token < chained.crossings_per_token


def _prefilled(route: ring.RingRoute, session: str, prompt) -> int:
    passed = route.run(
        session,
        1,
        list(range(len(prompt))),
        prompt,
        boundary_dtype="f32",
        all_logits=False,
        keep_boundaries=False,
    )
    return int(np.argmax(passed.logits[-1]))


def _next_after(clients, session: str, position: int, token: int, *, rewind: bool) -> tuple[int, tuple]:
    """One relayed pass (the last stage asked for drafts): its argmax and the nextn block's drafts."""
    relay, reply = None, None
    for c in clients:
        last = c is clients[-1]
        reply = c.forward(
            session, 1, [position], tokens=[token], boundary=relay, rewind=rewind, draft=K if last else 0
        )
        relay = reply.boundary_wire
    return int(np.argmax(reply.logits[-1])), tuple(reply.draft)


def _never_past(clients, session: str, prompt, tokens) -> tuple[int, tuple]:
    """The same pass on a session that fed ``tokens`` one by one and never went further."""
    for position, token in enumerate([*prompt, *tokens[:-1]]):
        _next_after(clients, session, position, token, rewind=False)
    return _next_after(clients, session, len(prompt) + len(tokens) - 1, tokens[-1], rewind=False)


def test_budget_stop_token_and_full_context_end_a_drafting_ring(
    reference, mtp_command, stubs, worker_env, tmp_path
) -> None:
    prompt, ref = reference
    at = next((i for i in range(2, K + 1) if ref[i] not in ref[1:i]), 1)  # a stop inside the first pass
    with launch(mtp_command, THREE, stubs=stubs, evidence=tmp_path, env=worker_env) as p:
        infos = drive.describe(p.clients)
        with ring.ring_route(p.clients, infos, addresses=None, sink_host="127.0.0.1") as route:
            assert _prefilled(route, "budget", prompt) == ref[0]
            budget = route.decode("budget", 1, len(prompt), ref[0], 3, draft=K, drafts=ref[1 : K + 1])
            assert _prefilled(route, "stop", prompt) == ref[0]
            stopped = route.decode(
                "stop", 1, len(prompt), ref[0], 20, stop_tokens=(ref[at],), draft=K, drafts=ref[1 : K + 1]
            )
            route.drain()
            full = ring.generate(route, prompt, 10 * CTX, session="full", draft=K)
            refused = route.sink.refused
        # the stages hold the first pass's positions: the next call takes the unused ones back
        after_budget = _next_after(p.clients, "budget", len(prompt) + 3, ref[3], rewind=True)
        after_stop = _next_after(p.clients, "stop", len(prompt) + at, ref[at], rewind=True)
        fresh = _never_past(p.clients, "fresh", prompt, ref[:4])
    print(
        f"\n[ring drafts] budget 3: {budget.end} {budget.tokens}; stop token {ref[at]} (token {at}): "
        f"{stopped.end} {stopped.tokens}; context {CTX}: {full.end} after {len(full.tokens)} tokens; "
        f"drafts after the budget {after_budget[1]}, never past {fresh[1]}"
    )
    assert budget.end == "budget" and budget.tokens == tuple(ref[1:4])
    assert len(budget.passes) == 1 and budget.drafted[0].accepted == K  # cut inside its one pass
    assert (
        stopped.end == "stop_token" and stopped.tokens == tuple(ref[1 : at + 1]) and len(stopped.passes) == 1
    )
    assert after_budget[0] == ref[4] and after_stop[0] == ref[at + 1]
    # the MTP context took the unused positions back (else its next catch-up fails); the random block's
    # drafts do not show whether its input row went back too (they stay equal with that left out)
    assert after_budget == fresh, "the nextn block's state did not go back with the unused drafts"
    assert full.end == "context_full" and len(full.tokens) == CTX - len(prompt) + 1
    assert full.tokens[:N_DECODE] == tuple(ref)
    assert refused == 0, "a ring delivered past its end"


def test_a_drafting_ring_is_refused_where_it_cannot_run(
    reference, mtp_command, stubs, worker_env, tmp_path
) -> None:
    prompt, ref = reference
    failures = {}
    for name, command in {
        "no --mtp": dataclasses.replace(mtp_command, mtp=False),
        "--max-rewind 1": dataclasses.replace(mtp_command, max_rewind=1),
    }.items():
        with launch(
            command, THREE, stubs=stubs, evidence=tmp_path / name.strip("-").replace(" ", "-"), env=worker_env
        ) as p:
            infos = drive.describe(p.clients)
            with ring.ring_route(p.clients, infos, addresses=None, sink_host="127.0.0.1") as route:
                _prefilled(route, "refused", prompt)
                with pytest.raises(StageFailed) as caught:
                    route.decode("refused", 1, len(prompt), ref[0], 8, draft=K)
            failures[name] = caught.value
            if name == "no --mtp":
                known = speculative.KnownDrafter(ref, n_vocab=infos[-1].n_vocab)
                with pytest.raises(ConfigurationError, match="NextnDrafter"):
                    speculative.run(p.clients, prompt, 8, k=K, drafter=known, route=routes.Ring())
    for name, failed in failures.items():
        print(f"\n[ring drafts] {name}: {failed}")
    assert failures["no --mtp"].stage == 2 and failures["no --mtp"].code == "FAILED_PRECONDITION"
    assert "without --mtp" in failures["no --mtp"].detail
    assert failures["--max-rewind 1"].stage == 0 and failures["--max-rewind 1"].code == "FAILED_PRECONDITION"
    assert "--max-rewind 3" in failures["--max-rewind 1"].detail


@pytest.mark.parametrize("victim", [0, 1, 2], ids=["first", "middle", "last"])
def test_a_stage_killed_in_a_drafting_ring_is_named(
    victim, reference, mtp_command, stubs, worker_env, tmp_path
) -> None:
    prompt, _ = reference
    with launch(mtp_command, THREE, stubs=stubs, evidence=tmp_path, env=worker_env) as p:
        infos = drive.describe(p.clients)
        with ring.ring_route(p.clients, infos, addresses=None, sink_host="127.0.0.1") as route:
            failed, took, delivered = killed_mid_ring(
                route,
                p.stages[victim].process,
                lambda: ring.generate(route, prompt, 10 * CTX, session="killed", draft=K),
            )
        pids = p.pids
    print(
        f"\n[ring drafts] stage {victim} of 3 killed after {delivered} deliveries: {failed} "
        f"(ended {took:.2f} s after the kill)"
    )
    assert delivered >= 10, "the ring ended before the kill"
    assert failed.stage == victim and failed.code == "DIED" and "SIGKILL" in str(failed)
    assert took < KILL_BOUND_S
    assert not any(proc_alive(pid) for pid in pids)
    assert our_workers(mtp_command.program[0]) == []


def test_the_mtp_gate_verifies_a_ring_placement_on_the_ring(
    reference, mtp_command, stubs, worker_env, tmp_path
) -> None:
    prompt, off = reference
    with launch(mtp_command, THREE, stubs=stubs, evidence=tmp_path, env=worker_env) as p:
        plain = drive.run_placement(p.clients, [prompt], N_DECODE, all_logits=False)
        figures = mtp.mtp_figures(
            p.clients, [prompt], plain, K, N_DECODE, boundary_dtype="f32", route=routes.Ring()
        )
    print(f"\n[ring drafts] MTP gate figures on a ring placement: {figures}")
    assert plain.prompts[0].tokens == off
    assert figures["forwarding"] == "ring" and figures["identical_fraction"] == 1.0
    assert figures["rollback_identical"] == 1.0
    # a ring pass crosses each of the 3 seams into a stage once (no crossing back to the driver)
    assert figures["crossings_per_token"] == pytest.approx(3 / figures["tokens_per_pass"])
    assert mtp.mtp_result("three", figures).status.name == "PASS"
