"""Our split against llama.cpp's own (issue 19): decode speed at 2 and 4 ways, one run, CPU, loopback.

Upstream's split is its RPC backend: ``llama-bench --rpc`` with ``-ngl`` layers on ``ggml-rpc-server``
processes (1 server holding 6 of the 12 layers: 2 ways; 3 servers holding 3 each: 4 ways, the other
layers and the output head local), all built from the pinned tree (tests/bench/rpc_split.py).  Ours
is the staged workers driven as a ring (streamed where the workers offer it), even splits, twice:
delivering tokens only (like llama-bench, which reads no logits: the side by side) and with each
token's logits row to the driver (what a certificate's speed run carries).  One
thread per process on both sides, the embedded tiny model, the configurations interleaved over ROUNDS
rounds so drift in the machine's load hits all alike.  Each side is also read against its own
monolithic run (llama-bench without RPC; our one-stage worker).  Figures, not a pass/fail property:
the only assertions are that every configuration decoded.

Run: ``nox -s bench -- -k rpc_split -s`` (the RPC build takes minutes cold, once per machine).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from certify.metrics import median_iqr
from pipeline import drive
from tests.bench import rpc_split
from tests.integration import conftest as shared
from worker.launcher import launch

real_ctx, cpu_build, tiny_model = shared.real_ctx, shared.cpu_build, shared.tiny_model
stubs, worker_command, worker_env = shared.stubs, shared.worker_command, shared.worker_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

N_GEN = 64
REPETITIONS = 3
ROUNDS = 3
THREADS = 1
OURS = {1: [(0, 12)], 2: [(0, 6), (6, 12)], 4: [(0, 3), (3, 6), (6, 9), (9, 12)]}
THEIRS = {1: (0, 0), 2: (1, 6), 4: (3, 9)}  # ways: (RPC servers, layers on them)


def _ours(clients, prompt, logits: bool = False) -> list[float]:
    s = drive.measure_speed(clients, prompt, N_GEN + 1, repetitions=REPETITIONS, warmup=1, forwarding="ring",
                            ring_logits=logits)
    return list(s.decode_tok_s)


def _theirs(tools: rpc_split.RpcTools, model, servers: list[str], gpu_layers: int, env) -> list[float]:
    return rpc_split.tg(tools.bench, model, n_gen=N_GEN, repetitions=REPETITIONS, threads=THREADS, env=env,
                        rpc=servers, gpu_layers=gpu_layers)


def test_our_split_against_llama_cpp_rpc(benchmark, real_ctx, tiny_model, worker_command, stubs, worker_env,
                                         tmp_path) -> None:
    tools = rpc_split.build(real_ctx)
    single = dataclasses.replace(worker_command, threads=THREADS)
    ours: dict[int, list[float]] = {w: [] for w in OURS}
    ours_logits: dict[int, list[float]] = {w: [] for w in OURS}
    theirs: dict[int, list[float]] = {w: [] for w in THEIRS}
    load_before = os.getloadavg()
    with launch(single, OURS[1], stubs=stubs, evidence=tmp_path / "o1", env=worker_env) as o1, \
         launch(single, OURS[2], stubs=stubs, evidence=tmp_path / "o2", env=worker_env) as o2, \
         launch(single, OURS[4], stubs=stubs, evidence=tmp_path / "o4", env=worker_env) as o4, \
         rpc_split.servers(tools.server, 3, threads=THREADS, env=worker_env, log=tmp_path / "rpc") as rpc:
        clients = {1: o1.clients, 2: o2.clients, 4: o4.clients}
        prompt = o1.clients[0].tokenize("", add_special=True) or [1]  # BOS only, like tg's first token
        for r in range(ROUNDS):
            for ways, (n_servers, layers) in THEIRS.items():
                theirs[ways] += _theirs(tools, tiny_model.first, rpc[:n_servers], layers, worker_env)
            for ways, got in clients.items():
                ours_logits[ways] += _ours(got, prompt, logits=True)
                if r == ROUNDS - 1 and ways == 4:
                    ours[ways] += benchmark.pedantic(_ours, args=(got, prompt), rounds=1, iterations=1)
                else:
                    ours[ways] += _ours(got, prompt)
    load_after = os.getloadavg()
    table = {}
    lines = [f"{'ways':>4} {'ours tok/s':>10} {'IQR':>6} {'/own mono':>9} {'llama.cpp RPC':>13} {'IQR':>6} "
             f"{'/own mono':>9} {'ours/theirs':>11} {'ours+logits':>11}"]
    for ways in OURS:
        o, t, ol = median_iqr(ours[ways]), median_iqr(theirs[ways]), median_iqr(ours_logits[ways])
        o_mono, t_mono = median_iqr(ours[1]).median, median_iqr(theirs[1]).median
        table[ways] = {"ours_tok_s": o.median, "ours_iqr": o.iqr, "ours_ratio_to_mono": o.median / o_mono,
                       "theirs_tok_s": t.median, "theirs_iqr": t.iqr,
                       "theirs_ratio_to_mono": t.median / t_mono, "ours_over_theirs": o.median / t.median,
                       "ours_with_logits_tok_s": ol.median}
        lines.append(f"{ways:>4} {o.median:10.1f} {o.iqr:6.1f} {o.median / o_mono:9.2f} {t.median:13.1f} "
                     f"{t.iqr:6.1f} {t.median / t_mono:9.2f} {o.median / t.median:11.2f} {ol.median:11.1f}")
    print(f"\n[bench rpc split] tiny-llama f32, {THREADS} thread per process, loopback, tg{N_GEN}, median "
          f"of {ROUNDS * REPETITIONS} runs per row; ours: staged workers as a ring delivering tokens only "
          f"(way 1: one worker; ours+logits: each token's logits row to the driver too), "
          f"theirs: llama-bench --rpc -ngl (way 1: llama-bench alone); load average before "
          f"{load_before[0]:.2f}, after {load_after[0]:.2f}, {os.cpu_count()} cpus\n  " + "\n  ".join(lines))
    benchmark.extra_info.update(table=table, load_before=list(load_before), load_after=list(load_after))
    assert all(v > 0 for v in np.concatenate([*ours.values(), *ours_logits.values(), *theirs.values()]))
