"""lanes/arch_fixtures.py without a build: the architecture names and the generator's skips read from a
tree's sources (another backend's exceptions left out), the generator's depth set in a copy of its
source, and the fixtures a generator writes (a real executable script here) taken whole or not at all."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from core.errors import RuntimeFailure
from lanes import arch_fixtures

ARCH_NAMES = """static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {
    { LLM_ARCH_LLAMA,            "llama"            },
    { LLM_ARCH_BERT,             "bert"             },
    { LLM_ARCH_GEMMA3,           "gemma3"           },
    { LLM_ARCH_RWKV7,            "rwkv7"            },
    { LLM_ARCH_JAMBA,            "jamba"            },
    { LLM_ARCH_EAGLE3,           "eagle3"           },
    { LLM_ARCH_DEEPSEEK4,        "deepseek4"        },
    { LLM_ARCH_UNKNOWN,          "(unknown)"        },
};

std::vector<llm_arch> llm_arch_all() {
"""

GENERATOR = """static gguf_context_ptr get_gguf_ctx(const llm_arch arch, const bool moe) {
    uint32_t n_vocab = 128;
    uint32_t n_layer = 2;
    if (arch == LLM_ARCH_LLAMA4) {
        n_layer = 4; // hparams.n_no_rope_layer_step is hard-coded to 4
    }
}

static bool arch_supported(const llm_arch arch) {
    if (arch == LLM_ARCH_RWKV7 || arch == LLM_ARCH_BERT) {
        return false; // FIXME RWKV models hang indefinitely.
    }
    if (arch == LLM_ARCH_DEEPSEEK4) {
        return false;
    }
#ifdef GGML_USE_HIP
    if (arch == LLM_ARCH_JAMBA) {
        return false;
    }
#endif // GGML_USE_HIP
    return true;
}

static int save_models(const llm_arch target_arch, const size_t seed) {
    for (const llm_arch & arch : llm_arch_all()) {
        if (arch == LLM_ARCH_UNKNOWN) {
            continue;
        }
        if (arch == LLM_ARCH_EAGLE3) {
            continue;
        }
    }
}
"""

SAVER = """bool llama_model_saver_supports_arch(llm_arch arch) {
    switch (arch) {
        case LLM_ARCH_GEMMA3:
        case LLM_ARCH_BERT:
            return false;
        default:
            return true;
    }
}
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for rel, text in (
        (arch_fixtures.NAMES_SOURCE, ARCH_NAMES),
        (arch_fixtures.SOURCE, GENERATOR),
        (arch_fixtures.SAVER_SOURCE, SAVER),
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_the_tree_names_its_architectures_and_why_the_generator_skips_some(tree: Path) -> None:
    assert arch_fixtures.architectures(tree) == (
        "bert",
        "deepseek4",
        "eagle3",
        "gemma3",
        "jamba",
        "llama",
        "rwkv7",
    )
    assert arch_fixtures.skipped(tree) == {
        "eagle3": "test-llama-archs skips it",
        "gemma3": "llama_model_saver cannot write it",
        "bert": "llama_model_saver cannot write it",  # the saver is asked first, as the generator does
        "rwkv7": "test-llama-archs: FIXME RWKV models hang indefinitely",
        "deepseek4": "test-llama-archs marks it unsupported",
        # jamba: only another backend (HIP) skips it, so it is generated here
    }


def test_a_tree_without_the_names_table_is_one_line(tree: Path) -> None:
    (tree / arch_fixtures.NAMES_SOURCE).write_text("// moved\n")
    with pytest.raises(RuntimeFailure, match="no LLM_ARCH_NAMES table: the tree changed shape"):
        arch_fixtures.architectures(tree)


def test_the_depth_is_set_in_a_copy_of_the_source_only(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "gen"
    out.mkdir()
    copy = arch_fixtures.source_at_depth(tree, 4, out)
    assert "uint32_t n_layer = 4;" in copy.read_text() and "n_layer = 4; // hparams" in copy.read_text()
    assert "uint32_t n_layer = 2;" in (tree / arch_fixtures.SOURCE).read_text()
    (tree / arch_fixtures.SOURCE).write_text(GENERATOR.replace("uint32_t n_layer = 2;", "int depth = 2;"))
    with pytest.raises(RuntimeFailure, match="found 0: the generator changed shape"):
        arch_fixtures.source_at_depth(tree, 4, out)


# A generator with test-llama-archs' command line (-a ARCH -s SEED -o DIR) that writes what its
# architecture's name says, and counts its runs.
SCRIPT = """#!{python}
import sys, pathlib
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
arch, out = args["-a"], pathlib.Path(args["-o"])
with open({runs!r}, "a") as f:
    f.write(arch + " " + args["-s"] + "\\n")
if arch == "hang":
    print("main: using seed 1", flush=True)
    import time
    time.sleep(60)
if arch == "crash":
    (out / "crash-dense.gguf").write_bytes(b"GG")  # cut short
    print("main: using seed 1\\nGGML_ASSERT(n_layer > 0) failed", file=sys.stderr)
    sys.exit(134)
if arch != "none":
    (out / (arch + "-dense.gguf")).write_bytes(b"GGUF")
    (out / (arch + "-moe.gguf")).write_bytes(b"GGUF")
"""


@pytest.fixture
def generator(tmp_path: Path) -> Path:
    path = tmp_path / "test-llama-archs"
    path.write_text(SCRIPT.format(python=sys.executable, runs=os.fspath(tmp_path / "runs")))
    path.chmod(0o755)
    return path


def test_fixtures_are_generated_once_and_moved_in_whole(generator: Path, tmp_path: Path) -> None:
    out = tmp_path / "fixtures"
    got = arch_fixtures.fixtures(generator, "llama", out)
    assert got.models == {"dense": out / "llama-dense.gguf", "moe": out / "llama-moe.gguf"} and got.note == ""
    assert arch_fixtures.fixtures(generator, "llama", out) == got
    assert (tmp_path / "runs").read_text() == "llama 1\n"  # upstream's seed; the second call found them
    assert sorted(p.name for p in out.iterdir()) == ["llama-dense.gguf", "llama-moe.gguf"]


def test_no_fixture_is_named_with_the_sources_reason_or_how_the_generator_ended(
    generator: Path, tmp_path: Path
) -> None:
    out = tmp_path / "fixtures"
    none = arch_fixtures.fixtures(generator, "none", out, known="llama_model_saver cannot write it")
    assert none.models == {} and none.note == "llama_model_saver cannot write it"
    crash = arch_fixtures.fixtures(generator, "crash", out)
    assert crash.note == "the generator exited 134: GGML_ASSERT(n_layer > 0) failed"
    assert list(out.iterdir()) == []  # nothing half-written is left to be taken for a fixture


def test_a_generator_that_hangs_costs_its_architecture_only(
    generator: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arch_fixtures, "GENERATOR_TIMEOUT", 1)
    hung = arch_fixtures.fixtures(generator, "hang", tmp_path / "fixtures")
    assert hung.models == {} and hung.note.startswith("the generator hung: ")
    assert list((tmp_path / "fixtures").iterdir()) == []


def test_a_generated_set_takes_the_generators_models_from_the_folder_the_roster_keeps(
    generator: Path, tree: Path, tmp_path: Path
) -> None:
    """``models`` (what Tools.fixture runs for fetch.arch_fixture): the generator found in the folder is
    used as it is (no build), upstream's seed writes into the roster's own fixtures, another seed beside
    them, and an architecture it writes nothing of is a RuntimeFailure with the reason."""
    where = arch_fixtures.folder(tmp_path / "work", "0123456789abcdef" * 4, 8)
    assert where == tmp_path / "work" / "roster" / "0123456789abcdef-8-layers"
    where.mkdir(parents=True)
    (where / "test-llama-archs").write_bytes(generator.read_bytes())
    (where / "test-llama-archs").chmod(0o755)
    got = arch_fixtures.models(where, tree, tmp_path / "no-build", "llama", 8)
    assert got == {v: where / "fixtures" / f"llama-{v}.gguf" for v in ("dense", "moe")}
    other = arch_fixtures.models(where, tree, tmp_path / "no-build", "llama", 8, seed=7)
    assert other["dense"] == where / "fixtures-seed-7" / "llama-dense.gguf"
    assert (tmp_path / "runs").read_text() == "llama 1\nllama 7\n"
    with pytest.raises(RuntimeFailure, match="wrote no model of none: the generator wrote no model of it"):
        arch_fixtures.models(where, tree, tmp_path / "no-build", "none", 8)
