"""Vulkan lane on Mesa's lavapipe: build (with the provisioned Debian 13 headers), then a real
cross-backend parity run of Vulkan workers against the CPU monolithic reference.

The full signed certificate comes from the README command (`dgr certify --recipe tiny-llama --lane
vulkan` with VK_ICD_FILENAMES on lavapipe); on a 2-core CI box that takes longer than a CI run can
give it beside the rest, so this test runs the recipe's own vulkan-software parity gates on the
monolithic placement, the middle cut, a three-stage cut (with the route change) and the f16 seam, with
one speed repetition of a few tokens and no concurrency runs, and checks that the workers really ran on
lavapipe and that the Vulkan monolithic worker captured the residual at every cut (patch 0006).
The recipe's prompts and greedy length stay whole: the f16 seam's top-1 limit is a fraction of rows,
and fewer rows would make one near-tie flip fail it. With the two gates this is the longest test here
(about 11 minutes of measurement on a quiet 2-core box, plus the lane's build in a fresh clone), so it
has its own timeout.

Skips (naming the packages) only when the machine has no glslc, no Vulkan loader or no lavapipe.
"""

from __future__ import annotations

import dataclasses
import os
import types
from pathlib import Path

import pytest

from core.context import Context
from lanes import vulkan
from lanes.base import Status

pytestmark = pytest.mark.slow

LVP_ICDS = ("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json", "/usr/share/vulkan/icd.d/lvp_icd.aarch64.json")
PLACEMENTS = ("mono", "two-middle", "three-first-middle", "two-middle-f16")


@pytest.fixture(scope="module")
def lavapipe_ctx(real_ctx: Context) -> Context:
    icd = next((p for p in LVP_ICDS if Path(p).is_file()), None)
    if icd is None:
        pytest.skip("no lavapipe here: apt-get install mesa-vulkan-drivers")
    found = vulkan.probe(real_ctx.env)
    if found.status is Status.MISSING and found.tool in ("glslc", "vulkan loader"):
        pytest.skip(f"{found.reason}")
    env = {k: v for k, v in real_ctx.env.items() if k not in ("VK_DRIVER_FILES", "GGML_VK_VISIBLE_DEVICES")}
    env["VK_ICD_FILENAMES"] = icd
    return Context(env=env, workspace=real_ctx.workspace)


@pytest.mark.timeout(2400)
def test_vulkan_workers_on_lavapipe_match_the_cpu_reference(lavapipe_ctx: Context) -> None:
    from certify import hardware, measure
    from certify.run import ctx_size, prepare
    from certify.verdict import Status as Verdict
    from lanes.runtime import lane_device, worker_environment
    from manifests import recipe_model as recipes
    from worker.launcher import WorkerCommand
    from worker.stubs import load as load_stubs

    ctx = lavapipe_ctx
    full = recipes.load("tiny-llama", ctx.env)
    recipe = dataclasses.replace(
        full,
        placements=types.MappingProxyType({k: v for k, v in full.placements.items() if k in PLACEMENTS}),
        # Speed is not what this test checks: one repetition of 4 prompt and 4 decoded tokens, no
        # concurrency (the recipe's 32 + 32 tokens made the speed runs a third of the lavapipe time).
        measure=dataclasses.replace(
            full.measure, warmup=1, repetitions=1, prompt_tokens=4, decode_tokens=4, concurrency=()
        ),
    )
    fp = hardware.fingerprint(ctx.env)
    hc = recipe.hardware_class("vulkan", int(fp["cpu_cores"]), hardware.gpu_names(fp))
    assert hc.name == "vulkan-software" and hc.agreement_for("vulkan") is not None
    prepared = prepare(ctx, recipe, "vulkan", store=None, need_cpu_reference=True)
    build = prepared.identity["build"]
    assert int(build["toolchain"]["versions"]["vulkan_headers"]) >= vulkan.MINIMUM_HEADER
    evidence = ctx.workspace.ensure(ctx.workspace.runs / f"test-vulkan-{os.getpid()}")
    size = ctx_size(recipe)

    def command(program: tuple[str, ...], lane: str) -> WorkerCommand:
        return WorkerCommand(program=program, model=prepared.model, threads=2, ctx_size=size, lane=lane)

    env = {**ctx.env, **worker_environment("vulkan", ctx.env)}
    assert env["GGML_VK_VISIBLE_DEVICES"] == "0"
    assert prepared.reference_worker is not None  # need_cpu_reference
    plan = measure.Plan(
        recipe=recipe,
        lane="vulkan",
        hardware_class=hc,
        worker=command(prepared.worker, "vulkan"),
        reference_worker=command(prepared.reference_worker, "cpu"),
        stubs=load_stubs(ctx.workspace),
        evidence=evidence,
        env=env,
        start_timeout=300,
        call_deadline=300,
    )
    out = measure.run(plan)
    device = lane_device("vulkan", out.figures["placements"])
    assert device is not None and device["software_rasterizer"] is True
    assert any("llvmpipe" in d for d in device["devices"])
    parity = [
        r
        for r in out.results
        if r.name.startswith(("staging-parity/", "backend-agreement/", "route-change/"))
    ]
    staged = [p for p in PLACEMENTS if p != "mono"]
    expected = {f"staging-parity/{p}" for p in staged} | {"backend-agreement/vulkan-vs-cpu"}
    assert {r.name for r in parity} >= expected
    failed = [f"{r.name}: {r.reason}" for r in parity if r.status is not Verdict.PASS]
    assert not failed, failed
    # Issue 42: the Vulkan monolithic worker captures the residual at every cut itself (layer-input
    # captures crashed lavapipe before patch 0006), and every seam is held to that capture.
    (lane_mono,) = [p for p in out.figures["placements"] if p["role"] == "reference"]
    assert lane_mono["lane"] == "vulkan" and "residuals_from" not in lane_mono
    for p in out.figures["placements"]:
        if p["role"] == "under test":
            assert {f"boundary_nmse@{c}" for c in p["cuts"]} <= set(p["parity"]), p["name"]
    for p in out.figures["placements"]:
        if p["role"] == "under test":
            fig = p["parity"]
            print(
                f"\nstaging {p['name']}: top1 {fig['top1_agreement']:.4f} kl_mean {fig['kl_mean']:.2e} "
                f"kl_max {fig['kl_max']:.2e} nmse {fig['logits_nmse']:.2e} "
                f"greedy {fig['greedy_match']:.3f} bitwise {fig['bitwise_logits']} "
                + " ".join(f"boundary@{c} {fig[f'boundary_nmse@{c}']:.2e}" for c in p["cuts"])
            )
    ba = out.figures["backend_agreement"]
    print(
        f"\nagreement: top1(clear) {ba['top1_agreement_clear']:.4f} of {ba['clear_rows']}/"
        f"{ba['rows_compared']} rows, kl_mean {ba['kl_mean']:.2e} kl_max {ba['kl_max']:.2e} "
        f"nmse {ba['logits_nmse']:.2e} "
        f"max|dlogit| {ba['max_abs_logit_diff']:.2e} free greedy {ba['free_running_greedy_match']:.3f}"
    )
