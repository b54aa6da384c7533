"""Which stage's memory is wrong (the ``kv-at-depth`` gate, issue 41): each stage's memory, layer by
layer, against the monolithic worker's.

A sum that does not add up says that some stage holds the wrong memory, not which one.  Every worker
reports the memory its own graph reads, by the layer each tensor is named after, and what it allocated
that no node of its graph reads (worker/src/memory_layers.h, measured in the worker).  A stage is named
when it holds memory none of its layers reads beyond what the monolithic worker holds so, when it reads
memory of a layer it does not own, or when one of its layers holds other bytes than the same layer does
in the monolithic worker.  An older worker reports no layers: then only the sum is judged.
"""

from __future__ import annotations

from collections.abc import Sequence

from worker.client import StageInfo

NO_LAYER = -1  # a memory tensor whose name ends in no layer


def stage_faults(mono: StageInfo, stages: Sequence[StageInfo]) -> list[str]:
    """One line per stage whose memory differs from the monolithic worker's for its own layers."""
    if not mono.memory.kv_bytes_by_layer:
        return []
    return [line for k, info in enumerate(stages) if (line := _fault(k, mono, info))]


def _fault(k: int, mono: StageInfo, info: StageInfo) -> str:
    """What is wrong with stage ``k``'s memory, in one line; "" when nothing is."""
    b, e = info.layer_begin, info.layer_end
    held, want = info.memory.kv_bytes_by_layer, mono.memory.kv_bytes_by_layer
    problems = []
    unread, mono_unread = info.memory.kv_unread_bytes, mono.memory.kv_unread_bytes
    if unread > mono_unread:
        problems.append(
            f"{unread} bytes allocated that none of its layers reads (the monolithic worker: {mono_unread})"
        )
    foreign = sorted(il for il in held if il != NO_LAYER and not b <= il < e)
    if foreign:
        problems.append(f"reads memory of layers it does not own: {', '.join(map(str, foreign))}")
    for il in range(b, e):
        if held.get(il, 0) != want.get(il, 0):
            problems.append(
                f"layer {il} holds {held.get(il, 0)} bytes, the monolithic worker {want.get(il, 0)}"
            )
    return f"stage {k} (layers {b}:{e}): {'; '.join(problems)}" if problems else ""
