"""The user's own manifests: artifact sets and recipes for models nobody shipped a manifest for.

An installed run's ``manifests/`` sits inside site-packages, no place to write, so what ``dgr seal``
creates for a new model and what ``dgr recipe init`` writes go to a folder of the user's:
``DGR_MANIFESTS_DIR``, by default ``manifests/`` in the workspace (``.work/manifests`` in a checkout, the
user data folder's ``manifests/`` for an installed run, as platformdirs says; ``DGR_WORK`` moves it with
the workspace).  It mirrors the shipped folder: ``artifacts/NAME.json`` and ``recipes/NAME.json``;
``DGR_RECIPES_DIR``, when set, names the recipes folder instead.  Both are searched before the shipped
manifests, so a name found in both is the user's (the writers refuse to create such a shadow).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from core.errors import ConfigurationError
from core.workspace import MANIFESTS, Workspace


def manifests_dir(env: Mapping[str, str]) -> Path:
    """``DGR_MANIFESTS_DIR``, else ``<workspace>/manifests``; refused when it names a file."""
    named = env.get("DGR_MANIFESTS_DIR", "").strip()
    folder = Path(named) if named else Workspace.from_env(env).root / "manifests"
    if folder.exists() and not folder.is_dir():
        raise ConfigurationError(
            f"DGR_MANIFESTS_DIR {folder} is not a directory", hint="name a folder, or unset it"
        )
    return folder


def artifacts_dir(env: Mapping[str, str]) -> Path:
    """Where the user's artifact-set manifests live (searched before ``manifests/artifacts``)."""
    return manifests_dir(env) / "artifacts"


def recipes_dir(env: Mapping[str, str]) -> Path:
    """Where the user's recipes live (searched before ``manifests/recipes``): ``DGR_RECIPES_DIR``, else
    ``recipes/`` in the user's manifests folder."""
    named = env.get("DGR_RECIPES_DIR", "").strip()
    return Path(named) if named else manifests_dir(env) / "recipes"


def is_shipped(path: Path) -> bool:
    """Whether a manifest file is one of ours (inside the package's own ``manifests/``)."""
    return path.resolve().is_relative_to(MANIFESTS.resolve())


def make(folder: Path) -> Path:
    """Create a user folder (and its parents) on first write; a one-line error when that fails."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot create {folder}: {exc.strerror}",
            hint="set DGR_MANIFESTS_DIR (or DGR_RECIPES_DIR) to a writable folder",
        ) from None
    return folder
