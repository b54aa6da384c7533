"""Decode speed of ring decode (issue 19 item 2) beside relayed and chained forwarding, loopback, CPU.

The ring twice: ``ring`` hands each pass stage to stage on a TCP connection kept open to the next
stage's pass port (what the certificate uses wherever every stage names one), ``ring-unary`` as one
Forward call per pass and stage (older workers), so the table shows what that takes off each crossing.

One ggml thread per worker (as DGR_WORKER_THREADS=1 does for a certificate), the embedded tiny model,
monolithic and 2, 4 and 12 stages, in one run: each placement's workers serve all three modes,
interleaved over ROUNDS rounds so drift in the machine's load hits every mode alike.  The table gives
median decode tok/s (IQR), the crossings on one token's critical path, and each figure's ratio to the
monolithic worker driven relayed (the end-to-end monolithic figure of the certificate), with the load
average before and after.  Each token's time is also split in two: the stages' compute (and how much
more it is than the monolithic worker's in the same mode) and the rest (seams, hand-offs, the driver),
so a staged placement's loss shows whether it comes from the crossings or from the compute itself.
A figure of the machine's load, not a pass/fail property: the only assertions are the crossings and
that every mode decoded.

Run: ``pytest tests/bench -m slow -s -k ring`` (or ``nox -s bench``).
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from certify.metrics import median_iqr
from pipeline import drive, routes
from tests.bench.placements import PLACEMENTS
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

SPECS = {  # each way of forwarding the bench compares, as the route it runs
    "relayed": routes.Relayed(),
    "chained": routes.Chained(),
    "ring-unary": routes.Ring(streams=False),
    "ring": routes.Ring(),
}
MODES = tuple(SPECS)
CROSSINGS = {
    "relayed": lambda n: 2 * n,
    "chained": lambda n: n + 1,
    "ring-unary": lambda n: n,
    "ring": lambda n: n,
}
N_DECODE = 65  # 64 decode steps per repetition
ROUNDS = 2
PROMPT = "Once upon a time"


def _sweep(clients) -> dict[str, dict]:
    got: dict[str, dict] = {m: {"tok_s": [], "seam_s": [], "compute_s": [], "crossings": 0} for m in MODES}
    prompt = clients[0].tokenize(PROMPT, add_special=True)
    for _ in range(ROUNDS):
        for mode in MODES:
            s = drive.measure_speed(
                clients,
                prompt,
                N_DECODE,
                repetitions=3,
                warmup=1,
                route=SPECS[mode],
            )
            got[mode]["tok_s"] += list(s.decode_tok_s)
            got[mode]["seam_s"] += [t for rep in s.seam_seconds for t in rep]
            got[mode]["compute_s"] += [sum(rep) for rep in s.stage_compute_per_token]
            got[mode]["crossings"] = s.crossings_per_token
    return got


def test_ring_vs_chained_vs_relayed(benchmark, worker_command, stubs, worker_env, tmp_path) -> None:
    single = dataclasses.replace(worker_command, threads=1)
    load_before = os.getloadavg()
    figures: dict[str, dict] = {}
    for name, placement in PLACEMENTS.items():
        with launch(single, placement, stubs=stubs, evidence=tmp_path / name, env=worker_env) as p:
            runs = (
                _sweep(p.clients)
                if name != "12-stages"
                else benchmark.pedantic(_sweep, args=(p.clients,), rounds=1, iterations=1)
            )
        figures[name] = runs
        for mode, run in runs.items():
            assert run["crossings"] == CROSSINGS[mode](len(placement)), (name, mode)
            assert all(v > 0 for v in run["tok_s"])
    load_after = os.getloadavg()
    mono = median_iqr(figures["monolithic"]["relayed"]["tok_s"]).median
    mono_compute = {mode: median_iqr(run["compute_s"]).median for mode, run in figures["monolithic"].items()}
    lines = [
        f"{'placement':<11} {'mode':<10} {'tok/s':>7} {'IQR':>6} {'x/tok':>5} {'/mono':>6} "
        f"{'seam ms':>8} {'ms/tok':>7} {'compute':>8} {'+compute':>8} {'rest':>6}"
    ]
    table = {}
    for name, runs in figures.items():
        for mode, run in runs.items():
            m = median_iqr(run["tok_s"])
            seam = median_iqr(run["seam_s"]).median * 1e3 if run["seam_s"] else float("nan")
            token_ms, compute_ms = 1e3 / m.median, median_iqr(run["compute_s"]).median * 1e3
            added_ms = compute_ms - mono_compute[mode] * 1e3
            table[f"{name}/{mode}"] = {
                "tok_s": m.median,
                "iqr": m.iqr,
                "crossings": run["crossings"],
                "ratio_to_monolithic": m.median / mono,
                "seam_ms": seam,
                "token_ms": token_ms,
                "compute_ms": compute_ms,
                "compute_added_ms": added_ms,
                "rest_ms": token_ms - compute_ms,
            }
            lines.append(
                f"{name:<11} {mode:<10} {m.median:7.1f} {m.iqr:6.1f} {run['crossings']:5d} "
                f"{m.median / mono:6.2f} {seam:8.3f} {token_ms:7.3f} {compute_ms:8.3f} "
                f"{added_ms:8.3f} {token_ms - compute_ms:6.3f}"
            )
    print(
        f"\n[bench ring] tiny-llama, 1 thread per worker, loopback, median of {ROUNDS * 3} runs x "
        f"{N_DECODE - 1} decode tokens; ring: pass connections, ring-unary: a Forward call per hop; "
        f"/mono = ratio to the monolithic worker driven relayed; seam ms = median one-way time of one "
        f"worker-to-worker seam crossing (next stage received - this stage sent; relayed: the driver's "
        f"round trip less compute); ms/tok = 1000 / tok/s; compute = the stages' llama_decode per token "
        f"(sum of per-stage medians); +compute = that less the monolithic worker's in the same mode (what "
        f"running the layers in separate processes adds to the compute itself); rest = ms/tok - compute "
        f"(seams, hand-offs, the driver) "
        f"({mono:.1f} tok/s); load average before {load_before[0]:.2f} {load_before[1]:.2f} "
        f"{load_before[2]:.2f}, after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}, "
        f"{os.cpu_count()} cpus\n  " + "\n  ".join(lines)
    )
    benchmark.extra_info.update(table=table, load_before=list(load_before), load_after=list(load_after))
