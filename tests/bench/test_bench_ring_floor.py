"""The workers' ring against the floor of a ring on this host: how much of a staged token's cost is
ours (issue 19, "seams at the physical limit").

``dgr-ring-floor`` (worker/tools/ring_floor.cpp, built beside the worker) runs the same even
placements as N stage processes of the same llama build that pass {position, token, boundary} over
loopback TCP and nothing else: no gRPC, no protobuf, no driver.  Its last stage hands each pick to a
reader thread here as it comes (``--deliver``: three int32 on one TCP connection), as the workers'
ring hands each token to the driver, so both sides carry a driver that reads every token.  What it
measures is llama's own work per pass, the kernel's socket calls and the processes taking turns on the
cores: the best a ring of N processes can do here.  Each placement is run both ways, interleaved over ROUNDS
rounds (token-only ring, one thread per process, free); the table gives tok/s, the ratio to each
side's own monolithic figure (of the medians, and ``paired``: within each round, then the median,
which the VM's drift over the run does not move; tests/bench/ways.paired_ratio), every process's CPU
time per token (where stages share cores, a
token costs that sum), and a token's time split in two: ``llama ms``, its stages' llama_decode (and
reading the output) summed, timed alike on both sides (the floor's ``decode_us_per_pass``, the
workers' ``compute_seconds``), and ``rest ms``, everything else (transport, hand-offs, the processes
waiting their turn).  ``ours/floor`` is how close the workers come (of the medians, then paired
round by round); the floor's own ``/mono`` is the
ceiling of any staged goal on this host; where both sides' ``llama ms`` grow with the stages, that
growth is llama's per pass on a shared host, not the transport's.

Property held: the floor's picks are the same tokens at every depth (staging is bitwise on one
backend and thread count there too).  Everything else is a figure of this machine.
Run: ``nox -s bench -- -s -k ring_floor``.
"""

from __future__ import annotations

import dataclasses
import os
from contextlib import ExitStack

import pytest

from certify.metrics import median_iqr
from tests.bench.floor_tool import FLOOR_ROUNDS, floor_tool, run_floor
from tests.bench.placements import PLACEMENTS
from tests.bench.ways import (
    N_DECODE,
    PROMPT,
    REPETITIONS,
    bench_rounds,
    decode_ring,
    paired_ratio,
    paired_spread,
    pooled,
)
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

ROUNDS = 3  # DGR_BENCH_ROUNDS overrides it (tests/bench/ways.bench_rounds)
THREADS = 1


def test_bench_workers_against_the_ring_floor(
    benchmark, cpu_build, tiny_model, worker_command, stubs, worker_env, tmp_path
) -> None:
    tool = floor_tool(cpu_build.dir)
    rounds = bench_rounds(ROUNDS)
    command = dataclasses.replace(worker_command, threads=THREADS)
    floor_rounds: dict[str, list[list[float]]] = {name: [] for name in PLACEMENTS}
    floor_cpu: dict[str, list[float]] = {name: [] for name in PLACEMENTS}
    floor_llama: dict[str, list[float]] = {name: [] for name in PLACEMENTS}
    floor_rest: dict[str, list[float]] = {name: [] for name in PLACEMENTS}
    floor_tokens: dict[str, list[int]] = {}
    ours_rounds: dict[str, list[list[float]]] = {name: [] for name in PLACEMENTS}
    ours_cpu: dict[str, list[float]] = {name: [] for name in PLACEMENTS}
    ours_llama: dict[str, list[float]] = {name: [] for name in PLACEMENTS}
    ours_rest: dict[str, list[float]] = {name: [] for name in PLACEMENTS}
    load_before = os.getloadavg()
    with ExitStack() as running:
        pipelines = {
            name: running.enter_context(
                launch(command, placement, stubs=stubs, env=worker_env, evidence=tmp_path / name)
            )
            for name, placement in PLACEMENTS.items()
        }
        prompt = pipelines["monolithic"].clients[0].tokenize(PROMPT, add_special=True)

        def sweep() -> None:
            for _ in range(rounds):
                for name, placement in PLACEMENTS.items():
                    floor = run_floor(tool, tiny_model.first, len(placement), THREADS)
                    floor_rounds[name].append(floor["tok_s"])
                    floor_cpu[name].append(sum(floor["cpu_us_per_pass"]))
                    llama_ms = sum(floor["decode_us_per_pass"]) / 1e3  # over the same passes as its rounds
                    floor_llama[name].append(llama_ms)
                    token_ms = sum(1e3 / v for v in floor["tok_s"]) / len(floor["tok_s"])
                    floor_rest[name].append(token_ms - llama_ms)
                    floor_tokens.setdefault(name, floor["tokens"])
                    ours = decode_ring(pipelines[name], prompt)
                    ours_rounds[name].append(ours.tok_s)
                    ours_cpu[name].append(ours.worker_cpu * 1e6)
                    ours_llama[name] += [c * 1e3 for c in ours.compute]
                    ours_rest[name] += [
                        1e3 / t - c * 1e3 for t, c in zip(ours.tok_s, ours.compute, strict=True)
                    ]

        benchmark.pedantic(sweep, rounds=1, iterations=1)
    load_after = os.getloadavg()
    f_mono = median_iqr(pooled(floor_rounds["monolithic"])).median
    o_mono = median_iqr(pooled(ours_rounds["monolithic"])).median
    lines = [
        f"{'placement':<11} {'floor tok/s':>11} {'IQR':>6} {'/mono':>6} {'paired':>6} {'rounds':>9} "
        f"{'cpu us':>6} {'llama ms':>8} {'rest ms':>7} {'ours tok/s':>10} {'IQR':>6} {'/mono':>6} "
        f"{'paired':>6} {'rounds':>9} {'cpu us':>6} {'llama ms':>8} {'rest ms':>7} {'ours/floor':>10} "
        f"{'paired':>6}"
    ]
    table = {}
    for name in PLACEMENTS:
        f, o = median_iqr(pooled(floor_rounds[name])), median_iqr(pooled(ours_rounds[name]))
        fc, oc = median_iqr(floor_cpu[name]).median, median_iqr(ours_cpu[name]).median
        fl, ol = median_iqr(floor_llama[name]).median, median_iqr(ours_llama[name]).median
        f_rest, o_rest = median_iqr(floor_rest[name]).median, median_iqr(ours_rest[name]).median
        f_paired = paired_ratio(floor_rounds[name], floor_rounds["monolithic"])
        o_paired = paired_ratio(ours_rounds[name], ours_rounds["monolithic"])
        f_low, f_high = paired_spread(floor_rounds[name], floor_rounds["monolithic"])
        o_low, o_high = paired_spread(ours_rounds[name], ours_rounds["monolithic"])
        over_floor_paired = paired_ratio(ours_rounds[name], floor_rounds[name])
        table[name] = {
            "floor_tok_s": f.median,
            "floor_ratio_to_mono": f.median / f_mono,
            "floor_paired_ratio_to_mono": f_paired,
            "floor_cpu_us": fc,
            "floor_llama_ms": fl,
            "floor_rest_ms": f_rest,
            "ours_tok_s": o.median,
            "ours_ratio_to_mono": o.median / o_mono,
            "ours_paired_ratio_to_mono": o_paired,
            "ours_cpu_us": oc,
            "floor_paired_rounds_low_high": [f_low, f_high],
            "ours_paired_rounds_low_high": [o_low, o_high],
            "ours_llama_ms": ol,
            "ours_rest_ms": o_rest,
            "ours_over_floor": o.median / f.median,
            "ours_over_floor_paired": over_floor_paired,
        }
        lines.append(
            f"{name:<11} {f.median:11.1f} {f.iqr:6.1f} {f.median / f_mono:6.2f} {f_paired:6.2f} "
            f"{f_low:4.2f}-{f_high:4.2f} {fc:6.0f} {fl:8.2f} {f_rest:7.2f} {o.median:10.1f} "
            f"{o.iqr:6.1f} {o.median / o_mono:6.2f} {o_paired:6.2f} {o_low:4.2f}-{o_high:4.2f} "
            f"{oc:6.0f} {ol:8.2f} {o_rest:7.2f} "
            f"{o.median / f.median:10.2f} {over_floor_paired:6.2f}"
        )
    lines.append(
        f"(median of {rounds * FLOOR_ROUNDS} floor rounds of 64 tokens and "
        f"{rounds * REPETITIONS} ring runs of {N_DECODE - 1}; "
        f"/mono: each side's own monolithic median; paired: each round's median over the same "
        f"round's monolithic median (ours/floor: the floor's), the median over rounds, and "
        f"rounds: the lowest and highest of those {rounds}; "
        f"cpu us: every process's CPU time per token; "
        f"llama ms: the stages' llama_decode per token, summed; "
        f"rest ms: each run's ms per token less its llama ms, the median; "
        f"{os.cpu_count()} cpus)"
    )
    print(
        f"\n[bench ring floor] tiny-llama, {THREADS} thread per process, loopback, free; load average "
        f"before {load_before[0]:.2f}, after {load_after[0]:.2f}\n  " + "\n  ".join(lines)
    )
    benchmark.extra_info.update(table=table, load_before=list(load_before), load_after=list(load_after))
    assert all(tokens == floor_tokens["monolithic"] for tokens in floor_tokens.values()), floor_tokens
    assert all(v > 0 for rounds in (*floor_rounds.values(), *ours_rounds.values()) for v in pooled(rounds))
