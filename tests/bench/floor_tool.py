"""One run of ``dgr-ring-floor`` (worker/tools/ring_floor.cpp) for the benches that read a figure
against it: N stage processes of this build with nothing of ours between them, the last stage's picks
handed to a reader here as a worker's ring hands each token to the driver."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from lanes.build import RING_FLOOR_TARGET
from tests.integration.conftest import floor_deliveries

FLOOR_ROUNDS = 3  # timed rounds of 64 tokens per run of the floor tool


def floor_tool(build_dir: Path) -> Path:
    return build_dir / "bin" / RING_FLOOR_TARGET


def run_floor(tool: Path, model: Path, stages: int, threads: int, ctx: int = 512) -> dict:
    """Its JSON: tok_s per round, cpu_us_per_pass and decode_us_per_pass per stage, tokens; every pick
    read by the reader.  ``ctx``: each stage's context (the worker's default, 512)."""
    argv = [
        os.fspath(tool),
        "-m",
        os.fspath(model),
        "--stages",
        str(stages),
        "--rounds",
        str(FLOOR_ROUNDS),
        "--threads",
        str(threads),
        "--ctx",
        str(ctx),
    ]
    with floor_deliveries() as (port, delivered):
        done = subprocess.run(
            [*argv, "--deliver", str(port)], capture_output=True, text=True, timeout=600, check=False
        )
    assert done.returncode == 0, f"{' '.join(argv)}: exit {done.returncode}: {done.stderr[-2000:]}"
    floor = json.loads(done.stdout)
    assert len(delivered) == FLOOR_ROUNDS * floor["tokens_per_round"], "the reader missed picks"
    return floor
