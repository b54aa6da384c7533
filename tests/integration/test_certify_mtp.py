"""Issue 17 must-show: `dgr certify --recipe tiny-v4-mtp` on the CPU lane.

A signed certificate that `dgr verify` accepts (PASS, or a FAIL only from the speed gate's time limits
on a loaded machine), in which every placement, the monolithic one included, passes the MTP gate: the
greedy tokens with MTP on (the last stage drafting 3 tokens per verify pass with the nextn block)
equal the placement's plain run for every prompt, and rejected drafts leave no trace; the report
shows the acceptance rate, tokens per pass and crossings per token.  Every other gate of tiny-v4
(staging parity bitwise on f32 seams, the route change) holds with the nextn block loaded.
"""

from __future__ import annotations

import base64
import json

import pytest

from tests.integration.dgr_cli import certify_and_verify, user_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

ENV = user_env()


@pytest.mark.parametrize("recipe", ["tiny-v4-mtp", "tiny-v4-mtp-file"])
def test_certify_tiny_v4_mtp(cpu_build, recipe: str) -> None:
    """tiny-v4-mtp-file: the block from its own file (--mtp-model), both sets named in the certificate."""
    cert, predicate = certify_and_verify(ENV, recipe)
    placements = {p["name"]: p for p in predicate["figures"]["placements"]}
    results = {r["name"]: r for r in predicate["results"]}
    if recipe == "tiny-v4-mtp":  # the drafting ring: the last stage verifies and drafts on its own
        assert placements["four-even-ring"]["mtp"]["forwarding"] == "ring"
    if recipe == "tiny-v4-mtp-file":
        identity = predicate["identity"]
        assert identity["artifacts"]["set"] == "tiny-v4"
        assert identity["mtp_artifacts"]["set"] == "tiny-v4-mtp-only"
        envelope = json.loads(cert.read_text())
        subjects = json.loads(base64.b64decode(envelope["payload"]))["subject"]
        assert any(s["name"].endswith("/mtp-tiny-v4-f32.gguf") for s in subjects)
    print(
        f"\n{recipe} on cpu: placement, forwarding, identical prompts, acceptance, tokens/pass, "
        "crossings/token"
    )
    for name, p in placements.items():
        m = p["mtp"]
        print(
            f"  {name:18s} {m['forwarding']:8s} {m['prompts_identical']}/{m['prompts']} "
            f"{m['acceptance_rate']:.2f} {m['tokens_per_pass']:.2f} {m['crossings_per_token']:.2f}"
        )
        assert results[f"mtp/{name}"]["status"] == "PASS", results[f"mtp/{name}"]
        assert m["prompts_identical"] == m["prompts"] > 0 and m["rollback_identical"] == 1.0
        assert m["draft_tokens"] == 3 and m["tokens_per_pass"] >= 1.0
    assert {r.split("/")[0] for r in results} >= {"mtp", "staging-parity", "route-change", "speed"}
    for name, r in results.items():
        if not name.startswith("speed/"):
            assert r["status"] == "PASS", r
    html = (cert.parent / "report.html").read_text()
    assert "MTP: speculative pipeline decoding" in html and "rollback leaves no trace" in html
