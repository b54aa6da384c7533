"""The synthetic DeepSeek-V4 (``deepseek4``): tiny dims, the real architecture, written as split GGUF files.

CI cannot hold V4 Flash (about 160 GiB), so the V4 data path is certified on this model instead. It has
every tensor and metadata key the pinned loader requires for ``deepseek4`` (``src/models/deepseek4.cpp``
``load_arch_hparams``/``load_arch_tensors``): hyper-connections (``hc_mult`` 4 copies of the residual,
Sinkhorn-mixed), the first ``hash_layer_count`` layers routed by a token-id -> expert table
(``ffn_gate_tid2eid``), the others by score + bias, routed + shared experts, grouped low-rank output
projection, and a per-layer compression ratio (0: sliding window only; 4: compressed KV + lightning
indexer; 128: heavily compressed KV).

MTP (``mtp: 1``; the default 0 writes no nextn block and leaves ``nextn_predict_layers`` out, so
tiny-v4's bytes are what they always were): one nextn block after the main layers, as the pinned loader
reads it, ``block_count`` = n_layer + 1, ``nextn_predict_layers`` = 1, the per-layer arrays
(``compress_ratios``, the SwiGLU clamps) one entry longer, and tensors ``blk.<n_layer>.*``: a full block
(score-routed: the pinned graph_mtp refuses a hash-routed one) plus ``nextn.{eh_proj,enorm,hnorm}`` and
``nextn.embed_tokens``, a bitwise copy of ``token_embd`` (DeepSeek's MTP module shares the main
embedding): with it the last stage of a pipeline, which holds no ``token_embd``, runs the block without
loading the stage-0 embedding (docs/mtp.md). The block's compression ratio must be 0: the pinned MTP
context keeps a plain sliding-window KV cache (``llama_kv_cache_iswa``), and its attention asserts
``inp_dsv4 || ratio == 0`` (``build_attention_impl``), so a ratio-4 or -128 nextn block would abort at
graph build. The MTP tensors are written after every main one, so the main layers draw the same weights
in the same order: a model with MTP holds tiny-v4's main tensors bitwise (only the split boundaries move).

Set ``tiny-v4`` (``manifests/artifacts/tiny-v4.json``) names this generator through the ``tinymodel``
origin with ``architecture: deepseek4`` (``fetch.tinymodel.generate`` dispatches here). Determinism is
tiny-llama's: PCG64 raw stream -> float64 -> one float32 rounding, norms exactly 1, the pinned gguf-py
writer (insertion order, no time/host/path), the tokenizer copied from the pinned tree's vocab file.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from core.errors import ConfigurationError
from fetch.mtp_file import write_mtp_only
from fetch.tinygguf import Weights, copy_tokenizer, import_gguf, split_names, write_splits

ARCH = "deepseek4"
HC_MULT = 4  # the pinned graph asserts hc == 4 (build_hc_pre)
DEFAULTS: dict[str, Any] = {
    "architecture": ARCH,
    "seed": 20260408,
    "n_layer": 12,
    "n_embd": 64,
    "n_head": 4,
    # != indexer_head_dim, as in V4 (512 vs 128): the pinned KV cache Hadamard-rotates a deepseek4 cache
    # whose head size equals the indexer's, so equal sizes would rotate the main attention cache too
    "head_dim": 256,
    "rope_dim": 64,
    "q_lora_rank": 32,
    "o_groups": 2,
    "o_lora_rank": 16,
    "n_expert": 8,
    "n_expert_used": 2,
    "n_expert_shared": 1,
    "n_ff_exp": 32,
    "hash_layer_count": 3,
    # per layer: 0 = sliding window only, 4 = compressed KV + lightning indexer, 128 = heavy compression
    "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 0],
    # 32 x 128: the smallest shape ggml-cuda's fused lightning indexer runs (V4 Flash: 64 x 128); fewer,
    # narrower heads give exact ties in the top-k (relu of negative dot products is exactly 0)
    "indexer_n_head": 32,
    "indexer_head_dim": 128,
    "indexer_top_k": 4,
    "sliding_window": 16,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "expert_weights_scale": 1.5,
    "swiglu_clamp": 10.0,
    "n_ctx": 512,
    "splits": 3,
    "init_std": 0.05,
    # Score-routed layers: the selection bias (exp_probs_b) of n_expert_used experts per layer, drawn at
    # random, is raised by this much, so the router's top-k margin (last chosen vs first left out) is
    # about this minus the spread of the scores (~0.4), not the razor-thin gap of random scores: an f16
    # seam's rounding (2^-11) or another backend's reduction order cannot flip a selection.
    "router_bias_boost": 1.0,
    "rms_eps": 1e-6,
    "rope_freq_base": 10000.0,
    "compress_rope_freq_base": 160000.0,
    "vocab": "models/ggml-vocab-llama-spm.gguf",
    "name": "dgr-tiny-v4",
    "ftype": "f32",
    # nextn (MTP) blocks after the main layers: 0 (tiny-v4) or 1 (tiny-v4-mtp); compress_ratios then
    # holds n_layer + mtp entries, the nextn block's 0
    "mtp": 0,
    # true: write only the nextn block as the pinned converter's --mtp does for V4 Flash (fetch.mtp_file):
    # one file, mtp-tiny-v4-VARIANT.gguf, with tensors copied from the whole model (needs mtp 1, splits 1)
    "mtp_only": False,
}
FTYPES = {"f32": 0}


def file_names(params: Mapping[str, Any], variant: str) -> list[str]:
    return split_names(_stem({**DEFAULTS, **params}, variant), int({**DEFAULTS, **params}["splits"]))


def _stem(p: Mapping[str, Any], variant: str) -> str:
    """``tiny-v4-VARIANT``, ``tiny-v4-mtp-VARIANT`` for a model with a nextn block, or the converter's
    ``mtp-tiny-v4-VARIANT`` for that block alone."""
    if p["mtp_only"]:
        return f"mtp-tiny-v4-{variant}"
    return f"tiny-v4-mtp-{variant}" if int(p["mtp"]) else f"tiny-v4-{variant}"


def _check(p: Mapping[str, Any]) -> None:
    unknown = sorted(set(p) - set(DEFAULTS))
    if unknown:
        raise ConfigurationError(f"tinymodel_v4: unknown parameter(s) {', '.join(unknown)}")
    if str(p["ftype"]) not in FTYPES:
        raise ConfigurationError(f"tinymodel_v4: ftype {p['ftype']!r} is not one of {', '.join(FTYPES)}")
    n_layer, mtp = int(p["n_layer"]), int(p["mtp"])
    if mtp not in (0, 1):
        raise ConfigurationError(
            f"tinymodel_v4: mtp is 0 or 1 (one nextn block, as the pinned loader reads it), not {p['mtp']!r}"
        )
    ratios = [int(r) for r in p["compress_ratios"]]
    if len(ratios) != n_layer + mtp or any(r not in (0, 4, 128) for r in ratios):
        raise ConfigurationError(
            "tinymodel_v4: compress_ratios needs one of 0, 4, 128 per layer (n_layer + mtp entries)"
        )
    if mtp and ratios[n_layer] != 0:
        raise ConfigurationError(
            "tinymodel_v4: the nextn block's compress ratio must be 0 (the pinned MTP context keeps only "
            "a sliding-window KV cache)"
        )
    if p["mtp_only"] and (mtp != 1 or int(p["splits"]) != 1):
        raise ConfigurationError(
            "tinymodel_v4: mtp_only writes one nextn block as one file (mtp 1, splits 1)"
        )
    if not 0 < int(p["hash_layer_count"]) < n_layer:
        raise ConfigurationError("tinymodel_v4: hash_layer_count must leave score-routed layers after it")
    if int(p["n_head"]) % int(p["o_groups"]) or int(p["rope_dim"]) > int(p["head_dim"]):
        raise ConfigurationError("tinymodel_v4: n_head must divide by o_groups and rope_dim fit head_dim")


def _tensor_count(p: Mapping[str, Any]) -> int:
    n = 1 + 2 + 3  # token_embd; output_norm, output; output_hc_{fn,base,scale}
    for ratio in (int(r) for r in p["compress_ratios"]):  # the main layers and the nextn block
        # attention 9, hyper-connections 6, MoE 9 (router, hash table or bias, norm, 3 routed, 3 shared)
        n += 9 + 6 + 9 + (4 if ratio else 0) + (6 if ratio == 4 else 0)
    return n + len(NEXTN) * int(p["mtp"])


def generate(out_dir: Path, params: Mapping[str, Any], variant: str, *, tree: Path) -> list[Path]:
    """Write the variant's split files into ``out_dir``; returns their paths in split order."""
    p = {**DEFAULTS, **params}
    _check(p)  # before touching the tree: a bad manifest is named as such
    if p["mtp_only"]:
        return [_generate_mtp_only(out_dir, p, variant, tree)]
    gguf = import_gguf(tree)
    d = _dims(p)
    splits = int(p["splits"])
    per_file = -(-_tensor_count(p) // splits)
    w = gguf.GGUFWriter(
        out_dir / f"{_stem(p, variant)}.gguf", ARCH, split_max_tensors=per_file if splits > 1 else 0
    )
    n_vocab = _add_metadata(gguf, w, p, d, tree)
    tensors = _Tensors(w, Weights(int(p["seed"])), float(p["init_std"]))
    token_embd = _add_output_tensors(tensors, d, n_vocab)
    for i, ratio in enumerate(d.ratios):  # the main layers, then the nextn block (after every main tensor)
        _add_block_tensors(tensors, d, i, ratio, n_vocab, float(p["router_bias_boost"]))
        if i >= d.n_layer:
            _add_nextn_tensors(tensors, d, i, token_embd)
    return write_splits(w, out_dir, file_names(p, variant), "tinymodel_v4")


def _generate_mtp_only(out_dir: Path, p: Mapping[str, Any], variant: str, tree: Path) -> Path:
    """The converter's --mtp file of this model: the whole model, block included, is written to a
    scratch folder inside ``out_dir`` (gone on return), and the file is cut from it (fetch.mtp_file),
    so its tensors are the whole model's bitwise."""
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".whole-") as scratch:
        whole = generate(Path(scratch), {**p, "mtp_only": False}, variant, tree=tree)
        return write_mtp_only(import_gguf(tree), whole, out_dir / file_names(p, variant)[0])


class _Dims(NamedTuple):
    n_layer: int  # main layers; the nextn block, if any, is layer n_layer (block_count n_layer + 1)
    n_embd: int
    n_head: int
    hd: int
    n_rot: int
    n_expert: int
    n_used: int
    n_shared: int
    n_ff: int
    q_rank: int
    o_groups: int
    o_rank: int
    ix_heads: int
    ix_dim: int
    hash_layers: int
    ratios: list[int]  # one per block: the main layers', then the nextn block's
    n_block: int  # block_count: n_layer + mtp


def _dims(p: Mapping[str, Any]) -> _Dims:
    """The model's sizes, read once from the checked parameters before the writer exists."""
    n_layer, n_embd, n_head, hd, n_rot = (
        int(p[k]) for k in ("n_layer", "n_embd", "n_head", "head_dim", "rope_dim")
    )
    n_expert, n_used, n_shared, n_ff = (
        int(p[k]) for k in ("n_expert", "n_expert_used", "n_expert_shared", "n_ff_exp")
    )
    q_rank, o_groups, o_rank = int(p["q_lora_rank"]), int(p["o_groups"]), int(p["o_lora_rank"])
    ix_heads, ix_dim = int(p["indexer_n_head"]), int(p["indexer_head_dim"])
    hash_layers = int(p["hash_layer_count"])
    ratios = [int(r) for r in p["compress_ratios"]]
    return _Dims(
        n_layer,
        n_embd,
        n_head,
        hd,
        n_rot,
        n_expert,
        n_used,
        n_shared,
        n_ff,
        q_rank,
        o_groups,
        o_rank,
        ix_heads,
        ix_dim,
        hash_layers,
        ratios,
        n_layer + int(p["mtp"]),
    )


def _add_metadata(gguf: Any, w: Any, p: Mapping[str, Any], d: _Dims, tree: Path) -> int:
    """Every KV pair the pinned loader reads for ``deepseek4``, then the tokenizer's; returns n_vocab.
    The writer keeps insertion order, so this order is part of the sealed bytes."""
    _add_attention_kv(w, p, d)
    _add_expert_kv(gguf, w, p, d)
    _add_compression_kv(w, p, d)
    w.add_file_type(FTYPES[str(p["ftype"])])
    n_vocab = copy_tokenizer(gguf, w, tree / str(p["vocab"]))
    w.add_vocab_size(n_vocab)
    return n_vocab


def _add_attention_kv(w: Any, p: Mapping[str, Any], d: _Dims) -> None:
    """Name, sizes and the attention's hyperparameters (MQA, low-rank q, sliding window)."""
    w.add_name(str(p["name"]))
    w.add_context_length(int(p["n_ctx"]))
    w.add_embedding_length(d.n_embd)
    w.add_embedding_length_out(d.n_embd * HC_MULT)
    w.add_block_count(d.n_block)
    if d.n_block > d.n_layer:
        w.add_nextn_predict_layers(d.n_block - d.n_layer)
    w.add_head_count(d.n_head)
    w.add_head_count_kv(1)  # one shared KV head (MQA), as in V4
    w.add_key_length(d.hd)
    w.add_value_length(d.hd)
    w.add_rope_dimension_count(d.n_rot)
    w.add_rope_freq_base(float(p["rope_freq_base"]))
    w.add_layer_norm_rms_eps(float(p["rms_eps"]))
    w.add_q_lora_rank(d.q_rank)
    w.add_sliding_window(int(p["sliding_window"]))


def _add_expert_kv(gguf: Any, w: Any, p: Mapping[str, Any], d: _Dims) -> None:
    """The MoE's: routed and shared experts, their gating and SwiGLU clamps."""
    w.add_expert_count(d.n_expert)
    w.add_expert_used_count(d.n_used)
    w.add_expert_shared_count(d.n_shared)
    w.add_expert_feed_forward_length(d.n_ff)
    w.add_expert_weights_scale(float(p["expert_weights_scale"]))
    w.add_expert_weights_norm(True)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SQRTSOFTPLUS)
    w.add_swiglu_clamp_exp([float(p["swiglu_clamp"])] * d.n_block)
    w.add_swiglu_clamp_shexp([float(p["swiglu_clamp"])] * d.n_block)


def _add_compression_kv(w: Any, p: Mapping[str, Any], d: _Dims) -> None:
    """The lightning indexer, grouped output, KV compression, hyper-connections and hash routing."""
    w.add_indexer_head_count(d.ix_heads)
    w.add_indexer_key_length(d.ix_dim)
    w.add_indexer_top_k(int(p["indexer_top_k"]))
    w.add_attention_output_group_count(d.o_groups)
    w.add_attention_output_lora_rank(d.o_rank)
    w.add_attention_compress_ratios(d.ratios)
    w.add_attention_compress_rope_freq_base(float(p["compress_rope_freq_base"]))
    w.add_hyper_connection_count(HC_MULT)
    w.add_hyper_connection_sinkhorn_iterations(int(p["hc_sinkhorn_iters"]))
    w.add_hyper_connection_epsilon(float(p["hc_eps"]))
    w.add_hash_layer_count(d.hash_layers)


class _Tensors:
    """The writer and the one weight stream every tensor draws from, in file order (the sealed
    digests depend on that order: tensors are added by the helpers below exactly as listed)."""

    def __init__(self, w: Any, rng: Weights, std: float) -> None:
        self.w, self.rng, self.std = w, rng, std

    def add(self, name: str, shape: tuple[int, ...], *, norm: bool = False) -> np.ndarray:
        # numpy shape = ggml ne reversed
        data = np.ones(shape, dtype=np.float32) if norm else self.rng.uniform(shape, self.std)
        self.w.add_tensor(name, data)
        return data


def _add_output_tensors(t: _Tensors, d: _Dims, n_vocab: int) -> np.ndarray:
    """The embedding, the output head and the output hyper-connection (written first, as the converter
    does); returns the embedding (the nextn block's copy of it)."""
    token_embd = t.add("token_embd.weight", (n_vocab, d.n_embd))
    t.add("output_norm.weight", (d.n_embd,), norm=True)
    t.add("output.weight", (n_vocab, d.n_embd))
    t.add("output_hc_fn.weight", (HC_MULT, HC_MULT * d.n_embd))
    t.add("output_hc_base.weight", (HC_MULT,))
    t.add("output_hc_scale.weight", (1,))
    return token_embd


NEXTN = ("eh_proj", "enorm", "hnorm", "embed_tokens")  # the nextn tensors after the block's own


def _add_nextn_tensors(t: _Tensors, d: _Dims, i: int, token_embd: np.ndarray) -> None:
    """What makes block ``i`` the nextn block: the projection of [embedding norm, hidden norm] (ggml ne
    {2 n_embd, n_embd}), the two norms, and the block's own embedding, a copy of ``token_embd`` (no
    draw: the weight stream is the same whether or not it is written). No ``shared_head_{head,norm}``:
    the block uses the main output head and norm, which its stage holds."""
    b = f"blk.{i}.nextn"
    t.add(f"{b}.eh_proj.weight", (d.n_embd, 2 * d.n_embd))
    t.add(f"{b}.enorm.weight", (d.n_embd,), norm=True)
    t.add(f"{b}.hnorm.weight", (d.n_embd,), norm=True)
    t.w.add_tensor(f"{b}.embed_tokens.weight", token_embd.copy())


def _add_block_tensors(t: _Tensors, d: _Dims, i: int, ratio: int, n_vocab: int, boost: float) -> None:
    """Layer ``i``: attention, hyper-connections, the compressor and indexer its ratio calls for, MoE."""
    b = f"blk.{i}"
    _add_attention_tensors(t, d, b)
    hc_dim, hc_mix = HC_MULT * d.n_embd, (2 + HC_MULT) * HC_MULT
    for part in ("attn", "ffn"):
        t.add(f"{b}.hc_{part}_fn.weight", (hc_mix, hc_dim))
        t.add(f"{b}.hc_{part}_base.weight", (hc_mix,))
        t.add(f"{b}.hc_{part}_scale.weight", (3,))
    if ratio:
        coff = 2 if ratio == 4 else 1
        t.add(f"{b}.attn_compressor_kv.weight", (coff * d.hd, d.n_embd))
        t.add(f"{b}.attn_compressor_gate.weight", (coff * d.hd, d.n_embd))
        t.add(f"{b}.attn_compressor_ape.weight", (ratio, coff * d.hd))
        t.add(f"{b}.attn_compressor_norm.weight", (d.hd,), norm=True)
    if ratio == 4:
        _add_indexer_tensors(t, d, b, ratio)
    _add_moe_tensors(t, d, b, i, n_vocab, boost)


def _add_attention_tensors(t: _Tensors, d: _Dims, b: str) -> None:
    """Low-rank q, the shared KV head and the grouped low-rank output projection."""
    n_embd, n_head, hd, q_rank = d.n_embd, d.n_head, d.hd, d.q_rank
    t.add(f"{b}.attn_norm.weight", (n_embd,), norm=True)
    t.add(f"{b}.attn_sinks.weight", (n_head,))
    t.add(f"{b}.attn_q_a.weight", (q_rank, n_embd))
    t.add(f"{b}.attn_q_a_norm.weight", (q_rank,), norm=True)
    t.add(f"{b}.attn_q_b.weight", (n_head * hd, q_rank))
    t.add(f"{b}.attn_kv.weight", (hd, n_embd))
    t.add(f"{b}.attn_kv_a_norm.weight", (hd,), norm=True)
    t.add(
        f"{b}.attn_output_a.weight", (d.o_rank * d.o_groups, n_head * hd // d.o_groups)
    )  # file layout of the converter
    t.add(f"{b}.attn_output_b.weight", (n_embd, d.o_groups * d.o_rank))


def _add_indexer_tensors(t: _Tensors, d: _Dims, b: str, ratio: int) -> None:
    """The lightning indexer of a ratio-4 layer and its own compressor."""
    ix_heads, ix_dim = d.ix_heads, d.ix_dim
    t.add(f"{b}.indexer.proj.weight", (ix_heads, d.n_embd))
    t.add(f"{b}.indexer.attn_q_b.weight", (ix_heads * ix_dim, d.q_rank))
    t.add(f"{b}.indexer_compressor_kv.weight", (2 * ix_dim, d.n_embd))
    t.add(f"{b}.indexer_compressor_gate.weight", (2 * ix_dim, d.n_embd))
    t.add(f"{b}.indexer_compressor_ape.weight", (ratio, 2 * ix_dim))
    t.add(f"{b}.indexer_compressor_norm.weight", (ix_dim,), norm=True)


def _add_moe_tensors(t: _Tensors, d: _Dims, b: str, i: int, n_vocab: int, boost: float) -> None:
    """The router (a token-id table in the first ``hash_layers`` layers, a selection bias after),
    routed and shared experts."""
    n_embd, n_expert, n_ff, n_shared = d.n_embd, d.n_expert, d.n_ff, d.n_shared
    t.add(f"{b}.ffn_gate_inp.weight", (n_expert, n_embd))
    if i < d.hash_layers:
        t.w.add_tensor(f"{b}.ffn_gate_tid2eid.weight", _hash_table(t.rng, n_vocab, n_expert, d.n_used))
    else:
        t.w.add_tensor(f"{b}.exp_probs_b.bias", _selection_bias(t.rng, n_expert, d.n_used, t.std, boost))
    t.add(f"{b}.ffn_norm.weight", (n_embd,), norm=True)
    t.add(f"{b}.ffn_gate_exps.weight", (n_expert, n_ff, n_embd))
    t.add(f"{b}.ffn_down_exps.weight", (n_expert, n_embd, n_ff))
    t.add(f"{b}.ffn_up_exps.weight", (n_expert, n_ff, n_embd))
    t.add(f"{b}.ffn_gate_shexp.weight", (n_ff * n_shared, n_embd))
    t.add(f"{b}.ffn_down_shexp.weight", (n_embd, n_ff * n_shared))
    t.add(f"{b}.ffn_up_shexp.weight", (n_ff * n_shared, n_embd))


def _selection_bias(rng: Weights, n_expert: int, n_used: int, std: float, boost: float) -> np.ndarray:
    """F32 [n_expert]: small random biases, ``boost`` added to ``n_used`` experts drawn at random."""
    bias = rng.uniform((n_expert,), std)
    keys = rng.bits.random_raw(n_expert).astype(np.uint64)
    favoured = np.argsort(keys, kind="stable")[:n_used]
    bias[favoured] += np.float32(boost)
    return bias


def _hash_table(rng: Weights, n_vocab: int, n_expert: int, n_used: int) -> np.ndarray:
    """token id -> ``n_used`` distinct experts (I32 [n_vocab, n_used]): a random permutation's head."""
    keys = rng.bits.random_raw(n_vocab * n_expert).astype(np.uint64).reshape(n_vocab, n_expert)
    order = np.argsort(keys, axis=1, kind="stable")
    return np.ascontiguousarray(order[:, :n_used].astype(np.int32))
