"""`dgr roster` as a user runs it, on the real CPU worker and the pinned tree's own fixture generator, for
a few architectures: llama and qwen2 (the stage cut stages them: every cut and four stages bitwise, llama
dense and MoE), talkie (refused: its layers read the token embedding, which a later stage lacks, and the
worker's reason names it), dream (a diffusion LM: listed, not staged) and bert (the generator writes
none: its source's reason).  The signed roster verifies, and the report index
shows it.  The whole roster (every architecture the tree knows) is `nox -s roster`."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest

from certify import roster
from tests.integration.dgr_cli import run_dgr, user_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ARCHS = ("llama", "qwen2", "talkie", "dream", "bert")
TALKIE = "layers [1, 4) of talkie read inp_embd (first stage only), which this stage does not hold"


@pytest.fixture(scope="module")
def ran(cpu_build) -> tuple[str, Path, dict]:
    args = [a for arch in ARCHS for a in ("--arch", arch)]
    done = run_dgr(user_env(), "roster", *args, timeout=800)
    assert done.returncode == 0, done.stdout + done.stderr
    said = dict(line.partition(": ")[::2] for line in done.stdout.splitlines() if line.startswith("signed: "))
    envelope = Path(said["signed"])
    predicate = json.loads(base64.b64decode(json.loads(envelope.read_text())["payload"]))["predicate"]
    return done.stdout, envelope, predicate


def test_each_architecture_has_its_row_and_the_summary_counts_them(ran) -> None:
    out, _, predicate = ran
    rows = {r["fixture"] or r["architecture"]: r for r in predicate["rows"]}
    fixtures = {
        "llama-dense.gguf",
        "llama-moe.gguf",
        "qwen2-dense.gguf",
        "talkie-dense.gguf",
        "dream-dense.gguf",
    }
    assert set(rows) == {*fixtures, "bert"}
    for name in ("llama-dense.gguf", "llama-moe.gguf", "qwen2-dense.gguf"):
        llama = rows[name]
        assert (llama["status"], llama["n_layer"], llama["boundary_width"]) == ("PASS", 4, 256), llama
        assert [p["stages"] for p in llama["placements"]] == [
            [[0, 1], [1, 4]],
            [[0, 2], [2, 4]],
            [[0, 3], [3, 4]],
            [[0, 1], [1, 2], [2, 3], [3, 4]],
        ]
        assert {p["status"] for p in llama["placements"]} == {"PASS"} and llama["sideband"] == []
    talkie = rows["talkie-dense.gguf"]
    assert talkie["status"] == "refused"
    assert talkie["reason"] == f"0:1 + 1:4: {TALKIE}"
    assert {p["status"] for p in talkie["placements"]} == {"refused"}
    assert (rows["dream-dense.gguf"]["status"], rows["dream-dense.gguf"]["reason"]) == (
        "not staged",
        roster.DIFFUSION,
    )
    assert rows["bert"]["status"] == "not generated"
    assert rows["bert"]["reason"] == f"test-llama-archs: TODO vocab; {roster.ENCODER_ONLY}"
    assert predicate["summary"] == {
        "architectures": 5,
        "generated": 4,
        "staged_bitwise": 2,
        "failed": 0,
        "refused": 1,
        "not_staged": 1,
        "not_generated": 1,
        "fixtures": 5,
        "fixtures_staged_bitwise": 3,
    }
    assert predicate["settings"]["n_layer"] == 4 and predicate["settings"]["lane"] == "cpu"
    progress = [line for line in out.splitlines() if line.startswith("roster [")]
    assert len(progress) == 6 and "llama-dense.gguf" in progress[2] and "3/3 + 4 stages" in progress[2]
    assert "roster: 2 of 4 generated architectures staged bitwise (3 of 5 fixtures)" in out


def test_the_signed_roster_verifies_and_the_index_shows_it(ran, tmp_path: Path) -> None:
    _, envelope, predicate = ran
    check = run_dgr(user_env(), "verify", str(envelope))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "ok   roster table: sha256 matches" in check.stdout
    # the worker, the generator and the four fixtures a worker loaded, each hashed again
    assert check.stdout.count("ok   subject ") == 6, check.stdout
    reports = tmp_path / "reports"
    shutil.copytree(envelope.parent, reports / "roster" / envelope.parent.name)
    done = run_dgr(user_env(), "report", "--reports", str(reports))
    assert done.returncode == 0, done.stderr
    html = (reports / "index.html").read_text()
    assert '<h2 id="roster">Roster</h2>' in html and predicate["made"] in html
    assert f"<td>0:1 + 1:4: {TALKIE}</td>" in html


def test_a_stage_before_the_last_passes_without_a_warning_from_llama(ran) -> None:
    """A stage before the last outputs every row's residual as its embeddings, so the worker marks every
    row an output; llama warned on each pass ("... were not marked as outputs -> overriding") while the
    worker marked none."""
    _, envelope, _ = ran
    runs = envelope.parents[3] / "runs" / f"roster-{envelope.parent.name}"
    first_stages = list(runs.rglob("stage-0-*.stderr"))
    assert first_stages, runs
    warned = [p for p in first_stages if "were not marked as outputs" in p.read_text(errors="replace")]
    assert not warned, warned[:3]
