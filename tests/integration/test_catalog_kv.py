"""The catalog's KV bytes per token are the workers' own (issue 45): `dgr catalog` over the session's
tiny-llama certification gives, for every stage of every certified placement, the bytes a session's
state grew by per position between two lengths the certification held (the Session RPC after each
prompt); workers started here on the same layers, prefilled to those two lengths, report the same
growth within 1%, and hold the weights the catalog says they do."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from pipeline import drive, routes
from tests.integration.dgr_cli import run_dgr, user_env
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

TOLERANCE = 0.01


def _held_growth(clients, length: tuple[int, int]) -> list[float]:
    """Each stage's state bytes per position between ``length[0]`` and ``length[1]`` positions held."""
    infos = drive.describe(clients)
    held = {}
    with routes.RELAYED.open(clients, infos, routes.LOOPBACK) as route:
        for n in length:
            session = drive.new_session(f"kv{n}")
            drive.prefill(route, [1 + (7 * i) % 97 for i in range(n)], session=session)
            held[n] = drive.held_by(clients, session)
            drive.reset_session(clients, session)
    lo, hi = length
    return [(b.state_bytes - a.state_bytes) / (hi - lo) for a, b in zip(held[lo], held[hi], strict=True)]


def test_catalog_kv_bytes_per_token_are_what_workers_hold(
    live_certification, worker_command, stubs, worker_env, tmp_path: Path
) -> None:
    live = live_certification()
    out = tmp_path / "catalog.json"
    done = run_dgr(user_env(), "catalog", str(live.certificate), "--out", str(out))
    assert done.returncode == 0, done.stderr
    doc = json.loads(base64.b64decode(json.loads(out.read_text())["payload"]))["predicate"]
    entries = [e for e in doc["entries"] if e["recipe"] == "tiny-llama"]
    assert entries, doc["entries"]
    for e in entries:
        stages = [tuple(s["layers"]) for s in e["stages"]]
        spans = {tuple(s["kv_held_between"]) for s in e["stages"]}
        assert {s["kv_bytes_per_token_from"] for s in e["stages"]} == {"held"}, e["placement"]
        assert len(spans) == 1, e["placement"]  # every stage held the same sessions
        evidence = tmp_path / e["placement"]
        with launch(worker_command, stages, stubs=stubs, evidence=evidence, env=worker_env) as p:
            weights = [c.info().memory.weight_bytes for c in p.clients]
            grown = _held_growth(p.clients, spans.pop())
        assert weights == [s["weight_bytes"] for s in e["stages"]], e["placement"]
        for k, (s, g) in enumerate(zip(e["stages"], grown, strict=True)):
            said = s["kv_bytes_per_token"]
            print(f"\n[catalog kv] {e['placement']} {k}: catalog {said:.1f}, held {g:.1f} bytes/position")
            assert g == pytest.approx(s["kv_bytes_per_token"], rel=TOLERANCE), (e["placement"], k)
