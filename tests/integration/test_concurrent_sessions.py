"""Issue 19 item 4: several sessions decoded at the same time through real workers (tiny model, CPU).

Each concurrent session must be bitwise the same session decoded alone (tokens and every pass's
logits), relayed and chained, and the staged sessions must choose the monolithic worker's tokens.
Throughput is not asserted here (two shared cores); `tests/bench/test_bench_concurrency.py` reports it.
"""

from __future__ import annotations

import dataclasses

import pytest

from pipeline import routes
from pipeline.concurrency import decode_together, diverging
from worker.client import StageFailed
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

TEXT = "Pipeline parallel inference splits the layers of a model across machines."
N_DECODE = 12
FOUR = [(0, 3), (3, 6), (6, 9), (9, 12)]


@pytest.fixture(scope="module")
def command(worker_command):
    return dataclasses.replace(worker_command, threads=1, max_sessions=8)


@pytest.fixture(scope="module")
def monolithic(command, stubs, worker_env, tmp_path_factory):
    evidence = tmp_path_factory.mktemp("mono")
    with launch(command, [(0, 12)], stubs=stubs, evidence=evidence, env=worker_env) as p:
        prompt = p.clients[0].tokenize(TEXT, add_special=True)
        alone = decode_together(p.clients, prompt, N_DECODE, 1).sessions[0]
        together = decode_together(p.clients, prompt, N_DECODE, 4)
    assert diverging(together, alone) == []
    return prompt, alone


@pytest.mark.parametrize("forwarding", ["relayed", "chained"])
def test_concurrent_sessions_equal_one_session_alone(
    forwarding, monolithic, command, stubs, worker_env, tmp_path
) -> None:
    prompt, mono = monolithic
    with launch(command, FOUR, stubs=stubs, evidence=tmp_path, env=worker_env) as p:
        alone = decode_together(p.clients, prompt, N_DECODE, 1, route=routes.spec_named(forwarding)).sessions[
            0
        ]
        together = decode_together(p.clients, prompt, N_DECODE, 4, route=routes.spec_named(forwarding))
    assert len(together.sessions) == 4 and together.aggregate_tok_s > 0
    assert alone.tokens == mono.tokens and alone.logits.tobytes() == mono.logits.tobytes()
    assert diverging(together, alone) == []
    print(
        f"\n{forwarding} 4 stages, 4 sessions: {together.aggregate_tok_s:.1f} tok/s aggregate "
        f"(one session: {len(alone.tokens) / (alone.ended - alone.started):.1f} tok/s)"
    )


def test_more_sessions_than_a_worker_holds_is_refused_not_mixed(
    command, monolithic, stubs, worker_env, tmp_path
) -> None:
    prompt, _ = monolithic
    small = dataclasses.replace(command, max_sessions=2)
    with launch(small, [(0, 6), (6, 12)], stubs=stubs, evidence=tmp_path, env=worker_env) as p:
        with pytest.raises(StageFailed, match="too many sessions"):
            decode_together(p.clients, prompt, N_DECODE, 3)
