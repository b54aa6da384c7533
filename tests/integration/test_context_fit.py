"""Issue 41: a stage that cannot hold the context it is asked for refuses at start, in one line naming
its layers, the bytes it needs and the bytes it has (worker/src/memory_fit.cpp), instead of allocating
on the kernel's overcommit and dying mid-certification; the stages that fit start as before."""

from __future__ import annotations

import dataclasses
import re

import pytest

from worker.client import StageFailed
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

HUGE = 1 << 24  # the most --ctx takes: 16,777,216 positions, about 100 GB of tiny-llama's KV


def test_a_stage_that_cannot_hold_the_context_refuses_at_start(
    worker_command, stubs, worker_env, tmp_path
) -> None:
    command = dataclasses.replace(worker_command, ctx_size=HUGE, threads=1)
    with pytest.raises(StageFailed) as failed:
        with launch(command, [(0, 6), (6, 12)], stubs=stubs, evidence=tmp_path / "ev", env=worker_env):
            pass
    message = str(failed.value)
    found = re.search(
        r"layers (\d+):(\d+) cannot hold a context of 16777216 positions: it needs (\d+) bytes of "
        r"host memory \(KV (\d+), compute (\d+)\), which has (\d+) bytes free",
        message,
    )
    assert found, message
    begin, end, need, kv, compute, have = (int(g) for g in found.groups())
    assert (begin, end) in (
        (0, 6),
        (6, 12),
    ) and f"stage {0 if begin == 0 else 1} (layers {begin}:{end})" in message
    assert need == kv + compute > have > 0
    # six of twelve layers at 16M positions: the KV alone is past any host this suite runs on
    assert kv > 32 << 30


@pytest.mark.parametrize("load", [None, "mmap"])
def test_a_stage_that_fits_starts_as_before(worker_command, stubs, worker_env, tmp_path, load) -> None:
    """Mapped weights too: llama cannot simulate a mapped load (it asserted, and every --load mmap worker
    died at start until the simulation read the weights in instead)."""
    command = dataclasses.replace(worker_command, ctx_size=4608, threads=1, load=load)
    with launch(command, [(0, 6), (6, 12)], stubs=stubs, evidence=tmp_path / "ev", env=worker_env) as p:
        infos = [c.info() for c in p.clients]
    assert [i.n_ctx for i in infos] == [4608, 4608] and all(i.memory.kv_bytes > 0 for i in infos)
    assert {i.memory.load_mode for i in infos} == {load or "none"}
