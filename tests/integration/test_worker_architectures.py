"""Architectures no patch names, on the real worker: staged by 0002's stage cut (issue 44).

Issue 20 item 16 found upstream's other graph builders (qwen2, phi3, mistral3, ...) aborting the
worker on a capture (they recorded no per-layer input), and 0001 refused their layer ranges at load.
The stage cut records each layer's input as the previous layer's named output, so these architectures
now load a layer range, split bitwise, and capture the residual entering a layer after the first.
The first layer's input only the builders that record it have (llama, deepseek4): a capture of it
elsewhere is refused with FAILED_PRECONDITION, and the worker stays up.

The models: tiny-llama relabelled as qwen2 in place (both names have five letters, so every key keeps
its length: qwen2's loader takes llama's tensor names and its q/k/v biases are optional), and upstream's
own fixture of each architecture the issue found aborting (qwen2, phi3, mistral3, gemma2, granite,
starcoder2, mamba2, falcon-h1). Every architecture the fixtures generate: `dgr roster`.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from fetch import source
from fetch.tinygguf import import_gguf
from pipeline import drive
from worker.client import StageFailed
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _relabel_as_qwen2(files: list[Path], dest: Path, tree: Path) -> Path:
    gguf = import_gguf(tree)
    dest.mkdir()
    copies = [Path(shutil.copy(f, dest / f.name)) for f in files]
    for path in copies:
        path.chmod(0o644)  # store files are published read-only
        reader = gguf.GGUFReader(path, "r+")
        for name, field in reader.fields.items():
            if name.startswith("llama."):
                field.parts[1][:5] = memoryview(b"qwen2")  # the key's bytes, memory-mapped read-write
            if name == "general.architecture":
                assert bytes(field.parts[-1]) == b"llama"
                field.parts[-1][:] = memoryview(b"qwen2")
        reader.data.flush()
        del reader
    return copies[0]


# The architectures issue 20 item 16 found aborting on a capture, as upstream's own fixture generator
# writes them (tests/integration/arch_fixtures.py: 2 layers, every optional tensor of the architecture).
FIXTURE_ARCHS = ("qwen2", "phi3", "mistral3", "gemma2", "granite", "starcoder2", "mamba2", "falcon-h1")


@pytest.fixture(scope="module", params=["qwen2-relabelled", *FIXTURE_ARCHS])
def generic_command(request, real_ctx, worker_command, tiny_model, tmp_path_factory):
    """A model of an architecture no patch names: tiny-llama relabelled as qwen2 in place, or the tree's
    own fixture of each architecture."""
    if request.param != "qwen2-relabelled":
        from tests.integration import arch_fixtures

        generator = request.getfixturevalue("arch_generator")
        models = arch_fixtures.generate(generator, request.param, tmp_path_factory.mktemp(request.param))
        return dataclasses.replace(worker_command, model=models["dense"], ctx_size=256)
    tree = source.ensure_pristine(real_ctx).path
    first = _relabel_as_qwen2(list(tiny_model.files), tmp_path_factory.mktemp("qwen2") / "m", tree)
    return dataclasses.replace(worker_command, model=first)


PROMPT = [1, 5, 9, 17, 33]  # token ids: the tree's fixture has a 128-token vocabulary and no tokenizer


def _shape(command) -> tuple[str, int]:
    """The model's architecture and block count, from its GGUF header."""
    from fetch.gguf_header import read_header

    header = read_header(command.model)
    return str(header.architecture), int(header.arch_value("block_count"))


def _run(command, placement, stubs, env, evidence, capture=()):
    with launch(command, placement, stubs=stubs, evidence=evidence, env=env, call_deadline=60) as p:
        return drive.run_placement(p.clients, [PROMPT], 4, capture=capture).prompts[0]


def test_a_split_is_bitwise_and_its_boundary_the_captured_input(generic_command, stubs, worker_env, tmp_path):
    arch, n_layer = _shape(generic_command)
    mono = _run(generic_command, [(0, n_layer)], stubs, worker_env, tmp_path / "mono", capture=[1])
    staged = _run(generic_command, [(0, 1), (1, n_layer)], stubs, worker_env, tmp_path / "staged")
    print(f"\n[architectures] {arch}: split at 1 of {n_layer}, greedy {list(staged.tokens)}")
    assert np.array_equal(mono.logits, staged.logits) and mono.tokens == staged.tokens
    assert np.array_equal(mono.captures[1], staged.boundaries[1])


def test_a_first_layer_capture_is_refused_and_the_worker_lives(generic_command, stubs, worker_env, tmp_path):
    arch, n_layer = _shape(generic_command)
    with launch(
        generic_command,
        [(0, n_layer)],
        stubs=stubs,
        evidence=tmp_path / "ev",
        env=worker_env,
        call_deadline=60,
    ) as p:
        client = p.clients[0]
        assert client.info().architecture == arch
        with pytest.raises(StageFailed, match="FAILED_PRECONDITION") as caught:
            client.forward("s", 1, list(range(len(PROMPT))), tokens=PROMPT, capture_layers=[0])
        print(f"\n[architectures] capture of layer 0 on {arch}: {caught.value}")
        text = str(caught.value)
        assert (
            f"capture of layer 0 is not supported for architecture {arch}:" in text
            and "llama, deepseek4" in text
        )
        assert client.health()[0] is True
        out = client.forward("s", 1, list(range(len(PROMPT))), tokens=PROMPT, capture_layers=[1])
        assert out.logits is not None


def test_a_stage_whose_layers_read_the_embedding_is_refused_by_name(
    arch_generator, worker_command, stubs, worker_env, tmp_path
) -> None:
    """The side-band the cut must not miss: talkie adds the (normed) token embedding to every layer's
    output, so a later stage would need it next to the boundary. Without it the stage is refused,
    naming the embedding its layers read, where computing on would give other logits silently (0002
    once fed a later stage's boundary to such a read); the monolithic model still runs."""
    from tests.integration import arch_fixtures

    models = arch_fixtures.generate(arch_generator, "talkie", tmp_path / "talkie")
    command = dataclasses.replace(worker_command, model=models["dense"], ctx_size=256)
    arch, n_layer = _shape(command)
    assert _run(command, [(0, n_layer)], stubs, worker_env, tmp_path / "mono").logits.size > 0
    with pytest.raises(StageFailed) as caught:
        _run(command, [(0, 1), (1, n_layer)], stubs, worker_env, tmp_path / "staged")
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "staged").rglob("*.log"))
    said = f"layers [1, {n_layer}) of {arch} read inp_embd (first stage only), which this stage does not hold"
    print(f"\n[architectures] staged {arch}: {caught.value}")
    assert said in str(caught.value) + logs, (str(caught.value), logs[-2000:])
