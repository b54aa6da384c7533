"""Where things live: the ignored workspace, the archive cache and the project's own data folders."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from certify.errors import ConfigurationError, IntegrityError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = PROJECT_ROOT / "manifests"
PATCHES = PROJECT_ROOT / "patches"
WORKER = PROJECT_ROOT / "worker"


@dataclass(frozen=True, kw_only=True)
class Workspace:
    """The layout of ``.work/`` (``DGR_WORK`` overrides) and the cross-workspace archive cache."""

    root: Path
    cache: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Workspace:
        root = Path(env.get("DGR_WORK") or PROJECT_ROOT / ".work")
        xdg = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "/tmp")) / ".cache")
        cache = Path(env.get("DGR_CACHE") or Path(xdg) / "dgr-certify")
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

    def ensure(self, path: Path) -> Path:
        """Create ``path`` under the workspace or cache, refusing any symlink on the way."""
        base = self.root if _is_under(path, self.root) else self.cache
        refuse_links_below(base, path)
        path.mkdir(parents=True, exist_ok=True)
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
            raise IntegrityError(f"{probe} is a symbolic link; refusing to write through it",
                                 hint="remove the link and retry")


def env_store(env: Mapping[str, str], explicit: str | None, ws: Workspace) -> Path:
    raw = explicit or env.get("DGR_STORE")
    if raw is None:
        return ws.store
    if not raw.strip():
        raise ConfigurationError("the artifact store path is empty", hint="pass --store DIR or set DGR_STORE")
    return Path(os.path.abspath(raw))
