"""Vulkan lane: glslc, the Vulkan headers + loader, SPIRV-Headers, and ggml's Vulkan backend.

The pinned tree uses ``vk::LayerSettingEXT`` unconditionally (ggml-vulkan.cpp, instance creation),
which the Vulkan headers only define from 1.3.272 (VK_EXT_layer_settings).  Debian 12 ships 1.3.239,
so its libvulkan-dev is too old.  Hook for newer headers: set DGR_VULKAN_SDK (or VULKAN_SDK) to a
prefix holding include/vulkan/, bin/glslc and share/cmake/SPIRV-Headers (a LunarG SDK, or Debian 13's
libvulkan-dev/spirv-headers/glslc unpacked into one prefix); the probe looks there first and the
build hands it to CMake as VULKAN_SDK, which FindVulkan and ggml-vulkan both honour.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Mapping
from pathlib import Path

from lanes import cmake
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


def sdk_prefix(env: Mapping[str, str]) -> Path | None:
    raw = env.get("DGR_VULKAN_SDK") or env.get("VULKAN_SDK")
    return Path(raw) if raw and raw.strip() else None


def _prefixes(env: Mapping[str, str]) -> list[Path]:
    sdk = sdk_prefix(env)
    return ([sdk] if sdk else []) + [Path(p) for p in SYSTEM_PREFIXES]


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


def _spirv_headers(prefix: Path) -> bool:
    patterns = [
        "share/cmake/SPIRV-Headers*",
        "lib/cmake/SPIRV-Headers*",
        "lib/*/cmake/SPIRV-Headers*",
        "share/SPIRV-Headers*/cmake",
        "share/spirv-headers*",
    ]
    return any(glob.glob(str(prefix / p)) for p in patterns)


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
            reason=f"toolchain not found: glslc ({INSTALL})",
        )
    glslc_version = first_line(tool_output(glslc, ["--version"], env)) or "unknown"
    include = next((p / "include" for p in _prefixes(env) if header_version(p / "include") is not None), None)
    if include is None:
        return ToolchainProbe(
            lane=name,
            status=Status.MISSING,
            tool="vulkan headers",
            path=glslc,
            minimum=MINIMUM,
            reason=f"toolchain not found: vulkan/vulkan_core.h ({INSTALL})",
        )
    hv = header_version(include)
    shown = f"1.x.{hv}"
    if hv is None or hv < MINIMUM_HEADER or not has_layer_settings(include):
        return ToolchainProbe(
            lane=name,
            status=Status.TOO_OLD,
            tool="vulkan headers",
            version=shown,
            path=str(include),
            minimum=MINIMUM,
            reason=f"Vulkan headers in {include} (VK_HEADER_VERSION {hv}) lack vk::LayerSettingEXT, "
            f"which the pinned tree needs: {INSTALL}",
        )
    prefix = include.parent
    if not any(_spirv_headers(p) for p in [prefix, *map(Path, SYSTEM_PREFIXES)]):
        return ToolchainProbe(
            lane=name,
            status=Status.MISSING,
            tool="SPIRV-Headers",
            path=str(prefix),
            minimum=MINIMUM,
            reason=f"toolchain not found: SPIRV-Headers CMake package ({INSTALL})",
        )
    found = ToolchainProbe(
        lane=name,
        status=Status.OK,
        tool="vulkan headers",
        version=shown,
        path=str(include),
        minimum=MINIMUM,
        versions={"vulkan_headers": str(hv), "glslc": glslc_version},
        locations={"vulkan_prefix": str(prefix), "glslc": glslc},
    )
    return cmake.merge(found, cmake.probe_host(env))


def cmake_args(options: BuildOptions, probe: ToolchainProbe | None = None) -> list[str]:
    return [*cmake.common_args(options), cmake.define("GGML_VULKAN", "ON")]


def environment(env: Mapping[str, str], probe: ToolchainProbe) -> dict[str, str]:
    prefix = probe.locations.get("vulkan_prefix")
    if not prefix or prefix in SYSTEM_PREFIXES:
        return {}
    return {"VULKAN_SDK": prefix}


def certifiable(env: Mapping[str, str], probe: ToolchainProbe) -> tuple[bool, str]:
    """Mesa's lavapipe (a software rasterizer) is enough for the parity gates."""
    if not probe.usable:
        return False, "toolchain missing"
    icds = [d for p in ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d") for d in glob.glob(f"{p}/*.json")]
    if not icds:
        return False, "no Vulkan driver (install mesa-vulkan-drivers for lavapipe)"
    soft = [i for i in icds if "lvp" in Path(i).name]
    return True, "lavapipe (software rasterizer)" if soft and len(soft) == len(
        icds
    ) else f"{len(icds)} Vulkan ICD(s)"
