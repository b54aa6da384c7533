"""Our split against llama.cpp's own (issue 19): decode speed at 2 and 4 ways, one run, CPU, loopback.

Upstream's split is its RPC backend: ``llama-bench --rpc`` with ``-ngl`` layers on ``ggml-rpc-server``
processes (1 server holding 6 of the 12 layers: 2 ways; 3 servers holding 3 each: 4 ways, the other
layers and the output head local), all built from the pinned tree (tests/bench/rpc_split.py).  Ours
is the staged workers driven as a ring (streamed where the workers offer it), even splits, twice:
delivering tokens only (like llama-bench, which reads no logits: the side by side) and with each
token's logits row to the driver (what a certificate's speed run carries).  One
thread per process on both sides, the embedded tiny model, the configurations interleaved over ROUNDS
rounds so drift in the machine's load hits all alike.  Each side is also read against its own
monolithic run (llama-bench without RPC; our one-stage worker).  All of it twice: every process free
to run anywhere, and every process of both sides held to one CPU (our --cpus, their ``taskset -c``),
since where a stage wakes moves a split's speed on a shared box (worker/README.md, "CPU affinity").
Figures, not a pass/fail property: the only assertions are that every configuration decoded.

Run: ``nox -s bench -- -k rpc_split -s`` (the RPC build takes minutes cold, once per machine).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import pytest

from certify.metrics import median_iqr
from pipeline import drive, routes
from tests.bench import rpc_split
from tests.bench.ways import bench_rounds, paired_ratio, paired_spread, pooled
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

N_GEN = 64
REPETITIONS = 3
ROUNDS = 3  # DGR_BENCH_ROUNDS overrides it (tests/bench/ways.bench_rounds)
THREADS = 1
OURS = {1: [(0, 12)], 2: [(0, 6), (6, 12)], 4: [(0, 3), (3, 6), (6, 9), (9, 12)]}
THEIRS = {1: (0, 0), 2: (1, 6), 4: (3, 9)}  # ways: (RPC servers, layers on them)


def _ours(clients, prompt, logits: bool = False) -> list[float]:
    s = drive.measure_speed(
        clients, prompt, N_GEN + 1, repetitions=REPETITIONS, warmup=1, route=routes.Ring(logits=logits)
    )
    return list(s.decode_tok_s)


@dataclasses.dataclass
class Side:
    """One way of placing the processes (free, or all held to one CPU) and its samples per ways: ours
    and theirs by round (for the paired ratio, tests/bench/ways.paired_ratio), ours with logits
    pooled."""

    cpus: str | None
    ours: dict[int, list[list[float]]] = dataclasses.field(default_factory=lambda: {w: [] for w in OURS})
    ours_logits: dict[int, list[float]] = dataclasses.field(default_factory=lambda: {w: [] for w in OURS})
    theirs: dict[int, list[list[float]]] = dataclasses.field(default_factory=lambda: {w: [] for w in THEIRS})


def _round(side: Side, tools, model, clients, rpc, prompt, env) -> None:
    for ways, (n_servers, layers) in THEIRS.items():
        side.theirs[ways].append(
            list(
                rpc_split.tg(
                    tools.bench,
                    model,
                    n_gen=N_GEN,
                    repetitions=REPETITIONS,
                    threads=THREADS,
                    env=env,
                    rpc=rpc[:n_servers],
                    gpu_layers=layers,
                    cpus=side.cpus,
                )
            )
        )
    for ways, got in clients.items():
        side.ours_logits[ways] += _ours(got, prompt, logits=True)
        side.ours[ways].append(_ours(got, prompt))


def _table(side: Side) -> tuple[dict, list[str]]:
    table, lines = {}, []
    o_mono, t_mono = median_iqr(pooled(side.ours[1])).median, median_iqr(pooled(side.theirs[1])).median
    for ways in OURS:
        o, t = median_iqr(pooled(side.ours[ways])), median_iqr(pooled(side.theirs[ways]))
        ol = median_iqr(side.ours_logits[ways])
        paired = paired_ratio(side.ours[ways], side.theirs[ways])
        low, high = paired_spread(side.ours[ways], side.theirs[ways])
        table[ways] = {
            "ours_tok_s": o.median,
            "ours_iqr": o.iqr,
            "ours_ratio_to_mono": o.median / o_mono,
            "theirs_tok_s": t.median,
            "theirs_iqr": t.iqr,
            "theirs_ratio_to_mono": t.median / t_mono,
            "ours_over_theirs": o.median / t.median,
            "ours_over_theirs_paired": paired,
            "ours_over_theirs_rounds_low_high": [low, high],
            "ours_with_logits_tok_s": ol.median,
        }
        lines.append(
            f"{side.cpus or 'free':>5} {ways:>4} {o.median:10.1f} {o.iqr:6.1f} "
            f"{o.median / o_mono:9.2f} {t.median:13.1f} {t.iqr:6.1f} {t.median / t_mono:9.2f} "
            f"{o.median / t.median:11.2f} {paired:6.2f} {low:4.2f}-{high:4.2f} {ol.median:11.1f}"
        )
    return table, lines


def test_our_split_against_llama_cpp_rpc(
    benchmark, real_ctx, tiny_model, worker_command, stubs, worker_env, tmp_path
) -> None:
    tools = rpc_split.build(real_ctx)
    rounds = bench_rounds(ROUNDS)
    cpu = str(min(os.sched_getaffinity(0)))
    sides = [Side(cpus=None), Side(cpus=cpu)]
    load_before = os.getloadavg()
    with contextlib.ExitStack() as running:
        placed = []
        for side in sides:
            cmd = dataclasses.replace(worker_command, threads=THREADS, cpus=(side.cpus,) if side.cpus else ())
            tag = side.cpus or "free"
            clients = {
                w: running.enter_context(
                    launch(cmd, OURS[w], stubs=stubs, env=worker_env, evidence=tmp_path / f"o{w}-{tag}")
                ).clients
                for w in OURS
            }
            rpc = running.enter_context(
                rpc_split.servers(
                    tools.server,
                    3,
                    threads=THREADS,
                    env=worker_env,
                    log=tmp_path / f"rpc-{tag}",
                    cpus=side.cpus,
                )
            )
            placed.append((side, clients, rpc))
        free_mono = placed[0][1][1]  # the free side's one-stage worker
        prompt = free_mono[0].tokenize("", add_special=True) or [1]  # BOS only, like tg's first token

        def sweep() -> None:
            for _ in range(rounds):
                for side, clients, rpc in placed:
                    _round(side, tools, tiny_model.first, clients, rpc, prompt, worker_env)

        benchmark.pedantic(sweep, rounds=1, iterations=1)
    load_after = os.getloadavg()
    lines = [
        f"{'cpus':>5} {'ways':>4} {'ours tok/s':>10} {'IQR':>6} {'/own mono':>9} {'llama.cpp RPC':>13} "
        f"{'IQR':>6} {'/own mono':>9} {'ours/theirs':>11} {'paired':>6} {'rounds':>9} "
        f"{'ours+logits':>11}"
    ]
    tables = {}
    for side in sides:
        tables[side.cpus or "free"], rows = _table(side)
        lines += rows
    print(
        f"\n[bench rpc split] tiny-llama f32, {THREADS} thread per process, loopback, tg{N_GEN}, median "
        f"of {rounds * REPETITIONS} runs per row; ours: staged workers as a ring delivering tokens only "
        f"(way 1: one worker; ours+logits: each token's logits row to the driver too), "
        f"paired: ours/theirs within each round, the median over rounds (rounds: the lowest and highest "
        f"of those {rounds}), "
        f"theirs: llama-bench --rpc -ngl (way 1: llama-bench alone); cpus: every process of both sides "
        f"free, or held to that CPU (our --cpus, their taskset -c); load average before "
        f"{load_before[0]:.2f}, after {load_after[0]:.2f}, {os.cpu_count()} cpus\n  " + "\n  ".join(lines)
    )
    benchmark.extra_info.update(tables=tables, load_before=list(load_before), load_after=list(load_after))
    samples = [
        v for side in sides for rounds in (*side.ours.values(), *side.theirs.values()) for v in pooled(rounds)
    ]
    samples += [v for side in sides for runs in side.ours_logits.values() for v in runs]
    assert all(v > 0 for v in samples)
