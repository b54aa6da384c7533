"""The system packages each lane needs: the one list (Debian/Ubuntu names, Homebrew where it differs).

Everything that names a system package reads it from here: `dgr doctor` (through ``lanes.cmake``),
`nox -s deps` (``ensure``), ``.ci/run`` and ``.github/workflows/certify.yml``::

    python3 -m lanes.packages cpu                 # the cpu lane's packages, one line
    python3 -m lanes.packages cpu vulkan tests    # several groups, each package once
    python3 -m lanes.packages --brew cpu          # Homebrew names (macOS)
    python3 -m lanes.packages ensure cpu          # install what is missing (root / sudo -n), else exit 4

Stdlib only: ``.ci/run`` and ``nox -s deps`` run this before the project is installed.
A part is looked for where the build looks (the PATH, pkg-config), not in dpkg's database, so a
gRPC built from source counts as present.
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# core.errors.ToolchainMissing.exit_code (this module may not import the project: see above).
EXIT_TOOLCHAIN = 4
EXIT_RUNTIME = 6  # core.errors.RuntimeFailure.exit_code


class NoAnswer(RuntimeError):
    """A probe that did not answer in time: neither present nor absent (the caller says so)."""


PKG_CONFIG_TIMEOUT_S = 120.0  # milliseconds when the machine is not starved


@dataclass(frozen=True, kw_only=True)
class Part:
    """One thing a build needs, how to look for it and the package that provides it."""

    key: str
    what: str  # as doctor names it
    apt: str | None  # Debian/Ubuntu package
    brew: str | None = None  # Homebrew formula (None: comes with Xcode / the runner)
    programs: tuple[str, ...] = ()  # present when any of these is on the PATH
    module: str | None = None  # present when `pkg-config --exists MODULE` succeeds
    files: tuple[str, ...] = ()  # present when any of these glob patterns names a file (a library)
    optional: bool = False


def _parts(*parts: Part) -> dict[str, Part]:
    return {p.key: p for p in parts}


# The CPU lane (and the worker every lane builds): compiler, CMake, ninja, gRPC C++ and protobuf.
CPU = _parts(
    Part(
        key="c++",
        what="a C++17 compiler (c++, g++ or clang++)",
        apt="g++",
        programs=("c++", "g++", "clang++"),
    ),
    Part(key="cmake", what="cmake", apt="cmake", brew="cmake", programs=("cmake",)),
    Part(key="ninja", what="ninja", apt="ninja-build", brew="ninja", programs=("ninja",)),
    Part(key="pkg-config", what="pkg-config", apt="pkg-config", brew="pkgconf", programs=("pkg-config",)),
    Part(
        key="grpc++",
        what="gRPC C++ development files (pkg-config grpc++)",
        apt="libgrpc++-dev",
        brew="grpc",
        module="grpc++",
    ),
    Part(
        key="protobuf",
        what="protobuf development files (pkg-config protobuf)",
        apt="libprotobuf-dev",
        brew="protobuf",
        module="protobuf",
    ),
    Part(key="protoc", what="protoc", apt="protobuf-compiler", brew="protobuf", programs=("protoc",)),
    Part(
        key="grpc_cpp_plugin",
        what="grpc_cpp_plugin",
        apt="protobuf-compiler-grpc",
        brew="grpc",
        programs=("grpc_cpp_plugin",),
    ),
    Part(
        key="git",
        what="git (fetch; without it the sdist mirror is used)",
        apt="git",
        programs=("git",),
        optional=True,
    ),
    Part(
        key="ccache",
        what="ccache (fast rebuilds)",
        apt="ccache",
        brew="ccache",
        programs=("ccache",),
        optional=True,
    ),
)

# Groups: a lane's own parts come on top of the CPU lane's (every lane builds the gRPC worker).
GROUPS: dict[str, dict[str, Part]] = {
    "cpu": CPU,
    "cuda": _parts(
        Part(key="nvcc", what="the CUDA toolkit (nvcc)", apt="nvidia-cuda-toolkit", programs=("nvcc",)),
    ),
    # Debian 12's glslc and loader are new enough; the headers (too old there) the lane provisions.
    "vulkan": _parts(
        Part(key="glslc", what="glslc", apt="glslc", programs=("glslc",)),
        Part(key="libvulkan1", what="the Vulkan loader (libvulkan1)", apt="libvulkan1"),
        Part(
            key="lavapipe",
            what="Mesa's lavapipe (a software Vulkan driver)",
            apt="mesa-vulkan-drivers",
            optional=True,
        ),
    ),
    # ROCm comes from AMD's packages, Metal with Xcode: neither is an apt package here.
    "rocm": {},
    "metal": {},
    # Ubuntu 24.04's Vulkan headers are new enough (>= 1.3.272): CI installs them instead of provisioning.
    "vulkan-headers": _parts(
        Part(key="libvulkan-dev", what="Vulkan headers", apt="libvulkan-dev"),
        Part(key="spirv-headers", what="SPIRV-Headers", apt="spirv-headers"),
    ),
    # `nox -s fuzz`'s worker targets: clang with its libFuzzer and sanitizer runtimes (the runtimes are
    # only recommended by clang's packages, and apt-get here installs no recommends).
    "fuzz": _parts(
        Part(
            key="clang++",
            what="clang (the worker's libFuzzer targets)",
            apt="clang",
            brew="llvm",
            programs=("clang++",),
        ),
        Part(
            key="libfuzzer",
            what="clang's libFuzzer and sanitizer runtimes",
            apt="libclang-rt-dev",
            brew="llvm",
            files=("/usr/lib/llvm-*/lib/clang/*/lib/*/libclang_rt.fuzzer*.a",),
        ),
    ),
    # What the slow suite uses beyond the lanes: a real browser for the report test.
    "tests": _parts(
        Part(
            key="chromium",
            what="chromium (report rendering test)",
            apt="chromium",
            programs=("chromium", "chromium-browser"),
            optional=True,
        ),
    ),
}
LANES_ON_CPU = ("cuda", "rocm", "vulkan", "metal")  # groups that need the CPU lane's parts too


def parts(*groups: str) -> list[Part]:
    """The parts of ``groups`` in order, each once (a lane group brings the CPU lane's)."""
    out: dict[str, Part] = {}
    for group in groups:
        if group not in GROUPS:
            raise KeyError(f"unknown package group {group!r}: choose from {', '.join(GROUPS)}")
        if group in LANES_ON_CPU:
            out.update(CPU)
        out.update(GROUPS[group])
    return list(out.values())


def part(key: str) -> Part:
    for group in GROUPS.values():
        if key in group:
            return group[key]
    raise KeyError(key)


def names(items: Iterable[Part], *, brew: bool = False) -> list[str]:
    """Package names, each once, in order (parts without one on that system are left out)."""
    out: list[str] = []
    for p in items:
        name = p.brew if brew else p.apt
        if name and name not in out:
            out.append(name)
    return out


def apt_line(items: Iterable[Part]) -> str:
    """The exact command a user runs to install ``items``."""
    return shlex.join(["sudo", "apt-get", "install", "-y", *names(items)])


# --- looking for the parts ------------------------------------------------------------------------


def present(p: Part, env: Mapping[str, str]) -> bool:
    """Whether ``p`` is where the build looks for it (parts without a check count as present)."""
    path = env.get("PATH", os.defpath)
    if p.programs:
        wanted = list(p.programs)
        if p.key == "c++" and env.get("CXX", "").strip():
            wanted = [env["CXX"].split()[0]]  # CMake takes CXX first, so do we
        return any(_which(w, path) for w in wanted)
    if p.module:
        return module_version(p.module, env) is not None
    if p.files:
        return any(Path(hit).is_file() for pattern in p.files for hit in glob.glob(pattern))
    return True


def _which(program: str, path: str) -> str | None:
    if os.sep in program:
        return program if os.access(program, os.X_OK) and os.path.isfile(program) else None
    return shutil.which(program, path=path)


def module_version(module: str, env: Mapping[str, str]) -> str | None:
    """``pkg-config --modversion MODULE`` with ``env``'s PATH and PKG_CONFIG_PATH; None when absent."""
    pkg_config = _which("pkg-config", env.get("PATH", os.defpath))
    if pkg_config is None:
        return None
    answers = []
    for query in ("--exists", "--modversion"):  # --exists also resolves the module's Requires, as CMake does
        try:
            done = subprocess.run(
                [pkg_config, query, module],
                env=dict(env),
                capture_output=True,
                text=True,
                timeout=PKG_CONFIG_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            # Not an answer: read as "absent", one slow pkg-config under load made a lane with every
            # part installed report gRPC missing (the busy run on 37f0fda: 60-odd tests errored).
            raise NoAnswer(
                f"pkg-config {query} {module} did not answer within {PKG_CONFIG_TIMEOUT_S:.0f} s"
            ) from None
        except OSError:
            return None
        if done.returncode != 0:
            return None
        answers.append(done.stdout.split())
    return answers[-1][0] if answers[-1] else "unknown"


def missing(items: Iterable[Part], env: Mapping[str, str]) -> list[Part]:
    return [p for p in items if not present(p, env)]


def listed(items: Sequence[Part]) -> str:
    return f"missing {', '.join(p.what for p in items)}"


def describe(items: Sequence[Part]) -> str:
    """'missing protoc, grpc_cpp_plugin (sudo apt-get install -y ...)': what a probe says."""
    return f"{listed(items)} ({apt_line(items)})"


# --- installing them ------------------------------------------------------------------------------


def _privilege(env: Mapping[str, str]) -> list[str] | None:
    """[] as root, ['sudo', '-n'] with passwordless sudo, None when neither."""
    if os.geteuid() == 0:
        return []
    sudo = _which("sudo", env.get("PATH", os.defpath))
    if sudo is None:
        return None
    ok = subprocess.run([sudo, "-n", "true"], env=dict(env), capture_output=True, check=False)
    # sudo drops the environment: say noninteractive on its command line
    return [sudo, "-n", "env", "DEBIAN_FRONTEND=noninteractive"] if ok.returncode == 0 else None


def ensure(groups: Sequence[str], env: Mapping[str, str], *, run=subprocess.run) -> int:
    """Install the missing packages of ``groups`` with apt-get; 0 when all required parts are there.

    Only when a required part is missing does anything run (one ``apt-get update``, then one install
    of every missing package, optional ones included).  Without root, passwordless sudo or apt-get:
    exit 4, printing the exact install line, and nothing else has started.
    """
    wanted = parts(*groups)
    lacking = missing(wanted, env)
    required = [p for p in lacking if not p.optional]
    label = " and ".join(f"{g} lane" if g in LANES_ON_CPU or g == "cpu" else g for g in groups)
    if not required:
        if lacking:
            print(
                f"deps: {label}: all required parts present; optional, not installed: "
                f"{', '.join(p.what for p in lacking)} ({apt_line(lacking)})",
                flush=True,
            )
        return 0
    apt_get = _which("apt-get", env.get("PATH", os.defpath))
    prefix = _privilege(env) if apt_get else None
    if apt_get is None or prefix is None:
        why = "no apt-get on this machine" if apt_get is None else "not root and no passwordless sudo"
        print(
            f"dgr: toolchain not found: {label}: {listed(required)}; {why}, so install them yourself: "
            f"{apt_line(lacking)}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_TOOLCHAIN
    failed = _apt_install([*prefix, apt_get], lacking, env, run=run)
    if failed:
        print(
            f"{failed.tail}\ndgr: toolchain not found: {label}: `{shlex.join(failed.argv)}` exited "
            f"{failed.returncode}; install them yourself: {apt_line(lacking)}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_TOOLCHAIN
    still = [p for p in missing(wanted, env) if not p.optional]
    if still:
        print(
            f"dgr: toolchain not found: {label}: installed, yet {describe(still)}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_TOOLCHAIN
    return 0


@dataclass(frozen=True)
class AptFailed:
    argv: list[str]
    returncode: int
    tail: str  # apt's and dpkg's last lines


def _apt_install(apt: list[str], lacking: Sequence[Part], env: Mapping[str, str], *, run) -> AptFailed | None:
    """`apt-get update`, then one install of every package of ``lacking``; the first command that fails."""
    packages = names(lacking)
    print(
        f"deps: installing {' '.join(packages)} with apt-get (missing: {', '.join(p.what for p in lacking)})",
        flush=True,
    )
    apt_env = {**env, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        [*apt, "update", "-qq"],
        [*apt, "install", "-y", "-qq", "--no-install-recommends", *packages],
    ):
        # apt's and dpkg's own chatter is shown only when they fail: the line above says what happens
        done = run(
            argv, env=apt_env, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        if done.returncode != 0:
            return AptFailed(argv, done.returncode, "\n".join((done.stdout or "").splitlines()[-15:]))
    return None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m lanes.packages", description=(__doc__ or "").split("\n\n")[0]
    )
    ap.add_argument("groups", nargs="+", metavar="GROUP", help=f"one or more of: ensure, {', '.join(GROUPS)}")
    ap.add_argument("--brew", action="store_true", help="print Homebrew names instead of Debian/Ubuntu ones")
    ap.add_argument("--required", action="store_true", help="leave the optional packages out")
    args = ap.parse_args(argv)
    groups = list(args.groups)
    do_ensure = groups[0] == "ensure"
    groups = groups[1:] if do_ensure else groups
    unknown = [g for g in groups if g not in GROUPS]
    if unknown or not groups:
        ap.error(f"unknown group {', '.join(unknown) or '(none)'}: choose from {', '.join(GROUPS)}")
    if do_ensure:
        try:
            return ensure(groups, os.environ)
        except NoAnswer as exc:
            print(f"lanes.packages: {exc}; run again", file=sys.stderr)
            return EXIT_RUNTIME
    chosen = [p for p in parts(*groups) if not (args.required and p.optional)]
    print(" ".join(names(chosen, brew=args.brew)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
