"""The roster's table (certify/roster.py): rows reduced from their placements, the per-architecture
summary, the Markdown page, the signed envelope `dgr verify` checks and refuses once altered, the gate's
exit code, and the report index's Roster section.  The rows are made by hand here; the slow test
(tests/integration/test_roster_cli.py) makes them on the real worker."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import jsonschema
import pytest

from certify import roster
from certify.keys import signing_key, trusted_keys
from certify.roster import Placed, Roster, Row, Status
from certify.verify import verify
from cli.main import main
from core.errors import GateFailed
from core.workspace import PROJECT_ROOT
from reports.index import render_index
from tests.unit.certify_fixtures import fake_context

SCHEMA = json.loads((PROJECT_ROOT / "manifests" / "schemas" / "roster.schema.json").read_text())
CUTS = (((0, 1), (1, 4)), ((0, 2), (2, 4)), ((0, 3), (3, 4)), ((0, 1), (1, 2), (2, 3), (3, 4)))
REFUSAL = "architecture qwen2 does not support loading a layer range"


def _passed(*stages: tuple[tuple[int, int], ...]) -> tuple[Placed, ...]:
    return tuple(Placed(stages=s, status=Status.PASS) for s in stages)


def _row(arch: str, variant: str, placed: tuple[Placed, ...], **kw) -> Row:
    status, reason = roster.reduce(placed)
    return Row(
        arch=arch,
        fixture=f"{arch}-{variant}.gguf",
        status=status,
        reason=reason,
        n_layer=4,
        placements=placed,
        boundary_width=256,
        seconds=0.25,
        **kw,
    )


def _rows() -> list[Row]:
    refused = tuple(Placed(stages=s, status=Status.REFUSED, detail=REFUSAL) for s in CUTS)
    wrong = Placed(stages=CUTS[1], status=Status.FAIL, detail="prompt 0, position 3: logits differ")
    return [
        _row("llama", "dense", _passed(*CUTS)),
        _row("llama", "moe", _passed(*CUTS), sideband=("token ids",)),
        _row("qwen2", "dense", refused),
        _row("mixed", "dense", _passed(*CUTS)),
        _row("mixed", "moe", (*_passed(CUTS[0]), wrong, *_passed(*CUTS[2:]))),
        Row(
            arch="dream",
            fixture="dream-dense.gguf",
            status=Status.NOT_STAGED,
            reason=roster.DIFFUSION,
            n_layer=4,
        ),
        Row(
            arch="bert",
            status=Status.NOT_GENERATED,
            reason="test-llama-archs: TODO vocab; " + roster.ENCODER_ONLY,
        ),
    ]


def test_a_fixture_fails_on_any_mismatch_is_refused_on_any_refusal_and_passes_only_whole() -> None:
    assert roster.reduce(_passed(*CUTS)) == (Status.PASS, "")
    half = (*_passed(*CUTS[:2]), Placed(stages=CUTS[3], status=Status.REFUSED, detail=REFUSAL))
    assert roster.reduce(half) == (
        Status.REFUSED,
        f"0:1 + 1:2 + 2:3 + 3:4: {REFUSAL} (2 of 3 placements passed)",
    )
    both = (Placed(stages=CUTS[0], status=Status.REFUSED, detail=REFUSAL), _rows()[4].placements[1])
    assert roster.reduce(both) == (Status.FAIL, "0:2 + 2:4: prompt 0, position 3: logits differ")


def test_the_summary_counts_each_architecture_by_its_worst_fixture() -> None:
    rows = [r.record() for r in _rows()]
    assert roster.summary(rows) == {
        "architectures": 5,
        "generated": 4,
        "staged_bitwise": 1,  # llama; mixed has a FAIL beside its PASS
        "failed": 1,
        "refused": 1,
        "not_staged": 1,
        "not_generated": 1,
        "fixtures": 6,
        "fixtures_staged_bitwise": 3,
    }
    assert roster.summary_line(roster.summary(rows)).startswith(
        "1 of 4 generated architectures staged bitwise (3 of 6 fixtures); 1 failed, 1 refused, "
    )


def test_cuts_passed_names_the_two_stage_cuts_and_the_longer_placement() -> None:
    rows = {r.fixture or r.arch: r.record() for r in _rows()}
    assert roster.cuts_passed(rows["llama-dense.gguf"]["placements"]) == "3/3 + 4 stages"
    assert roster.cuts_passed(rows["qwen2-dense.gguf"]["placements"]) == "0/3 + 4 stages refused"
    assert roster.cuts_passed(rows["mixed-moe.gguf"]["placements"]) == "2/3 + 4 stages"
    assert roster.cuts_passed(rows["dream-dense.gguf"]["placements"]) == ""


def test_the_gate_fails_on_a_mismatch_only_naming_the_fixture_and_position() -> None:
    rows = [r.record() for r in _rows()]
    with pytest.raises(GateFailed) as caught:
        roster.gate(rows, Path("/r/roster.json"))
    assert caught.value.exit_code == 5
    assert "mixed-moe.gguf: 0:2 + 2:4: prompt 0, position 3: logits differ" in caught.value.one_line()
    roster.gate([r for r in rows if r["status"] != "FAIL"], Path("/r/roster.json"))  # refusals are data


def test_architectures_that_are_no_decoder_only_text_model_have_a_reason() -> None:
    assert roster.not_staged("llama") is None and roster.not_staged("qwen2") is None
    assert roster.not_staged("t5") == roster.ENCODER_DECODER
    assert roster.not_staged("bert") == roster.not_staged("t5encoder") == roster.ENCODER_ONLY
    assert roster.not_staged("llada-moe") == roster.DIFFUSION
    assert all(reason for reason in roster.NOT_STAGED.values())


def _made(root: Path) -> Roster:
    files = {
        "worker/dgr-shard-worker": root / "worker",
        "fixtures/llama-dense.gguf": root / "llama-dense.gguf",
    }
    for name, path in files.items():
        path.write_bytes(name.encode() * 100)
    settings = {
        "lane": "cpu",
        "n_layer": 4,
        "seed": "1",
        "threads": 1,
        "ctx": 128,
        "prompts": [[1, 2]],
        "n_decode": 4,
    }
    return Roster(
        run_id="20261207T000000Z-abcdef",
        made="2026-12-07T00:00:00Z",
        seconds=12.5,
        identity={
            "llama_cpp_commit": "4df29be4f4c3" + "0" * 28,
            "patched_tree": "ab" * 20,
            "build_key": "cd" * 32,
        },
        settings=settings,
        rows=_rows(),
        subjects=files,
    )


@pytest.fixture
def signed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    ctx = fake_context(tmp_path)
    for k, v in ctx.env.items():
        monkeypatch.setenv(k, v)
    envelope, page = roster.sign(_made(tmp_path), signing_key(ctx.env, ctx.workspace))
    return roster.write(ctx.workspace.reports / "roster" / "20261207T000000Z-abcdef", envelope, page)


def test_the_page_shows_every_row_its_summary_and_escapes_the_reason(signed: Path) -> None:
    page = (signed.parent / roster.TABLE_FILE).read_text()
    assert "**1 of 4 generated architectures staged bitwise (3 of 6 fixtures); 1 failed" in page
    lines = [ln for ln in page.splitlines() if ln.startswith("| ")]
    assert lines[0] == "| " + " | ".join(roster.COLUMNS) + " |" and len(lines) == 1 + len(_rows())
    assert "| llama | llama-moe.gguf | 4 | PASS | 3/3 + 4 stages | 256 | token ids | 0.25 |  |" in lines
    qwen2 = "| qwen2 | qwen2-dense.gguf | 4 | refused | 0/3 + 4 stages refused | 256 | — | 0.25 |"
    assert f"{qwen2} 0:1 + 1:4: {REFUSAL} |" in lines
    assert roster.table_lines([{**_rows()[0].record(), "reason": "a|b"}])[2].endswith("| a\\|b |")


def test_dgr_verify_accepts_the_roster_and_refuses_it_altered(
    signed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    statement = json.loads(base64.b64decode(json.loads(signed.read_text())["payload"]))
    assert statement["predicateType"] == "https://dgr-certify/roster/v1"
    jsonschema.validate(statement["predicate"], SCHEMA)
    assert main(["verify", os.fspath(signed)]) == 0
    said = capsys.readouterr().out
    assert f"roster: {signed}" in said and "ok   roster table: sha256 matches" in said
    assert said.count("ok   subject ") == 2  # the worker and the fixture, hashed again
    assert "verified: roster 20261207T000000Z-abcdef: 1 of 4 generated architectures staged bitwise" in said

    page = signed.parent / roster.TABLE_FILE
    page.write_text(page.read_text().replace("| FAIL |", "| PASS |"))
    assert main(["verify", os.fspath(signed)]) == 3
    assert "roster table" in capsys.readouterr().err


def test_a_roster_whose_payload_or_subject_changed_does_not_verify(signed: Path, tmp_path: Path) -> None:
    keys = trusted_keys(ws=fake_context(tmp_path).workspace)
    assert verify(signed, keys).ok
    (tmp_path / "llama-dense.gguf").write_bytes(b"another model")
    assert [ln.what for ln in verify(signed, keys).failures] == ["subject fixtures/llama-dense.gguf"]
    envelope = json.loads(signed.read_text())
    envelope["payload"] = base64.b64encode(
        base64.b64decode(envelope["payload"]).replace(b'"FAIL"', b'"PASS"', 1)
    ).decode()
    signed.write_text(json.dumps(envelope))
    assert "signature" in [ln.what for ln in verify(signed, keys, subjects=False).failures]


def test_the_report_index_shows_the_latest_roster_and_names_one_that_does_not_verify(
    signed: Path, tmp_path: Path
) -> None:
    ctx = fake_context(tmp_path)
    html = render_index(ctx, ctx.workspace.reports).read_text()
    assert '<h2 id="roster">Roster</h2>' in html
    assert "<strong>1 of 4 generated architectures staged bitwise (3 of 6 fixtures)" in html
    assert html.count('<tr class="') == len(_rows())
    assert (
        f"<td>0:1 + 1:4: {REFUSAL}</td>" in html and 'href="roster/20261207T000000Z-abcdef/roster.md"' in html
    )
    page = signed.parent / roster.TABLE_FILE
    page.write_text(page.read_text() + "edited\n")
    html = render_index(ctx, ctx.workspace.reports).read_text()
    assert "does NOT verify: roster table" in html and '<tr class="' not in html


def test_the_index_without_a_roster_says_how_to_make_one(tmp_path: Path) -> None:
    ctx = fake_context(tmp_path)
    assert "No roster yet: <code>dgr roster</code>" in render_index(ctx, ctx.workspace.reports).read_text()
