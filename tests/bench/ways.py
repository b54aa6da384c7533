"""One table for benches that run every placement of tests/bench/placements.py two or more ways (free
or pinned, mapped or read weights, a narrow or a wide model): each way's workers started once,
token-only ring decode interleaved over the rounds so drift in the machine's load hits every way
alike, each median divided by the best monolithic median, so no way is credited with a slower
reference (or, for ways that run different models, by its own)."""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np

from certify.metrics import median_iqr
from pipeline import drive, routes
from tests.bench.cpu_time import cpu_seconds
from tests.bench.placements import PLACEMENTS
from worker.launcher import WorkerCommand, launch

N_DECODE = 65
REPETITIONS = 3
PROMPT = "Once upon a time"


@dataclass(frozen=True)
class WaysTable:
    lines: list[str]  # the printed table, a header first
    extra_info: dict  # for pytest-benchmark: each (placement, way)'s median, IQR, ratio, seam and CPU
    samples: list[float]  # every run's tok/s
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]

    def publish(self, tag: str, what: str, benchmark, **extra) -> None:
        """Print the table under ``[bench TAG] WHAT`` with the load averages, hand it to
        pytest-benchmark, and hold the bench's one property: every run decoded."""
        print(
            f"\n[bench {tag}] {what}; load average before {self.load_before[0]:.2f}, after "
            f"{self.load_after[0]:.2f}\n  " + "\n  ".join(self.lines)
        )
        benchmark.extra_info.update(
            table=self.extra_info,
            load_before=list(self.load_before),
            load_after=list(self.load_after),
            **extra,
        )
        assert all(v > 0 for v in self.samples)


@dataclass(frozen=True)
class RingFigures:
    tok_s: list[float]  # each run's decode tok/s
    seams: list[float]  # every seam crossing's one-way seconds
    worker_cpu: float  # the workers' CPU seconds per token, all of them together
    driver_cpu: float  # this process's (the driver's) CPU seconds per token, every thread
    compute: list[float]  # each run's llama time per token: its stages' median compute_seconds summed


def decode_ring(pipeline, prompt, driver_yields: bool = True, delivery_stream: bool = True) -> RingFigures:
    """A token-only ring's figures over REPETITIONS runs (the warm-up run and the prefills counted in
    the CPU time and the tokens alike).  ``delivery_stream=False``: Deliver calls, not frames on the
    driver's delivery port."""
    cpu_before, driver_before = cpu_seconds(pipeline.pids), time.process_time()
    speed = drive.measure_speed(
        pipeline.clients,
        prompt,
        N_DECODE,
        repetitions=REPETITIONS,
        warmup=1,
        route=routes.Ring(logits=False, driver_yields=driver_yields, delivery_stream=delivery_stream),
    )
    tokens = (REPETITIONS + 1) * (len(prompt) + N_DECODE - 1)
    return RingFigures(
        tok_s=list(speed.decode_tok_s),
        seams=[t for rep in speed.seam_seconds for t in rep],
        worker_cpu=(cpu_seconds(pipeline.pids) - cpu_before) / tokens,
        driver_cpu=(time.process_time() - driver_before) / tokens,
        compute=[sum(rep) for rep in speed.stage_compute_per_token],
    )


def pooled(rounds: list[list[float]]) -> list[float]:
    """Every round's runs in one list: the whole run's samples, for its median and IQR."""
    return [v for runs in rounds for v in runs]


def bench_rounds(default: int) -> int:
    """A bench's round count: ``default``, or ``DGR_BENCH_ROUNDS`` for a run that wants its paired
    ratios tighter (every round is another pair; the time grows with it)."""
    text = os.environ.get("DGR_BENCH_ROUNDS", "")
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"DGR_BENCH_ROUNDS={text!r}: a number of rounds, 1 or more")
    return int(text)


def paired_spread(rounds: list[list[float]], reference: list[list[float]]) -> tuple[float, float]:
    """The lowest and the highest round's ratio that ``paired_ratio`` takes the median of: how far
    one round can be from another on this machine, so a verdict at a goal's edge reads as such."""
    ratios = _round_ratios(rounds, reference)
    return min(ratios), max(ratios)


def _round_ratios(rounds: list[list[float]], reference: list[list[float]]) -> list[float]:
    if len(rounds) != len(reference) or not rounds:
        raise ValueError(f"{len(rounds)} rounds against {len(reference)} rounds of the reference")
    return [median_iqr(x).median / median_iqr(ref).median for x, ref in zip(rounds, reference, strict=True)]


def paired_ratio(rounds: list[list[float]], reference: list[list[float]]) -> float:
    """The median over rounds of (this round's median / the reference's median in the same round).

    Why: on a shared VM the speed drifts by 10-20% within minutes (llama-bench gave 216 and 364 tok/s
    seven minutes apart), so a ratio of medians taken over a whole run carries that drift.  Runs made
    in one round are seconds apart; their ratio, then the median over rounds, does not."""
    return float(np.median(_round_ratios(rounds, reference)))


def compare_ways(
    ways: dict[str, WorkerCommand],
    *,
    rounds: int,
    benchmark,
    stubs,
    env,
    evidence,
    own_monolithic: bool = False,
    driver_keeps: frozenset[str] = frozenset(),
    deliver_calls: frozenset[str] = frozenset(),
) -> WaysTable:
    """Every placement decoded each way (a token-only ring), ``rounds`` rounds, in one run.
    ``own_monolithic``: each way's ratios are to its own monolithic median (ways that run different
    models), not to the best of them.  ``driver_keeps``: the ways whose driver does not yield to the
    stages while it reads (pipeline/yielding.py); the others' does.  ``deliver_calls``: the ways whose
    rings deliver by Deliver calls; the others' by frames on the driver's delivery port.
    ``DGR_BENCH_ROUNDS`` overrides ``rounds`` (bench_rounds)."""
    rounds = bench_rounds(rounds)
    load_before = os.getloadavg()
    # each (placement, way)'s tok/s, one list per round (the paired ratio pairs rounds)
    by_round: dict[tuple[str, str], list[list[float]]] = {
        (name, way): [] for name in PLACEMENTS for way in ways
    }
    seam_s: dict[tuple[str, str], list[float]] = {key: [] for key in by_round}
    cpu_s: dict[tuple[str, str], list[float]] = {key: [] for key in by_round}
    driver_s: dict[tuple[str, str], list[float]] = {key: [] for key in by_round}
    with ExitStack() as running:
        # ways with one command share its workers: two launches of the same binary can differ by
        # 10-20% (where their processes settled), which would be charged to the ways' difference
        launched: dict[tuple[str, WorkerCommand], list] = {}
        for name, placement in PLACEMENTS.items():
            for way, cmd in ways.items():
                if (name, cmd) not in launched:
                    launched[(name, cmd)] = running.enter_context(
                        launch(
                            cmd,
                            placement,
                            stubs=stubs,
                            env=env,
                            evidence=evidence / f"{name}-{way}".replace(" ", "-"),
                        )
                    )
        groups = {(name, way): launched[(name, cmd)] for name in PLACEMENTS for way, cmd in ways.items()}
        prompt = next(iter(groups.values())).clients[0].tokenize(PROMPT, add_special=True)

        def sweep() -> None:
            for _ in range(rounds):
                for key, pipeline in groups.items():
                    got = decode_ring(
                        pipeline,
                        prompt,
                        driver_yields=key[1] not in driver_keeps,
                        delivery_stream=key[1] not in deliver_calls,
                    )
                    by_round[key].append(got.tok_s)
                    seam_s[key] += got.seams
                    cpu_s[key].append(got.worker_cpu)
                    driver_s[key].append(got.driver_cpu)

        benchmark.pedantic(sweep, rounds=1, iterations=1)
        load_after = os.getloadavg()
    medians = {key: median_iqr(pooled(rounds)) for key, rounds in by_round.items()}
    seam_us = {key: median_iqr(v).median * 1e6 if v else float("nan") for key, v in seam_s.items()}
    cpu_us = {key: median_iqr(v).median * 1e6 for key, v in cpu_s.items()}
    driver_us = {key: median_iqr(v).median * 1e6 for key, v in driver_s.items()}
    best = max(medians[("monolithic", way)].median for way in ways)
    mono = {way: medians[("monolithic", way)].median if own_monolithic else best for way in ways}
    paired = {(n, w): paired_ratio(by_round[(n, w)], by_round[("monolithic", w)]) for (n, w) in by_round}
    spread = {(n, w): paired_spread(by_round[(n, w)], by_round[("monolithic", w)]) for (n, w) in by_round}
    header = " ".join(
        f"{way + ' tok/s':>14} {'IQR':>6} {'/mono':>6} {'paired':>6} {'rounds':>9} "
        f"{'seam us':>7} {'cpu us':>6} {'drv us':>6}"
        for way in ways
    )
    lines = [f"{'placement':<11} {header}"]
    for name in PLACEMENTS:
        cells = [
            f"{medians[(name, w)].median:14.1f} {medians[(name, w)].iqr:6.1f} "
            f"{medians[(name, w)].median / mono[w]:6.2f} {paired[(name, w)]:6.2f} "
            f"{spread[(name, w)][0]:4.2f}-{spread[(name, w)][1]:4.2f} "
            f"{seam_us[(name, w)]:7.1f} {cpu_us[(name, w)]:6.0f} {driver_us[(name, w)]:6.0f}"
            for w in ways
        ]
        lines.append(f"{name:<11} " + " ".join(cells))
    reference = (
        "each way's own monolithic median"
        if own_monolithic
        else f"the better monolithic median, {best:.1f} tok/s"
    )
    lines.append(
        f"(/mono: {reference}; paired: to the way's own monolithic run in the same round, the "
        f"median over rounds, and rounds: the lowest and highest of those {rounds}; "
        f"median of {rounds * REPETITIONS} "
        f"runs x {N_DECODE - 1} tokens; seam us: median one-way crossing, next stage received - "
        f"this stage sent; cpu us: every worker's CPU time per token, drv us: the driver's, "
        f"medians over the rounds; "
        f"{os.cpu_count()} cpus)"
    )
    info = {
        f"{n}/{w}": {
            "tok_s": m.median,
            "iqr": m.iqr,
            "ratio_to_monolithic": m.median / mono[w],
            "paired_ratio_to_own_monolithic": paired[(n, w)],
            "paired_rounds_low_high": list(spread[(n, w)]),
            "seam_us": seam_us[(n, w)],
            "worker_cpu_us_per_token": cpu_us[(n, w)],
            "driver_cpu_us_per_token": driver_us[(n, w)],
        }
        for (n, w), m in medians.items()
    }
    samples = [v for rounds in by_round.values() for v in pooled(rounds)]
    return WaysTable(
        lines=lines, extra_info=info, samples=samples, load_before=load_before, load_after=load_after
    )
