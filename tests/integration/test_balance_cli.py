"""`dgr balance` as a user runs it, on the embedded tiny model (provisioned, then its headers read), and
the bytes it says a stage holds against what the worker's loader holds."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from fetch.gguf_header import read_header
from fetch.provision import provision
from manifests import recipe_model
from pipeline.balance import held_bytes
from tests.integration.dgr_cli import run_dgr, user_env
from worker.launcher import launch

pytestmark = pytest.mark.slow


def test_balance_prints_the_recipes_balanced_cut_beside_the_even_one(tiny_model) -> None:
    done = run_dgr(user_env(), "balance", "--stages", "4")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("balance: tiny-llama (f32), 12 layers into 4 stages")
    # the head and one layer; the first stage holds the whole embedding but reads one row of it
    assert lines[4] == "  stage 3: layers [11, 12), 35.9 MB a token (51%), holds 35.9 MB"
    assert lines[1] == "  stage 0: layers [0, 3), 9.4 MB a token (13%), holds 42.2 MB"
    assert "(the even cut [[0, 3], [3, 6], [6, 9], [9, 12]]: 42.2 MB a token (60%))" in lines[5]
    assert lines[6] == "most held by a stage: 42.2 MB of weights, before its KV cache (the even cut: 42.2 MB)"
    stages = json.loads("{" + lines[-1] + "}")["stages"]
    recipe = recipe_model.load("tiny-llama")
    assert [tuple(s) for s in stages] == list(recipe.placements["four-balanced-ring"].stages)


@pytest.mark.parametrize(
    "stages,why",
    [
        ("13", "cannot cut 12 layers into 13 non-empty stages"),
        ("0", "invalid number of stages (>= 1) value: '0'"),
    ],
)
def test_balance_refuses_a_cut_it_cannot_make_in_one_line(tiny_model, stages: str, why: str) -> None:
    done = run_dgr(user_env(), "balance", "--stages", stages)
    assert done.returncode == 2
    assert why in done.stderr.strip().splitlines()[-1]


def test_under_fit_no_stage_holds_more_and_a_limit_no_cut_meets_is_one_line(tiny_model) -> None:
    done = run_dgr(user_env(), "balance", "--stages", "4", "--fit", "40MB")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith(", each holding at most 40.0 MB")
    held = [float(line.rsplit("holds ", 1)[1].removesuffix(" MB")) for line in lines[1:5]]
    assert max(held) <= 40.0 and held[0] == 39.1  # the first stage gives up a layer to fit
    assert json.loads("{" + lines[-1] + "}")["stages"] == [[0, 2], [2, 6], [6, 11], [11, 12]]
    refused = run_dgr(user_env(), "balance", "--stages", "4", "--fit", "30MB")
    assert refused.returncode == 2
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "no cut of 12 layers into 4 stages has each stage hold at most 30.0 MB: "
            "the least any cut needs is 35.9 MB"
        )
    )
    bad = run_dgr(user_env(), "balance", "--stages", "4", "--fit", "lots")
    assert bad.returncode == 2 and "invalid size" in bad.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "recipe,placement",
    [
        ("tiny-llama", [(0, 3), (3, 11), (11, 12)]),
        ("tiny-v4", [(0, 1), (1, 3), (3, 12)]),
        ("tiny-v4-mtp", [(0, 3), (3, 12)]),
        ("tiny-v4-mtp-file", [(0, 3), (3, 12)]),
    ],
)
def test_the_bytes_a_stage_holds_are_what_the_workers_loader_holds(
    real_ctx, worker_command, stubs, worker_env, tmp_path: Path, recipe: str, placement
) -> None:
    """pipeline.balance's held bytes against llama_model_size() of each stage's own load (Info's
    weight_bytes): the first stage with the whole embedding, the last with the head and the output
    tensors (V4's hyper-connection ones too), every expert of a V4 layer, and with MTP the nextn
    block of the set (--mtp) or the whole MTP-only file the last stage loads beside (--mtp-model)."""
    spec = recipe_model.load(recipe)
    files = provision(real_ctx, spec.artifacts, variant=spec.variant).files
    mtp_set = getattr(spec.mtp, "artifacts", None)
    mtp_files = provision(real_ctx, mtp_set, variant=spec.mtp.variant).files if mtp_set else []
    held = held_bytes(
        [read_header(Path(f)) for f in files],
        mtp=bool(spec.mtp),
        mtp_file=[read_header(Path(f)) for f in mtp_files],
    )
    command = dataclasses.replace(
        worker_command,
        model=Path(files[0]),
        ctx_size=256,
        mtp=bool(spec.mtp),
        mtp_model=Path(mtp_files[0]) if mtp_files else None,
    )
    with launch(command, placement, stubs=stubs, evidence=tmp_path / "ev", env=worker_env) as pipeline:
        loaded = [client.info().memory.weight_bytes for client in pipeline.clients]
    assert loaded == [held.stage(start, end) for start, end in placement]
