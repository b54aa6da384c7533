"""The embedded default model: a deterministic synthetic dense llama, written as three split GGUF files.

Set ``tiny-llama`` (``manifests/artifacts/tiny-llama.json``) holds both variants, ``f32`` and ``q8_0``;
a recipe names ``artifacts: tiny-llama`` and ``variant: f32`` (or ``q8_0``).  The set's ``generated``
origin carries the shared parameters, each variant adds its ``ftype``.

Byte-for-byte determinism (so the sealed digests hold on every machine):
- weights come from PCG64's *raw* 64-bit stream (bit generators are stable across numpy versions,
  distribution methods are not), mapped to uniform floats in [-a, a) with a = std * sqrt(3) using plain
  IEEE float64 arithmetic, then rounded once to float32; norms are exactly 1;
- q8_0 uses the pinned tree's gguf-py quantizer; the writer is the pinned gguf-py, which writes KV
  pairs and tensors in insertion order and stamps no time, host or path into the file;
- the tokenizer KV pairs are copied, in file order, from the pinned tree's vocab file.
Layout follows llama-gguf-split: ``<name>-0000k-of-0000n.gguf``, ``split.no``/``split.count``/
``split.tensors.count`` in every file, all other metadata in the first file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from core.errors import ConfigurationError
from fetch.tinygguf import Weights, copy_tokenizer, import_gguf, split_names, write_splits

DEFAULTS: dict[str, Any] = {
    "architecture": "llama",
    "seed": 20260101,
    "n_layer": 12,
    "n_embd": 256,
    "n_head": 8,
    "n_head_kv": 4,
    "n_ff": 768,
    "n_ctx": 512,
    "splits": 3,
    "init_std": 0.02,
    "rms_eps": 1e-5,
    "rope_freq_base": 10000.0,
    "vocab": "models/ggml-vocab-llama-spm.gguf",
    "name": "dgr-tiny-llama",
    "ftype": "f32",
    "weight_scales": False,
    "file_stem": "tiny-llama",  # the split files' names: <file_stem>-<variant>-0000K-of-0000N.gguf
}
FTYPES = {"f32": 0, "q8_0": 7}  # llama_ftype: ALL_F32, MOSTLY_Q8_0
# With ``weight_scales``: per-layer tensors llama.cpp's generic pass loads as per-tensor scales
# (NVFP4 checkpoints carry them).  The weight scales multiply the matmul's result, so they change the
# logits; the input scale is loaded but unused by a dense f32 graph.  Powers of two keep it exact.
SCALES = {"attn_q.scale": 0.5, "ffn_down.scale": 2.0, "attn_q.input_scale": 1.0}


def file_names(params: Mapping[str, Any], variant: str) -> list[str]:
    p = {**DEFAULTS, **params}
    return split_names(f"{p['file_stem']}-{variant}", int(p["splits"]))


def selects_top_k(params: Mapping[str, Any]) -> bool:
    """Whether the generated model's graph selects by top-k (DeepSeek V4's indexer and router), whose
    conditioning sealing measures. An MTP-only file is not a model that runs by itself (no trunk): the
    trunk's selections are measured on its own set, and the block's on the set that holds it whole."""
    return params.get("architecture", "llama") == "deepseek4" and not params.get("mtp_only", False)


def generate(out_dir: Path, params: Mapping[str, Any], variant: str, *, tree: Path) -> list[Path]:
    """Write the variant's split files into ``out_dir`` (which must exist and be empty of them)."""
    if params.get("architecture", "llama") == "deepseek4":
        from fetch import tinymodel_v4  # the synthetic DeepSeek-V4 shares this origin kind

        return tinymodel_v4.generate(out_dir, params, variant, tree=tree)
    gguf = import_gguf(tree)
    p = _checked(params)
    dims = _dims(p)
    writer = _open_writer(gguf, out_dir, p, dims, variant)
    n_vocab = _add_metadata(gguf, writer, p, dims, tree)
    _add_tensors(gguf, writer, p, dims, n_vocab)
    return write_splits(writer, out_dir, file_names(p, variant), "tinymodel")


def _checked(params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters over the defaults; an unknown name or ftype is the manifest's error, named."""
    p = {**DEFAULTS, **params}
    unknown = sorted(set(p) - set(DEFAULTS))
    if unknown:
        raise ConfigurationError(f"tinymodel: unknown parameter(s) {', '.join(unknown)}")
    ftype = str(p["ftype"])
    if ftype not in FTYPES:
        raise ConfigurationError(f"tinymodel: ftype {ftype!r} is not one of {', '.join(FTYPES)}")
    return p


class _Dims(NamedTuple):
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    head_dim: int


def _dims(p: Mapping[str, Any]) -> _Dims:
    """The model's sizes, read once from the parameters before the writer exists (a bad one fails
    first, as it always did)."""
    n_layer, n_embd, n_head, n_head_kv, n_ff = (
        int(p[k]) for k in ("n_layer", "n_embd", "n_head", "n_head_kv", "n_ff")
    )
    return _Dims(n_layer, n_embd, n_head, n_head_kv, n_ff, head_dim=n_embd // n_head)


def _open_writer(gguf: Any, out_dir: Path, p: Mapping[str, Any], dims: _Dims, variant: str) -> Any:
    """The pinned gguf-py writer, splitting the tensors evenly over ``splits`` files as
    llama-gguf-split does (token_embd, 9 per layer, output_norm and output)."""
    n_tensors = 1 + (9 + (len(SCALES) if p["weight_scales"] else 0)) * dims.n_layer + 2
    splits = int(p["splits"])
    per_file = -(-n_tensors // splits)
    return gguf.GGUFWriter(
        out_dir / f"{p['file_stem']}-{variant}.gguf", "llama", split_max_tensors=per_file if splits > 1 else 0
    )


def _add_metadata(gguf: Any, writer: Any, p: Mapping[str, Any], dims: _Dims, tree: Path) -> int:
    """The llama KV pairs, then the tokenizer's copied from the pinned vocab file; returns n_vocab.
    The writer keeps insertion order, so this order is part of the sealed bytes."""
    ftype = str(p["ftype"])
    writer.add_name(str(p["name"]))
    writer.add_context_length(int(p["n_ctx"]))
    writer.add_embedding_length(dims.n_embd)
    writer.add_block_count(dims.n_layer)
    writer.add_feed_forward_length(dims.n_ff)
    writer.add_head_count(dims.n_head)
    writer.add_head_count_kv(dims.n_head_kv)
    writer.add_rope_dimension_count(dims.head_dim)
    writer.add_rope_freq_base(float(p["rope_freq_base"]))
    writer.add_layer_norm_rms_eps(float(p["rms_eps"]))
    writer.add_file_type(FTYPES[ftype])
    if ftype != "f32":
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    n_vocab = copy_tokenizer(gguf, writer, tree / str(p["vocab"]))
    writer.add_vocab_size(n_vocab)
    return n_vocab


def _add_tensors(gguf: Any, writer: Any, p: Mapping[str, Any], dims: _Dims, n_vocab: int) -> None:
    """Every tensor in file order, weights drawn from one stream in that order (the sealed digests
    depend on it); norms are ones, and q8_0 quantizes all but the norms."""
    n_layer, n_embd, n_ff = dims.n_layer, dims.n_embd, dims.n_ff
    ftype = str(p["ftype"])
    rng = Weights(int(p["seed"]))
    std = float(p["init_std"])
    q8 = gguf.GGMLQuantizationType.Q8_0

    def add(name: str, shape: tuple[int, ...], *, norm: bool = False) -> None:
        data = np.ones(shape, dtype=np.float32) if norm else rng.uniform(shape, std)
        if ftype == "q8_0" and not norm:
            writer.add_tensor(name, gguf.quants.quantize(data, q8), raw_dtype=q8)
        else:
            writer.add_tensor(name, data)

    add("token_embd.weight", (n_vocab, n_embd))
    kv_dim = dims.head_dim * dims.n_head_kv
    for i in range(n_layer):
        add(f"blk.{i}.attn_norm.weight", (n_embd,), norm=True)
        add(f"blk.{i}.attn_q.weight", (n_embd, n_embd))
        add(f"blk.{i}.attn_k.weight", (kv_dim, n_embd))
        add(f"blk.{i}.attn_v.weight", (kv_dim, n_embd))
        add(f"blk.{i}.attn_output.weight", (n_embd, n_embd))
        add(f"blk.{i}.ffn_norm.weight", (n_embd,), norm=True)
        add(f"blk.{i}.ffn_gate.weight", (n_ff, n_embd))
        add(f"blk.{i}.ffn_up.weight", (n_ff, n_embd))
        add(f"blk.{i}.ffn_down.weight", (n_embd, n_ff))
        if p["weight_scales"]:
            for suffix, value in SCALES.items():
                writer.add_tensor(f"blk.{i}.{suffix}", np.full((1,), value, dtype=np.float32))
    add("output_norm.weight", (n_embd,), norm=True)
    add("output.weight", (n_vocab, n_embd))
