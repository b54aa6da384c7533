"""The MTP-only file's layout (fetch.mtp_file) and how the last stage is told to load it.

The converter's ``--mtp`` keeps the nextn block, the tensors outside the blocks and the hash-routing
tables, and nothing of the trunk; the bytes themselves are held by tests/integration/test_mtp_file.py
(regenerated against the sealed set and compared with tiny-v4-mtp's tensors).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigurationError
from fetch import mtp_file, tinymodel_v4
from manifests.artifact_sets import load_set
from worker.launcher import WorkerCommand

NAMES = [
    "token_embd.weight",
    "output_norm.weight",
    "output.weight",
    "output_hc_fn.weight",
    "blk.0.attn_norm.weight",
    "blk.0.ffn_gate_tid2eid.weight",
    "blk.2.ffn_gate_tid2eid.weight",
    "blk.3.exp_probs_b.bias",
    "blk.11.ffn_up_exps.weight",
    "blk.12.attn_norm.weight",
    "blk.12.ffn_up_exps.weight",
    "blk.12.nextn.eh_proj.weight",
    "blk.12.nextn.enorm.weight",
    "blk.12.nextn.hnorm.weight",
    "blk.12.nextn.embed_tokens.weight",
]


def test_the_mtp_file_keeps_what_the_converter_keeps_in_file_order() -> None:
    kept = mtp_file.mtp_tensor_names(NAMES, 12)
    assert kept == [
        "token_embd.weight",
        "output_norm.weight",
        "output.weight",
        "output_hc_fn.weight",
        "blk.0.ffn_gate_tid2eid.weight",
        "blk.2.ffn_gate_tid2eid.weight",
        "blk.12.attn_norm.weight",
        "blk.12.ffn_up_exps.weight",
        "blk.12.nextn.eh_proj.weight",
        "blk.12.nextn.enorm.weight",
        "blk.12.nextn.hnorm.weight",
    ]
    assert not any(n.startswith(("blk.11.", "blk.3.")) for n in kept)


def test_the_generator_names_the_file_as_the_converter_does_and_refuses_what_it_cannot_cut(tmp_path) -> None:
    block = {"mtp": 1, "compress_ratios": [*tinymodel_v4.DEFAULTS["compress_ratios"], 0]}
    only = {**block, "mtp_only": True, "splits": 1}
    assert tinymodel_v4.file_names(only, "f32") == ["mtp-tiny-v4-f32.gguf"]
    for bad in ({"mtp_only": True, "splits": 1}, {**block, "mtp_only": True, "splits": 3}):
        with pytest.raises(ConfigurationError, match="mtp_only writes one nextn block as one file"):
            tinymodel_v4.generate(tmp_path, bad, "f32", tree=tmp_path)


def test_the_sealed_mtp_only_set_is_the_mtp_set_cut() -> None:
    whole, cut = load_set("tiny-v4-mtp"), load_set("tiny-v4-mtp-only")
    w, c = whole.origins[0].parameters, cut.origins[0].parameters
    differ = {k for k in {*w, *c} if w.get(k) != c.get(k)}
    assert differ == {"mtp_only", "splits", "name"} and c["mtp_only"] is True
    v = cut.variant(None)
    assert v.sealed and [f.name for f in v.files] == ["mtp-tiny-v4-f32.gguf"]
    assert v.gguf.kv["deepseek4.nextn_predict_layers"] == 1 and v.gguf.block_count == 13


def test_the_last_stage_alone_gets_the_mtp_file(tmp_path: Path) -> None:
    cmd = WorkerCommand(
        program=("w",), model=tmp_path / "main.gguf", mtp=True, mtp_model=tmp_path / "mtp-main.gguf"
    )
    assert cmd.argv((8, 12), last=True)[-2:] == ["--mtp-model", str(tmp_path / "mtp-main.gguf")]
    assert "--mtp-model" not in cmd.argv((0, 8)) and "--mtp" not in cmd.argv((0, 8))
    in_file = WorkerCommand(program=("w",), model=tmp_path / "main.gguf", mtp=True)
    assert in_file.argv((8, 12), last=True)[-1] == "--mtp"
