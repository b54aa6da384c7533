"""Metal lane: Apple's Metal backend, built on macOS with Xcode (xcrun finds the metal compiler)."""

from __future__ import annotations

import sys
from collections.abc import Mapping

from lanes import cmake
from lanes.base import BuildOptions, Status, ToolchainProbe, first_line, tool_output, which

name = "metal"
targets: tuple[str, ...] = ()
runner_labels: tuple[str, ...] = ("macos-14",)

MINIMUM = "macOS with Xcode command line tools (xcrun metal)"
INSTALL = "build this lane on macOS with Xcode installed (xcode-select --install)"


def probe(env: Mapping[str, str], *, platform: str = sys.platform) -> ToolchainProbe:
    if platform != "darwin":
        return ToolchainProbe(
            lane=name,
            status=Status.MISSING,
            tool="xcrun",
            minimum=MINIMUM,
            reason=f"toolchain not found: Metal needs macOS with Xcode (this is {platform})",
        )
    xcrun = which("xcrun", env)
    if xcrun is None:
        return ToolchainProbe(
            lane=name,
            status=Status.MISSING,
            tool="xcrun",
            minimum=MINIMUM,
            reason=f"toolchain not found: xcrun ({INSTALL})",
        )
    metal = first_line(tool_output(xcrun, ["--find", "metal"], env))
    if not metal:
        return ToolchainProbe(
            lane=name,
            status=Status.MISSING,
            tool="metal",
            path=xcrun,
            minimum=MINIMUM,
            reason=f"toolchain not found: the metal compiler (xcrun --find metal failed; {INSTALL})",
        )
    version = first_line(tool_output(xcrun, ["--show-sdk-version"], env)) or "unknown"
    found = ToolchainProbe(
        lane=name,
        status=Status.OK,
        tool="metal",
        version=version,
        path=metal,
        minimum=MINIMUM,
        versions={"macos_sdk": version},
    )
    return cmake.merge(found, cmake.probe_host(env))


def cmake_args(options: BuildOptions, probe: ToolchainProbe | None = None) -> list[str]:
    # The embedded library puts the compiled shaders inside the binary: nothing to ship beside it.
    return [
        *cmake.common_args(options),
        cmake.define("GGML_METAL", "ON"),
        cmake.define("GGML_METAL_EMBED_LIBRARY", "ON"),
    ]


def environment(env: Mapping[str, str], probe: ToolchainProbe) -> dict[str, str]:
    return {}


def certifiable(env: Mapping[str, str], probe: ToolchainProbe) -> tuple[bool, str]:
    return True, "Apple GPU (Metal)"
