"""The ``DGR_*`` variables checked once at the edge, so a typo fails at start (exit 2) with the variable
named, instead of being ignored or failing deep inside a run."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from core.errors import ConfigurationError

CHOICES = {
    "DGR_SEAMS": ("off", "on"),
    "DGR_SEAMS_BACKEND": ("netem", "shaper"),
}


def check(env: Mapping[str, str]) -> None:
    for name, allowed in CHOICES.items():
        value = env.get(name, "").strip()
        if value and value not in allowed:
            raise ConfigurationError(f"{name}={value!r} is not one of {', '.join(allowed)}",
                                     hint=f"unset {name} for the default")
    threads = env.get("DGR_WORKER_THREADS", "").strip()
    if threads and not (threads.isdigit() and int(threads) >= 1):
        raise ConfigurationError(f"DGR_WORKER_THREADS={threads!r} is not a positive integer",
                                 hint="unset it to use every core")
    recipes = env.get("DGR_RECIPES_DIR", "")
    if recipes and not Path(recipes).is_dir():
        raise ConfigurationError(f"DGR_RECIPES_DIR={recipes!r} is not a directory",
                                 hint="name a folder of recipe files, or unset it")
