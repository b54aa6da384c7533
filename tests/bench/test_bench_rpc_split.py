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

Beyond the tiny model on loopback (issue 46; tests/bench/rpc_shapes.py): gemma3-270m-q4 (real weights,
Q4_K, 18 layers) on loopback, free, over 8 paired rounds; and the tiny model on a shaped fabric (each
process in its own network namespace, every link a rack's or a metro WAN's), ours and theirs on the
same links with the same splits, interleaved rounds.

Run: ``nox -s bench -- -k rpc_split -s`` (the RPC build takes minutes cold, once per machine).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from certify.metrics import median_iqr
from pipeline import drive, routes, seams
from tests.bench import rpc_shapes, rpc_split
from tests.bench.ways import bench_rounds, paired_ratio, paired_spread, pooled
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

N_GEN = 64
REPETITIONS = 3
ROUNDS = 3  # DGR_BENCH_ROUNDS overrides it (tests/bench/ways.bench_rounds)
THREADS = 1
OURS = {1: [(0, 12)], 2: [(0, 6), (6, 12)], 4: [(0, 3), (3, 6), (6, 9), (9, 12)]}
THEIRS = {1: (0, 0), 2: (1, 6), 4: (3, 9)}  # ways: (RPC servers, layers on them)


def _ours(
    clients, prompt, logits: bool = False, n_gen: int = N_GEN, reach: routes.Reach = routes.LOOPBACK
) -> list[float]:
    s = drive.measure_speed(
        clients,
        prompt,
        n_gen + 1,
        repetitions=REPETITIONS,
        warmup=1,
        route=routes.Ring(logits=logits),
        reach=reach,
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
    title = f"tiny-llama f32, loopback: decode tok/s against ways, tg{N_GEN}, {THREADS} thread per process"
    folder = rpc_shapes.plot_folder(tmp_path)
    print(
        f"  plot: {rpc_shapes.plot(folder, 'rpc-split-tiny-loopback', title, sides[0].ours, sides[0].theirs)}"
    )
    samples = [
        v for side in sides for rounds in (*side.ours.values(), *side.theirs.values()) for v in pooled(rounds)
    ]
    samples += [v for side in sides for runs in side.ours_logits.values() for v in runs]
    assert all(v > 0 for v in samples)


GEMMA_LAYERS = 18
GEMMA_ROUNDS = 8  # the paired rounds; DGR_BENCH_ROUNDS overrides it


def _theirs(tools, model, split: rpc_shapes.Split, rpc, n_gen: int, env, prefix=()) -> list[float]:
    """llama-bench's tg samples for ``split``: its servers' share of the layers on the first of ``rpc``."""
    return rpc_split.tg(
        tools.bench,
        model,
        n_gen=n_gen,
        repetitions=REPETITIONS,
        threads=THREADS,
        env=env,
        rpc=rpc[: split.servers],
        gpu_layers=split.server_layers,
        prefix=prefix,
    )


def _side_by_side(
    ways, ours: dict[int, list[list[float]]], theirs: dict[int, list[list[float]]]
) -> list[str]:
    """One line per ways: each side's median tok/s, and ours/theirs paired (lowest-highest round)."""
    head = f"{'ways':>4} {'ours tok/s':>10} {'llama.cpp RPC':>13} {'ours/theirs':>11} {'paired':>6}"
    lines = [f"{head} {'rounds':>9}"]
    for w in ways:
        o, t = median_iqr(pooled(ours[w])).median, median_iqr(pooled(theirs[w])).median
        low, high = paired_spread(ours[w], theirs[w])
        paired = paired_ratio(ours[w], theirs[w])
        lines.append(f"{w:>4} {o:10.1f} {t:13.1f} {o / t:11.2f} {paired:6.2f} {low:4.2f}-{high:4.2f}")
    return lines


def test_our_split_against_llama_cpp_rpc_on_real_weights(
    benchmark, real_ctx, gemma_store, worker_command, stubs, worker_env, tmp_path
) -> None:
    tools = rpc_split.build(real_ctx)
    rounds = bench_rounds(GEMMA_ROUNDS)
    model = Path(gemma_store.provisioned.first)
    splits = rpc_shapes.even_splits(GEMMA_LAYERS, (1, 2, 4))
    cmd = dataclasses.replace(worker_command, model=model, threads=THREADS)
    ours: dict[int, list[list[float]]] = {w: [] for w in splits}
    theirs: dict[int, list[list[float]]] = {w: [] for w in splits}
    with contextlib.ExitStack() as running:
        clients = {
            w: running.enter_context(
                launch(cmd, s.ours, stubs=stubs, env=worker_env, evidence=tmp_path / f"o{w}")
            ).clients
            for w, s in splits.items()
        }
        rpc = running.enter_context(
            rpc_split.servers(tools.server, 3, threads=THREADS, env=worker_env, log=tmp_path / "rpc")
        )
        prompt = clients[1][0].tokenize("", add_special=True) or [2]

        def sweep() -> None:
            for _ in range(rounds):
                for w, s in splits.items():
                    theirs[w].append(_theirs(tools, model, s, rpc, N_GEN, worker_env))
                    ours[w].append(_ours(clients[w], prompt))

        benchmark.pedantic(sweep, rounds=1, iterations=1)
    cuts = "; ".join(
        f"{w}: {s.ours}, theirs {s.server_layers} layers on {s.servers} servers" for w, s in splits.items()
    )
    print(
        f"\n[bench rpc split] gemma3-270m-q4 (Q4_K, {GEMMA_LAYERS} layers), {THREADS} thread per process, "
        f"loopback, free, tg{N_GEN}, {rounds} rounds of {REPETITIONS} runs each way; ours: a ring "
        f"delivering tokens only; theirs: llama-bench --rpc -ngl (way 1: each side alone); splits {cuts}; "
        f"{os.cpu_count()} cpus\n  " + "\n  ".join(_side_by_side(splits, ours, theirs))
    )
    benchmark.extra_info.update(ours=ours, theirs=theirs)
    title = f"gemma3-270m-q4, loopback: decode tok/s against ways, tg{N_GEN}, {THREADS} thread per process"
    folder = rpc_shapes.plot_folder(tmp_path)
    print(f"  plot: {rpc_shapes.plot(folder, 'rpc-split-gemma-loopback', title, ours, theirs)}")
    assert all(v > 0 for side in (ours, theirs) for runs in side.values() for v in pooled(runs))


SHAPED_GEN = 16  # tokens per run on a shaped link: a metro token is tens of milliseconds
SHAPED_ROUNDS = 3


@dataclasses.dataclass
class Shaped:
    """One link class's samples by ways, ours and theirs by round."""

    name: str
    link: Any
    ours: dict[int, list[list[float]]]
    theirs: dict[int, list[list[float]]]


def _on_fabric(name, link, support, tools, splits, rounds, model, cmd, stubs, env, evidence) -> Shaped:
    """Every split of ``splits`` on one fabric of ``link``s, ours and theirs interleaved by round."""
    got = Shaped(name=name, link=link, ours={w: [] for w in splits}, theirs={w: [] for w in splits})
    fabric = seams.Fabric(links=rpc_shapes.profiles(link, max(splits)), support=support, env=env)
    with fabric, contextlib.ExitStack() as running:
        placed = fabric.places()
        reach = routes.Reach(addresses=None, sink_host=fabric.driver_address)
        clients = {
            w: running.enter_context(
                launch(cmd, s.ours, stubs=stubs, env=env, evidence=evidence / f"o{w}", placed=placed[:w])
            ).clients
            for w, s in splits.items()
        }
        rpc = running.enter_context(
            rpc_shapes.rpc_servers_on(fabric, tools, env=env, log=evidence / "rpc", threads=THREADS)
        )
        prompt = clients[min(splits)][0].tokenize("", add_special=True) or [1]
        for _ in range(rounds):
            for w, s in splits.items():
                got.theirs[w].append(
                    _theirs(tools, model, s, rpc, SHAPED_GEN, env, prefix=rpc_shapes.stage0_prefix(fabric))
                )
                got.ours[w].append(_ours(clients[w], prompt, n_gen=SHAPED_GEN, reach=reach))
    return got


def test_our_split_against_llama_cpp_rpc_on_shaped_links(
    benchmark, real_ctx, tiny_model, worker_command, stubs, worker_env, tmp_path
) -> None:
    support = seams.probe(worker_env)
    if not support.available:
        pytest.skip(f"no shaped fabric here: {support.reason}")
    tools = rpc_split.build(real_ctx)
    rounds = bench_rounds(SHAPED_ROUNDS)
    splits = rpc_shapes.even_splits(12, (2, 4))
    cmd = dataclasses.replace(worker_command, threads=THREADS)
    report: list[Shaped] = []

    def sweep() -> None:
        for name, link in rpc_shapes.links().items():
            evidence = tmp_path / name
            args = (tools, splits, rounds, tiny_model.first, cmd, stubs, worker_env, evidence)
            report.append(_on_fabric(name, link, support, *args))

    benchmark.pedantic(sweep, rounds=1, iterations=1)
    for got in report:
        print(
            f"\n[bench rpc split] tiny-llama f32, shaped fabric ({got.name}: {got.link.delay_s * 1e3:.0f} "
            f"ms one way, {(got.link.rate_bps or 0) / 1e6:.0f} Mbit/s into every node; backend "
            f"{support.backend}), {THREADS} thread per process, tg{SHAPED_GEN}, {rounds} rounds of "
            f"{REPETITIONS} runs each way; ours: stage k in namespace k, a ring delivering tokens only; "
            f"theirs: llama-bench in namespace 0, RPC server k in namespace k\n  "
            + "\n  ".join(_side_by_side(splits, got.ours, got.theirs))
        )
        benchmark.extra_info[got.name] = {"ours": got.ours, "theirs": got.theirs}
        title = f"tiny-llama f32, {got.name} links: decode tok/s against ways, tg{SHAPED_GEN}"
        where = rpc_shapes.plot(
            rpc_shapes.plot_folder(tmp_path), f"rpc-split-tiny-{got.name}", title, got.ours, got.theirs
        )
        print(f"  plot: {where}")
        assert all(v > 0 for side in (got.ours, got.theirs) for runs in side.values() for v in pooled(runs))
