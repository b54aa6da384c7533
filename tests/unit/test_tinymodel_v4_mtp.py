"""The synthetic DeepSeek-V4's nextn (MTP) block, without a build or the pinned tree: the generator's
``mtp`` parameter (0 writes tiny-v4 exactly as before; 1 adds one nextn block after every main tensor,
the metadata the pinned loader reads for it), the sealed ``tiny-v4-mtp`` set against the generator and
against tiny-v4, and the parameters it refuses.

The generator runs for real here with a recording stand-in for the pinned gguf-py writer (and a small
vocabulary): what it asks the writer for, in order, is what the sealed bytes are made of. The bytes
themselves are held by tests/integration/test_tiny_v4_mtp_set.py (regenerated against the seal).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from core.errors import ConfigurationError
from fetch import tinymodel, tinymodel_v4
from manifests.artifact_sets import ARTIFACTS, load_set

N_VOCAB = 40


class _Writer:
    """Records every call the generator makes, in order: KV pairs as (method, args), tensors as
    ("tensor", name, array)."""

    def __init__(self, path: Path, arch: str, *, split_max_tensors: int) -> None:
        self.calls: list[tuple[Any, ...]] = [("open", path.name, arch, split_max_tensors)]
        _Writer.last = self

    def add_tensor(self, name: str, data: np.ndarray) -> None:
        self.calls.append(("tensor", name, np.array(data, copy=True)))

    def __getattr__(self, method: str):
        return lambda *args: self.calls.append((method, *args))


def _generate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **params: Any) -> list[tuple[Any, ...]]:
    gating = SimpleNamespace(SQRTSOFTPLUS="sqrtsoftplus")
    gguf = SimpleNamespace(GGUFWriter=_Writer, ExpertGatingFuncType=gating)
    monkeypatch.setattr(tinymodel_v4, "import_gguf", lambda tree: gguf)
    monkeypatch.setattr(tinymodel_v4, "copy_tokenizer", lambda g, w, vocab: N_VOCAB)
    monkeypatch.setattr(tinymodel_v4, "write_splits", lambda w, out, names, who: names)
    names = tinymodel.generate(tmp_path, {"architecture": "deepseek4", **params}, "f32", tree=tmp_path)
    calls = _Writer.last.calls
    assert names == tinymodel_v4.file_names(params, "f32")
    assert sum(c[0] == "tensor" for c in calls) == tinymodel_v4._tensor_count(
        {**tinymodel_v4.DEFAULTS, **params}
    )
    return calls


def _tensors(calls: list[tuple[Any, ...]]) -> list[tuple[str, np.ndarray]]:
    return [(c[1], c[2]) for c in calls if c[0] == "tensor"]


def _kv(calls: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [c for c in calls if c[0] not in ("tensor", "open")]


MTP = {"mtp": 1, "compress_ratios": [*tinymodel_v4.DEFAULTS["compress_ratios"], 0]}


def test_mtp_off_is_the_default_and_writes_no_nextn_block(monkeypatch, tmp_path) -> None:
    assert tinymodel_v4.DEFAULTS["mtp"] == 0
    calls = _generate(monkeypatch, tmp_path)
    assert calls[0][1] == "tiny-v4-f32.gguf"
    assert not any("nextn" in c[0] for c in _kv(calls))
    assert ("add_block_count", 12) in calls
    assert not any(name.startswith("blk.12.") for name, _ in _tensors(calls))


def test_the_nextn_block_follows_every_main_tensor_and_leaves_them_be(monkeypatch, tmp_path) -> None:
    off = _generate(monkeypatch, tmp_path)
    on = _generate(monkeypatch, tmp_path, **MTP)
    main, with_mtp = _tensors(off), _tensors(on)
    # the same weight stream in the same order: every main tensor first and bitwise the same
    assert [n for n, _ in with_mtp[: len(main)]] == [n for n, _ in main]
    pairs = zip(main, with_mtp[: len(main)], strict=True)
    assert all(np.array_equal(a, b) and a.dtype == b.dtype for (_, a), (_, b) in pairs)
    block = dict(with_mtp[len(main) :])
    assert all(name.startswith("blk.12.") for name in block)
    # a full score-routed block at ratio 0 (no compressor, no indexer, no hash table), then the nextn tensors
    assert "blk.12.exp_probs_b.bias" in block and "blk.12.ffn_gate_tid2eid.weight" not in block
    assert not any("compressor" in n or "indexer" in n for n in block)
    assert list(block)[-4:] == [f"blk.12.nextn.{t}.weight" for t in tinymodel_v4.NEXTN]
    n_embd = tinymodel_v4.DEFAULTS["n_embd"]
    assert block["blk.12.nextn.eh_proj.weight"].shape == (n_embd, 2 * n_embd)  # ggml ne {2 n_embd, n_embd}
    assert np.array_equal(block["blk.12.nextn.enorm.weight"], np.ones(n_embd, np.float32))
    # the block's own embedding is token_embd, bitwise (the last stage holds no token_embd)
    assert np.array_equal(block["blk.12.nextn.embed_tokens.weight"], dict(main)["token_embd.weight"])
    assert block["blk.12.nextn.embed_tokens.weight"].shape == (N_VOCAB, n_embd)


def test_the_nextn_metadata_is_what_the_pinned_loader_reads(monkeypatch, tmp_path) -> None:
    off, on = _kv(_generate(monkeypatch, tmp_path)), _kv(_generate(monkeypatch, tmp_path, **MTP))
    assert ("add_block_count", 13) in on and ("add_nextn_predict_layers", 1) in on
    on_arrays = {c[0]: c[1] for c in on if len(c) > 1 and isinstance(c[1], list)}
    assert all(len(v) == 13 for v in on_arrays.values()), on_arrays
    assert set(on_arrays) == {
        "add_swiglu_clamp_exp",
        "add_swiglu_clamp_shexp",
        "add_attention_compress_ratios",
    }
    assert on_arrays["add_attention_compress_ratios"][-1] == 0
    # the rest of the metadata, and its order, is tiny-v4's
    rest = [c for c in on if c[0] != "add_nextn_predict_layers"]
    assert [c[0] for c in rest] == [c[0] for c in off]
    differ = {c[0] for c, d in zip(rest, off, strict=True) if c != d}
    assert differ == {"add_block_count", *on_arrays}


def _sealed(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    doc = json.loads((ARTIFACTS / f"{name}.json").read_text())
    return {**doc["origins"][0]["parameters"], **doc["variants"]["f32"]["parameters"]}, doc["variants"]["f32"]


def test_the_sealed_mtp_set_is_tiny_v4_plus_the_block() -> None:
    v4, _ = _sealed("tiny-v4")
    mtp, variant = _sealed("tiny-v4-mtp")
    assert "mtp" not in v4  # tiny-v4's manifest predates the parameter: the default keeps its bytes
    assert mtp["mtp"] == 1 and mtp["compress_ratios"] == [*v4["compress_ratios"], 0]
    differ = {k for k in set(v4) | set(mtp) if v4.get(k) != mtp.get(k)}
    assert differ == {"mtp", "compress_ratios", "name"}  # same seed and shapes: the same main weights
    assert tinymodel_v4.file_names(mtp, "f32") == [f["name"] for f in variant["files"]]
    g = variant["gguf"]
    assert g["block_count"] == 13 and g["kv"]["deepseek4.nextn_predict_layers"] == 1
    n_tensors = tinymodel_v4._tensor_count({**tinymodel_v4.DEFAULTS, **mtp})
    assert sum(g["tensor_counts"]) == n_tensors == 360 + 24 + 4  # tiny-v4's, a ratio-0 block, 4 nextn
    assert all(len(f["sha256"]) == 64 and len(f["blake3"]) == 64 and f["size"] > 0 for f in variant["files"])
    assert load_set("tiny-v4-mtp").variant("f32").files  # it parses as a sealed set
    assert (
        tinymodel_v4._tensor_count({**tinymodel_v4.DEFAULTS, **v4})
        == sum(_sealed("tiny-v4")[1]["gguf"]["tensor_counts"])
        == 360
    )


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        ({"mtp": 2}, "mtp is 0 or 1"),
        ({"mtp": 1}, "n_layer \\+ mtp entries"),  # 12 ratios for 13 blocks
        ({"compress_ratios": [*tinymodel_v4.DEFAULTS["compress_ratios"], 0]}, "n_layer \\+ mtp entries"),
        ({"mtp": 1, "compress_ratios": [*tinymodel_v4.DEFAULTS["compress_ratios"], 4]}, "must be 0"),
        ({"mtp": 1, "compress_ratios": [*tinymodel_v4.DEFAULTS["compress_ratios"], 128]}, "must be 0"),
    ],
)
def test_the_generator_refuses_a_nextn_block_the_pinned_tree_cannot_run(tmp_path, change, expect) -> None:
    with pytest.raises(ConfigurationError, match=expect):
        tinymodel.generate(tmp_path, {"architecture": "deepseek4", **change}, "f32", tree=tmp_path / "none")
    assert list(tmp_path.iterdir()) == []
