"""Where things live: the ignored workspace, the archive cache and the project's own data folders.

The data folders (manifests, patches, worker sources) are package data: found through
importlib.resources, so a wheel install has them as a checkout does.  The workspace defaults to
``.work/`` in a checkout, and to the platform's user data folder for an installed run, whose package
folder is no place to write; ``DGR_WORK`` overrides both. The archive cache defaults to the platform's
user cache folder (``DGR_CACHE`` overrides). platformdirs knows each platform's rule (XDG on Linux,
``~/Library`` on macOS, where the Metal lane runs); it reads the process environment.
"""

from __future__ import annotations

import importlib.resources
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from core.errors import ConfigurationError, IntegrityError


def package_dir(package: str) -> Path:
    """The folder holding one of our packages and its data files (checkout, editable or wheel)."""
    found = importlib.resources.files(package)
    try:
        return Path(os.fspath(found))  # type: ignore[call-overload]
    except TypeError:
        raise ConfigurationError(
            f"the {package} package is not a plain folder ({found}): dgr-certify runs from a "
            "checkout or an unpacked install",
            hint="pip install the wheel (it installs unzipped)",
        ) from None


PROJECT_ROOT = Path(__file__).resolve().parent.parent  # the checkout, or site-packages when installed
MANIFESTS = package_dir("manifests")
PATCHES = package_dir("patches")
WORKER = package_dir("worker")
# A checkout has its pyproject.toml beside the packages; site-packages never does.
APP = "dgr-certify"
CHECKOUT: Path | None = PROJECT_ROOT if (PROJECT_ROOT / "pyproject.toml").is_file() else None


def default_root(env: Mapping[str, str]) -> Path:
    """``.work/`` in a checkout; the user data folder (``~/.local/share/dgr-certify`` on Linux) for an
    installed run."""
    if CHECKOUT is not None:
        return CHECKOUT / ".work"
    return Path(platformdirs.user_data_dir(APP, appauthor=False))


@dataclass(frozen=True, kw_only=True)
class Workspace:
    """The layout of ``.work/`` (``DGR_WORK`` overrides) and the cross-workspace archive cache."""

    root: Path
    cache: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Workspace:
        root = Path(env.get("DGR_WORK") or default_root(env))
        cache = Path(env.get("DGR_CACHE") or platformdirs.user_cache_dir(APP, appauthor=False))
        for name, path in (("DGR_WORK", root), ("DGR_CACHE", cache)):
            if path.exists() and not path.is_dir():
                raise ConfigurationError(f"{name} {path} is not a directory", hint=f"set {name} to a folder")
        return cls(root=Path(os.path.abspath(root)), cache=Path(os.path.abspath(cache)))

    # Stage outputs -----------------------------------------------------------------------------
    @property
    def sources(self) -> Path:
        return self.root / "src"

    @property
    def patched(self) -> Path:
        return self.root / "patched"

    @property
    def builds(self) -> Path:
        return self.root / "build"

    @property
    def store(self) -> Path:
        return self.root / "store"

    @property
    def staging(self) -> Path:
        return self.root / "staging"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def upstream(self) -> Path:
        """`dgr upstream`'s series and upstream test results."""
        return self.root / "upstream"

    def ensure(self, path: Path) -> Path:
        """Create ``path`` under the workspace or cache, refusing any symlink on the way."""
        base = self.root if _is_under(path, self.root) else self.cache
        refuse_links_below(base, path)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            name = "DGR_WORK" if base == self.root else "DGR_CACHE"
            raise ConfigurationError(
                f"cannot create {path}: {exc.strerror}", hint=f"set {name} to a writable folder"
            ) from None
        return path


def _is_under(path: Path, base: Path) -> bool:
    try:
        Path(os.path.abspath(path)).relative_to(Path(os.path.abspath(base)))
    except ValueError:
        return False
    return True


def refuse_links_below(base: Path, path: Path) -> None:
    """RELIABILITY 14: nothing is written through a link planted inside our own folders.

    ``base`` itself may be a link (an operator mounting the store elsewhere is their choice);
    every component below it must be a real directory or file.
    """
    base = Path(os.path.abspath(base))
    target = Path(os.path.abspath(path))
    rel = target.relative_to(base)
    probe = base
    for part in rel.parts:
        probe = probe / part
        if probe.is_symlink():
            raise IntegrityError(
                f"{probe} is a symbolic link; refusing to write through it", hint="remove the link and retry"
            )


def env_store(env: Mapping[str, str], explicit: str | None, ws: Workspace) -> Path:
    raw = explicit or env.get("DGR_STORE")
    if raw is None:
        return ws.store
    if not raw.strip():
        raise ConfigurationError("the artifact store path is empty", hint="pass --store DIR or set DGR_STORE")
    store = Path(os.path.abspath(raw))
    if store.exists() and not store.is_dir():
        raise ConfigurationError(
            f"store {store} is not a writable directory (not a directory)", hint="pass --store DIR"
        )
    return store


def sweep_leftovers(parent: Path, pattern: str) -> None:
    """Temp dirs of an interrupted run (kill -9); only called while holding that target's lock."""
    for old in parent.glob(pattern):
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
