"""ROCm lane: HIP (hipcc/hipconfig, clang from ROCm's llvm) + ggml's HIP backend, hipBLAS and rocBLAS."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from core.errors import ConfigurationError
from lanes import cmake
from lanes.base import (
    BuildOptions,
    Status,
    ToolchainProbe,
    at_least,
    dotted,
    first_line,
    parse_version,
    tool_output,
    which,
)

name = "rocm"
targets: tuple[str, ...] = ()
runner_labels: tuple[str, ...] = ("self-hosted", "linux", "x64", "gpu-amd")

# ggml/src/ggml-hip/CMakeLists.txt at the pin: `if (${hip_VERSION} VERSION_LESS 6.1) FATAL_ERROR`.
# Debian 12's hipcc is 5.2, so the distribution package is not enough.
MINIMUM = (6, 1)
CMAKE_MINIMUM = (3, 21)  # ggml-hip's cmake_minimum_required
# MI200 (CDNA2), MI300 (CDNA3), RDNA2 and RDNA3 workstation cards.
DEFAULT_TARGETS = "gfx90a;gfx942;gfx1030;gfx1100"

WELL_KNOWN_ROOTS: tuple[str, ...] = ("/opt/rocm",)

_TARGET = re.compile(r"^gfx[0-9a-f]{3,4}(:[a-z+-]+)*$")
INSTALL = (
    f"install ROCm >= {dotted(MINIMUM)} with hipcc, hipblas and rocblas from AMD's packages and set "
    "ROCM_PATH; Debian 12's own hipcc package is HIP 5.2, too old for the pinned tree"
)


def gpu_targets(options: BuildOptions) -> str:
    raw = options.hip_targets or DEFAULT_TARGETS
    items = [t.strip() for t in re.split(r"[;,\s]+", raw) if t.strip()]
    bad = [t for t in items if not _TARGET.match(t)]
    if not items or bad:
        raise ConfigurationError(
            f"invalid HIP GPU targets {raw!r}",
            hint="give gfx names such as gfx90a;gfx1100 (see `rocminfo | grep gfx`)",
        )
    return ";".join(items)


def _hipconfig(env: Mapping[str, str]) -> str | None:
    roots = [env.get("ROCM_PATH", ""), env.get("HIP_PATH", ""), *WELL_KNOWN_ROOTS]
    for candidate in [str(Path(r) / "bin" / "hipconfig") for r in roots if r] + ["hipconfig"]:
        path = which(candidate, env)
        if path:
            return path
    return None


def probe(env: Mapping[str, str]) -> ToolchainProbe:
    minimum = f"HIP {dotted(MINIMUM)}"
    hipconfig = _hipconfig(env)
    hipcc = which("hipcc", env)
    if hipconfig is None and hipcc is None:
        return ToolchainProbe(
            lane=name,
            status=Status.MISSING,
            tool="hipcc",
            minimum=minimum,
            reason=f"toolchain not found: hipcc/hipconfig ({INSTALL})",
        )
    # `hipconfig --version` prints the bare HIP version; hipcc prints "HIP version: X" among others.
    if hipconfig:
        text = first_line(tool_output(hipconfig, ["--version"], env))
    else:
        out = tool_output(hipcc, ["--version"], env) or ""  # type: ignore[arg-type]
        m = re.search(r"HIP version:\s*(\S+)", out)
        text = m.group(1) if m else first_line(out)
    version = parse_version(text)
    tool_path = hipcc or hipconfig
    shown = dotted(version) if version else None
    if not at_least(version, MINIMUM):
        return ToolchainProbe(
            lane=name,
            status=Status.TOO_OLD,
            tool="hipcc",
            version=shown,
            path=tool_path,
            minimum=minimum,
            reason=f"HIP {shown or 'of unknown version'} at {tool_path} is too old: "
            f"the pinned tree needs HIP >= {dotted(MINIMUM)} ({INSTALL})",
        )
    root = Path(tool_path).resolve().parent.parent  # type: ignore[arg-type]
    rocm_root = Path(env.get("ROCM_PATH") or root)
    missing = [lib for lib in ("hipblas", "rocblas") if not (rocm_root / "lib" / "cmake" / lib).is_dir()]
    if missing:
        return ToolchainProbe(
            lane=name,
            status=Status.MISSING,
            tool="hipcc",
            version=shown,
            path=tool_path,
            minimum=minimum,
            reason=f"toolchain not found: {' and '.join(missing)} under {rocm_root} ({INSTALL})",
        )
    found = ToolchainProbe(
        lane=name,
        status=Status.OK,
        tool="hipcc",
        version=shown,
        path=tool_path,
        minimum=minimum,
        versions={"hip": text or shown},  # type: ignore[dict-item]
        locations={"rocm_root": str(rocm_root), "hip_clang": str(rocm_root / "llvm" / "bin" / "clang")},
    )
    return cmake.merge(found, cmake.probe_host(env, cmake_minimum=CMAKE_MINIMUM))


def cmake_args(options: BuildOptions, probe: ToolchainProbe | None = None) -> list[str]:
    return [
        *cmake.common_args(options),
        cmake.define("GGML_HIP", "ON"),
        cmake.define("GPU_TARGETS", gpu_targets(options)),
    ]


def environment(env: Mapping[str, str], probe: ToolchainProbe) -> dict[str, str]:
    """The pinned tree's docs: HIPCXX="$(hipconfig -l)/clang" HIP_PATH="$(hipconfig -R)"."""
    if "rocm_root" not in probe.locations:
        return {}
    return {
        "HIPCXX": probe.locations["hip_clang"],
        "HIP_PATH": probe.locations["rocm_root"],
        "ROCM_PATH": probe.locations["rocm_root"],
    }


def certifiable(env: Mapping[str, str], probe: ToolchainProbe) -> tuple[bool, str]:
    if not Path("/dev/kfd").exists():
        return False, "no AMD GPU here (/dev/kfd absent; compile-only)"
    return True, "AMD GPU (/dev/kfd)"
