"""Issue 20 item 16 on the real worker: an architecture whose graph the patch stack does not stage.

Upstream's other graph builders (qwen2, phi3, mistral3, ...) run every layer and record no per-layer
input, so a capture request used to abort the worker in llama-graph (GGML_ASSERT, SIGABRT): any client
could kill it. The worker now refuses the capture with FAILED_PRECONDITION naming the architecture and
stays up; a layer range of such a model was already refused at load by 0001, and stays so.

The models: tiny-llama relabelled as qwen2 in place (both names have five letters, so every key keeps
its length: qwen2's loader takes llama's tensor names and its q/k/v biases are optional), and upstream's
own fixture of each architecture the issue found aborting (qwen2, phi3, mistral3, gemma2, granite,
starcoder2, mamba2, falcon-h1).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from core.errors import RuntimeFailure
from fetch import source
from fetch.tinygguf import import_gguf
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
def unstaged_command(request, real_ctx, worker_command, tiny_model, tmp_path_factory):
    """A model of an architecture the stack does not stage: tiny-llama relabelled as qwen2 in place, or
    the tree's own fixture of each architecture."""
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


def test_a_capture_is_refused_and_the_worker_stays_up(unstaged_command, stubs, worker_env, tmp_path) -> None:
    arch, n_layer = _shape(unstaged_command)
    with launch(
        unstaged_command,
        [(0, n_layer)],
        stubs=stubs,
        evidence=tmp_path / "ev",
        env=worker_env,
        call_deadline=60,
    ) as p:
        client = p.clients[0]
        assert client.info().architecture == arch
        prompt = PROMPT
        with pytest.raises(StageFailed, match="FAILED_PRECONDITION") as caught:
            client.forward("s", 1, list(range(len(prompt))), tokens=prompt, capture_layers=[1])
        print(f"\n[architectures] capture on {arch}: {caught.value}")
        text = str(caught.value)
        assert f"architecture {arch}:" in text and "llama, gemma3, deepseek4" in text
        assert client.health()[0] is True
        out = client.forward("s", 1, list(range(len(prompt))), tokens=prompt)  # whole-model runs still do
        assert out.logits is not None


def test_a_layer_range_is_refused_at_start(unstaged_command, stubs, worker_env, tmp_path) -> None:
    arch, n_layer = _shape(unstaged_command)
    with pytest.raises(RuntimeFailure) as caught:
        with launch(
            unstaged_command,
            [(0, 1), (1, n_layer)],
            stubs=stubs,
            evidence=tmp_path / "ev",
            env=worker_env,
            start_timeout=120,
        ):
            pass
    text = f"{caught.value.one_line()} {caught.value.hint or ''}"
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "ev").rglob("*.log"))
    print(f"\n[architectures] staged {arch}: {caught.value.one_line()}")
    assert f"architecture {arch} does not support loading a layer range" in text + logs, text + logs[-2000:]
