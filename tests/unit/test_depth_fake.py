"""Depth and pipelined prefill over the Python fake worker (real gRPC, real launcher): the scenario in a
certification, the KV gate catching a stage that holds too much, and the pipelined prefill giving the
relayed one's logits.  The real workers' run is tests/integration/test_depth.py."""

from __future__ import annotations

import base64
import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cli.balance import route_change_cost
from core.errors import ConfigurationError, IntegrityError
from pipeline import drive, routes
from pipeline.depth import run_at_depth
from pipeline.pipelined import overlapped
from tests.unit.certify_fixtures import certify_fake, fake_context, small_recipe_doc
from tests.unit.fake_stages import fake_command, fake_env, load_stubs
from worker.launcher import launch

PROMPT = [(7 * i + 3) % 40 for i in range(150)]


def _depth_doc() -> dict[str, Any]:
    doc = small_recipe_doc()
    doc["depth"] = {
        "context": 512,
        "prompt_tokens": [60, 200],
        "ubatch": 32,
        "decode_tokens": 4,
        "seed": 11,
        "placements": ["two-middle", "twelve-single"],
    }
    return doc


@pytest.fixture(scope="module")
def certified(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """One certification with the scenario (its folder, what it wrote), read by the tests below."""
    root = tmp_path_factory.mktemp("depth")
    return root, certify_fake(root, _depth_doc())


def test_a_certification_runs_its_depth_scenario_and_says_so(certified: tuple[Path, Any]) -> None:
    root, w = certified
    assert w.verdict.passed, w.verdict.reasons
    assert json.loads(w.evidence.joinpath("run.json").read_text())["status"] == "PASS"
    depth = _predicate(w)["figures"]["depth"]
    assert depth["applies"] and depth["scenario"]["context"] == 512
    assert [p["name"] for p in depth["placements"]] == ["two-middle", "twelve-single"]
    for p in depth["placements"]:
        assert p["parity"]["bitwise_logits"] and p["parity"]["greedy_match"] == 1.0
        # 60 and 200 tokens in passes of 32: 2 + 7 judged prefill rows, then 3 decoded rows each
        assert p["parity"]["rows_compared"] == (2 + 3) + (7 + 3)
        assert p["kv_bytes_sum"] == p["kv_bytes_monolithic"] == depth["monolithic"]["kv_bytes"][0]
        assert [q["passes"] for q in p["prompts"]] == [2, 7]
        # the longest prompt's prefill again, pipelined: the same logits, its speed beside the relayed one
        assert p["prefill"]["bitwise"] and p["prefill"]["passes"] == 7 and p["prefill"]["pipelined_tok_s"] > 0
        # the session state each stage held at the end of each prompt (the Session RPC): the stages'
        # sum is the monolithic worker's, and the longer prompt holds more
        held = [sum(q["held_bytes"]) for q in p["prompts"]]
        assert (
            held == [sum(q["held_bytes"]) for q in depth["monolithic"]["prompts"]] and 0 < held[0] < held[1]
        )
        assert all(len(q["held_bytes"]) == len(p["stages"]) for q in p["prompts"])
    names = {r["name"]: r["status"] for r in _predicate(w)["results"]}
    assert names["depth-parity/twelve-single"] == "PASS" and names["kv-at-depth/two-middle"] == "PASS"
    # the recipe's route-change placement is not run at depth: the scenario's first placement switches
    rc = depth["route_change"]
    assert (rc["placement"], rc["prefix_tokens"], rc["switch_at"]) == ("two-middle", 200, 2)
    assert rc["reprefill_tokens"] == 202 and rc["reprefill_s"] > 0 and rc["switched"] == rc["reference"]
    assert names["route-change-at-depth/two-middle"] == "PASS"
    html = w.html.read_text()
    assert "Depth: the recipe's context scenario" in html and "Every stage allocates 512 positions" in html
    assert (
        "Session state held at the end of each prompt" in html and "Decode tokens/s after each prompt" in html
    )
    assert html.count("<polyline") == 2 * 3  # monolithic and both placements, in each chart
    # `dgr balance --certificate` reads the same figure from the verified certificate
    line = route_change_cost(fake_context(root), w.certificate, "tiny-fake")
    assert line.startswith(
        "route change at 200 tokens (two-middle, lane cpu): re-prefilling 202 positions took "
    )
    assert "Route change at depth (two-middle): after a 200-token prompt" in html


def test_balance_refuses_a_certificate_that_does_not_verify_or_is_of_another_recipe(
    certified: tuple[Path, Any], tmp_path: Path
) -> None:
    root, w = certified
    ctx = fake_context(root)  # the workspace whose key signed it
    with pytest.raises(ConfigurationError, match="certifies recipe 'tiny-fake', not 'tiny-llama'"):
        route_change_cost(ctx, w.certificate, "tiny-llama")
    forged = tmp_path / "forged.json"
    envelope = json.loads(w.certificate.read_text())
    envelope["payload"] = base64.b64encode(
        base64.b64decode(envelope["payload"]).replace(b"202", b"203")
    ).decode()
    forged.write_text(json.dumps(envelope))
    route_change_cost(ctx, w.certificate, "tiny-fake")  # the unforged one verifies in this context
    with pytest.raises(IntegrityError):
        route_change_cost(ctx, forged, "tiny-fake")


def test_a_stage_holding_more_kv_than_its_layers_fails_the_kv_gate_and_is_named(tmp_path: Path) -> None:
    ctx = fake_context(tmp_path, DGR_FAKE_FAULT="kv-double", DGR_FAKE_FAULT_BEGIN="6")
    doc = _depth_doc()
    doc["depth"]["placements"] = ["two-middle"]
    w = certify_fake(tmp_path, doc, ctx=ctx)
    assert w.verdict.status.value == "FAIL"
    (reason,) = [r for r in w.verdict.reasons if r.startswith("kv-at-depth/two-middle")]
    assert "stage 1 (layers 6:12) " in reason and "the monolithic worker" in reason


def _predicate(w: Any) -> dict[str, Any]:
    envelope = json.loads(w.certificate.read_text())
    return json.loads(base64.b64decode(envelope["payload"]))["predicate"]


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory):
    return load_stubs(tmp_path_factory.mktemp("stubs"))


@pytest.mark.parametrize("placement", [[(0, 6), (6, 12)], [(0, 1), (1, 5), (5, 12)]])
def test_a_pipelined_prefill_gives_the_relayed_logits_bit_for_bit(stubs, tmp_path: Path, placement) -> None:
    cmd = dataclasses.replace(fake_command(tmp_path), batch=16)
    with launch(cmd, placement, stubs=stubs, evidence=tmp_path / "ev", env=fake_env(stubs)) as p:
        relayed = run_at_depth(p.clients, PROMPT, 5, route=routes.RELAYED)
        pipelined = run_at_depth(p.clients, PROMPT, 5, route=routes.spec_named("pipelined"))
        trace = drive.run_placement(p.clients, [PROMPT], 3, route=routes.spec_named("pipelined"))
        plain = drive.run_placement(p.clients, [PROMPT], 3)
    assert pipelined.prefill_passes == relayed.prefill_passes == 10
    assert np.array_equal(pipelined.logits, relayed.logits) and pipelined.tokens == relayed.tokens
    assert np.array_equal(trace.prompts[0].logits, plain.prompts[0].logits)
    for cut in trace.cuts:  # every seam's boundary, chunk after chunk, as relayed carried it
        assert np.array_equal(trace.prompts[0].boundaries[cut], plain.prompts[0].boundaries[cut])
    assert trace.prompts[0].prefill.n_tokens == len(PROMPT) and trace.forwarding == "pipelined"


def test_each_stage_takes_its_chunks_in_order_and_the_next_stage_overlaps() -> None:
    seen: list[tuple[int, int]] = []
    second_chunk_started = threading.Event()
    overlap: list[bool] = []

    def step(k: int, i: int, relay: str | None) -> str:
        assert relay == (None if k == 0 else f"{k - 1}:{i}")
        seen.append((k, i))
        if (k, i) == (0, 1):
            second_chunk_started.set()
        if (k, i) == (1, 0):  # stage 1 works on chunk 0 while stage 0 takes chunk 1
            overlap.append(second_chunk_started.wait(timeout=30))
        return f"{k}:{i}"

    done = overlapped(3, 5, step)
    assert overlap == [True]
    for k in range(3):
        assert [i for s, i in seen if s == k] == list(range(5))
    assert done.replies[4] == ["0:4", "1:4", "2:4"]
    assert done.finished == sorted(done.finished) and all(t > 0 for t in done.finished)


def test_a_stage_that_fails_stops_the_schedule_and_its_error_is_raised() -> None:
    started: list[tuple[int, int]] = []

    def step(k: int, i: int, relay: str | None) -> str:
        started.append((k, i))
        if (k, i) == (1, 2):
            raise RuntimeError("stage 1 died on chunk 2")
        time.sleep(0.02 if k == 0 else 0.001)  # stage 0 takes a second for all 50 chunks
        return "x"

    with pytest.raises(RuntimeError, match="stage 1 died on chunk 2"):
        overlapped(3, 50, step)
    assert (2, 2) not in started and (1, 3) not in started
    assert max(i for k, i in started if k == 0) < 49  # stage 0 stopped early, not after all 50 chunks


def test_a_recipe_without_a_scenario_shows_no_depth_section(tmp_path: Path) -> None:
    """The certificate says why depth did not apply; the page says nothing (it showed two empty gate
    tables under a "Not run" line for every recipe without a scenario)."""
    w = certify_fake(tmp_path, small_recipe_doc())
    depth = _predicate(w)["figures"]["depth"]
    assert not depth["applies"] and "names no depth scenario" in depth["reason"]
    html = w.html.read_text()
    assert "Depth:" not in html and html.count('class="dataframe gate"') == 3
