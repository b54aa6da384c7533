"""The sealed tiny-v4-mtp set (tiny-v4 plus one nextn block, fetch/tinymodel_v4.py ``mtp: 1``) on the
CPU lane: provisioned (regenerated and held to its sealed digests), its main tensors bitwise tiny-v4's,
the shard worker with MTP off computing exactly tiny-v4 on whole and staged placements, and the last
stage of a staged run loading the nextn block and running an MTP context on it.

The last test compiles tests/integration/mtp_last_stage.cpp against the lane's libraries (as
arch_fixtures does the tree's fixture generator): two stages [0, cut) and [cut, 12), the last with
``load_mtp``, and its ``LLAMA_CONTEXT_TYPE_MTP`` context, against the whole model with MTP in one
process; the probe checks bitwise equality itself and prints its figures.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fetch import source
from fetch.provision import provision
from fetch.tinygguf import import_gguf
from pipeline import drive
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Pipeline stages hand the residual on."]
N_DECODE = 12
PLACEMENTS = {"monolithic": [(0, 12)], "3-stages": [(0, 4), (4, 8), (8, 12)]}
PROBE = Path(__file__).with_name("mtp_last_stage.cpp")


@pytest.fixture(scope="module")
def sets(real_ctx) -> dict[str, Path]:
    """Both sets provisioned: generated into staging and verified against their sealed digests."""
    return {name: Path(provision(real_ctx, name).first) for name in ("tiny-v4", "tiny-v4-mtp")}


def _tensors(first: Path, gguf) -> dict[str, np.ndarray]:
    out = {}
    for path in sorted(first.parent.glob(first.name.replace("00001-of", "*-of"))):
        for t in gguf.GGUFReader(path).tensors:
            out[t.name] = np.array(t.data)
    return out


def test_the_mtp_set_holds_tiny_v4s_tensors_and_the_nextn_block(real_ctx, sets) -> None:
    gguf = import_gguf(source.ensure_pristine(real_ctx).path)
    v4, mtp = _tensors(sets["tiny-v4"], gguf), _tensors(sets["tiny-v4-mtp"], gguf)
    assert len(v4) == 360 and len(mtp) == 388
    assert all(name in mtp and mtp[name].tobytes() == data.tobytes() for name, data in v4.items())
    extra = sorted(set(mtp) - set(v4))
    assert all(name.startswith("blk.12.") for name in extra) and len(extra) == 28
    assert mtp["blk.12.nextn.embed_tokens.weight"].tobytes() == v4["token_embd.weight"].tobytes()


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_workers_with_mtp_off_compute_tiny_v4(
    sets, placement, worker_command, stubs, worker_env, tmp_path
) -> None:
    traces = {}
    for name, model in sets.items():
        command = dataclasses.replace(worker_command, model=model, ctx_size=256)
        evidence = tmp_path / name
        with launch(command, PLACEMENTS[placement], stubs=stubs, evidence=evidence, env=worker_env) as p:
            prompts = [p.clients[0].tokenize(t, add_special=True) for t in TEXTS]
            traces[name] = drive.run_placement(p.clients, prompts, N_DECODE)
    for a, b in zip(traces["tiny-v4"].prompts, traces["tiny-v4-mtp"].prompts, strict=True):
        assert a.tokens == b.tokens
        assert a.logits.shape == b.logits.shape and a.logits.tobytes() == b.logits.tobytes()
        assert a.boundaries.keys() == b.boundaries.keys()
        assert all(a.boundaries[c].tobytes() == b.boundaries[c].tobytes() for c in a.boundaries)
    infos = {name: t.infos for name, t in traces.items()}
    for a, b in zip(infos["tiny-v4"], infos["tiny-v4-mtp"], strict=True):
        assert (a.n_layer, a.n_vocab) == (b.n_layer, b.n_vocab) and a.n_layer == 12
        assert a.memory.kv_bytes == b.memory.kv_bytes  # the main KV keeps no cells for the nextn layer
    weights = {name: [i.memory.weight_bytes for i in infos[name]] for name in infos}
    print(
        f"{placement}: {len(TEXTS)} prompts x {N_DECODE} tokens, tiny-v4-mtp (MTP off) == tiny-v4 bitwise; "
        f"weight bytes per stage {weights['tiny-v4-mtp']} vs {weights['tiny-v4']}"
    )
    if len(infos["tiny-v4"]) > 1:
        # a stage counts the tensors it holds; a whole model (no range) reports its file's tensors, the
        # skipped nextn block included (llama_model_size of an unranged model: the loader's total)
        assert weights["tiny-v4-mtp"] == weights["tiny-v4"]


# libllama and ggml only (the probe uses no common code), each archive before the ones it uses
LIBS = ("src/libllama.a", "ggml/src/libggml.a", "ggml/src/libggml-cpu.a", "ggml/src/libggml-base.a")


@pytest.fixture(scope="session")  # test_mtp_workers.py uses it too: compiled once
def mtp_probe(real_ctx, cpu_build, tmp_path_factory) -> Path:
    """The probe, compiled with the lane's compiler and OpenMP flags against its static libraries and
    the patched tree's headers (llama-ext.h for the nextn embeddings)."""
    from patches.stack import ensure_patched

    tree = ensure_patched(real_ctx).path
    cache = (cpu_build.dir / "CMakeCache.txt").read_text()
    setting = dict(re.findall(r"^(CMAKE_CXX_COMPILER|OpenMP_CXX_FLAGS):[A-Z]+=(.*)$", cache, re.M))
    libs = [cpu_build.dir / "llama" / lib for lib in LIBS]
    assert all(lib.is_file() for lib in libs), f"the CPU lane build changed shape: {libs}"
    out = tmp_path_factory.mktemp("mtp") / "mtp-last-stage"
    argv = [
        setting.get("CMAKE_CXX_COMPILER") or "c++",
        "-std=c++17",
        "-O1",
        *setting.get("OpenMP_CXX_FLAGS", "").split(),
        *(f"-I{tree / d}" for d in ("include", "src", "ggml/include")),
        str(PROBE),
        "-o",
        str(out),
        *map(str, libs),
        "-lpthread",
        "-ldl",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"building {PROBE.name} failed:\n{done.stderr[-3000:]}"
    return out


@pytest.mark.parametrize("cut", [8, 2])  # 2: the last stage starts in the hash-routed layers (token sideband)
def test_the_last_stage_runs_the_nextn_block(sets, mtp_probe, cut) -> None:
    threads = os.environ.get("DGR_TEST_THREADS", "2")
    done = subprocess.run(
        [
            str(mtp_probe),
            "-m",
            str(sets["tiny-v4-mtp"]),
            "-c",
            str(cut),
            "-n",
            "8",
            "-t",
            threads,
            "-p",
            TEXTS[0],
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.rstrip().endswith("OK"), (done.stdout, done.stderr[-3000:])
    figures = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    print(f"\n[mtp last stage, cut {cut}] " + "; ".join(f"{k} {v}" for k, v in figures.items()))
    n_vocab, n_embd = 32000, 64
    # the block brings its own embed_tokens: the last stage holds no token_embd (the two stages hold the
    # whole model's bytes, not a second embedding: f32 here, so at least n_vocab x n_embd x 4 bytes more)
    assert figures["n_layer_nextn last"] == "1"
    held = int(figures["first stage bytes"]) + int(figures["last stage bytes without mtp"])
    assert held - int(figures["whole bytes without mtp"]) < n_vocab * n_embd * 4
    assert int(figures["drafts"]) == 8
    for key in (
        "main logits staged - whole",
        "h_nextn staged - whole",
        "mtp logits staged - whole",
        "main logits mtp on - off",
    ):
        assert float(figures[f"max |{key}|"]) == 0.0
    # the block on the last stage: its layer, eh_proj, the norms and the embedding copy (f32)
    extra = int(figures["last stage bytes with mtp"]) - int(figures["last stage bytes without mtp"])
    assert extra > n_vocab * n_embd * 4 + 2 * n_embd * n_embd * 4
