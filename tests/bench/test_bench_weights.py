"""Weights read into the worker's memory on huge pages against weights mapped from the file, in one run
(worker/README.md, "Weights in memory").

On the CPU lane the worker reads its weights (llama's load mode "none") into buffers that ggml advises
for transparent huge pages (patch 0005); ``--load mmap`` keeps them in the page cache on 4 KiB pages,
as before.  A decode pass streams every weight once, so the page size decides how many page-table
walks it takes, in the monolithic worker and in every stage alike.  Every placement decoded as a
token-only ring both ways, interleaved, each divided by the better monolithic figure; the kernel's
THP setting and the huge-page memory each way held are printed beside it.

A figure of this machine, not a pass/fail property: the only assertion is that every run decoded
(tests/integration/test_worker_weights.py holds both ways to the same logits).
Run: ``nox -s bench -- -s -k weights``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.bench.ways import compare_ways

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

ROUNDS = 3
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _said(evidence: Path) -> list[str]:
    """Each monolithic worker's own line on how it loaded its weights."""
    return [
        line.split(": ", 1)[1]
        for log in sorted(evidence.glob("monolithic-*/stage-0-*.stderr"))
        for line in log.read_text().splitlines()
        if "weights loaded" in line
    ]


def test_bench_read_weights_against_mapped(benchmark, worker_command, stubs, worker_env, tmp_path) -> None:
    ways = {
        "mapped": dataclasses.replace(worker_command, threads=1, load="mmap"),
        "read": dataclasses.replace(worker_command, threads=1),
    }
    table = compare_ways(
        ways, rounds=ROUNDS, benchmark=benchmark, stubs=stubs, env=worker_env, evidence=tmp_path
    )
    thp = THP.read_text().strip() if THP.is_file() else "absent"
    table.publish(
        "weights",
        f"tiny-llama token-only ring, 1 thread per worker, loopback; mapped: --load "
        f"mmap, read: the default (load mode none); THP {thp}; the monolithic workers said: "
        f"{'; '.join(_said(tmp_path))}",
        benchmark,
        thp=thp,
    )
