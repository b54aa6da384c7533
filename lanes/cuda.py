"""CUDA lane: nvcc + ggml's CUDA backend. Compiles anywhere nvcc is; certifies only with an NVIDIA GPU."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from core.errors import ConfigurationError
from core.workspace import Workspace
from lanes import cmake, toolchains
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

# Where a driver's libcuda.so lives on a GPU box (Debian/Ubuntu, RHEL).
DRIVER_DIRS: tuple[str, ...] = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64")
CUBLAS_INSTALL = (
    "install the toolkit's cuBLAS (NVIDIA's libcublas-dev package), or `pip install nvidia-cublas` and set "
    "DGR_CUBLAS_ROOT=<site-packages>/nvidia/cu13"
)
# Pinned cuBLAS wheels the lane provisions itself, by the toolkit's major version (manifests/toolchains).
CUBLAS_TOOLCHAINS: dict[int, str] = {13: "cublas-cu13"}

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
    root = Path(bindir).parent
    include, lib = _cublas(root, env, version)
    if include is None or lib is None:
        pin = _cublas_pin(version)
        offer = (
            f"`dgr build --lane cuda` provisions the pinned {pin.files[0].package}=={pin.version} into "
            "the workspace; or "
            if pin is not None
            else ""
        )
        return ToolchainProbe(
            lane=name,
            status=Status.MISSING,
            tool="cuBLAS",
            version=text,
            path=nvcc,
            minimum=minimum,
            reason=f"toolchain not found: cuBLAS (cublas_v2.h, libcublas) for the CUDA {text} toolkit "
            f"at {root}: {offer}{CUBLAS_INSTALL}",
        )
    driver = _driver(root)
    found = ToolchainProbe(
        lane=name,
        status=Status.OK,
        tool="nvcc",
        version=text,
        path=nvcc,
        minimum=minimum,
        # nvcc and cuBLAS versions shape the binaries (the key); where they live does not.
        versions={"nvcc": text, "cublas": _cublas_version(include)},  # type: ignore[dict-item]
        locations={
            "nvcc": str(Path(bindir) / "nvcc"),
            "cuda_root": str(root),
            "cublas_include": str(include),
            "cublas_lib": str(lib),
            "cuda_driver": str(driver or ""),
        },
    )
    return cmake.merge(found, cmake.probe_host(env, cmake_minimum=CMAKE_MINIMUM))


def _cublas_pin(version: tuple[int, ...] | None) -> toolchains.Toolchain | None:
    """The pinned cuBLAS wheel for this toolkit's major version, if the project has one."""
    pin = CUBLAS_TOOLCHAINS.get(version[0]) if version else None
    return toolchains.load(pin) if pin else None


def _prefixes(root: Path, env: Mapping[str, str], version: tuple[int, ...] | None) -> list[Path]:
    extra = [Path(env["DGR_CUBLAS_ROOT"])] if env.get("DGR_CUBLAS_ROOT", "").strip() else []
    pin = _cublas_pin(version)
    provisioned = toolchains.installed(toolchains.workspace(env), pin) if pin is not None else None
    # An explicit DGR_CUBLAS_ROOT first, then the toolkit's own, then the one this lane provisioned.
    return [*extra, root, *sorted(root.glob("targets/*")), *([provisioned] if provisioned else [])]


def _cublas_version(include: Path) -> str:
    """CUBLAS_VER_MAJOR.MINOR.PATCH.BUILD from cublas_api.h ("unknown" when the header hides it)."""
    try:
        text = (include / "cublas_api.h").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "unknown"
    fields = ("MAJOR", "MINOR", "PATCH", "BUILD")
    parts = [re.search(rf"#define\s+CUBLAS_VER_{p}\s+(\d+)", text) for p in fields]
    return ".".join(m.group(1) for m in parts if m) or "unknown"


def _cublas(
    root: Path, env: Mapping[str, str], version: tuple[int, ...] | None = None
) -> tuple[Path | None, Path | None]:
    """cuBLAS headers and library: DGR_CUBLAS_ROOT, the toolkit, or the workspace's pinned wheel."""
    prefixes = _prefixes(root, env, version)
    include = next((p / "include" for p in prefixes if (p / "include" / "cublas_v2.h").is_file()), None)
    libs = (p / d for p in prefixes for d in ("lib64", "lib"))
    lib = next((d for d in libs if any(d.glob("libcublas.so*")) and any(d.glob("libcublasLt.so*"))), None)
    return include, lib


def _driver(root: Path) -> Path | None:
    """libcuda.so to link against: the driver's, or the toolkit's stub (a GPU-less build box)."""
    places = [root / d / "stubs" for d in ("lib64", "lib")] + [
        t / "lib" / "stubs" for t in root.glob("targets/*")
    ]
    places += [Path(p) for p in DRIVER_DIRS]
    return next((p / "libcuda.so" for p in places if (p / "libcuda.so").exists()), None)


def _library(directory: Path, stem: str) -> Path:
    """The unversioned name when present (a toolkit), else the soname a wheel ships (libcublas.so.13)."""
    plain = directory / f"{stem}.so"
    return plain if plain.exists() else sorted(directory.glob(f"{stem}.so.*"))[0]


def cmake_args(options: BuildOptions, probe: ToolchainProbe | None = None) -> list[str]:
    args = [
        *cmake.common_args(options),
        cmake.define("GGML_CUDA", "ON"),
        cmake.define("CMAKE_CUDA_ARCHITECTURES", architectures(options)),
    ]
    where = probe.locations if probe is not None else {}
    if where.get("cuda_root") and not where.get("cuda_driver"):
        # No libcuda.so (driver or stub) to link: ggml's legacy memory pool instead of the VMM one.
        args.append(cmake.define("GGML_CUDA_NO_VMM", "ON"))
    return args


def location_args(probe: ToolchainProbe, host: cmake.HostTools) -> list[str]:
    """Paths and launchers (not in the build key: the cuBLAS version is, through probe.versions)."""
    args = []
    if host.ccache:
        # ccache understands nvcc: a rebuild of an unchanged .cu with the same flags is a cache hit.
        args.append(cmake.define("CMAKE_CUDA_COMPILER_LAUNCHER", host.ccache))
    where = probe.locations
    include, lib, root = where.get("cublas_include"), where.get("cublas_lib"), where.get("cuda_root")
    if include and lib and root and not Path(include).is_relative_to(root):
        # cuBLAS outside the toolkit (a package-index wheel): FindCUDAToolkit would not look there.
        args += [
            cmake.define("CUDA_cublas_LIBRARY", str(_library(Path(lib), "libcublas"))),
            cmake.define("CUDA_cublasLt_LIBRARY", str(_library(Path(lib), "libcublasLt"))),
            cmake.define("CMAKE_CUDA_FLAGS", f"-I{include}"),
        ]
    return args


def provision(workspace: Workspace, env: Mapping[str, str], found: ToolchainProbe) -> ToolchainProbe:
    """A toolkit without cuBLAS: install the pinned wheel into the workspace, then probe again.

    Anything else missing (nvcc, cmake, a compiler) is the user's to install: the probe says what.
    """
    if found.status is not Status.MISSING or found.tool != "cuBLAS":
        return found
    pin = _cublas_pin(parse_version(found.version))
    if pin is None:
        return found
    toolchains.ensure(workspace, env, pin)
    return probe(env)


def environment(env: Mapping[str, str], probe: ToolchainProbe) -> dict[str, str]:
    """Point CMake at the real toolkit (a wrapper's directory has no headers or libraries)."""
    out: dict[str, str] = {}
    if "nvcc" in probe.locations:
        out["CUDACXX"] = probe.locations["nvcc"]
        out["CUDAToolkit_ROOT"] = probe.locations["cuda_root"]
    return out


def certifiable(env: Mapping[str, str], probe: ToolchainProbe) -> tuple[bool, str]:
    smi = which("nvidia-smi", env)
    listing = tool_output(smi, ["-L"], env) if smi else None
    if listing and "GPU " in listing:
        return True, listing.strip().splitlines()[0]
    return False, "no NVIDIA GPU here (compile-only)"
