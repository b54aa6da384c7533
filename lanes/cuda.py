"""CUDA lane: nvcc + ggml's CUDA backend. Compiles anywhere nvcc is; certifies only with an NVIDIA GPU."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from certify.errors import ConfigurationError
from lanes import cmake
from lanes.base import (
    BuildOptions,
    Status,
    ToolchainProbe,
    at_least,
    dotted,
    parse_version,
    tool_output,
    which,
)

name = "cuda"
targets: tuple[str, ...] = ()
runner_labels: tuple[str, ...] = ("self-hosted", "linux", "x64", "gpu-nvidia")

# The oldest toolkit that knows every default architecture below (sm_89 and sm_90 came with 11.8);
# the pinned tree's ggml-cuda itself gates its features on 11.x CUDART versions.
MINIMUM = (11, 8)
# The CUDA lane needs cmake 3.18 (ggml-cuda); the worker needs 3.19 anyway.
CMAKE_MINIMUM = (3, 19)
# Explicit, never "native": the build box may have no GPU, and the binaries must not depend on it.
# Ampere (A100, RTX 30), Ampere GA10x, Ada (L4, RTX 40), Hopper (H100/H200).
DEFAULT_ARCHITECTURES = "80;86;89;90"

# Where the toolkit lives when nothing on PATH or in the environment says so.
WELL_KNOWN_NVCC: tuple[str, ...] = ("/usr/local/cuda/bin/nvcc",)

_ARCH = re.compile(r"^\d{2,3}[af]?(-real|-virtual)?$")


def architectures(options: BuildOptions) -> str:
    """The lane's CUDA architectures (``--cuda-architectures`` / DGR_CUDA_ARCHITECTURES override)."""
    raw = options.cuda_architectures or DEFAULT_ARCHITECTURES
    items = [a.strip() for a in re.split(r"[;,\s]+", raw) if a.strip()]
    bad = [a for a in items if not _ARCH.match(a)]
    if not items or bad:
        raise ConfigurationError(
            f"invalid CUDA architectures {raw!r}" + (f" ({', '.join(bad)})" if bad and bad != [raw] else ""),
            hint="give explicit compute capabilities such as 80;86;89;90; not 'native', since the build "
            "must not depend on the build machine's GPU",
        )
    return ";".join(items)


def _candidates(env: Mapping[str, str]) -> list[str]:
    found = [env.get("CUDACXX", "")]
    found += [str(Path(env[v]) / "bin" / "nvcc") for v in ("CUDA_HOME", "CUDA_PATH") if env.get(v)]
    found += ["nvcc", *WELL_KNOWN_NVCC]
    return [c for c in found if c]


def _toolkit_bin(nvcc: str, env: Mapping[str, str]) -> str:
    """The toolkit's real bin dir: nvcc on PATH may be a wrapper script (/usr/local/bin/nvcc here)."""
    if (Path(nvcc).resolve().parent.parent / "include" / "cuda_runtime.h").is_file():
        return str(Path(nvcc).resolve().parent)
    out = tool_output(nvcc, ["--dryrun", "-c", "-x", "cu", "/dev/null", "-o", "/dev/null"], env) or ""
    m = re.search(r"^#\$ _HERE_=(.+)$", out, re.MULTILINE)
    return m.group(1).strip() if m else str(Path(nvcc).parent)


def probe(env: Mapping[str, str]) -> ToolchainProbe:
    minimum = f"nvcc {dotted(MINIMUM)}"
    nvcc = next((p for p in (which(c, env) for c in _candidates(env)) if p), None)
    if nvcc is None:
        return ToolchainProbe(
            lane=name,
            status=Status.MISSING,
            tool="nvcc",
            minimum=minimum,
            reason=f"toolchain not found: nvcc (install the CUDA toolkit >= {dotted(MINIMUM)} "
            "and put its bin/ on PATH or set CUDA_HOME)",
        )
    banner = tool_output(nvcc, ["--version"], env) or ""
    m = re.search(r"release\s+[\d.]+,\s*V([\d.]+)", banner) or re.search(r"release\s+([\d.]+)", banner)
    version = parse_version(m.group(1)) if m else None
    text = m.group(1) if m else None
    if not at_least(version, MINIMUM):
        return ToolchainProbe(
            lane=name,
            status=Status.TOO_OLD,
            tool="nvcc",
            version=text,
            path=nvcc,
            minimum=minimum,
            reason=f"nvcc {text or 'of unknown version'} at {nvcc} is too old: "
            f"install the CUDA toolkit >= {dotted(MINIMUM)}",
        )
    bindir = _toolkit_bin(nvcc, env)
    found = ToolchainProbe(
        lane=name,
        status=Status.OK,
        tool="nvcc",
        version=text,
        path=nvcc,
        minimum=minimum,
        versions={"nvcc": text},  # type: ignore[dict-item]
        locations={"nvcc": str(Path(bindir) / "nvcc"), "cuda_root": str(Path(bindir).parent)},
    )
    return cmake.merge(found, cmake.probe_host(env, cmake_minimum=CMAKE_MINIMUM))


def cmake_args(options: BuildOptions) -> list[str]:
    return [
        *cmake.common_args(options),
        cmake.define("GGML_CUDA", "ON"),
        cmake.define("CMAKE_CUDA_ARCHITECTURES", architectures(options)),
    ]


def environment(env: Mapping[str, str], probe: ToolchainProbe) -> dict[str, str]:
    """Point CMake at the real toolkit (a wrapper's directory has no headers or libraries)."""
    out: dict[str, str] = {}
    if "nvcc" in probe.locations:
        out["CUDACXX"] = probe.locations["nvcc"]
        out["CUDAToolkit_ROOT"] = probe.locations["cuda_root"]
    return out


def certifiable(env: Mapping[str, str], probe: ToolchainProbe) -> tuple[bool, str]:
    if not probe.usable:
        return False, "toolchain missing"
    smi = which("nvidia-smi", env)
    listing = tool_output(smi, ["-L"], env) if smi else None
    if listing and "GPU " in listing:
        return True, listing.strip().splitlines()[0]
    return False, "no NVIDIA GPU here (compile-only)"
