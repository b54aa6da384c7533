"""What every lane looks like: the Lane protocol, the probe result, build options and the registry.

Each lane is a module (``lanes/cpu.py``, ``cuda.py``, ...) with the same small surface, the way
cibuildwheel keeps one module per platform behind one protocol.  Shared CMake driving lives once in
``lanes/cmake.py``; the build itself (key, directory, provenance) in ``lanes/build.py``.
"""

from __future__ import annotations

import enum
import importlib
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from core.errors import CommandFailed, CommandTimeout, ConfigurationError, ToolchainMissing

LANE_NAMES: tuple[str, ...] = ("cpu", "cuda", "rocm", "vulkan", "metal")

# The registry: lane name -> module implementing the Lane protocol (imported on first use).
REGISTRY: dict[str, str] = {name: f"lanes.{name}" for name in LANE_NAMES}

# A version query that prints nothing for this long is a hung tool, not a slow one.
VERSION_TIMEOUT_S = 30.0


class Status(enum.StrEnum):
    OK = "ok"
    MISSING = "missing"
    TOO_OLD = "too old"


@dataclass(frozen=True, kw_only=True)
class ToolchainProbe:
    """What a lane found on this machine.

    ``versions`` names every tool whose version shapes the binaries (compiler, cmake, nvcc, ...):
    it goes into the build key.  ``locations`` are paths the lane's environment needs (toolkit
    roots, include dirs); they are provenance, not identity.
    """

    lane: str
    status: Status
    tool: str
    version: str | None = None
    path: str | None = None
    minimum: str | None = None
    reason: str | None = None
    versions: Mapping[str, str] = field(default_factory=dict)
    locations: Mapping[str, str] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return self.status is not Status.MISSING

    @property
    def usable(self) -> bool:
        return self.status is Status.OK

    def require(self) -> ToolchainProbe:
        """Return self when usable; else raise ToolchainMissing (exit 4) naming what to install."""
        if not self.usable:
            # ToolchainMissing prints "toolchain not found:" itself; say it once.
            reason = (self.reason or self.status.value).removeprefix("toolchain not found: ")
            raise ToolchainMissing(f"{self.lane} lane: {reason}")
        return self

    def as_dict(self) -> dict[str, object]:
        return {
            "lane": self.lane,
            "status": self.status.value,
            "tool": self.tool,
            "version": self.version,
            "path": self.path,
            "minimum": self.minimum,
            "reason": self.reason,
            "versions": dict(self.versions),
            "locations": dict(self.locations),
        }


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """What the user may choose for a build; everything here that changes the binaries is in the key.

    ``from_env`` folds in the DGR_* environment overrides once, so lane functions stay pure.
    """

    jobs: int | None = None
    build_type: str = "Release"
    # GGML_NATIVE=ON tunes for the build box's CPU and makes the binaries (and their numerics) depend
    # on it; OFF builds a portable x86-64-v3 style baseline that any CI runner reproduces.
    native: bool = False
    cuda_architectures: str | None = None
    hip_targets: str | None = None
    # Compiler sanitizers for every binary (DGR_SANITIZE=address,undefined): the worker and libllama
    # under ASan/UBSan, a build of its own (the flags are in the key); "" builds without.
    sanitize: str = ""
    reverify: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str], **given: object) -> BuildOptions:
        values = {k: v for k, v in given.items() if v is not None}
        for name, var in (
            ("cuda_architectures", "DGR_CUDA_ARCHITECTURES"),
            ("hip_targets", "DGR_HIP_TARGETS"),
            ("sanitize", "DGR_SANITIZE"),
        ):
            if name not in values and env.get(var, "").strip():
                values[name] = env[var].strip()
        if "jobs" in values and int(values["jobs"]) < 1:  # type: ignore[call-overload]
            raise ConfigurationError(f"--jobs must be at least 1 (got {values['jobs']})")
        if "sanitize" in values:
            values["sanitize"] = sanitizers(str(values["sanitize"]))
        return cls(**values)  # type: ignore[arg-type]

    @property
    def parallel(self) -> int:
        return self.jobs or os.cpu_count() or 1


SANITIZERS = ("address", "undefined")  # GCC's and Clang's -fsanitize= names that combine with each other


def sanitizers(text: str) -> str:
    """DGR_SANITIZE's comma list, checked and in one order (the build key must not depend on how it was
    written): "undefined,address" -> "address,undefined"."""
    named = {part.strip() for part in text.split(",") if part.strip()}
    unknown = sorted(named - set(SANITIZERS))
    if unknown:
        raise ConfigurationError(
            f"DGR_SANITIZE: unknown sanitizer {', '.join(map(repr, unknown))}",
            hint=f"name any of {', '.join(SANITIZERS)}, comma-separated",
        )
    return ",".join(s for s in SANITIZERS if s in named)


class Lane(Protocol):
    """The surface every lane module exposes (modules satisfy this structurally)."""

    name: str
    # Extra CMake targets this lane needs beyond the pipeline's own (lanes.build.TARGETS).
    targets: tuple[str, ...]
    # CI runner labels a job for this lane needs (`dgr matrix`).
    runner_labels: tuple[str, ...]

    def probe(self, env: Mapping[str, str]) -> ToolchainProbe: ...

    def cmake_args(self, options: BuildOptions, probe: ToolchainProbe | None = None) -> list[str]:
        """Every argument that shapes the binaries (all of them go into the build key).

        Without a probe: the lane's own choices only (what tests and `dgr matrix` see); with one,
        also what follows from the toolchain found (a cuBLAS outside the CUDA toolkit, say).
        """
        ...

    def environment(self, env: Mapping[str, str], probe: ToolchainProbe) -> dict[str, str]: ...

    def certifiable(self, env: Mapping[str, str], probe: ToolchainProbe) -> tuple[bool, str]:
        """Whether this machine can run the lane's workers (a device), given a usable probe."""
        ...


def certifiable(lane: Lane, env: Mapping[str, str], probe: ToolchainProbe) -> tuple[bool, str]:
    """The lane's own answer once its toolchain is usable; without one nothing is built to run."""
    if not probe.usable:
        return False, "toolchain missing"
    return lane.certifiable(env, probe)


def get(name: str) -> Lane:
    """The lane module called ``name``; ConfigurationError (exit 2) naming the known lanes."""
    try:
        module = REGISTRY[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown lane {name!r}", hint=f"choose one of {', '.join(LANE_NAMES)}"
        ) from None
    return importlib.import_module(module)  # type: ignore[return-value]


def all_lanes() -> list[Lane]:
    return [get(name) for name in LANE_NAMES]


# --- small helpers the lane probes share ------------------------------------------------------------

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """First dotted version in ``text`` (``release 13.0, V13.0.88`` -> (13, 0))."""
    if not text:
        return None
    m = _VERSION.search(text)
    if not m:
        return None
    return tuple(int(p) for p in m.groups() if p is not None)


def at_least(version: tuple[int, ...] | None, minimum: tuple[int, ...]) -> bool:
    return version is not None and version >= minimum


def dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(p) for p in version)


def which(program: str, env: Mapping[str, str]) -> str | None:
    """``program`` on the PATH of ``env`` (never ours), or an explicit path when it is executable."""
    if os.sep in program:
        return program if os.access(program, os.X_OK) and Path(program).is_file() else None
    return shutil.which(program, path=env.get("PATH", os.defpath))


def tool_output(path: str, args: list[str], env: Mapping[str, str]) -> str | None:
    """Combined output of ``path args`` (a version query); None when it fails or hangs."""
    from core import proc

    try:
        return proc.run([path, *args], env=env, no_output_timeout=VERSION_TIMEOUT_S).output
    except (CommandFailed, CommandTimeout, ToolchainMissing, OSError):
        return None


def first_line(text: str | None) -> str | None:
    if not text:
        return None
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return None
