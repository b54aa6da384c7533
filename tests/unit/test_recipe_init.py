"""Issue 44, bring your own GGUF: `dgr recipe init --artifacts NAME` writes a recipe for a sealed set into
the user's recipes folder: the placements `dgr balance` cuts, its family's shipped prompts and thresholds
(manifests/recipe_draft.py); it validates and loads as certify loads recipes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fetch.gguf_header import read_header
from manifests import recipe_model
from manifests.loader import validate
from manifests.recipe_draft import FAMILIES, placements
from manifests.tiling import first_break
from pipeline.balance import balanced_stages, decode_cost
from tests.unit.byo_case import Dgr, dgr, llama, write_model


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Dgr:
    return dgr(tmp_path, monkeypatch, capsys)


def _sealed(run: Dgr, n_layer: int, name: str = "mine", **kw: object) -> list[Path]:
    files = write_model(run.tmp / name, llama(n_layer, split=2, **kw))  # type: ignore[arg-type]
    rc, _, err = run("seal", "--artifacts", name, "--from", str(run.tmp / name))
    assert (rc, err) == (0, [])
    return files


def _recipe(run: Dgr, name: str = "mine") -> dict:
    return json.loads((run.manifests / "recipes" / f"{name}.json").read_text())


def test_a_recipe_for_a_twelve_layer_model(run: Dgr) -> None:
    files = _sealed(run, 12)
    rc, out, err = run("recipe", "init", "--artifacts", "mine")
    assert (rc, err) == (0, []), err
    path = run.manifests / "recipes" / "mine.json"
    assert f"wrote recipe mine -> {path}" in out and "next: dgr certify --recipe mine" in out
    doc = _recipe(run)
    validate(doc, "recipe", source=str(path))
    loaded = recipe_model.load("mine", run.env)  # certify's loader, from the user's folder
    assert Path(loaded.source) == path and (loaded.artifacts, loaded.variant, loaded.n_layer) == (
        "mine",
        "f32",
        12,
    )
    cost = decode_cost([read_header(f) for f in files])
    assert set(doc["placements"]) == {
        "mono",
        "two-balanced",
        "three-balanced",
        "four-balanced",
        "ten-balanced",
    }
    assert doc["placements"]["mono"]["stages"] == [[0, 12]]
    for n, key in ((2, "two"), (3, "three"), (4, "four"), (10, "ten")):
        stages = doc["placements"][f"{key}-balanced"]["stages"]
        assert stages == [list(s) for s in balanced_stages(cost, n)]  # dgr balance's own cut
        assert len(stages) == n and first_break([tuple(s) for s in stages], 12) is None  # contiguous
    # the rest is the llama family's shipped recipe, as it is, and the description says so
    shipped = json.loads((recipe_model.RECIPES / "tiny-llama.json").read_text())
    for key in ("prompts", "n_decode", "measure", "lanes", "hardware_classes", "boundary_dtype"):
        assert doc[key] == shipped[key], key
    assert doc["mtp"] is False and "depth" not in doc and "route_change" not in doc
    assert "copied from recipe tiny-llama" in doc["description"]
    assert "cpu-ci, gpu-cuda, vulkan-software" in doc["description"]
    assert "No " not in doc["description"].split("cuts them.")[1].split("Prompts")[0]


def test_a_model_of_few_layers_gets_only_the_cuts_it_allows(run: Dgr) -> None:
    _sealed(run, 3)
    assert run("recipe", "init", "--artifacts", "mine")[0] == 0
    doc = _recipe(run)
    assert set(doc["placements"]) == {"mono", "two-balanced", "three-balanced"}
    assert doc["placements"]["three-balanced"]["stages"] == [[0, 1], [1, 2], [2, 3]]
    assert "No 4- or 10-stage placement: the model has 3 layers." in doc["description"]


def test_placements_stop_where_the_layers_do() -> None:
    def even(n: int) -> list[tuple[int, int]]:
        return [(k, k + 1) for k in range(n)]

    assert list(placements(2, even)[0]) == ["mono", "two-balanced"] and placements(2, even)[1] == [3, 4, 10]
    assert placements(10, even)[1] == []
    with pytest.raises(Exception, match="a model of 1 layer has no staged placement"):
        placements(1, even)


def test_an_unknown_set_is_one_line(run: Dgr) -> None:
    rc, _, err = run("recipe", "init", "--artifacts", "nosuchset")
    assert rc == 2 and len(err) == 1
    assert err[0].startswith("dgr: configuration error: unknown artifact set 'nosuchset'")


def test_an_existing_recipe_is_replaced_only_with_force(run: Dgr) -> None:
    _sealed(run, 3)
    assert run("recipe", "init", "--artifacts", "mine")[0] == 0
    path = run.manifests / "recipes" / "mine.json"
    path.write_text(path.read_text().replace("Drafted by", "Edited by hand, drafted by"))
    edited = path.read_bytes()
    rc, _, err = run("recipe", "init", "--artifacts", "mine")
    assert rc == 2 and len(err) == 1 and f"recipe 'mine' already exists ({path})" in err[0]
    assert "--force replaces it" in err[0] and path.read_bytes() == edited
    assert run("recipe", "init", "--artifacts", "mine", "--force")[0] == 0
    assert path.read_bytes() != edited and _recipe(run)["description"].startswith("Drafted by")


def test_a_recipe_never_shadows_a_shipped_one(run: Dgr) -> None:
    _sealed(run, 3)
    rc, _, err = run("recipe", "init", "--artifacts", "mine", "--name", "tiny-llama")
    assert rc == 2 and len(err) == 1 and "'tiny-llama' is a shipped recipe" in err[0]
    assert not (run.manifests / "recipes").exists()


def test_dgr_recipes_dir_is_where_it_goes(run: Dgr, tmp_path: Path) -> None:
    _sealed(run, 2)
    run.monkeypatch.setenv("DGR_RECIPES_DIR", str(tmp_path / "own"))
    (tmp_path / "own").mkdir()
    assert run("recipe", "init", "--artifacts", "mine", "--name", "mine-2")[0] == 0
    assert json.loads((tmp_path / "own" / "mine-2.json").read_text())["artifacts"] == "mine"
    assert recipe_model.find("mine-2", run.env) == tmp_path / "own" / "mine-2.json"


@pytest.mark.parametrize(
    ("kw", "said"),
    [
        ({"tokenizer": "no_vocab"}, "has no tokenizer (tokenizer.ggml.model 'no_vocab')"),
        ({"arch": "qwen2"}, "no shipped recipe of architecture 'qwen2'"),
    ],
)
def test_a_set_no_recipe_can_certify_is_refused(run: Dgr, kw: dict, said: str) -> None:
    _sealed(run, 3, **kw)
    rc, _, err = run("recipe", "init", "--artifacts", "mine")
    assert rc == 2 and len(err) == 1 and said in err[0], err
    assert not (run.manifests / "recipes").exists()


def test_like_takes_another_shipped_recipe_of_the_family_and_refuses_another_family(run: Dgr) -> None:
    _sealed(run, 3)
    rc, _, err = run("recipe", "init", "--artifacts", "mine", "--like", "gemma3-270m-q4")
    assert rc == 2 and "--like gemma3-270m-q4: a gemma3 recipe, and the set is a llama" in err[0]
    assert run("recipe", "init", "--artifacts", "mine", "--like", "tiny-llama-deep")[0] == 0
    assert "copied from recipe tiny-llama-deep" in _recipe(run)["description"]


def test_every_family_default_is_a_shipped_recipe_of_its_architecture() -> None:
    for architecture, name in FAMILIES.items():
        assert recipe_model.load_file(recipe_model.RECIPES / f"{name}.json").architecture == architecture
