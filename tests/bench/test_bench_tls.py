"""What authenticating the seams costs the streamed ring (issue 43), in one run: authentication against
none.

1. One crossing: ``dgr-link-floor`` (worker/tools/link_floor.cpp) echoes frames of the V4-sized 64 KiB
   boundary and of a 1 KiB one between two processes on loopback, through the pass port's own code
   (secure_link.h), plain, over TLS records and in authenticated frames (mac_frames.h) side by side in
   every round; a crossing is half a round trip. Goal: authenticated <= 1.25x plain at both sizes
   (paired: each round's ratio, then the median), met by the authenticated frames; TLS records, which
   also encrypt, are shown beside them.
2. The ring: the tiny model's token-only streamed ring at 2, 4 and 12 stages, workers plain, with
   --tls (pass ports, deliveries and every gRPC call over TLS), and with --tls --pass-frames mac (the
   pass ports in authenticated frames), interleaved over the rounds. Goal: the 12-stage ring with
   authentication >= 0.9x the ring without (paired), for both.

Figures of this machine: the only assertion is that every run decoded and every round trip came back.
Run: ``nox -s bench -- -s -k tls``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest

from certify.metrics import median_iqr
from lanes.build import LINK_FLOOR_TARGET
from tests.bench.placements import PLACEMENTS
from tests.bench.ways import PROMPT, bench_rounds, decode_ring, paired_ratio, paired_spread, pooled
from worker import tls, tls_ca
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

ROUNDS = 8  # DGR_BENCH_ROUNDS overrides it
SIZES = (1024, 65536)
CROSSING_GOAL = 1.25
RING_GOAL = 0.9


def test_bench_one_crossing_over_tls_against_plain(benchmark, cpu_build, ca: Path) -> None:
    rounds = bench_rounds(ROUNDS)
    argv = [
        os.fspath(cpu_build.dir / "bin" / LINK_FLOOR_TARGET),
        "--tls",
        os.fspath(ca / tls_ca.HOSTS / "worker"),
        "--bytes",
        ",".join(map(str, SIZES)),
        "--rounds",
        str(rounds),
    ]

    def run() -> dict:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)

    got = benchmark.pedantic(run, rounds=1, iterations=1)
    lines = [
        f"{'bytes':>7} {'plain us':>9} {'tls us':>8} {'tls/plain':>10} {'rounds':>10} {'mac us':>8} "
        f"{'mac/plain':>10} {'rounds':>10}  goal <= {CROSSING_GOAL}"
    ]
    for row in got["sizes"]:
        tls_r, mac_r = row["tls_over_plain"], row["mac_over_plain"]
        lines.append(
            f"{row['bytes']:7d} {np.median(row['plain_us']):9.1f} {np.median(row['tls_us']):8.1f} "
            f"{np.median(tls_r):10.2f} {min(tls_r):4.2f}-{max(tls_r):4.2f} {np.median(row['mac_us']):8.1f} "
            f"{np.median(mac_r):10.2f} {min(mac_r):4.2f}-{max(mac_r):4.2f}"
        )
    print(
        f"\n[bench tls] one crossing of a pass port's connection ({got['trips']} round trips per size, "
        f"way and round; {rounds} rounds; {os.cpu_count()} cpus; tls: TLS records, mac: authenticated "
        f"frames)\n  " + "\n  ".join(lines)
    )
    benchmark.extra_info.update(crossings=got["sizes"])
    assert all(u > 0 for row in got["sizes"] for u in row["plain_us"] + row["tls_us"] + row["mac_us"])


def test_bench_streamed_ring_over_tls_against_plain(
    benchmark, worker_command, stubs, worker_env, ca: Path, tmp_path: Path
) -> None:
    rounds = bench_rounds(3)
    plain = dataclasses.replace(worker_command, threads=1)
    secured = dataclasses.replace(
        plain, tls=ca / tls_ca.HOSTS / "worker", driver_tls=tls.load(ca / tls_ca.HOSTS / "driver")
    )
    ways = {
        "plain": plain,
        "mutual TLS": secured,
        "mac frames": dataclasses.replace(secured, pass_frames="mac"),
    }
    by_round: dict[tuple[str, str], list[list[float]]] = {(n, w): [] for n in PLACEMENTS for w in ways}
    with ExitStack() as running:
        groups = {
            (n, w): running.enter_context(
                launch(
                    cmd,
                    PLACEMENTS[n],
                    stubs=stubs,
                    env=worker_env,
                    evidence=tmp_path / f"{n}-{w}".replace(" ", "-"),
                )
            )
            for n in PLACEMENTS
            for w, cmd in ways.items()
        }
        prompt = groups[("monolithic", "plain")].clients[0].tokenize(PROMPT, add_special=True)

        def sweep() -> None:
            for _ in range(rounds):
                for key, pipeline in groups.items():
                    by_round[key].append(decode_ring(pipeline, prompt).tok_s)

        benchmark.pedantic(sweep, rounds=1, iterations=1)
    lines = [
        f"{'placement':<11} {'plain tok/s':>12} {'TLS tok/s':>10} {'TLS/plain':>9} {'rounds':>10} "
        f"{'mac tok/s':>10} {'mac/plain':>9} {'rounds':>10}"
    ]
    info = {}
    for n in PLACEMENTS:
        a = by_round[(n, "plain")]
        info[n] = {"plain_tok_s": median_iqr(pooled(a)).median}
        line = f"{n:<11} {info[n]['plain_tok_s']:12.1f}"
        for way, key in (("mutual TLS", "tls"), ("mac frames", "mac")):
            b = by_round[(n, way)]
            ratio, (low, high) = paired_ratio(b, a), paired_spread(b, a)
            info[n][f"{key}_tok_s"] = median_iqr(pooled(b)).median
            info[n][f"paired_{key}_over_plain"] = ratio
            line += f" {info[n][f'{key}_tok_s']:10.1f} {ratio:9.2f} {low:4.2f}-{high:4.2f}"
        lines.append(line)
    print(
        f"\n[bench tls] token-only streamed ring, tiny-llama, 1 thread per worker, loopback, free; TLS and "
        f"authenticated frames (mac) against plain, paired over {rounds} rounds (goal at 12 stages >= "
        f"{RING_GOAL})\n  " + "\n  ".join(lines)
    )
    benchmark.extra_info.update(table=info)
    assert all(v > 0 for runs in by_round.values() for v in pooled(runs))
