"""The pinned tree's own model-fixture generator, built against the CPU lane's static libraries.

llama.cpp's ``tests/test-llama-archs.cpp`` writes a small random model of every architecture it knows
(``-a ARCH -s SEED -o DIR`` saves ``ARCH-dense.gguf`` and, where the architecture has experts,
``ARCH-moe.gguf``) with llama-model-saver: the tensors upstream's loader asks for, including ones our
own generator does not write (per-tensor ``.scale`` / ``.input_scale``, ``rope_freqs`` shared by every
layer, biases).  ``dgr roster`` stages every model it writes; the hostile-input tests load them, so the
patch stack meets files it was not written against.

The CPU lane builds libllama and libllama-common statically with tests off; compiling the one source
file against those archives takes seconds, where turning the tree's tests on would add a build of
every test to every lane's key.

Depth: the generator gives most architectures 2 layers, which admit one cut and no placement of three
stages.  ``build_generator(..., n_layer=N)`` compiles a copy of the source with that default raised
(architectures the source gives a depth of their own, such as llama4 or nemotron_h, keep theirs).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from core import proc
from core.errors import CommandTimeout, RuntimeFailure

SOURCE = "tests/test-llama-archs.cpp"
NAMES_SOURCE = "src/llama-arch.cpp"  # LLM_ARCH_NAMES: what llm_arch_all() walks, and the generator with it
SAVER_SOURCE = "src/llama-model-saver.cpp"  # llama_model_saver_supports_arch: what the generator can write
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
# Seconds the generator may print nothing: it writes every model of one architecture in well under one.
GENERATOR_TIMEOUT = 120
SEED = "1"  # upstream's own (the ctest of test-recurrent-state-rollback); every roster fixture has it
VARIANTS = ("dense", "moe")  # the files the generator writes per architecture: ARCH-dense.gguf, ARCH-moe.gguf

_DEFAULT_DEPTH = re.compile(r"(\buint32_t\s+n_layer\s*=\s*)(\d+)(\s*;)")
_NAMES_TABLE = re.compile(r"LLM_ARCH_NAMES\s*=\s*\{(.*?)\n\};", re.S)
_NAME = re.compile(r'\{\s*LLM_ARCH_(\w+)\s*,\s*"([^"]+)"\s*\}')
# `if (arch == LLM_ARCH_X || ...) { return false; // why }` (or `continue;`), the comment optional
_SKIP = re.compile(
    r"if \(([^{]*?)\)\s*\{\s*(?:return false|continue);[ \t]*(?://[ \t]*(.*?))?\s*\n\s*\}", re.S
)
_PREPROCESSED = re.compile(r"^#if.*?^#endif[^\n]*", re.S | re.M)  # another backend's exceptions
_ENUM = re.compile(r"LLM_ARCH_(\w+)")


def folder(workspace_root: Path, build_key: str, n_layer: int) -> Path:
    """Where the generator of one CPU lane build (whose key covers the tree) at one depth and its models
    are kept: ``dgr roster`` and the generated sets of roster fixtures (fetch.arch_fixture) share it."""
    return workspace_root / "roster" / f"{build_key[:16]}-{n_layer}-layers"


def _cache_value(build_dir: Path, name: str) -> str:
    found = re.search(rf"^{name}:[A-Z]+=(.*)$", (build_dir / "CMakeCache.txt").read_text(), re.M)
    return found.group(1) if found else ""


def _archives(build_dir: Path) -> list[str]:
    paths = []
    for name in ARCHIVES:
        found = sorted((build_dir / "llama").rglob(name))
        if not found:
            raise RuntimeFailure(
                f"{name} is not in the CPU lane build {build_dir}: the build changed shape",
                hint="rebuild it with `dgr build --lane cpu`",
            )
        paths.append(str(found[0]))
    return paths


def source_at_depth(tree: Path, n_layer: int, out_dir: Path) -> Path:
    """A copy of the generator's source whose default depth is ``n_layer`` (its includes still resolve
    through the tree's include folders)."""
    text = (tree / SOURCE).read_text()
    found = _DEFAULT_DEPTH.findall(text)
    if len(found) != 1:
        raise RuntimeFailure(
            f"{tree / SOURCE}: expected one `uint32_t n_layer = N;` (the fixtures' default depth), "
            f"found {len(found)}: the generator changed shape",
            hint="build it at the tree's own depth (no n_layer) or update lanes/arch_fixtures.py",
        )
    copy = out_dir / Path(SOURCE).name
    copy.write_text(_DEFAULT_DEPTH.sub(rf"\g<1>{n_layer}\g<3>", text))
    return copy


def build_generator(tree: Path, build_dir: Path, out: Path, *, n_layer: int | None = None) -> Path:
    """Compile the tree's fixture generator at ``out`` with the lane's own compiler and OpenMP flags;
    ``n_layer``: the default depth of its models (None: the source's own, 2)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    source = tree / SOURCE if n_layer is None else source_at_depth(tree, n_layer, out.parent)
    compiler = _cache_value(build_dir, "CMAKE_CXX_COMPILER") or "c++"
    includes = [f"-I{tree / d}" for d in ("include", "src", "common", "ggml/include", "vendor")]
    argv = [
        compiler,
        "-std=c++17",
        "-O1",
        *_cache_value(build_dir, "OpenMP_CXX_FLAGS").split(),
        *includes,
        str(source),
        "-o",
        str(out),
        *_archives(build_dir),
        "-lpthread",
        "-ldl",
    ]
    proc.run(argv, no_output_timeout=600)
    return out


def generator_in(where: Path, tree: Path, build_dir: Path, n_layer: int) -> Path:
    """The generator at this depth in ``where`` (``folder``), built there on first use."""
    out = where / "test-llama-archs"
    if not out.is_file():
        where.mkdir(parents=True, exist_ok=True)
        part = where / f"test-llama-archs.{os.getpid()}.part"  # another run may be building it too
        build_generator(tree, build_dir, part, n_layer=n_layer)
        part.replace(out)  # whole or absent: a build cut short is never taken for the generator
    return out


def _names(tree: Path) -> dict[str, str]:
    """LLM_ARCH_ enum suffix -> the architecture's name, from the tree's LLM_ARCH_NAMES table."""
    found = _NAMES_TABLE.search((tree / NAMES_SOURCE).read_text())
    names = {enum: name for enum, name in _NAME.findall(found.group(1)) if enum != "UNKNOWN"} if found else {}
    if not names:
        raise RuntimeFailure(f"{tree / NAMES_SOURCE}: no LLM_ARCH_NAMES table: the tree changed shape")
    return names


def architectures(tree: Path) -> tuple[str, ...]:
    """Every architecture name the tree knows (its LLM_ARCH_NAMES table, which the generator walks),
    sorted; the table's placeholder for an unknown architecture is left out."""
    return tuple(sorted(_names(tree).values()))


def _body(text: str, signature: str) -> str:
    """The body of the function ``signature`` starts (to the first closing brace in column 0)."""
    start = text.find(signature)
    return "" if start < 0 else text[start : text.find("\n}", start)]


def _skips(body: str, names: Mapping[str, str], why: str) -> dict[str, str]:
    """name -> reason for each architecture an `if (...) { return false; }` or `continue;` of ``body``
    names: its comment, else ``why``."""
    out: dict[str, str] = {}
    for condition, comment in _SKIP.findall(_PREPROCESSED.sub("", body)):
        comment = comment.strip().rstrip(".")  # the row's reason goes on after it
        said = f"test-llama-archs: {comment}" if comment else why
        for enum in _ENUM.findall(condition):
            if enum in names:
                out.setdefault(names[enum], said)
    return out


def skipped(tree: Path) -> dict[str, str]:
    """Why the generator writes no model of an architecture, as the tree's sources say: its own skips
    (each with its comment) and what llama_model_saver cannot write.  The generator's output does not
    say it reliably (its log lines go through a thread that a short run exits before)."""
    names = _names(tree)
    source = (tree / SOURCE).read_text()
    saver = _body((tree / SAVER_SOURCE).read_text(), "bool llama_model_saver_supports_arch(")
    unsaved = saver.split("return false;")[0] if "return false;" in saver else ""
    out = _skips(_body(source, "static int save_models("), names, "test-llama-archs skips it")
    for enum in _ENUM.findall(unsaved):
        if enum in names:
            out.setdefault(names[enum], "llama_model_saver cannot write it")
    unsupported = "test-llama-archs marks it unsupported"
    for name, why in _skips(_body(source, "static bool arch_supported("), names, unsupported).items():
        out.setdefault(name, why)
    return out


@dataclass(frozen=True, kw_only=True)
class Fixtures:
    """What the generator wrote for one architecture, or why it wrote nothing."""

    arch: str
    models: Mapping[str, Path] = field(default_factory=dict[str, Path])  # variant -> file
    note: str = ""  # why there is no model ("" when it wrote one)


def why_none(output: str, returncode: int, known: str | None) -> str:
    """Why the generator wrote no model: how it exited when it failed, else what its source says
    (``known``, from ``skipped``)."""
    if returncode != 0:
        last = [line.strip() for line in output.splitlines() if line.strip()][-1:]
        return f"the generator exited {returncode}" + (f": {last[0]}" if last else "")
    return known or "the generator wrote no model of it"


def fixtures(
    generator: Path, arch: str, out_dir: Path, *, known: str | None = None, seed: str = SEED
) -> Fixtures:
    """The generator's models of ``arch`` in ``out_dir`` (written with ``seed`` when absent), one
    generator process per architecture so that one crash costs one architecture.  Each file is written
    in a folder of its own and moved in whole, so a model found in ``out_dir`` is a finished one.
    ``known``: the source's reason should it write none (``skipped``)."""
    found = {v: out_dir / f"{arch}-{v}.gguf" for v in VARIANTS}
    if not any(p.is_file() for p in found.values()):
        out_dir.mkdir(parents=True, exist_ok=True)
        part = Path(tempfile.mkdtemp(prefix=f".{arch}.", suffix=".part", dir=out_dir))  # one per run
        argv = [generator, "-a", arch, "-s", seed, "-o", part]
        try:
            done = proc.run(argv, check=False, no_output_timeout=GENERATOR_TIMEOUT)
        except CommandTimeout as exc:  # a hang costs this architecture, not the run
            shutil.rmtree(part, ignore_errors=True)
            return Fixtures(arch=arch, note=f"the generator hung: {exc.message}")
        if done.returncode == 0:
            for path in found.values():
                if (part / path.name).is_file():
                    (part / path.name).replace(path)
        shutil.rmtree(part, ignore_errors=True)
        if not any(p.is_file() for p in found.values()):
            return Fixtures(arch=arch, note=why_none(done.output, done.returncode, known))
    return Fixtures(arch=arch, models={v: p for v, p in found.items() if p.is_file()})


def models(
    where: Path, tree: Path, build_dir: Path, arch: str, n_layer: int, *, seed: int = int(SEED)
) -> Mapping[str, Path]:
    """The generator's models of ``arch`` at ``n_layer`` layers (variant -> file), kept in ``where``
    (``folder``) beside the generator, both made there when absent (upstream's seed: the roster's own
    files): what a generated set of a roster fixture is made from (fetch.arch_fixture).  RuntimeFailure
    with the reason when it writes none."""
    generator = generator_in(where, tree, build_dir, n_layer)
    out = where / ("fixtures" if str(seed) == SEED else f"fixtures-seed-{seed}")
    got = fixtures(generator, arch, out, known=skipped(tree).get(arch), seed=str(seed))
    if not got.models:
        raise RuntimeFailure(f"the pinned tree's fixture generator wrote no model of {arch}: {got.note}")
    return got.models


def generate(generator: Path, arch: str, out_dir: Path) -> dict[str, Path]:
    """The generator's models of ``arch`` ({"dense": path, "moe": path} as it wrote them, upstream's
    seed), through ``fixtures``; RuntimeFailure when it wrote no dense model."""
    got = fixtures(generator, arch, out_dir)
    if "dense" not in got.models:
        said = f"{generator.name} -a {arch} -o {out_dir} wrote no {arch}-dense.gguf"
        raise RuntimeFailure(f"{said}: {got.note}")
    return dict(got.models)


def generated(generator: Path, arch: str, out: Path) -> Path:
    """``out/ARCH-dense.gguf`` (the upstream ctests' model), written by upstream's generator when absent."""
    return generate(generator, arch, out)["dense"]
