"""Issue 44, bring your own GGUF: `dgr seal --artifacts NAME --from DIR|hub:...` for a set no manifest
folder has describes it from the files' GGUF headers into the user's manifests folder, then seals it;
user sets are found before the shipped ones (manifests.user_folder, fetch.describe)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.context import Context
from core.workspace import MANIFESTS
from fetch.provision import provision
from manifests import recipe_model, user_folder
from manifests.artifact_sets import ARTIFACTS, find_set, known_sets, load_set
from tests.unit.byo_case import Dgr, dgr, llama, tensors, write_model
from tests.unit.hubcase import PATHS, REPO, HubCase, hub_case, run_cli


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Dgr:
    return dgr(tmp_path, monkeypatch, capsys)


def _manifest(run: Dgr, name: str) -> dict:
    return json.loads((run.manifests / "artifacts" / f"{name}.json").read_text())


def test_a_new_set_is_described_from_its_split_headers_and_sealed(run: Dgr, tmp_path: Path) -> None:
    # names that sort against split order: the manifest lists them as split.no orders them
    blobs = llama(4, split=3)
    write_model(tmp_path / "model", blobs, ["c-first.gguf", "b-second.gguf", "a-third.gguf"])
    rc, out, err = run("seal", "--artifacts", "mine", "--from", str(tmp_path / "model"))
    assert (rc, err) == (0, [])
    path = run.manifests / "artifacts" / "mine.json"
    assert f"-> {path}" in out and "dgr recipe init --artifacts mine" in out
    data = _manifest(run, "mine")
    assert data["origins"] == [{"kind": "local", "path": str((tmp_path / "model").resolve())}]
    assert data["default_variant"] == "f32" and list(data["variants"]) == ["f32"]
    variant = data["variants"]["f32"]
    assert [f["name"] for f in variant["files"]] == ["c-first.gguf", "b-second.gguf", "a-third.gguf"]
    assert all(len(f["sha256"]) == 64 and f["chunks"] for f in variant["files"])
    per_file = -(-len(tensors(4)) // 3)
    assert variant["gguf"] == {
        "architecture": "llama",
        "block_count": 4,
        "split_count": 3,
        "tensor_counts": [per_file, per_file, len(tensors(4)) - 2 * per_file],
        "kv": {"general.file_type": 0, "llama.embedding_length": 64, "tokenizer.ggml.model": "llama"},
    }
    assert "llama, 4 blocks, 3 files" in data["description"]
    # the set loads by name and provisions from its local origin, every copy held to the headers
    assert load_set("mine").name == "mine"
    done = provision(Context.from_env(), "mine", progress=lambda *a, **k: _Quiet())
    assert [p.read_bytes() for p in done.files] == blobs


class _Quiet:
    def __enter__(self) -> _Quiet:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int) -> None:
        return None


def test_sealing_the_same_files_again_gives_the_same_manifest(run: Dgr, tmp_path: Path) -> None:
    write_model(tmp_path / "model", llama(2))
    assert run("seal", "--artifacts", "mine", "--from", str(tmp_path / "model"))[0] == 0
    first = (run.manifests / "artifacts" / "mine.json").read_bytes()
    assert run("seal", "--artifacts", "mine", "--from", str(tmp_path / "model"))[0] == 0
    assert (run.manifests / "artifacts" / "mine.json").read_bytes() == first


def _nothing_written(run: Dgr) -> None:
    folder = run.manifests / "artifacts"
    assert not folder.exists() or list(folder.iterdir()) == [], list(folder.iterdir())


@pytest.mark.parametrize(
    ("case", "code", "said"),
    [
        ("not a folder", 2, "is not a directory"),
        ("empty", 2, "holds no .gguf files"),
        ("two models", 2, "holds 2 models (a.gguf, b.gguf)"),
        ("missing shard", 3, "not one complete split set: split 2 of 3 is missing"),
        ("not a gguf", 3, "bad magic"),
    ],
)
def test_a_bad_folder_is_one_line_and_writes_nothing(
    run: Dgr, tmp_path: Path, case: str, code: int, said: str
) -> None:
    source = tmp_path / "model"
    if case == "not a folder":
        source.write_bytes(llama(2)[0])
    elif case == "empty":
        source.mkdir()
    elif case == "two models":
        write_model(source, [llama(2)[0], llama(3)[0]], ["a.gguf", "b.gguf"])
    elif case == "missing shard":
        write_model(source, llama(4, split=3)[::2], ["m-1.gguf", "m-3.gguf"])
    else:
        write_model(source, [b"not a model at all" * 10])
    rc, _, err = run("seal", "--artifacts", "mine", "--from", str(source))
    assert rc == code and len(err) == 1 and said in err[0], (rc, err)
    _nothing_written(run)


def test_an_unknown_set_without_files_says_how_to_describe_one(run: Dgr) -> None:
    rc, _, err = run("seal", "--artifacts", "mine")
    assert rc == 2 and len(err) == 1
    assert "unknown artifact set 'mine'" in err[0] and "--from DIR" in err[0]


def test_an_existing_user_set_is_not_overwritten_by_another_model(run: Dgr, tmp_path: Path) -> None:
    write_model(tmp_path / "model", llama(2))
    assert run("seal", "--artifacts", "mine", "--from", str(tmp_path / "model"))[0] == 0
    path = run.manifests / "artifacts" / "mine.json"
    before = path.read_bytes()
    write_model(tmp_path / "other", llama(3))
    rc, _, err = run("seal", "--artifacts", "mine", "--from", str(tmp_path / "other"))
    assert rc == 2 and len(err) == 1
    assert "is a llama of 2 blocks; model.gguf is a llama of 3 blocks" in err[0]
    assert f"remove {path} to describe it afresh" in err[0]
    assert path.read_bytes() == before


def test_a_shipped_name_is_not_taken_by_another_model(run: Dgr, tmp_path: Path) -> None:
    shipped = (ARTIFACTS / "tiny-llama.json").read_bytes()
    write_model(tmp_path / "model", llama(2))
    rc, _, err = run("seal", "--artifacts", "tiny-llama", "--from", str(tmp_path / "model"))
    assert rc == 2 and len(err) == 1
    assert "artifact set 'tiny-llama'" in err[0] and "is a llama of 12 blocks" in err[0]
    assert "it is a shipped set: give the new one a name of its own" in err[0]
    assert (ARTIFACTS / "tiny-llama.json").read_bytes() == shipped
    _nothing_written(run)


def test_the_users_folders_are_searched_before_the_shipped_ones(run: Dgr, tmp_path: Path) -> None:
    env = run.env
    assert user_folder.manifests_dir(env) == run.manifests
    mine = run.manifests / "artifacts" / "tiny-llama.json"
    mine.parent.mkdir(parents=True)
    data = json.loads((ARTIFACTS / "tiny-llama.json").read_text())
    mine.write_text(json.dumps({**data, "description": "the user's own copy"}))
    assert find_set("tiny-llama", env) == mine
    assert load_set("tiny-llama", env=env).description == "the user's own copy"
    assert load_set("tiny-llama", root=ARTIFACTS).description == data["description"]  # a named root
    assert find_set("gemma3-270m-q4", env) == ARTIFACTS / "gemma3-270m-q4.json"
    assert "tiny-llama" in known_sets(env=env) and "gemma3-270m-q4" in known_sets(env=env)
    # recipes: DGR_RECIPES_DIR, else recipes/ in the user's manifests folder, then ours
    assert recipe_model.recipe_dirs(env) == [run.manifests / "recipes", MANIFESTS / "recipes"]
    assert recipe_model.recipe_dirs({**env, "DGR_RECIPES_DIR": str(tmp_path)})[0] == tmp_path


def test_the_default_user_folder_is_in_the_workspace(tmp_path: Path) -> None:
    assert user_folder.manifests_dir({"DGR_WORK": str(tmp_path / "w")}) == tmp_path / "w" / "manifests"
    assert user_folder.artifacts_dir({"DGR_MANIFESTS_DIR": str(tmp_path)}) == tmp_path / "artifacts"
    (tmp_path / "file").write_text("")
    with pytest.raises(Exception, match="is not a directory"):
        user_folder.manifests_dir({"DGR_MANIFESTS_DIR": str(tmp_path / "file")})
    assert user_folder.is_shipped(ARTIFACTS / "tiny-llama.json")
    assert not user_folder.is_shipped(tmp_path / "tiny-llama.json")


# --- from the hub ---------------------------------------------------------------------------------


@pytest.fixture
def case(tmp_path: Path, ctx: Context) -> Iterator[HubCase]:
    with hub_case(tmp_path, ctx) as made:
        yield made


def test_a_new_set_from_the_hub_is_described_from_the_downloaded_headers(
    case: HubCase, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ("seal", "--artifacts", "fromhub", "--from", f"hub:{REPO}@main", "--include", "Q4/*.gguf")
    assert run_cli(case, monkeypatch, *argv, "--allow-host", case.storage.netloc) == 0
    commit = case.hub.repos[REPO].commit
    assert f"from {REPO} at {commit}" in capsys.readouterr().out
    path = case.manifests / "fromhub.json"  # the user's artifacts folder of the hub case
    data = json.loads(path.read_text())
    [origin] = data["origins"]
    assert origin["kind"] == "hub" and origin["repo"] == REPO
    assert origin["allowed_redirect_hosts"] == [case.storage.netloc]
    assert origin["revision"] == commit and origin["paths"] == PATHS
    [(vname, variant)] = data["variants"].items()
    assert data["default_variant"] == vname
    assert [f["name"] for f in variant["files"]] == PATHS
    assert variant["gguf"]["architecture"] == "llama" and variant["gguf"]["split_count"] == 2
    assert load_set("fromhub", env={"DGR_MANIFESTS_DIR": str(case.manifests.parent)}).variants[vname].sealed


def test_a_hub_repo_of_several_models_is_refused_without_include(
    case: HubCase, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ("seal", "--artifacts", "fromhub", "--from", f"hub:{REPO}@main")
    assert run_cli(case, monkeypatch, *argv, "--allow-host", case.storage.netloc) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith(("seal ", "fetch "))]
    assert len(err) == 1 and "holds 2 models" in err[0] and "model-f16.gguf" in err[0], err
    assert not (case.manifests / "fromhub.json").exists()
