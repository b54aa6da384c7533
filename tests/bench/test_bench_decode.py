"""Decode speed of the shard worker (issue 4 must-show), on the embedded tiny model, CPU lane.

1. Monolithic worker decode tok/s vs the pinned tree's own ``llama-bench -p 0 -n N`` (tg) on the same
   model and thread count.  The worker's figure is end to end as the driver sees it: gRPC round trip,
   the logits row back to Python and the greedy argmax included; and again as a one-stage ring
   delivering tokens only (pipeline/ring.py), where the worker picks each token and starts the next
   pass itself: no driver call between two tokens, and, like llama-bench, no logits read (what a
   serving client takes).  Issue 19's goal (end to end >= 0.95x) is printed as met or not: a figure.
   Beside them, each round, ``dgr-ring-floor --stages 1`` (tests/bench/floor_tool.py): one process of
   this build decoding with the worker's load mode and context and handing each pass to itself over
   loopback TCP, nothing of ours in it, so what llama-bench keeps over any ring on this host reads
   apart from ours.  (llama-bench sizes its context to the test, 64 cells, and llama then attends over
   64 cells where a worker at --ctx 512 attends over 256; a ring at --ctx 66 measured the same as at
   512 all the same: 0.958x and 0.959x paired over 8 rounds on 2026-12-04.)
2. 2-stage loopback decode tok/s vs monolithic (one seam: boundary relay plus a second round trip), the
   two stages sharing the THREADS cores as dgr certify shares a host's.

The two sides run interleaved (ROUNDS times) so background load on a shared box hits both alike; the
figures are medians over every sample, and the ring's ratio to llama-bench also ``paired`` (each round
against llama-bench's in the same round, then the median; tests/bench/ways.paired_ratio), which the
goal's verdict reads.  Run: ``nox -s bench`` or ``pytest tests/bench -m slow -s``.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from certify.inputs import worker_threads
from core import proc
from pipeline import drive, routes
from tests.bench.floor_tool import floor_tool, run_floor
from tests.bench.ways import bench_rounds, paired_ratio, paired_spread, pooled
from tests.integration import conftest as shared
from worker.launcher import launch

# The slow suite's session fixtures (build once, provision once), shared without a conftest of our own.
THREADS = shared.THREADS

# The first test of a fresh checkout builds the CPU lane inside its fixture: allow for that.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

N_GEN = 64
REPETITIONS = 5
ROUNDS = 3  # the llama-bench comparison: DGR_BENCH_ROUNDS overrides it (tests/bench/ways.bench_rounds)
GOAL = 0.95


def _llama_bench_tg(binary, model, threads: int, env) -> list[float]:
    # -mmp 0: weights read into memory, as the worker holds them on the CPU lane (both on huge pages)
    argv = [
        binary,
        "-m",
        model,
        "-p",
        "0",
        "-n",
        str(N_GEN),
        "-t",
        str(threads),
        "-r",
        str(REPETITIONS),
        "-mmp",
        "0",
        "-o",
        "json",
    ]
    out = proc.run(argv, env=env, no_output_timeout=300).output
    start = out.index("[")
    rows = json.loads(out[start : out.rindex("]") + 1])
    tg = [r for r in rows if r.get("n_prompt") == 0 and r.get("n_gen") == N_GEN]
    assert tg, f"llama-bench printed no tg{N_GEN} row: {out[-500:]}"
    return [float(v) for v in tg[0]["samples_ts"]]


def _worker_decode(
    clients, prompt, compute: list[float] | None = None, route: routes.RouteSpec = routes.RELAYED
) -> list[float]:
    """End-to-end decode tok/s per repetition; ``compute`` collects the worker-side rate (1 / the
    median llama_decode seconds per token, summed over stages) that excludes the RPC round trip.
    A ring delivers tokens only, as llama-bench reads no logits either."""
    speed = drive.measure_speed(
        clients,
        prompt,
        N_GEN + 1,
        repetitions=REPETITIONS,
        warmup=1,
        route=route,
    )
    if compute is not None:
        compute += [1.0 / sum(rep) for rep in speed.stage_compute_per_token]
    return list(speed.decode_tok_s)


def test_monolithic_decode_vs_llama_bench(
    benchmark, cpu_build, tiny_model, worker_command, stubs, worker_env, tmp_path
) -> None:
    bench = cpu_build.binaries["llama-bench"]
    ours: list[float] = []  # relayed: a Forward call per token, the logits row to the driver
    ours_compute: list[float] = []
    # tok/s per round: llama-bench, the floor, a one-stage ring (tokens only: no driver call between two
    # tokens, no logits read)
    by_round: dict[str, list[list[float]]] = {"llama-bench": [], "floor": [], "ring": []}
    rounds = bench_rounds(ROUNDS)
    with launch(worker_command, [(0, 12)], stubs=stubs, evidence=tmp_path / "ev", env=worker_env) as p:
        prompt = p.clients[0].tokenize("", add_special=True) or [1]  # BOS only, like tg's first token
        for r in range(rounds):
            by_round["llama-bench"].append(_llama_bench_tg(bench, tiny_model.first, THREADS, worker_env))
            by_round["floor"].append(
                run_floor(
                    floor_tool(cpu_build.dir), tiny_model.first, 1, THREADS, ctx=worker_command.ctx_size
                )["tok_s"]
            )
            by_round["ring"].append(_worker_decode(p.clients, prompt, route=routes.Ring(logits=False)))
            if r < rounds - 1:
                ours += _worker_decode(p.clients, prompt, ours_compute)
        ours += benchmark.pedantic(
            _worker_decode, args=(p.clients, prompt, ours_compute), rounds=1, iterations=1
        )
    theirs = by_round["llama-bench"]
    medians = {name: float(np.median(pooled(runs))) for name, runs in by_round.items()}
    paired = {name: paired_ratio(runs, theirs) for name, runs in by_round.items()}
    spread = {name: paired_spread(runs, theirs) for name, runs in by_round.items()}
    ratio = float(np.median(ours) / medians["llama-bench"])
    compute_ratio = float(np.median(ours_compute) / medians["llama-bench"])
    verdict = paired["ring"]
    over_floor = paired_ratio(by_round["ring"], by_round["floor"])
    benchmark.extra_info.update(
        {
            "threads": THREADS,
            "n_gen": N_GEN,
            "ctx": worker_command.ctx_size,
            "goal": GOAL,
            "worker_decode_tok_s_median": float(np.median(ours)),
            "ratio": ratio,
            "worker_compute_tok_s_median": float(np.median(ours_compute)),
            "compute_ratio": compute_ratio,
            "tok_s_median": medians,
            "paired_ratio_to_llama_bench": paired,
            "paired_rounds_low_high": {k: list(v) for k, v in spread.items()},
            "ring_over_floor": over_floor,
            "samples": by_round,
            "worker_samples": ours,
            "load_average": list(os.getloadavg()),
        }
    )
    what = {
        "llama-bench": f"llama-bench tg{N_GEN}",
        "floor": f"dgr-ring-floor --stages 1 --ctx {worker_command.ctx_size} (nothing of ours)",
        "ring": f"a one-stage ring of the worker, --ctx {worker_command.ctx_size}, tokens only",
    }
    lines = [
        f"{what[name]:<54} {medians[name]:7.1f} tok/s  x{medians[name] / medians['llama-bench']:.3f}  "
        f"paired x{paired[name]:.3f} ({spread[name][0]:.2f}-{spread[name][1]:.2f})"
        for name in by_round
    ]
    lines.append(
        f"the monolithic worker relayed (gRPC, the logits row to the driver): {np.median(ours):.1f} "
        f"tok/s (x{ratio:.3f}); its own llama_decode {np.median(ours_compute):.1f} tok/s "
        f"(x{compute_ratio:.3f})"
    )
    lines.append(
        f"goal: the ring >= {GOAL}x llama-bench: {'met' if verdict >= GOAL else 'NOT met'} "
        f"(paired x{verdict:.3f}; the ring over the floor, paired, {over_floor:.3f})"
    )
    print(
        f"\n[bench] monolithic decode against llama-bench, {THREADS} thread(s), {rounds} interleaved "
        f"rounds, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (paired: each round "
        f"against llama-bench's in the same round, the median, and the lowest-highest round)\n  "
        + "\n  ".join(lines)
    )
    # A figure, not a gate (as every other speed bench here): the same build gave the worker's own
    # llama_decode 0.887x-0.982x of llama-bench in runs an hour apart on this shared VM, so a gate would
    # fail `nox -s bench` on the machine's mood.  The sanity bound only catches a broken measurement.
    assert 0.25 < compute_ratio < 4


def test_two_stage_loopback_vs_monolithic(benchmark, worker_command, stubs, worker_env, tmp_path) -> None:
    # the two stages share the THREADS cores, as dgr certify shares a host's (certify.inputs.worker_threads):
    # at a thread per core each, one stage's idle OpenMP team spins on the cores the other computes on
    command = dataclasses.replace(worker_command, threads=worker_threads({}, THREADS, 2))
    mono: list[float] = []
    staged: list[float] = []
    seams: list[float] = []
    with (
        launch(command, [(0, 12)], stubs=stubs, evidence=tmp_path / "mono", env=worker_env) as m,
        launch(command, [(0, 6), (6, 12)], stubs=stubs, evidence=tmp_path / "two", env=worker_env) as s,
    ):
        prompt = m.clients[0].tokenize("", add_special=True) or [1]
        for r in range(ROUNDS):
            mono += _worker_decode(m.clients, prompt)
            if r < ROUNDS - 1:
                staged += _worker_decode(s.clients, prompt)
        samples = benchmark.pedantic(
            drive.measure_speed,
            args=(s.clients, prompt, N_GEN + 1),
            kwargs={"repetitions": REPETITIONS, "warmup": 1},
            rounds=1,
            iterations=1,
        )
        staged += list(samples.decode_tok_s)
        seams += [rep[0] for rep in samples.seam_seconds]
    ratio = float(np.median(staged) / np.median(mono))
    figures = {
        "threads": command.threads,
        "n_gen": N_GEN,
        "mono_decode_tok_s_median": float(np.median(mono)),
        "two_stage_decode_tok_s_median": float(np.median(staged)),
        "ratio": ratio,
        "seam_seconds_median": float(np.median(seams)),
        "seam_bytes_per_token": samples.seam_bytes_per_token[0],
    }
    benchmark.extra_info.update(figures)
    print(
        f"\n[bench] 2-stage loopback decode at {command.threads} threads per worker "
        f"{np.median(staged):.1f} tok/s vs monolithic {np.median(mono):.1f} tok/s: {ratio:.3f}x; "
        f"seam {np.median(seams) * 1e3:.3f} ms and {samples.seam_bytes_per_token[0]} B per token"
    )
    assert ratio > 0.5, figures
