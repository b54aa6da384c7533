"""The catalog's KV bytes per token held against what workers report (issue 45): `dgr catalog` over a
certificate, then, for each named entry, workers started on its stages' layers and prefilled to the two
lengths the certification held report the same growth per position of their sessions' state."""

from __future__ import annotations

import base64
import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from pipeline import drive, routes
from tests.integration.dgr_cli import run_dgr, user_env
from worker.launcher import WorkerCommand, launch

TOLERANCE = 0.01


def catalog_of(certificate: Path, out: Path) -> dict[str, Any]:
    """`dgr catalog CERTIFICATE --out OUT`, as a user runs it; its predicate."""
    done = run_dgr(user_env(), "catalog", str(certificate), "--out", str(out))
    assert done.returncode == 0, done.stderr
    return json.loads(base64.b64decode(json.loads(out.read_text())["payload"]))["predicate"]


def held_growth(clients, length: tuple[int, int]) -> list[float]:
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


def check_entries(
    catalog: dict[str, Any],
    recipe: str,
    command: WorkerCommand,
    stubs: Any,
    env: dict[str, str],
    evidence: Path,
    placements: Collection[str] = (),
) -> int:
    """Every entry of ``recipe`` (or only ``placements``): its figure is what the workers hold, within
    TOLERANCE, and they hold the weights it says.  Returns how many entries were checked."""
    entries = [
        e
        for e in catalog["entries"]
        if e["recipe"] == recipe and (not placements or e["placement"] in placements)
    ]
    assert entries, catalog["entries"]
    for e in entries:
        stages = [tuple(s["layers"]) for s in e["stages"]]
        spans = {tuple(s["kv_held_between"]) for s in e["stages"]}
        assert {s["kv_bytes_per_token_from"] for s in e["stages"]} == {"held"}, e["placement"]
        assert len(spans) == 1, e["placement"]  # every stage held the same sessions
        with launch(command, stages, stubs=stubs, evidence=evidence / e["placement"], env=env) as p:
            weights = [c.info().memory.weight_bytes for c in p.clients]
            grown = held_growth(p.clients, spans.pop())
        assert weights == [s["weight_bytes"] for s in e["stages"]], e["placement"]
        for k, (s, g) in enumerate(zip(e["stages"], grown, strict=True)):
            said = s["kv_bytes_per_token"]
            print(f"\n[catalog kv] {e['placement']} {k}: catalog {said:.1f}, held {g:.1f} bytes/position")
            assert g == pytest.approx(said, rel=TOLERANCE), (e["placement"], k)
    return len(entries)
