"""The model files upstream's suites load: upstream's own random fixtures and the store's small models.

``test-llama-archs -a ARCH -s 1 -o DIR`` (built from the pristine tree) writes ARCH-dense.gguf the
way upstream's ctest does for test-recurrent-state-rollback; tiny-llama and gemma-3-270m are
provisioned (and verified) from the store like any recipe's artifact set.  Names: ``gen:ARCH``,
``tiny``, ``gemma3``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

from core.context import Context
from core.errors import RuntimeFailure
from lanes import arch_fixtures

# Names a suite may use for a provisioned artifact set (its default variant's first split file).
STORE_SETS = {"tiny": "tiny-llama", "gemma3": "gemma3-270m-q4"}


def provisioned(ctx: Context, set_name: str) -> Path:
    from fetch.provision import provision
    from lanes.build import fetch_tools

    return provision(ctx, set_name, tools=fetch_tools(ctx)).files[0]


def models(
    ctx: Context, generator: Path, out: Path, *, wanted: Collection[str], say: Callable[[str], None]
) -> dict[str, Path]:
    """The files named in ``wanted`` (``gen:ARCH``, ``tiny``); another name is left out (its suite
    then reports NOT_RUN naming it)."""
    archs = [n.removeprefix("gen:") for n in sorted(wanted) if n.startswith("gen:")]
    found = {}
    for arch in archs:
        try:
            found[f"gen:{arch}"] = arch_fixtures.generated(generator, arch, out)
        except RuntimeFailure as exc:  # its suites say NOT_RUN ("no model gen:ARCH here") on both sides
            say(str(exc))
    for name, set_name in STORE_SETS.items():
        if name in wanted:
            found[name] = provisioned(ctx, set_name)
    if found:
        say(f"models: {', '.join(f'{k}={v.name}' for k, v in found.items())}")
    return found
