"""An MTP-only GGUF: the pinned converter's ``--mtp`` layout, cut from a model that holds its nextn block.

DeepSeek V4 Flash's nextn block never reaches the main file: ``convert_hf_to_gguf.py --mtp`` writes it
alone (``conversion/deepseek.py``, ``mtp_only``), as the block's own tensors plus the shared token
embedding, the output norm and head, the head's hyper-connection tensors and the hash-routing tables,
under the main model's header with ``block_count`` = main layers + 1 and ``nextn_predict_layers`` set.
The pinned loader reads such a file with its trunk tensors optional, and the last stage of a pipeline
loads it as a second model (worker ``--mtp-model``; docs/mtp.md).

The synthetic model with MTP (tiny-v4-mtp) keeps its block in the main file. Cutting the same tensors
out of it, bytes copied and nothing redrawn, gives the real target's layout for a block whose drafts
are already known, so the ``--mtp-model`` path is proven against the ``--mtp`` one on the CPU. The
block's ``nextn.embed_tokens`` is left out, as the converter never writes one for V4: the block then
embeds with the file's ``token_embd``, the fallback the real file exercises.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.errors import ConfigurationError, IntegrityError

HASH_TABLE = re.compile(r"blk\.\d+\.ffn_gate_tid2eid\.weight")
NOT_IN_MTP_FILE = ".nextn.embed_tokens.weight"  # the converter keeps the shared token_embd instead


def mtp_tensor_names(names: Sequence[str], n_layer_main: int) -> list[str]:
    """The tensors the converter's ``--mtp`` keeps, in file order: every tensor outside the blocks
    (embedding, output norm and head, their hyper-connection tensors), the nextn block
    (``blk.<n_layer_main>.*``), and the hash-routing tables of the main layers."""
    block = f"blk.{n_layer_main}."
    return [
        n
        for n in names
        if (not n.startswith("blk.") or n.startswith(block) or HASH_TABLE.fullmatch(n))
        and not n.endswith(NOT_IN_MTP_FILE)
    ]


def write_mtp_only(gguf: Any, sources: Sequence[Path], out: Path) -> Path:
    """Write ``out`` from the split files ``sources`` of a model with one nextn block: their header
    (split keys dropped) and the tensors ``mtp_tensor_names`` keeps, bytes as they are."""
    readers = [gguf.GGUFReader(p) for p in sources]
    arch = _field(readers[0], "general.architecture")
    n_nextn = _field(readers[0], f"{arch}.nextn_predict_layers", required=False)
    if not n_nextn:
        raise ConfigurationError(
            f"{sources[0].name}: no {arch}.nextn_predict_layers: the model holds no "
            f"nextn block to write as an MTP-only file"
        )
    n_layer_main = int(_field(readers[0], f"{arch}.block_count")) - int(n_nextn)
    tensors = {t.name: t for r in readers for t in r.tensors}
    kept = [tensors[name] for name in mtp_tensor_names(list(tensors), n_layer_main)]
    writer = gguf.GGUFWriter(out, arch)
    _copy_header(gguf, readers[0], writer)
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data)
    writer.close()
    if not out.is_file():
        raise IntegrityError(f"mtp_file: the writer did not produce {out.name}")
    return out


def _copy_header(gguf: Any, reader: Any, writer: Any) -> None:
    """Every KV pair in file order but the writer's own (architecture, GGUF.*) and the split keys."""
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith(("GGUF.", "split.")):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)


def _field(reader: Any, key: str, *, required: bool = True) -> Any:
    field = reader.get_field(key)
    if field is None:
        if required:
            raise ConfigurationError(f"GGUF header has no {key}")
        return None
    return field.contents()
