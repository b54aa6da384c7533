"""Issue 41: the kv-at-depth gate catches a stage whose KV at depth is wrong, on a real worker built wrong.

The worker here is built from the patched tree with one line of 0003 (patches/0003-layer-filtered-kv.patch)
taken out: the DeepSeek V4 compressor state (``llama_dsv4_comp_state``, one of the caches 0003 filters)
is allocated for every layer, owned or not.  Built as any lane build is (lanes.build.build_tree, a key
of its own; with ccache only the edited file compiles).  Its stages compute the same logits, so no parity
gate can see the fault; the gate must, naming the stages and what each holds, while the correct build's
stages add up to the monolithic worker's exactly."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from certify import depth
from certify.verdict import Status
from core.canonical import canonical_digest
from lanes import base
from lanes.build import WORKER, Tree, build_tree
from manifests.recipe_model import Depth, Placement
from pipeline import drive
from tests.integration.conftest import THREADS
from worker.launcher import WorkerCommand, launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

FILTER = "        if (!hparams.owns_layer(il)) {\n            continue;\n        }\n"
FILE = "src/llama-kv-cache-dsv4.cpp"
CONTEXT = 1536
SCENARIO = Depth(context=CONTEXT, prompt_tokens=(1024,), ubatch=256, decode_tokens=8, seed=7)
SPLIT = Placement(name="split", stages=((0, 11), (11, 12)))


def _unfiltered_tree(ctx) -> Tree:
    """The patched tree with the compressor state's layer filter removed (hard links but for that file),
    beside the real one so ccache sees the same relative paths."""
    from patches.stack import ensure_patched

    patched = ensure_patched(ctx)
    copy = patched.path.with_name(f"{patched.path.name}-unfiltered-comp-state")
    if not copy.is_dir():
        tmp = copy.with_name(copy.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(patched.path, tmp, copy_function=os.link, symlinks=True)
        text = (tmp / FILE).read_text()
        assert text.count(FILTER) == 1, "0003's compressor-state filter is not where this test expects it"
        (tmp / FILE).unlink()  # a new file, not the linked one
        (tmp / FILE).write_text(text.replace(FILTER, ""))
        tmp.rename(copy)
    digest = canonical_digest({"tree": patched.digest, "fault": "0003 comp-state filter removed"})
    return Tree(path=copy, digest=digest, provenance=patched.provenance)


@pytest.fixture(scope="module")
def unfiltered_worker(real_ctx, cpu_build) -> Path:
    lane = base.get("cpu")
    built = build_tree(
        real_ctx,
        lane,
        lane.probe(real_ctx.env),
        _unfiltered_tree(real_ctx),
        options=base.BuildOptions.from_env(real_ctx.env),
        project=WORKER,
        targets=("dgr-shard-worker",),
    )
    assert built.worker is not None and built.worker != cpu_build.worker
    return built.worker


def _infos(program: Path, model: Path, placement, stubs, env, evidence):
    cmd = WorkerCommand(
        program=(os.fspath(program),), model=model, threads=THREADS, ctx_size=CONTEXT, batch=256, lane="cpu"
    )
    with launch(cmd, placement, stubs=stubs, evidence=evidence, env=env) as p:
        return drive.describe(p.clients)


def test_a_stage_holding_state_for_layers_it_does_not_own_fails_the_kv_gate(
    unfiltered_worker, cpu_build, real_ctx, stubs, worker_env, tmp_path
) -> None:
    from fetch.provision import provision

    model = Path(provision(real_ctx, "tiny-v4").first)
    mono = _infos(cpu_build.worker, model, [(0, 12)], stubs, worker_env, tmp_path / "mono")
    right = _infos(cpu_build.worker, model, list(SPLIT.stages), stubs, worker_env, tmp_path / "right")
    wrong = _infos(unfiltered_worker, model, list(SPLIT.stages), stubs, worker_env, tmp_path / "wrong")

    held = {**depth.kv_figures(mono, right), "kv_bytes": depth.kv_bytes_of(right)}
    assert depth.kv_result(SPLIT, held, SCENARIO).status is Status.PASS
    faulty = {**depth.kv_figures(mono, wrong), "kv_bytes": depth.kv_bytes_of(wrong)}
    result = depth.kv_result(SPLIT, faulty, SCENARIO)
    assert result.status is Status.FAIL and faulty["kv_bytes_sum"] > faulty["kv_bytes_monolithic"]
    extra = [w - r for w, r in zip(depth.kv_bytes_of(wrong), depth.kv_bytes_of(right), strict=True)]
    assert [i.memory.kv_unread_bytes for i in right] == [0, 0]
    assert extra[1] > 0, "the one-layer stage holds state for the ten layers it does not own"
    assert f"stage 1 (layers 11:12) {depth.kv_bytes_of(wrong)[1]} bytes" in result.reason
    # the stage is named: the state it holds for layers it does not own is memory no node of its graph
    # reads (worker/src/memory_layers.h), and the stage that holds none is not named
    named = f"stage 1 (layers 11:12): {extra[1]} bytes allocated that none of its layers reads"
    assert result.reason.startswith(named), result.reason
    assert "stage 0 (layers 0:11):" not in result.reason
    assert wrong[1].memory.kv_bytes_by_layer == {11: mono[0].memory.kv_bytes_by_layer[11]}
    assert f"at a context of {CONTEXT}" in result.reason
    print(f"\nkv-at-depth on the unfiltered build: {result.reason} (extra bytes per stage {extra})")
