"""The ``DGR_*`` variables checked once at the edge, so a typo fails at start (exit 2) with the variable
named, instead of being ignored or failing deep inside a run."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from core.digits import ascii_int
from core.errors import ConfigurationError

_CPU_LIST = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")

CHOICES = {
    "DGR_SEAMS": ("off", "on"),
    "DGR_SEAMS_BACKEND": ("netem", "shaper"),
    # each worker's --load: llama.cpp's load modes (worker/README.md, "Weights in memory")
    "DGR_WORKER_LOAD": ("none", "mmap", "mlock", "mmap+mlock", "dio", "auto"),
}


def _choice(env: Mapping[str, str], name: str) -> str:
    """The value of a CHOICES variable ("" when unset), refused when it is not one of them."""
    value, allowed = env.get(name, "").strip(), CHOICES[name]
    if value and value not in allowed:
        raise ConfigurationError(
            f"{name}={value!r} is not one of {', '.join(allowed)}", hint=f"unset {name} for the default"
        )
    return value


def check(env: Mapping[str, str]) -> None:
    for name in CHOICES:
        _choice(env, name)
    threads = env.get("DGR_WORKER_THREADS", "").strip()
    if threads and not (ascii_int(threads) or 0) >= 1:
        raise ConfigurationError(
            f"DGR_WORKER_THREADS={threads!r} is not a positive integer", hint="unset it to use every core"
        )
    worker_cpus(env)
    recipes = env.get("DGR_RECIPES_DIR", "")
    if recipes and not Path(recipes).is_dir():
        raise ConfigurationError(
            f"DGR_RECIPES_DIR={recipes!r} is not a directory",
            hint="name a folder of recipe files, or unset it",
        )


def worker_load(env: Mapping[str, str]) -> str | None:
    """``DGR_WORKER_LOAD``: how every worker loads its weights (its ``--load``); unset: the worker's own
    default (read into memory where the weights stay on the host, else llama's auto).  ``mmap`` keeps
    them in the page cache, for a host whose memory holds the model only once."""
    return _choice(env, "DGR_WORKER_LOAD") or None


def worker_cpus(env: Mapping[str, str]) -> tuple[str, ...]:
    """``DGR_WORKER_CPUS``: CPU lists separated by spaces, stage k held to list k modulo their count
    (``"0"``: every stage on CPU 0; ``"0-3 4-7"``: even stages on 0-3, odd ones on 4-7); unset: free.
    Each list becomes the worker's ``--cpus`` (worker/README.md, "CPU affinity"), and the worker
    itself refuses a CPU this machine does not let it use."""
    lists = tuple(env.get("DGR_WORKER_CPUS", "").split())
    bad = [c for c in lists if not _CPU_LIST.fullmatch(c)]
    if bad:
        raise ConfigurationError(
            f"DGR_WORKER_CPUS: {bad[0]!r} is not a CPU list such as 0-3,8",
            hint="give one list per stage, separated by spaces, or unset it",
        )
    return lists
