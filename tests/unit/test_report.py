"""The HTML report and the index: self-contained, escaped, and saying what the certificate says."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from certify import certificate as cert
from certify import keys
from core.canonical import sha256_file
from reports.index import render_index
from reports.matrix import matrix
from reports.render import render
from tests.unit.certify_fixtures import certify_fake, fake_context, small_recipe_doc


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("report")
    return root, certify_fake(root)


def _statement(w) -> dict:
    import base64
    import json

    env = json.loads(w.certificate.read_text())
    return json.loads(base64.b64decode(env["payload"]))


def test_page_is_self_contained(run) -> None:
    _, w = run
    html = w.html.read_text()
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html, re.I)
    assert "<link" not in html.lower() and "@import" not in html and "url(" not in html
    assert html.count("<svg") == 2 and "<style>" in html


def test_page_shows_verdict_gates_and_identity(run) -> None:
    _, w = run
    html = w.html.read_text()
    stmt = _statement(w)
    pred = stmt["predicate"]
    assert 'class="banner PASS"' in html and "Verdict: PASS" in html
    for check in (
        "top-1 agreement",
        "KL mean",
        "logits NMSE",
        "boundary NMSE (worst cut)",
        "decode tok/s (median)",
        "staged/monolithic decode",
        "tokens identical after re-prefill",
    ):
        assert check in html, check
    assert "&lt;= 1.000e-10" in html  # thresholds beside values
    assert "Seams against the transport floor" in html and "measured / gRPC floor" in html
    assert "Throughput with several sessions in flight" in html and "2 at once: tok/s" in html
    assert pred["recipe"]["digest"] in html and pred["signer"]["keyid"] in html
    assert "not trusted for publication" in html
    for s in stmt["subject"]:
        assert s["digest"]["sha256"] in html
    assert sha256_file(w.html) == pred["report"]["html_sha256"]


def test_hostile_text_is_escaped(run) -> None:
    _, w = run
    stmt = _statement(w)
    del stmt["predicate"]["report"]
    evil = '<script>alert("x")</script><img src=http://evil/x>'
    stmt["predicate"]["hardware"]["cpu_model"] = evil
    stmt["predicate"]["verdict"] = {"status": "FAIL", "reasons": [evil]}
    stmt["predicate"]["results"][1]["reason"] = evil
    stmt["predicate"]["figures"]["placements"][1]["name"] = evil
    stmt["subject"].append(cert.subject(evil, {"sha256": "0" * 64}))
    html = render(stmt, signer=stmt["predicate"]["signer"])
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;" in html


def test_fail_page_marks_failures(tmp_path: Path) -> None:
    w = certify_fake(tmp_path, small_recipe_doc(decode_tok_s_min=1e9))
    html = w.html.read_text()
    assert 'class="banner FAIL"' in html and "✗ FAIL" in html and "Why" in html


def test_index_matrix_states(run, tmp_path: Path) -> None:
    root, w = run
    reports = tmp_path / "reports"
    shutil.copytree(w.certificate.parent.parent.parent.parent, reports)
    ctx = fake_context(root, DGR_RECIPES_DIR=str(root))
    out = render_index(ctx, reports)
    html = out.read_text()
    assert 'id="matrix"' in html
    cpu_row = re.search(r"<tr><th>cpu</th>(.*?)</tr>", html, re.S).group(1)
    assert "certified" in cpu_row and "report.html" in cpu_row
    assert "never run" in html or "compile-only" in html
    # The catalog's entries: each placement the certificate passed, its stages and seams (issue 45).
    catalog = re.search(r'<table id="catalog">(.*?)</table>', html, re.S).group(1)
    rows = re.findall(r"<tr><td>cpu</td><td>tiny-fake</td><td>cpu-ci</td><td>([a-z-]+)</td>", catalog)
    assert sorted(rows) == ["three-first-middle", "twelve-single", "two-middle"]
    assert "Certified placements (3)" in html and w.run_id in catalog
    # A tampered page is listed as not verifying, and the lane is no longer certified.
    page = next(reports.rglob("report.html"))
    page.write_text(page.read_text() + "<!-- edited -->")
    html = render_index(ctx, reports).read_text()
    assert "does not verify" in html and "NO: report HTML" in html
    cpu_row = re.search(r"<tr><th>cpu</th>(.*?)</tr>", html, re.S).group(1)
    assert ">certified<" not in cpu_row
    assert "Certified placements (0)" in html  # nothing of a certificate that does not verify


def test_matrix_lists_every_lane(run) -> None:
    root, w = run
    ctx = fake_context(root, DGR_RECIPES_DIR=str(root))
    data = matrix(ctx)["include"]
    assert [e["lane"] for e in data] == ["cpu", "cuda", "rocm", "vulkan", "metal"]
    by = {e["lane"]: e for e in data}
    assert by["cpu"]["mode"] == "certify" and by["cpu"]["recipe"] == "tiny-llama"
    assert by["cuda"]["mode"] == "compile" and by["cuda"]["runs-on"] == ["ubuntu-latest"]
    assert by["rocm"]["mode"] == "probe"
    assert all(e["status"] == "compile-only" for e in data)  # no tiny-llama certificate in this workspace
    gpu = {e["lane"]: e for e in matrix(ctx, self_hosted=True)["include"]}
    assert gpu["cuda"]["mode"] == "certify" and "gpu-nvidia" in gpu["cuda"]["runs-on"]
    # The fake run's recipe is certified in its own workspace, so the matrix for it says so.
    mine = {e["lane"]: e for e in matrix(ctx, recipe="tiny-fake")["include"]}
    assert mine["cpu"]["status"] == "certified" and mine["cuda"]["status"] == "compile-only"


def test_dev_key_trust_is_workspace_bound(run, tmp_path: Path) -> None:
    root, w = run
    other = fake_context(tmp_path)
    from certify.verify import verify

    v = verify(w.certificate, keys.trusted_keys(ws=other.workspace))
    assert not v.ok and "not trusted" in v.failures[0].detail


def test_report_and_matrix_commands(run, tmp_path: Path) -> None:
    import json

    from tests.integration.dgr_cli import run_dgr

    root, _ = run
    ctx = fake_context(root, DGR_RECIPES_DIR=str(root))
    done = run_dgr(ctx.env, "report", timeout=120)
    assert done.returncode == 0, done.stderr
    index = Path(done.stdout.strip().removeprefix("index: "))
    assert index == ctx.workspace.reports / "index.html" and index.is_file()
    out = tmp_path / "github-output"
    done = run_dgr(ctx.env, "matrix", "--github-output", str(out), timeout=120)
    assert done.returncode == 0, done.stderr
    line = out.read_text().strip()
    assert line.startswith("matrix=") and "\n" not in line
    assert json.loads(line.removeprefix("matrix=")) == json.loads(done.stdout)


def test_speed_table_says_where_each_stage_was_held() -> None:
    from reports.render import speed_frame

    placements = [
        {"name": "pinned", "n_stages": 4, "cpus": ["0", "0", "1-2", ""]},
        {"name": "free", "n_stages": 2, "cpus": ["", ""]},
        {"name": "older", "n_stages": 1},
    ]  # a certificate from before the field
    assert list(speed_frame(placements)["stage CPUs"]) == ["0 | 0 | 1-2 | any", "any", "any"]


def test_speed_table_says_how_each_stage_held_its_weights() -> None:
    from reports.render import speed_frame

    placements = [
        {
            "name": "read",
            "n_stages": 2,
            "load_mode": ["none", "none"],
            "huge_page_bytes": [98 << 20, 2 << 20],
        },
        {"name": "mapped", "n_stages": 1, "load_mode": ["mmap"], "huge_page_bytes": [-1]},
        {"name": "older", "n_stages": 1},
    ]  # a certificate from before the fields
    assert list(speed_frame(placements)["stage weights"]) == [
        "none, 98 MiB huge | none, 2 MiB huge",
        "mmap",
        "—",
    ]
