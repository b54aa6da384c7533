"""CPU lane: the host C++ compiler and ggml's CPU backend. Certified here (no device needed).

Its probe is the host probe (``lanes.cmake.probe_host``): compiler, cmake, ninja, and what the worker
links (pkg-config's grpc++ and protobuf, protoc, grpc_cpp_plugin), every missing part named with the
package from ``lanes.packages``; ccache is optional and only noted.
"""

from __future__ import annotations

from collections.abc import Mapping

from lanes import cmake, packages
from lanes.base import BuildOptions, Status, ToolchainProbe

name = "cpu"
targets: tuple[str, ...] = ()
runner_labels: tuple[str, ...] = ("ubuntu-latest",)
TOOL_NAMES = {"gcc": "g++", "clang": "clang++"}
MINIMUM = "g++ 9 / clang++ 10, cmake 3.19"  # cmake.CXX_MINIMUM and cmake.CMAKE_MINIMUM


def probe(env: Mapping[str, str]) -> ToolchainProbe:
    host = cmake.probe_host(env)
    if host.problem:
        status = Status.TOO_OLD if host.problem_is_age else Status.MISSING
        return ToolchainProbe(
            lane=name,
            status=status,
            tool="c++",
            path=host.cxx,
            reason=host.problem,
            minimum=MINIMUM,
        )
    optional = packages.missing([packages.part("ccache")], env)
    return ToolchainProbe(
        lane=name,
        status=Status.OK,
        tool=TOOL_NAMES.get(host.cxx_id or "", "c++"),
        version=host.versions["cxx"].split()[-1],
        path=host.cxx,
        minimum=MINIMUM,
        # an OK probe's reason is a note, not a failure: the optional part that would help
        reason=f"optional: {packages.describe(optional)}" if optional else None,
        versions=dict(host.versions),
        locations=dict(host.worker),
    )


def cmake_args(options: BuildOptions, probe: ToolchainProbe | None = None) -> list[str]:
    return cmake.common_args(options)


def environment(env: Mapping[str, str], probe: ToolchainProbe) -> dict[str, str]:
    return {}


def certifiable(env: Mapping[str, str], probe: ToolchainProbe) -> tuple[bool, str]:
    return True, "runs on this CPU"
