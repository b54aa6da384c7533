"""The pinned tree's own model-fixture generator, built in the test against the CPU lane's libraries.

llama.cpp's ``tests/test-llama-archs.cpp`` writes a small random model of every architecture it knows
(``-a ARCH -s SEED -o DIR`` saves ``ARCH-dense.gguf`` and, where the architecture has experts,
``ARCH-moe.gguf``) with llama-model-saver: the tensors upstream's loader asks for, including ones our
own generator does not write (per-tensor ``.scale`` / ``.input_scale``, ``rope_freqs`` shared by every
layer, biases).  Models from it are what hostile-input tests load, so the patch stack meets files it
was not written against.

The CPU lane builds libllama and libllama-common statically with tests off; compiling the one source
file against those archives takes seconds, where turning the tree's tests on would add a build of
every test to every lane's key.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from lanes import upstream_models

SOURCE = "tests/test-llama-archs.cpp"
# Link order: each archive before the ones it uses.
ARCHIVES = (
    "libllama-common.a",
    "libllama-common-base.a",
    "libllama.a",
    "libggml.a",
    "libggml-cpu.a",
    "libggml-base.a",
    "libcpp-httplib.a",
)


def _cache_value(build_dir: Path, name: str) -> str:
    found = re.search(rf"^{name}:[A-Z]+=(.*)$", (build_dir / "CMakeCache.txt").read_text(), re.M)
    return found.group(1) if found else ""


def _archives(build_dir: Path) -> list[str]:
    paths = []
    for name in ARCHIVES:
        found = sorted((build_dir / "llama").rglob(name))
        assert found, f"{name} not in {build_dir}: the CPU lane build changed shape"
        paths.append(str(found[0]))
    return paths


def build_generator(tree: Path, build_dir: Path, out: Path) -> Path:
    """Compile the tree's fixture generator at ``out`` with the lane's own compiler and OpenMP flags."""
    compiler = _cache_value(build_dir, "CMAKE_CXX_COMPILER") or "c++"
    includes = [f"-I{tree / d}" for d in ("include", "src", "common", "ggml/include", "vendor")]
    argv = [
        compiler,
        "-std=c++17",
        "-O1",
        *_cache_value(build_dir, "OpenMP_CXX_FLAGS").split(),
        *includes,
        str(tree / SOURCE),
        "-o",
        str(out),
        *_archives(build_dir),
        "-lpthread",
        "-ldl",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"building {SOURCE} failed:\n{done.stderr[-3000:]}"
    return out


def generate(generator: Path, arch: str, out_dir: Path) -> dict[str, Path]:
    """The generator's models of ``arch`` ({"dense": path, "moe": path} as it wrote them), through
    lanes.upstream_models (the upstream suites' own call, same seed)."""
    dense = upstream_models.generated(generator, arch, out_dir)
    moe = out_dir / f"{arch}-moe.gguf"
    return {"dense": dense, **({"moe": moe} if moe.is_file() else {})}
