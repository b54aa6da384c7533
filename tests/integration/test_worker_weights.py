"""How the real worker holds its weights (worker/README.md, "Weights in memory"): on the CPU lane it
reads them into its own memory, where ggml advises them for transparent huge pages (patch 0005), instead
of mapping the file on 4 KiB pages; ``--load MODE`` takes llama.cpp's load modes, an unknown one is a
usage error (exit 2, its line first); and where the weights sit changes no logit."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pipeline import drive
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
PROMPT = "Where the weights sit changes no logit."


def _huge_bytes(pid: int) -> int:
    """AnonHugePages of a process, from its smaps_rollup."""
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    return int(re.search(r"^AnonHugePages:\s+(\d+) kB", text, re.M)[1]) * 1024


def _loaded_line(evidence: Path) -> str:
    """The worker's own word on its load mode (one stage's stderr)."""
    text = next(evidence.glob("stage-0-*.stderr")).read_text()
    return next(line for line in text.splitlines() if "weights loaded" in line)


def _logits(
    worker_command, stubs, worker_env, evidence: Path, load: str | None
) -> tuple[np.ndarray, int, str]:
    cmd = dataclasses.replace(worker_command, load=load)
    with launch(cmd, [(0, 12)], stubs=stubs, evidence=evidence, env=worker_env) as p:
        prompts = [p.clients[0].tokenize(PROMPT, add_special=True)]
        trace = drive.run_placement(p.clients, prompts, 6)
        huge = _huge_bytes(p.pids[0])
        memory = drive.describe(p.clients)[0].memory  # Info says it too (the certificate's record)
    assert memory.load_mode == (load or "none") and memory.huge_page_bytes >= 0
    return trace.prompts[0].logits, huge, _loaded_line(evidence)


def test_cpu_weights_are_read_onto_huge_pages_and_compute_what_mapped_weights_do(
    worker_command, stubs, worker_env, tmp_path
) -> None:
    read, read_huge, read_said = _logits(worker_command, stubs, worker_env, tmp_path / "read", None)
    mapped, mapped_huge, mapped_said = _logits(worker_command, stubs, worker_env, tmp_path / "mapped", "mmap")
    print(
        f"\n[weights] default: {read_said.split(': ', 1)[1]} (smaps {read_huge >> 20} MiB); "
        f"--load mmap: {mapped_said.split(': ', 1)[1]} (smaps {mapped_huge >> 20} MiB)"
    )
    assert "(load mode none)" in read_said and "(load mode mmap)" in mapped_said
    assert np.array_equal(read, mapped), "the load mode changed a logit"
    if THP.is_file() and "[never]" not in THP.read_text():
        # tiny-llama's 38 MiB of weights alone span many 2 MiB pages; mapped, they are file pages
        assert read_huge >= 8 << 20 and read_huge > mapped_huge


@pytest.mark.parametrize("bad", ["bogus", "MMAP", ""])
def test_an_unknown_load_mode_is_a_usage_error(worker_command, bad) -> None:
    argv = worker_command.argv((0, 12)) + ["--load", bad]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    # the usage error's own line first, then the usage text (as every usage error of the worker)
    assert done.stderr.splitlines()[0] == (
        f"dgr-shard-worker: --load: unknown load mode '{bad}' "
        "(one of none, mmap, mlock, mmap+mlock, dio, auto)"
    )
