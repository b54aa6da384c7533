"""fetch.conditioning against a stand-in probe: a real executable script in <build>/bin."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from certify.errors import CommandFailed, ConfigurationError, RuntimeFailure
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
    assert args["--ctx"] == "256"  # the certifier's context for prompts this short (certify.run.ctx_size)


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
