"""fetch.conditioning against a stand-in probe: a real executable script in <build>/bin."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from core.errors import CommandFailed, ConfigurationError, RuntimeFailure
from fetch.conditioning import PROBE, measure_conditioning, parse_report

# Echoes what it was given into a report of the probe's kind, or misbehaves on request.
FAKE_PROBE = """#!{python}
import json, sys
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
mode = {mode!r}
if mode == "fail":
    print("dgr-topk-probe: cannot load", args["--model"], file=sys.stderr)
    sys.exit(6)
doc = {{"schema_version": 1 if mode == "ok" else 2, "kind": "dgr.topk_probe", "args": args,
       "prompts_seen": json.load(open(args["--prompts-file"])), "selections": []}}
print("llama log noise on stdout")
open(args["--out"], "w").write(json.dumps(doc))
"""


def fake_build(tmp_path: Path, mode: str = "ok") -> Path:
    probe = tmp_path / "build" / "bin" / PROBE
    probe.parent.mkdir(parents=True)
    probe.write_text(FAKE_PROBE.format(python=sys.executable, mode=mode))
    probe.chmod(0o755)
    return tmp_path / "build"


def test_passes_prompts_as_token_lists_and_reads_the_report(tmp_path: Path) -> None:
    report = measure_conditioning(fake_build(tmp_path), Path("m.gguf"), [(1, 2, 3), [4]], 32, 2)
    assert report["prompts_seen"] == [[1, 2, 3], [4]]
    args = report["args"]
    assert (args["--model"], args["--threads"], args["--n-decode"]) == ("m.gguf", "2", "32")
    assert args["--ctx"] == "256"  # the certifier's context for prompts this short (certify.inputs.ctx_size)


def test_context_grows_with_the_longest_prompt(tmp_path: Path) -> None:
    report = measure_conditioning(fake_build(tmp_path), Path("m.gguf"), [list(range(300))], 32, 1)
    assert report["args"]["--ctx"] == "512"


def test_a_build_without_the_probe_says_rebuild(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="predates the probe"):
        measure_conditioning(tmp_path, Path("m.gguf"), [[1]], 4, 1)


def test_empty_prompts_are_refused_before_running(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="at least one prompt"):
        measure_conditioning(fake_build(tmp_path), Path("m.gguf"), [[1], []], 4, 1)


def test_a_failing_probe_raises_with_its_message(tmp_path: Path) -> None:
    with pytest.raises(CommandFailed, match="cannot load"):
        measure_conditioning(fake_build(tmp_path, "fail"), Path("m.gguf"), [[1]], 4, 1)


def test_another_schema_version_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeFailure, match="schema version 2"):
        measure_conditioning(fake_build(tmp_path, "v2"), Path("m.gguf"), [[1]], 4, 1)


def test_parse_report_refuses_other_documents() -> None:
    with pytest.raises(RuntimeFailure, match="no valid JSON"):
        parse_report("{")
    with pytest.raises(RuntimeFailure, match="kind"):
        parse_report(json.dumps({"schema_version": 1, "kind": "dgr.build"}))


def _selection(kind: str, name: str, ties: int, near: int, abs_m: float | None, rel_m: float | None) -> dict:
    return {
        "input": name,
        "kind": kind,
        "k": 4,
        "rows": 10,
        "contested_rows": 8,
        "exact_ties": ties,
        "near_ties": near,
        "min_abs_margin": abs_m,
        "min_rel_margin": rel_m,
    }


def test_summary_keeps_the_smallest_margin_per_kind_and_where_it_is() -> None:
    from fetch.conditioning import describe, summary, tied

    report = {
        "near_tie_rel": 1e-3,
        "selections": [
            _selection("indexer", "lid_score_masked-2", 0, 1, 3e-5, 2e-3),
            _selection("indexer", "lid_score_masked-4", 0, 0, 1e-5, 5e-3),
            _selection("router", "ffn_moe_probs_biased-3", 0, 0, None, None),
        ],
    }
    s = summary(report)
    ix = s["kinds"]["indexer"]
    assert (ix["ops"], ix["contested_rows"], ix["exact_ties"], ix["near_ties"]) == (2, 16, 0, 1)
    assert ix["min_abs_margin"] == 1e-5 and ix["min_abs_margin_in"] == "lid_score_masked-4"
    assert ix["min_rel_margin"] == 2e-3 and ix["min_rel_margin_in"] == "lid_score_masked-2"
    assert s["kinds"]["router"]["min_rel_margin"] is None
    assert tied(report) == []
    lines = describe(s)
    assert lines[0].startswith("indexer: 2 selections, 16 of 20 rows contested, 0 exact ties, 1 near ties")
    assert "n/a" in lines[1]
    report["selections"].append(_selection("indexer", "lid_score_masked-6", 3, 3, 0.0, 0.0))
    assert tied(report) == ["lid_score_masked-6 (indexer): 3 of 8 contested rows"]
