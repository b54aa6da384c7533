"""A roster fixture as an artifact set: the pinned tree's generator's model of one architecture, given
a vocabulary and written over split files (the ``test-llama-archs`` generator of a ``generated`` origin).

upstream's generator (``tests/test-llama-archs.cpp``, built by lanes.arch_fixtures and handed down as
``Tools.fixture``) writes ``tokenizer.ggml.model = no_vocab``: its 128 tokens have no text, and llama.cpp
aborts on a tokenize call against such a model, while certify tokenizes a recipe's prompts with the
model's own tokenizer (every real GGUF carries one).  So the file is rewritten by the pinned gguf-py with
every KV pair and tensor as the generator wrote them and a 128-token sentencepiece vocabulary in place of
the empty one: the control tokens, the word boundary, the printable ASCII characters the shipped prompts
use, and a few common pairs to fill the rest.  The weights are untouched, so the model computes what the
generator's did (what ``dgr roster`` staged).

Byte-for-byte: the generator draws every weight from ``std::mt19937`` seeded by the seed xor
``std::hash`` of the tensor's name, through ``std::normal_distribution<float>``; the engine is fixed by
the standard, the hash and the distribution are the standard library's own.  With GCC's libstdc++ the
files are the same from every build of the generator (measured with GCC 12: the roster's 4-layer
fixtures byte-identical over five CPU lane builds of five patched trees, the 8-layer ones over -O0, -O1
and -O2), so a set sealed from them provisions wherever the lane links libstdc++; another library
(libc++) may draw other weights, which provisioning refuses as a digest mismatch.  The rewrite is the
pinned gguf-py's, in file order, stamping nothing of the machine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import ConfigurationError
from fetch.tinygguf import import_gguf, split_names, write_splits

N_VOCAB = 128  # what the generator gives every architecture but a few (chameleon, qwen3tts)
CHARS = [chr(c) for c in range(33, 127)]  # printable ASCII but the space, which sentencepiece spells '▁'
PAIRS = [
    "▁t", "▁a", "▁s", "▁o", "▁c", "▁p", "▁m", "▁l", "▁f", "▁i", "th", "he", "in", "er", "an", "re",
    "on", "at", "en", "es", "or", "ti", "is", "ar", "al", "le", "nd", "ing", "▁the", "▁of",
]  # fmt: skip
# The origin's parameters: which of the generator's models, at what depth and seed, written how.
REQUIRED = ("architecture", "n_layer", "file_stem")
DEFAULTS: dict[str, Any] = {"fixture": "dense", "seed": 1, "splits": 1}

Models = Callable[[str, int, int], Mapping[str, Path]]  # (architecture, layers, seed) -> variant -> file


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


def with_vocabulary(
    model: Path, out_dir: Path, tree: Path, *, split: int = 1, stem: str | None = None
) -> list[Path]:
    """``model`` rewritten into ``out_dir`` with a vocabulary, over ``split`` files named after ``stem``
    (default the model's) as llama-gguf-split lays a set out; the paths, in split order."""
    gguf = import_gguf(tree)
    reader = gguf.GGUFReader(model)
    arch = str(reader.fields["general.architecture"].contents())
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    if n_vocab != N_VOCAB:
        raise ConfigurationError(f"{model.name}: {n_vocab} tokens; the vocabulary written here has {N_VOCAB}")
    stem = stem or model.stem
    out_dir.mkdir(parents=True, exist_ok=True)
    per_file = -(-len(reader.tensors) // split)
    writer = gguf.GGUFWriter(out_dir / f"{stem}.gguf", arch, split_max_tensors=per_file if split > 1 else 0)
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
    return write_splits(writer, out_dir, split_names(stem, split), "arch_fixture")


def _checked(params: Mapping[str, Any]) -> dict[str, Any]:
    """The origin's parameters over the defaults; a missing or unknown one is the manifest's error."""
    p = {**DEFAULTS, **params}
    missing = [k for k in REQUIRED if k not in p]
    unknown = sorted(set(p) - set(DEFAULTS) - set(REQUIRED))
    if missing or unknown:
        said = [f"missing {', '.join(missing)}"] if missing else []
        said += [f"unknown {', '.join(unknown)}"] if unknown else []
        raise ConfigurationError(
            f"test-llama-archs origin: {'; '.join(said)}",
            hint=f"it takes {', '.join(REQUIRED)}, and optionally {', '.join(DEFAULTS)}",
        )
    return p


def generate(
    out_dir: Path, params: Mapping[str, Any], variant: str, *, tree: Path, models: Models
) -> list[Path]:
    """The variant's split files in ``out_dir``: the generator's model (``models``, from the CPU lane)
    with a vocabulary, named ``<file_stem>-<variant>-0000K-of-0000N.gguf``."""
    p = _checked(params)
    arch, n_layer, seed = str(p["architecture"]), int(p["n_layer"]), int(p["seed"])
    written = models(arch, n_layer, seed)
    kind = str(p["fixture"])
    if kind not in written:
        raise ConfigurationError(
            f"the fixture generator writes no {kind} model of {arch}",
            hint=f"it writes: {', '.join(sorted(written))} (parameter 'fixture')",
        )
    stem = f"{p['file_stem']}-{variant}"
    return with_vocabulary(written[kind], out_dir, tree, split=int(p["splits"]), stem=stem)
