"""The splits of tests/bench/test_bench_rpc_split.py beyond the tiny model on loopback (issue 46): the
same layer splits for our staged workers and for llama.cpp's RPC backend, on any model, and the side
by side on a shaped fabric (pipeline.seams: each process in its own network namespace, every access
link shaped like a rack or a metro WAN).

Where the processes sit on a fabric of N stage namespaces: our stage k in namespace k, the driver in
the root namespace (its link is stage 0's profile, off a ring's critical path); llama-bench, which
computes the first layers and the output head itself, in namespace 0 (stage 0's place) and RPC server k
in namespace k (k >= 1), so a boundary crosses the same links either way.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.seam_model import Profiles, link_of
from pipeline.shaper import Link
from tests.bench import rpc_split

WAN_RECIPE = "tiny-llama-wan"


def links() -> dict[str, Link]:
    """The WAN recipe's link classes, each read from its 2-stage chained placement: one-way delay and
    access rate, without the recipe's jitter (a paired ratio of runs this short reads cleaner without
    it; docs/performance.md says so)."""
    from manifests.recipe_model import load

    wan = load(WAN_RECIPE)
    return {
        name: dataclasses.replace(link_of(wan.placements[f"{name}-2-chained"].seam(0)), jitter_s=0.0)
        for name in ("rack", "metro")
    }


@dataclass(frozen=True)
class Split:
    """One model split ``ways`` ways both sides alike: ours as contiguous layer ranges, theirs as the
    RPC servers and the layers on them (llama-bench keeps the first stage's layers and the output
    head; llama.cpp spreads the offloaded layers over the servers by their free memory, equally here,
    so a 4-way server share can differ from ours by a layer)."""

    ways: int
    ours: list[tuple[int, int]]
    servers: int
    server_layers: int


def even_splits(n_layer: int, ways: Sequence[int]) -> dict[int, Split]:
    out = {}
    for w in ways:
        cuts = [round(k * n_layer / w) for k in range(w + 1)]
        ours = list(zip(cuts[:-1], cuts[1:], strict=True))
        out[w] = Split(ways=w, ours=ours, servers=w - 1, server_layers=n_layer - cuts[1] if w > 1 else 0)
    return out


def profiles(link: Link, n_stages: int) -> Profiles:
    return Profiles(driver=link, stages=(link,) * n_stages)


@contextmanager
def rpc_servers_on(
    fabric: Any, tools: rpc_split.RpcTools, *, env, log: Path, threads: int
) -> Iterator[list[str]]:
    """RPC server k where our stage k runs (pipeline.seams.Fabric.places), for k = 1 .. the fabric's last
    stage; their addresses in order."""
    at = fabric.places()[1:]
    with rpc_split.servers(tools.server, len(at), threads=threads, env=env, log=log, places=at) as addresses:
        yield addresses


def stage0_prefix(fabric: Any) -> tuple[str, ...]:
    """llama-bench's prefix on ``fabric``: stage 0's namespace."""
    return fabric.places()[0].prefix


def plot(
    folder: Path,
    name: str,
    title: str,
    ours: dict[int, list[list[float]]],
    theirs: dict[int, list[list[float]]],
) -> Path:
    """tok/s against ways, ours and llama.cpp RPC's (each the median of its runs), as ``name``.svg in
    ``folder`` (docs/performance.md shows them): the report's own line chart, no plotting library."""
    from reports.charts import lines

    def medians(by_ways: dict[int, list[list[float]]]) -> list[tuple[float, float]]:
        return [
            (float(w), float(np.median([v for runs in r for v in runs]))) for w, r in by_ways.items() if r
        ]

    chart = lines([("ours", medians(ours)), ("llama.cpp RPC", medians(theirs))], title=title, unit="tok/s")
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{name}.svg"
    out.write_text(str(chart))
    return out


def plot_folder(default: Path) -> Path:
    """Where the plots go: ``DGR_BENCH_PLOTS`` (docs/performance/ for a run that updates the docs), or
    ``default`` (the test's own temporary folder)."""
    chosen = os.environ.get("DGR_BENCH_PLOTS", "")
    return Path(chosen) if chosen else default
