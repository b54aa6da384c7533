"""Issue 20 item 17 on the real worker: a llama whose layers carry per-tensor scale tensors.

llama.cpp's generic pass asks for a layer's ``*.scale`` / ``*.input_scale`` only when that layer's
weight was loaded.  With 0001 skipping the weights of layers outside a stage's range, those scales were
never asked for, never counted, and both stages of a split failed in done_getting_tensors ("wrong number
of tensors").  0001 now accounts for every file tensor of an unowned layer.

The model is the tiny-llama generator's ``weight_scales`` variant (4 layers, one split file): the weight
scales are powers of two that change the logits, so a stage that dropped its own scales would not match.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from core.errors import RuntimeFailure
from fetch import source, tinymodel
from fetch.tinygguf import import_gguf
from pipeline import drive
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

N_LAYER = 4
PARAMS = {
    "n_layer": N_LAYER,
    "n_embd": 64,
    "n_head": 4,
    "n_head_kv": 2,
    "n_ff": 128,
    "n_ctx": 256,
    "splits": 1,
}
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Once upon a time"]
N_DECODE = 8


def _generate(tree: Path, out: Path, *, scales: bool) -> Path:
    out.mkdir()
    [first] = tinymodel.generate(out, {**PARAMS, "weight_scales": scales}, "f32", tree=tree)
    return first


@pytest.fixture(scope="module")
def tree(real_ctx) -> Path:
    return source.ensure_pristine(real_ctx).path


@pytest.fixture(scope="module")
def scaled(tree, tmp_path_factory) -> Path:
    return _generate(tree, tmp_path_factory.mktemp("scaled") / "m", scales=True)


def _run(command, placement, stubs, env, evidence: Path) -> drive.Trace:
    with launch(command, placement, stubs=stubs, evidence=evidence, env=env) as p:
        prompts = [p.clients[0].tokenize(t, add_special=True) for t in TEXTS]
        return drive.run_placement(p.clients, prompts, N_DECODE)


def test_the_model_carries_scale_tensors(scaled, tree) -> None:
    reader = import_gguf(tree).GGUFReader(scaled)
    names = {t.name for t in reader.tensors}
    for suffix in tinymodel.SCALES:
        assert {f"blk.{i}.{suffix}" for i in range(N_LAYER)} <= names


def test_a_split_of_a_scaled_llama_equals_the_whole(
    scaled, tree, worker_command, stubs, worker_env, tmp_path
) -> None:
    command = dataclasses.replace(worker_command, model=scaled, ctx_size=256)
    mono = _run(command, [(0, N_LAYER)], stubs, worker_env, tmp_path / "mono")
    staged = _run(command, [(0, 1), (1, 3), (3, N_LAYER)], stubs, worker_env, tmp_path / "staged")
    for m, s in zip(mono.prompts, staged.prompts, strict=True):
        assert np.array_equal(m.logits, s.logits), float(np.abs(m.logits - s.logits).max())
        assert m.tokens == s.tokens
    # The scales are in the computation: the same weights without them give other logits.
    plain = dataclasses.replace(command, model=_generate(tree, tmp_path / "plain", scales=False))
    unscaled = _run(plain, [(0, N_LAYER)], stubs, worker_env, tmp_path / "unscaled")
    assert not np.array_equal(unscaled.prompts[0].logits, mono.prompts[0].logits)


def _rename_tensor(path: Path, tree: Path, old: str, new: str) -> None:
    """Rename a tensor in place (same length, so no offset moves): the loader then never asks for it."""
    assert len(old) == len(new)
    reader = import_gguf(tree).GGUFReader(path, "r+")
    [tensor] = [t for t in reader.tensors if t.name == old]
    tensor.field.parts[1][:] = np.frombuffer(new.encode(), dtype=np.uint8)
    reader.data.flush()
    del reader


def test_an_unasked_tensor_fails_every_stage_as_it_fails_the_whole_model(
    scaled, tree, worker_command, stubs, worker_env, tmp_path
) -> None:
    """A stray tensor no loader asks for is an error on every stage, whether or not it owns the
    tensor's layer: a stage asks for the tensors of the layers it does not own too (as placeholders),
    so it checks the file as the whole model's load does; the worker's line names the range."""
    odd = tmp_path / "odd.gguf"
    odd.write_bytes(scaled.read_bytes())
    _rename_tensor(odd, tree, "blk.3.attn_q.scale", "blk.3.attn_q.scalf")
    command = dataclasses.replace(worker_command, model=odd, ctx_size=256)
    for placement in ([(0, N_LAYER)], [(0, 2), (2, N_LAYER)]):
        evidence = tmp_path / f"ev-{len(placement)}"
        with pytest.raises(RuntimeFailure) as caught:
            _run(command, placement, stubs, worker_env, evidence)
        logs = "".join(p.read_text(errors="replace") for p in evidence.rglob("*.log"))
        text = f"{caught.value.one_line()} {caught.value.hint or ''} {logs}"
        assert "wrong number of tensors" in text and re.search(r"failed to load layers \d+:\w+ of", text), (
            text[-2000:]
        )


# Token ids, not text: the tree's fixtures carry a 128-token vocabulary and no tokenizer.
FIXTURE_PROMPTS = [[1, 5, 9, 17, 33, 2], [3, 4, 100, 7]]


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_the_tree_fixture_generators_llamas_split(
    kind, arch_generator, tree, worker_command, stubs, worker_env, tmp_path
) -> None:
    """The file the failure was found with: upstream's own llama fixture (2 layers, every optional
    scale, rope_freqs shared by both layers).  Before the fix: "expected 64, got 50" on both stages."""
    from tests.integration import arch_fixtures

    model = arch_fixtures.generate(arch_generator, "llama", tmp_path / "m")[kind]
    names = {t.name for t in import_gguf(tree).GGUFReader(model).tensors}
    assert {"blk.1.attn_q.scale", "blk.1.attn_q.input_scale", "rope_freqs.weight"} <= names
    command = dataclasses.replace(worker_command, model=model, ctx_size=256)
    traces = []
    for placement in ([(0, 2)], [(0, 1), (1, 2)]):
        with launch(
            command, placement, stubs=stubs, evidence=tmp_path / f"ev{len(placement)}", env=worker_env
        ) as p:
            traces.append(drive.run_placement(p.clients, FIXTURE_PROMPTS, N_DECODE))
    mono, staged = traces
    for m, s in zip(mono.prompts, staged.prompts, strict=True):
        assert np.array_equal(m.logits, s.logits), float(np.abs(m.logits - s.logits).max())
        assert m.tokens == s.tokens
