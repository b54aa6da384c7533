"""Issue 8 item 1: chained forwarding on the real worker and the embedded tiny model (CPU lane).

For 2, 4 and 12 stages on 127.0.0.1: chained logits == relayed logits == monolithic logits (max abs
difference 0), the same greedy tokens, the same seam boundaries; an f16 seam gives the same bytes
either way; a killed middle stage is named (DIED) within seconds and no worker is left behind.
``test_decode_speed_chained_vs_relayed`` prints decode tokens/s of both on loopback (the figure for
the report; not a gate: two shared cores make it noisy).
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time

import numpy as np
import pytest

from certify.metrics import median_iqr
from pipeline import drive, routes
from pipeline.sink import chain_route
from tests.integration.conftest import our_workers, proc_alive
from worker.client import StageFailed
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Pipeline parallel inference splits the layers of a model across machines.",
    "Once upon a time",
]
N_DECODE = 24
N_LAYER = 12
PLACEMENTS = {
    "2-stages": [(0, 6), (6, 12)],
    "4-stages": [(0, 3), (3, 6), (6, 9), (9, 12)],
    "12-stages": [(k, k + 1) for k in range(N_LAYER)],
}


@pytest.fixture(scope="module")
def reference(worker_command, stubs, worker_env, tmp_path_factory):
    evidence = tmp_path_factory.mktemp("mono")
    with launch(worker_command, [(0, N_LAYER)], stubs=stubs, evidence=evidence, env=worker_env) as p:
        prompts = [p.clients[0].tokenize(text, add_special=True) for text in TEXTS]
        trace = drive.run_placement(p.clients, prompts, N_DECODE, capture=list(range(1, N_LAYER)))
        chained = drive.run_placement(p.clients, prompts, N_DECODE, route=routes.Chained())
    for r, c in zip(trace.prompts, chained.prompts, strict=True):
        assert np.array_equal(r.logits, c.logits), "one stage chained to the sink differs from relayed"
    return prompts, trace


def _max_diff(a: drive.Trace, b: drive.Trace) -> float:
    return max(float(np.abs(x.logits - y.logits).max()) for x, y in zip(a.prompts, b.prompts, strict=True))


@pytest.mark.parametrize("name", list(PLACEMENTS))
def test_chained_equals_relayed_equals_monolithic(
    name, reference, worker_command, stubs, worker_env, tmp_path
) -> None:
    prompts, mono = reference
    placement = PLACEMENTS[name]
    n = len(placement)
    with launch(worker_command, placement, stubs=stubs, evidence=tmp_path / "ev", env=worker_env) as p:
        relayed = drive.run_placement(p.clients, prompts, N_DECODE)
        chained = drive.run_placement(p.clients, prompts, N_DECODE, route=routes.Chained())
        pids = p.pids
    assert [s.process.returncode for s in p.stages] == [0] * n, "clean exit on SIGTERM"
    print(
        f"\n[chained] {name}: max |chained - relayed| = {_max_diff(chained, relayed):.3g}, "
        f"max |chained - monolithic| = {_max_diff(chained, mono):.3g}; crossings per decode token "
        f"chained {chained.prompts[0].decode[0].crossings} vs relayed "
        f"{relayed.prompts[0].decode[0].crossings}; "
        f"seam bytes {list(chained.seam_bytes())}"
    )
    for c, r, m in zip(chained.prompts, relayed.prompts, mono.prompts, strict=True):
        assert c.tokens == r.tokens == m.tokens
        assert np.array_equal(c.logits, r.logits) and np.array_equal(c.logits, m.logits)
        for cut in chained.cuts:
            assert np.array_equal(c.boundaries[cut], m.captures[cut]), f"boundary at layer {cut}"
        step = c.decode[0]
        assert step.crossings == n + 1 and r.decode[0].crossings == 2 * n
        assert len(step.seam_seconds) == n - 1 and all(s > 0 for s in step.seam_seconds)
        assert all(0 < x <= w for x, w in zip(step.stage_compute, step.stage_wall, strict=True))
    assert chained.seam_bytes() == relayed.seam_bytes()
    assert not any(proc_alive(pid) for pid in pids)
    assert our_workers(worker_command.program[0]) == []


def test_chained_f16_seam(reference, worker_command, stubs, worker_env, tmp_path) -> None:
    prompts, mono = reference
    with launch(
        worker_command, PLACEMENTS["4-stages"], stubs=stubs, evidence=tmp_path / "ev", env=worker_env
    ) as p:
        relayed = drive.run_placement(p.clients, prompts, N_DECODE, boundary_dtype="f16")
        chained = drive.run_placement(
            p.clients, prompts, N_DECODE, boundary_dtype="f16", route=routes.Chained()
        )
    print(
        f"\n[chained f16] 4 stages: max |chained - relayed| = {_max_diff(chained, relayed):.3g}, "
        f"max |chained - monolithic f32| = {_max_diff(chained, mono):.3g}"
    )
    assert chained.seam_bytes() == relayed.seam_bytes()
    rows, width = mono.prompts[0].captures[3].shape
    assert chained.prompts[0].prefill.seam_bytes[0] == (len(prompts[0])) * width * 2
    for c, r in zip(chained.prompts, relayed.prompts, strict=True):
        assert c.tokens == r.tokens and np.array_equal(c.logits, r.logits)


def test_killed_middle_stage_is_named(reference, worker_command, stubs, worker_env, tmp_path) -> None:
    prompts, _ = reference
    with launch(
        worker_command, PLACEMENTS["4-stages"], stubs=stubs, evidence=tmp_path / "ev", env=worker_env
    ) as p:
        drive.run_placement(p.clients, prompts[:1], 4, route=routes.Chained())
        infos = drive.describe(p.clients)
        p.stages[2].process.send_signal(signal.SIGKILL)
        started = time.monotonic()
        # straight into a chained pass (describe() would already notice the dead stage through Info)
        with (
            pytest.raises(StageFailed) as caught,
            chain_route(p.clients, infos, addresses=None, sink_host="127.0.0.1") as route,
        ):
            route.run(
                "after-kill",
                1,
                list(range(len(prompts[0]))),
                prompts[0],
                boundary_dtype="f32",
                all_logits=False,
                keep_boundaries=False,
            )
        took = time.monotonic() - started
        pids = p.pids
    print(f"\n[chained] killed stage 2 of 4: {caught.value} (after {took:.2f} s)")
    assert caught.value.stage == 2 and caught.value.code == "DIED" and "SIGKILL" in str(caught.value)
    assert "chained Forward" in str(caught.value)
    assert took < 5
    assert not any(proc_alive(pid) for pid in pids)
    assert our_workers(worker_command.program[0]) == []


def test_killed_middle_stage_mid_decode(reference, worker_command, stubs, worker_env, tmp_path) -> None:
    """The kill lands while passes are flowing (a timer, not between runs)."""
    prompts, _ = reference
    with launch(
        worker_command, PLACEMENTS["4-stages"], stubs=stubs, evidence=tmp_path / "ev", env=worker_env
    ) as p:
        timer = threading.Timer(0.5, p.stages[1].process.kill)
        timer.start()
        started = time.monotonic()
        try:
            with pytest.raises(StageFailed) as caught:
                drive.measure_speed(
                    p.clients, prompts[0], 400, repetitions=50, warmup=0, route=routes.Chained()
                )
        finally:
            timer.cancel()
        took = time.monotonic() - started
    print(f"\n[chained] stage 1 killed mid-decode: {caught.value} ({took:.2f} s after start)")
    assert caught.value.stage == 1 and caught.value.code == "DIED"
    assert took < 6
    assert our_workers(worker_command.program[0]) == []


def test_decode_speed_chained_vs_relayed(reference, worker_command, stubs, worker_env, tmp_path) -> None:
    """One ggml thread per worker: with more, twelve workers' spinning threads on a small machine make
    the figure a measure of CPU oversubscription rather than of the seams."""
    prompts, _ = reference
    single = dataclasses.replace(worker_command, threads=1)
    lines = []
    for name, placement in PLACEMENTS.items():
        with launch(single, placement, stubs=stubs, evidence=tmp_path / name, env=worker_env) as p:
            got = {}
            for forwarding in ("relayed", "chained", "relayed", "chained"):  # interleaved: drift hits both
                s = drive.measure_speed(
                    p.clients, prompts[1], 33, repetitions=3, warmup=1, route=routes.spec_named(forwarding)
                )
                got.setdefault(forwarding, []).extend(s.decode_tok_s)
                crossings = s.crossings_per_token
                got[forwarding + "-x"] = crossings
        rel, ch = median_iqr(got["relayed"]), median_iqr(got["chained"])
        lines.append(
            f"{name}: decode tok/s relayed {rel.median:.1f} (IQR {rel.iqr:.1f}, "
            f"{got['relayed-x']} crossings/token), chained {ch.median:.1f} (IQR {ch.iqr:.1f}, "
            f"{got['chained-x']} crossings/token), chained/relayed {ch.median / rel.median:.2f}"
        )
        assert got["chained-x"] == len(placement) + 1 and got["relayed-x"] == 2 * len(placement)
        assert all(v > 0 for v in got["relayed"] + got["chained"])
    print(
        "\n[chained vs relayed, loopback, 1 thread per worker, median of 6 runs x 32 decode tokens]\n  "
        + "\n  ".join(lines)
    )
