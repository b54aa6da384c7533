"""Vulkan lane: glslc, the Vulkan headers + loader, SPIRV-Headers, and ggml's Vulkan backend.

The pinned tree uses ``vk::LayerSettingEXT`` unconditionally (ggml-vulkan.cpp, instance creation),
which the Vulkan headers only define from 1.3.272 (VK_EXT_layer_settings).  Debian 12 ships 1.3.239.
Headers are only headers: when the system's are too old the lane provisions Debian 13's
libvulkan-dev + spirv-headers (pinned in manifests/toolchains/vulkan-headers-debian13.json, verified
by sha256) into the workspace, and keeps Debian 12's own glslc and loader (Debian 13's binaries need
glibc 2.38).  A Vulkan SDK (DGR_VULKAN_SDK or VULKAN_SDK: include/vulkan/, bin/glslc,
share/cmake/SPIRV-Headers) is looked at first and handed to CMake as VULKAN_SDK.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Mapping
from pathlib import Path

from core.workspace import Workspace
from lanes import cmake, toolchains
from lanes.base import BuildOptions, Status, ToolchainProbe, first_line, tool_output, which

name = "vulkan"
targets: tuple[str, ...] = ()
# Ubuntu 24.04 ships Vulkan headers 1.3.275 (>= 272), glslc and Mesa's lavapipe.
runner_labels: tuple[str, ...] = ("ubuntu-24.04",)

MINIMUM_HEADER = 272  # VK_HEADER_VERSION that first defines vk::LayerSettingEXT
MINIMUM = f"Vulkan headers 1.3.{MINIMUM_HEADER} (vk::LayerSettingEXT)"
SYSTEM_PREFIXES = ("/usr", "/usr/local")
INSTALL = (
    "install Vulkan headers >= 1.3.272, glslc and SPIRV-Headers: Debian 13's libvulkan-dev glslc "
    "spirv-headers, or a Vulkan SDK with DGR_VULKAN_SDK=<prefix>"
)
# What a Debian 12 user installs from their own OS; the newer headers the lane provisions itself.
SYSTEM_INSTALL = (
    "apt-get install glslc libvulkan1 (Debian 12's are new enough; the lane provisions the headers)"
)
HEADERS_TOOLCHAIN = "vulkan-headers-debian13"
LOADER_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)


def sdk_prefix(env: Mapping[str, str]) -> Path | None:
    raw = env.get("DGR_VULKAN_SDK") or env.get("VULKAN_SDK")
    return Path(raw) if raw and raw.strip() else None


def _provisioned(env: Mapping[str, str]) -> Path | None:
    """The headers this lane provisioned into the workspace (None until `dgr build --lane vulkan`)."""
    return toolchains.installed(toolchains.workspace(env), toolchains.load(HEADERS_TOOLCHAIN))


def _prefixes(env: Mapping[str, str]) -> list[Path]:
    sdk = sdk_prefix(env)
    provisioned = _provisioned(env)
    # An SDK first, then the system's own; the provisioned copy when the system's are too old.
    system = [Path(p) for p in SYSTEM_PREFIXES]
    return ([sdk] if sdk else []) + system + ([provisioned] if provisioned else [])


def _loader(env: Mapping[str, str]) -> Path | None:
    """The Vulkan loader to link (libvulkan.so.1 is enough: ggml-vulkan loads entry points itself)."""
    sdk = sdk_prefix(env)
    dirs = ([sdk / "lib"] if sdk else []) + [Path(d) for d in LOADER_DIRS]
    names = ("libvulkan.so", "libvulkan.so.1")
    return next((d / n for d in dirs for n in names if (d / n).exists()), None)


SPIRV_CONFIG_DIRS = ("share/cmake/SPIRV-Headers*", "lib/cmake/SPIRV-Headers*", "lib/*/cmake/SPIRV-Headers*")


def _spirv_dir(prefixes: list[Path]) -> Path | None:
    """The directory holding SPIRVHeadersConfig.cmake / SPIRV-HeadersConfig.cmake."""
    for prefix in prefixes:
        for pattern in SPIRV_CONFIG_DIRS:
            for hit in sorted(glob.glob(str(prefix / pattern))):
                if glob.glob(f"{hit}/SPIRV-Headers*Config.cmake"):
                    return Path(hit)
    return None


def header_version(include: Path) -> int | None:
    """VK_HEADER_VERSION from vulkan_core.h, or None."""
    core = include / "vulkan" / "vulkan_core.h"
    try:
        text = core.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    m = re.search(r"^#define\s+VK_HEADER_VERSION\s+(\d+)", text, re.MULTILINE)
    return int(m.group(1)) if m else None


def has_layer_settings(include: Path) -> bool:
    """The exact thing the pinned tree needs: a C++ binding for VkLayerSettingEXT."""
    for hpp in ("vulkan_structs.hpp", "vulkan.hpp"):
        try:
            if "struct LayerSettingEXT" in (include / "vulkan" / hpp).read_text(
                encoding="utf-8", errors="replace"
            ):
                return True
        except OSError:
            continue
    return False


def _glslc(env: Mapping[str, str]) -> str | None:
    sdk = sdk_prefix(env)
    if sdk is not None and which(str(sdk / "bin" / "glslc"), env):
        return str(sdk / "bin" / "glslc")
    return which("glslc", env)


def probe(env: Mapping[str, str]) -> ToolchainProbe:
    glslc = _glslc(env)
    if glslc is None:
        return ToolchainProbe(
            lane=name,
            status=Status.MISSING,
            tool="glslc",
            minimum=MINIMUM,
            reason=f"toolchain not found: glslc ({SYSTEM_INSTALL}; or {INSTALL})",
        )
    glslc_version = first_line(tool_output(glslc, ["--version"], env)) or "unknown"
    loader = _loader(env)
    if loader is None:
        return ToolchainProbe(
            lane=name,
            status=Status.MISSING,
            tool="vulkan loader",
            path=glslc,
            minimum=MINIMUM,
            reason=f"toolchain not found: the Vulkan loader libvulkan.so.1 ({SYSTEM_INSTALL})",
        )
    prefixes = _prefixes(env)
    headers = _header_versions(prefixes)
    include = next((i for i, hv in headers.items() if hv >= MINIMUM_HEADER and has_layer_settings(i)), None)
    if include is None:
        return _unusable_headers(headers)
    prefix = include.parent
    spirv = _spirv_dir([prefix, *prefixes])
    if spirv is None:
        return ToolchainProbe(
            lane=name,
            status=Status.MISSING,
            tool="SPIRV-Headers",
            path=str(prefix),
            minimum=MINIMUM,
            reason=f"toolchain not found: SPIRV-Headers CMake package (`dgr build --lane vulkan` "
            f"provisions Debian 13's spirv-headers; or {INSTALL})",
        )
    found = _found(include, headers[include], spirv, loader=loader, glslc=glslc, glslc_version=glslc_version)
    return cmake.merge(found, cmake.probe_host(env))


def _header_versions(prefixes: list[Path]) -> dict[Path, int]:
    """include dir -> VK_HEADER_VERSION for each prefix that has vulkan_core.h, in prefix order
    (the file is about a megabyte: each prefix's is read once)."""
    header_versions = {p / "include": header_version(p / "include") for p in prefixes}
    return {i: hv for i, hv in header_versions.items() if hv is not None}


def _unusable_headers(headers: Mapping[Path, int]) -> ToolchainProbe:
    """No prefix has headers the pinned tree builds with: MISSING when none has any, else TOO_OLD
    naming the newest found (the one an upgrade would replace)."""
    newest = max(headers, key=headers.__getitem__, default=None)
    hv = headers[newest] if newest is not None else None
    fix = f"`dgr build --lane vulkan` provisions Debian 13's into the workspace; or {INSTALL}"
    return ToolchainProbe(
        lane=name,
        status=Status.MISSING if newest is None else Status.TOO_OLD,
        tool="vulkan headers",
        version=f"1.x.{hv}" if hv is not None else None,
        path=str(newest) if newest is not None else None,
        minimum=MINIMUM,
        reason=(
            f"toolchain not found: vulkan/vulkan_core.h ({fix})"
            if newest is None
            else f"Vulkan headers in {newest} (VK_HEADER_VERSION {hv}) lack vk::LayerSettingEXT, "
            f"which the pinned tree needs: {fix}"
        ),
    )


def _found(
    include: Path, hv: int, spirv: Path, *, loader: Path, glslc: str, glslc_version: str
) -> ToolchainProbe:
    """The usable toolchain: versions feed the build key, locations only the CMake arguments."""
    prefix = include.parent
    return ToolchainProbe(
        lane=name,
        status=Status.OK,
        tool="vulkan headers",
        version=f"1.x.{hv}",
        path=str(include),
        minimum=MINIMUM,
        versions={"vulkan_headers": str(hv), "glslc": glslc_version, "spirv_headers": _spirv_version(spirv)},
        locations={
            "vulkan_prefix": str(prefix),
            "vulkan_include": str(include),
            "vulkan_loader": str(loader),
            "spirv_headers_dir": str(spirv),
            "glslc": glslc,
        },
    )


def _spirv_version(config_dir: Path) -> str:
    """PACKAGE_VERSION from SPIRV-Headers' ConfigVersion file (the build key's part)."""
    for path in sorted(config_dir.glob("*ConfigVersion.cmake")):
        m = re.search(r'set\(PACKAGE_VERSION\s+"([^"]+)"', path.read_text(encoding="utf-8", errors="replace"))
        if m:
            return m.group(1)
    return "unknown"


def provision(workspace: Workspace, env: Mapping[str, str], found: ToolchainProbe) -> ToolchainProbe:
    """Headers too old or missing: provision the pinned Debian 13 headers, then probe again.

    glslc and the loader are binaries the OS must provide (Debian 13's need a newer glibc).
    """
    if found.usable or found.tool not in ("vulkan headers", "SPIRV-Headers"):
        return found
    toolchains.ensure(workspace, env, toolchains.load(HEADERS_TOOLCHAIN))
    return probe(env)


def cmake_args(options: BuildOptions, probe: ToolchainProbe | None = None) -> list[str]:
    return [*cmake.common_args(options), cmake.define("GGML_VULKAN", "ON")]


def location_args(probe: ToolchainProbe, host: cmake.HostTools) -> list[str]:
    """Exactly which headers, loader, glslc and SPIRV-Headers (paths: provenance, not key)."""
    where = probe.locations
    pairs = (
        ("Vulkan_INCLUDE_DIR", "vulkan_include"),
        ("Vulkan_LIBRARY", "vulkan_loader"),
        ("Vulkan_GLSLC_EXECUTABLE", "glslc"),
        ("SPIRV-Headers_DIR", "spirv_headers_dir"),
    )
    return [cmake.define(var, where[key]) for var, key in pairs if where.get(key)]


def environment(env: Mapping[str, str], probe: ToolchainProbe) -> dict[str, str]:
    sdk = sdk_prefix(env)
    if sdk is None or probe.locations.get("vulkan_prefix") != str(sdk):
        return {}
    return {"VULKAN_SDK": str(sdk)}


ICD_DIRS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d")


def icd_files(env: Mapping[str, str]) -> list[Path]:
    """The Vulkan driver manifests the loader will use: VK_DRIVER_FILES / VK_ICD_FILENAMES, else icd.d."""
    for var in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES"):
        if env.get(var, "").strip():
            return [Path(p) for p in env[var].split(":") if p.strip()]
    return [Path(f) for d in ICD_DIRS for f in sorted(glob.glob(f"{d}/*.json"))]


def _lavapipe_only(icds: list[Path]) -> bool:
    return bool(icds) and all(i.name.startswith("lvp_icd") for i in icds)


def worker_environment(env: Mapping[str, str]) -> dict[str, str]:
    """ggml skips CPU-type Vulkan devices unless named: with only lavapipe to use, name device 0."""
    if env.get("GGML_VK_VISIBLE_DEVICES", "").strip() or not _lavapipe_only(icd_files(env)):
        return {}
    return {"GGML_VK_VISIBLE_DEVICES": "0"}


def certifiable(env: Mapping[str, str], probe: ToolchainProbe) -> tuple[bool, str]:
    """Mesa's lavapipe (a software rasterizer) is enough for the parity gates."""
    icds = [i for i in icd_files(env) if i.is_file()]
    if not icds:
        return False, "no Vulkan driver (install mesa-vulkan-drivers for lavapipe)"
    if _lavapipe_only(icds):
        return True, "lavapipe (software rasterizer)"
    return True, f"{len(icds)} Vulkan ICD(s); for lavapipe set VK_ICD_FILENAMES to its lvp_icd manifest"
