"""What the bring-your-own-GGUF tests share: small llama files with real layer tensors (built byte by byte
with ggufmaker, split as llama-gguf-split lays a set out), and `dgr` run in-process with a private
workspace and user manifests folder."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.unit.ggufmaker import I32, STRING, U16, U32, gguf_bytes, kv

N_EMBD = 64
LAYER = (("attn_norm.weight", N_EMBD), ("attn_q.weight", N_EMBD * N_EMBD), ("ffn_up.weight", N_EMBD * 96))


def tensors(n_layer: int) -> list[tuple[str, int]]:
    """A llama's tensors in the order converters write them: embedding, layers, norm, head."""
    names = [("token_embd.weight", N_EMBD * 32)]
    names += [(f"blk.{i}.{name}", size) for i in range(n_layer) for name, size in LAYER]
    return [*names, ("output_norm.weight", N_EMBD), ("output.weight", N_EMBD * 32)]


def llama(
    n_layer: int, *, split: int = 1, arch: str = "llama", tokenizer: str = "llama", seed: int = 0
) -> list[bytes]:
    """The files of one model: ``arch`` with ``n_layer`` blocks over ``split`` files."""
    all_tensors = tensors(n_layer)
    per_file = -(-len(all_tensors) // split)
    files = []
    for i in range(split):
        kvs = []
        if i == 0:
            kvs += [
                kv("general.architecture", STRING, arch),
                kv(f"{arch}.block_count", U32, n_layer),
                kv(f"{arch}.embedding_length", U32, N_EMBD),
                kv("general.file_type", U32, 0),
                kv("tokenizer.ggml.model", STRING, tokenizer),
            ]
        if split > 1:
            kvs += [kv("split.no", U16, i), kv("split.count", U16, split)]
            kvs += [kv("split.tensors.count", I32, len(all_tensors))]
        files.append(gguf_bytes(kvs, all_tensors[i * per_file : (i + 1) * per_file], seed=seed + i))
    return files


def write_model(folder: Path, blobs: Sequence[bytes], names: Sequence[str] | None = None) -> list[Path]:
    """The files into ``folder``, named as llama-gguf-split names them unless ``names`` says otherwise."""
    folder.mkdir(parents=True, exist_ok=True)
    n = len(blobs)
    names = names or ([f"model-{i + 1:05d}-of-{n:05d}.gguf" for i in range(n)] if n > 1 else ["model.gguf"])
    for name, blob in zip(names, blobs, strict=True):
        (folder / name).write_bytes(blob)
    return [folder / name for name in names]


@dataclass(frozen=True)
class Dgr:
    """`dgr` in this process, its environment private to the test."""

    tmp: Path
    monkeypatch: pytest.MonkeyPatch
    capsys: pytest.CaptureFixture[str]

    @property
    def manifests(self) -> Path:
        return self.tmp / "user-manifests"

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def __call__(self, *argv: str) -> tuple[int, str, list[str]]:
        """The exit code, stdout and stderr's lines (progress bars left out)."""
        from cli.main import main

        self.capsys.readouterr()
        rc = main(list(argv))
        out = self.capsys.readouterr()
        err = [ln for ln in out.err.splitlines() if ln.strip() and not ln.startswith(("seal ", "fetch "))]
        return rc, out.out, err


def dgr(tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Dgr:
    """A private workspace, cache and user manifests folder; no recipes folder, store or key of the
    caller's."""
    for key in [k for k in os.environ if k.startswith("DGR_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("DGR_WORK", str(tmp / "work"))
    monkeypatch.setenv("DGR_CACHE", str(tmp / "cache"))
    made = Dgr(tmp, monkeypatch, capsys)
    monkeypatch.setenv("DGR_MANIFESTS_DIR", str(made.manifests))
    return made
