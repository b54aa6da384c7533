"""What both synthetic-model generators (``tinymodel`` for llama, ``tinymodel_v4`` for DeepSeek V4)
share: the pinned tree's gguf-py, the split file names and writing, the deterministic weight stream
and the tokenizer copy. Byte-for-byte determinism rests here (see ``tinymodel``'s docstring).
"""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import ConfigurationError, IntegrityError


def import_gguf(tree: Path) -> Any:
    """The pinned tree's gguf-py (not whatever the environment may have installed)."""
    where = (tree / "gguf-py").resolve()
    if not (where / "gguf" / "__init__.py").is_file():
        raise ConfigurationError(f"{where} has no gguf package; is {tree} a llama.cpp tree?")
    loaded = sys.modules.get("gguf")
    if loaded is not None:
        if Path(loaded.__file__ or "").resolve().is_relative_to(where):
            return loaded
        raise ConfigurationError(
            f"another gguf package is already imported from {loaded.__file__}", hint="run in a fresh process"
        )
    # The tree is pristine and verified by its tree id: the import must leave no __pycache__ in it
    # (Python writes bytecode beside the sources unless told not to; the next check would refuse the tree).
    sys.path.insert(0, str(where))
    writes_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        module = importlib.import_module("gguf")
    finally:
        sys.dont_write_bytecode = writes_bytecode
        sys.path.remove(str(where))
    return module


def split_names(stem: str, n: int) -> list[str]:
    """The names the writer gives ``n`` split files of ``stem`` (one file keeps the bare stem)."""
    return [f"{stem}-{i + 1:05d}-of-{n:05d}.gguf" for i in range(n)] if n > 1 else [f"{stem}.gguf"]


def write_splits(writer: Any, out_dir: Path, names: list[str], who: str) -> list[Path]:
    """Write the header, KV pairs and tensors, close, and check every named split file is there."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    paths = [out_dir / n for n in names]
    for path in paths:
        if not path.is_file():
            raise IntegrityError(f"{who}: the writer did not produce {path.name}")
    return paths


class Weights:
    """Uniform weights in [-a, a) from PCG64's raw stream (stable across numpy versions)."""

    def __init__(self, seed: int) -> None:
        self.bits = np.random.PCG64(seed)

    def uniform(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        n = math.prod(shape)
        raw = self.bits.random_raw(n).astype(np.uint64)
        unit = (raw >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))  # [0, 1), exact
        a = std * math.sqrt(3.0)
        return ((unit * 2.0 - 1.0) * a).astype(np.float32).reshape(shape)


def copy_tokenizer(gguf: Any, writer: Any, vocab: Path) -> int:
    """Copy the tokenizer KV pairs, in file order, from the pinned tree's vocab file; returns n_vocab."""
    reader = gguf.GGUFReader(vocab)
    n_vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[1]
            value = field.contents()
            writer.add_key_value(name, value, vtype, sub_type=sub)
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(value)
        else:
            writer.add_key_value(name, field.contents(), vtype)
    if not n_vocab:
        raise IntegrityError(f"{vocab} has no tokenizer.ggml.tokens")
    return n_vocab
