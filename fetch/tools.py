"""The pinned tree's programs that provisioning and sealing run but the fetch stage cannot build.

fetch sits below lanes in the import graph (lanes builds what fetch fetched), so a caller above both
(the CLI, certify, the device bundle) passes the programs down as ``Tools``; ``lanes.build.fetch_tools``
makes the usual one, which builds the CPU lane on first use. Each is resolved only when a set needs it
(a package-index origin needs the split tool, sealing a top-k model the probe, a roster fixture's set
the tree's fixture generator), so a set that needs none of them never triggers a build.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from core.errors import ToolchainMissing


@dataclass(frozen=True)
class Tools:
    split: Callable[[], Path]  # the pinned llama-gguf-split binary
    probe_build: Callable[[], Path]  # a CPU lane build folder holding dgr-topk-probe
    # (architecture, layers, seed) -> the pinned tree's fixture generator's models of it, variant -> file
    fixture: Callable[[str, int, int], Mapping[str, Path]]


def _not_given(program: str) -> ToolchainMissing:
    return ToolchainMissing(
        f"this artifact set needs the pinned {program}, and no build was given",
        hint="run it through `dgr provision` / `dgr seal`, which build the CPU lane",
    )


def _missing(program: str) -> Callable[[], Path]:
    def refuse() -> Path:
        raise _not_given(program)

    return refuse


def _no_generator(arch: str, n_layer: int, seed: int) -> Mapping[str, Path]:
    raise _not_given("fixture generator (test-llama-archs)")


NO_TOOLS = Tools(
    split=_missing("llama-gguf-split"), probe_build=_missing("dgr-topk-probe"), fixture=_no_generator
)
