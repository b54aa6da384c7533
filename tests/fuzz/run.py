"""`nox -s fuzz`: each target under libFuzzer for a time budget, then one line per target.

``python -m tests.fuzz.run [--seconds S] [--runs N] [--out DIR] [TARGET ...]`` starts one libFuzzer
process per target, reads how many inputs it tried, and lists any finding (saved under
DIR/<target>/findings/).  Exit 1 when a target has a finding.  Two kinds of target:
- the Python parsers under atheris (tests.fuzz.targets; seeds: tests.fuzz.seeds): a finding is an
  input that raised something other than a DgrError;
- the worker's C++ readers (tests.fuzz.native, built with clang under AddressSanitizer and UBSan;
  seeds: passes recorded from a ring): a finding is a crash, a sanitizer report, a leak or a timeout.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from core.errors import DgrError
from core.workspace import PROJECT_ROOT, Workspace
from tests.fuzz import native, seeds, targets

DONE = re.compile(r"Done (\d+) runs in (\d+) second")
STATS = re.compile(r"^#(\d+)\s", re.M)


def atheris_program(name: str) -> list[str]:
    return [sys.executable, "-m", "tests.fuzz.atheris_target", name]


def fuzz_one(
    name: str, program: list[str], inputs: list[bytes], seconds: int, runs: int, out: Path
) -> dict[str, object]:
    """``program`` (a libFuzzer main) on ``name``'s corpus under ``out``, started from ``inputs``."""
    corpus, findings = out / name / "corpus", out / name / "findings"
    corpus.mkdir(parents=True, exist_ok=True)
    findings.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(inputs):
        (corpus / f"seed-{i}").write_bytes(seed)
    argv = [
        *program,
        f"-max_total_time={seconds}",
        f"-artifact_prefix={findings}/",
        "-max_len=65536",
        "-rss_limit_mb=2048",
        "-timeout=10",
        "-print_final_stats=1",
    ]
    if runs:
        argv.append(f"-runs={runs}")
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f"dgr-fuzz-{name}-"))  # the target's scratch files (libFuzzer's
    try:  # exit skips Python's atexit)
        done = subprocess.run(
            [*argv, str(corpus)],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=seconds + 600,
            env={**os.environ, "DGR_FUZZ_SCRATCH": str(work)},
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log = done.stdout + done.stderr
    (out / name / "libfuzzer.log").write_text(log)
    m = DONE.search(log)
    tried = int(m[1]) if m else max((int(x) for x in STATS.findall(log)), default=0)
    found = sorted(p.name for p in findings.iterdir())
    return {
        "target": name,
        "inputs": tried,
        "seconds": round(time.monotonic() - started, 1),
        "findings": found,
        "exit": done.returncode,
    }


def plan(names: list[str], out: Path) -> list[tuple[str, list[str], list[bytes]]]:
    """Each target to run with its program and seeds; the worker's are built first, once."""
    chosen = names or [*targets.TARGETS, *native.PROGRAMS]
    programs = native.build(out / "build") if any(n in native.PROGRAMS for n in chosen) else {}
    return [
        (n, [str(programs[n])], native.seeds(n))
        if n in native.PROGRAMS
        else (n, atheris_program(n), seeds.seeds(n))
        for n in chosen
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz.run", description=__doc__)
    every = [*targets.TARGETS, *native.PROGRAMS]
    ap.add_argument("targets", nargs="*", choices=[[], *every], default=[], metavar="TARGET")
    ap.add_argument("--seconds", type=int, default=60, help="time budget per target (default 60)")
    ap.add_argument("--runs", type=int, default=0, help="stop a target after N inputs (0: time only)")
    ap.add_argument(
        "--out",
        type=Path,
        default=Workspace.from_env(os.environ).root / "fuzz",
        help="where findings, logs and the built targets go (default: the workspace's fuzz/, DGR_WORK)",
    )
    args = ap.parse_args(argv)
    try:
        chosen = plan(args.targets, args.out)
    except DgrError as e:  # the worker's targets could not be built: a missing toolchain, a failed step
        print(f"fuzz: the worker's targets: {e.one_line()}", file=sys.stderr, flush=True)
        return e.exit_code
    bad = 0
    for name, program, inputs in chosen:
        r = fuzz_one(name, program, inputs, args.seconds, args.runs, args.out)
        ok = not r["findings"] and r["exit"] == 0
        bad += not ok
        found = ": " + ", ".join(r["findings"]) if r["findings"] else ""
        tail = "" if ok else f" (exit {r['exit']}; log {args.out / name / 'libfuzzer.log'})"
        print(
            f"fuzz {name}: {r['inputs']} inputs in {r['seconds']} s, "
            f"{len(r['findings'])} finding(s){found}{tail}",
            flush=True,
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
