"""A roster fixture as a user would bring it: the pinned tree's llama fixture with a vocabulary.

upstream's generator (lanes/arch_fixtures.py) writes ``tokenizer.ggml.model = no_vocab``: its 128
tokens have no text, and llama.cpp aborts on a tokenize call against such a model, while certify
tokenizes the recipe's prompts with the model's own tokenizer (every real GGUF carries one).  So the
file is rewritten by the pinned gguf-py with every KV pair and tensor as the generator wrote them and
a 128-token sentencepiece vocabulary in place of the empty one: the control tokens, the word
boundary, the printable ASCII characters the shipped prompts use, and a few common pairs to fill the
rest.  The weights are untouched, so the model computes what the generator's did.

``split`` writes the tensors over that many files, as llama-gguf-split lays a set out (``split.no``,
``split.count``, ``split.tensors.count``), so sealing meets a real split layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fetch.tinygguf import import_gguf, split_names, write_splits

N_VOCAB = 128  # what the generator gives every architecture but a few (chameleon, qwen3tts)
CHARS = [chr(c) for c in range(33, 127)]  # printable ASCII but the space, which sentencepiece spells '▁'
PAIRS = [
    "▁t", "▁a", "▁s", "▁o", "▁c", "▁p", "▁m", "▁l", "▁f", "▁i", "th", "he", "in", "er", "an", "re",
    "on", "at", "en", "es", "or", "ti", "is", "ar", "al", "le", "nd", "ing", "▁the", "▁of",
]  # fmt: skip


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types: <unk>, <s>, </s>, '▁', the characters, then the pairs (higher
    scores first, so sentencepiece merges them)."""
    tokens = ["<unk>", "<s>", "</s>", "▁", *CHARS, *PAIRS]
    assert len(tokens) == N_VOCAB and len(set(tokens)) == N_VOCAB
    scores = [0.0, 0.0, 0.0, -1.0] + [-2.0] * len(CHARS) + [-1.0 - k / 100 for k in range(len(PAIRS))]
    types = [2, 3, 3] + [1] * (N_VOCAB - 3)  # unknown, control, control, normal
    return tokens, scores, types


def _copy_fields(gguf: Any, reader: Any, writer: Any) -> None:
    """Every KV pair but the tokenizer's, those the writer writes itself and empty arrays (which
    gguf-py refuses to write; llama's loader reads none of them), in file order."""
    for field in reader.fields.values():
        name, value = field.name, field.contents()
        if name.startswith(("GGUF.", "tokenizer.", "split.")) or name == "general.architecture":
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY and not len(value):
            continue
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, vtype, sub_type=sub)


def with_vocabulary(model: Path, out_dir: Path, tree: Path, *, split: int = 1) -> list[Path]:
    """``model`` rewritten into ``out_dir`` with a vocabulary (and over ``split`` files); the paths."""
    gguf = import_gguf(tree)
    reader = gguf.GGUFReader(model)
    arch = str(reader.fields["general.architecture"].contents())
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == N_VOCAB, "the generator's vocab size"
    out_dir.mkdir(parents=True, exist_ok=True)
    per_file = -(-len(reader.tensors) // split)
    writer = gguf.GGUFWriter(out_dir / model.name, arch, split_max_tensors=per_file if split > 1 else 0)
    _copy_fields(gguf, reader, writer)
    tokens, scores, types = vocabulary()
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    return write_splits(writer, out_dir, split_names(model.stem, split), "byo_model")
