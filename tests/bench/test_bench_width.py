"""What staging costs on a wider model: the tiny model (n_embd 256, 98 MiB) against one of the same
shape at n_embd 768 (503 MiB), every placement as a token-only ring, in one run.

A staged token pays for its seams, for each stage's own handling, and for compute that runs slower in
several processes than in one.  The first two are fixed per token, so the narrow model's
milliseconds show them at their worst; the wide model's tens of milliseconds show what they come to
where the layers do real work.  Each way is divided by its own monolithic worker; the seam column
gives the median one-way crossing.  The wide model is generated here (fetch.tinymodel, the tiny
model's generator with wider dimensions, a few seconds).

A figure of this machine, not a pass/fail property: the only assertion is that every run decoded.
Run: ``nox -s bench -- -s -k width``.
"""

from __future__ import annotations

import dataclasses

import pytest

from fetch import source, tinymodel
from tests.bench.ways import compare_ways

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

ROUNDS = 2
WIDE = {"n_embd": 768, "n_ff": 2304, "n_head": 12, "n_head_kv": 4, "splits": 1}


def test_bench_staging_on_a_wider_model(
    benchmark, real_ctx, worker_command, stubs, worker_env, tmp_path
) -> None:
    wide_dir = tmp_path / "wide"
    wide_dir.mkdir()
    (wide,) = tinymodel.generate(wide_dir, WIDE, "f32", tree=source.ensure_pristine(real_ctx).path)
    single = dataclasses.replace(worker_command, threads=1)
    ways = {"n_embd 256": single, "n_embd 768": dataclasses.replace(single, model=wide)}
    table = compare_ways(
        ways,
        rounds=ROUNDS,
        benchmark=benchmark,
        stubs=stubs,
        env=worker_env,
        evidence=tmp_path / "ev",
        own_monolithic=True,
    )
    table.publish(
        "width",
        f"token-only ring, 1 thread per worker, loopback; the wide model "
        f"{wide.stat().st_size / 2**20:.0f} MiB",
        benchmark,
    )
