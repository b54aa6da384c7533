"""The generators a ``generated`` origin names, behind one call that provisioning and sealing share.

- ``tinymodel``: our synthetic models, drawn from PCG64 in Python (fetch.tinymodel; DeepSeek V4 through
  fetch.tinymodel_v4);
- ``test-llama-archs``: a roster fixture, the pinned tree's own generator's model of an architecture
  given a vocabulary (fetch.arch_fixture); the generator is built against the CPU lane, so it comes
  down from above as ``Tools.fixture``.

Each writes a variant's files into an empty folder; the caller hashes them (seal) or verifies them
against the sealed digests (provisioning), so a generator that drew other bytes is caught there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fetch.tools import Tools

Generator = Callable[[Path, Mapping[str, Any], str, Path, Tools], list[Path]]  # out, params, variant, tree


def _tinymodel(out: Path, params: Mapping[str, Any], variant: str, tree: Path, tools: Tools) -> list[Path]:
    from fetch import tinymodel

    return tinymodel.generate(out, params, variant, tree=tree)


def _arch_fixture(out: Path, params: Mapping[str, Any], variant: str, tree: Path, tools: Tools) -> list[Path]:
    from fetch import arch_fixture

    return arch_fixture.generate(out, params, variant, tree=tree, models=tools.fixture)


GENERATORS: dict[str, Generator] = {"tinymodel": _tinymodel, "test-llama-archs": _arch_fixture}


def generate(
    generator: str | None, out: Path, params: Mapping[str, Any], variant: str, *, tree: Path, tools: Tools
) -> list[Path]:
    """The variant's files written into ``out`` by the origin's ``generator`` (the schema admits only
    the names of GENERATORS)."""
    return GENERATORS[generator or "tinymodel"](out, params, variant, tree, tools)
