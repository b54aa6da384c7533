"""What ``dgr recipe init`` writes: a first recipe for an artifact set, from its family's shipped defaults.

A recipe holds what is certified (set, variant, architecture, layers), how (placements, prompts, decode
length, measurement) and the pre-locked thresholds per hardware class.  For a model nobody wrote a recipe
for, only the placements depend on the model: the monolithic reference and 2, 3 and 4 stages, plus a
10-stage one where the model has the layers, each cut by decode cost as ``dgr balance`` cuts (the caller
passes that cut in; pipeline.balance sits above this package).  A cut the layers do not allow is left
out and the description says so.  Everything else is the shipped recipe of the same architecture family
(FAMILIES), copied as it is: its prompts, decode length, measurement, lanes and hardware classes.  Those
thresholds were measured on that recipe's model, so the description says so and that they want
measuring again on this one; there is no depth scenario, route change or MTP until someone adds them.

The recipe goes to the user's recipes folder (manifests.user_folder), never over an existing one unless
forced, never as a shadow of a shipped one, and only once it loads as certify loads recipes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from core.canonical import write_json
from core.errors import ConfigurationError
from manifests import user_folder
from manifests.artifact_sets import ArtifactSet
from manifests.recipe_model import RECIPES, Recipe, from_document, load, load_file

# architecture -> the shipped recipe whose defaults a new recipe of it takes (``--like`` picks another)
FAMILIES = {"llama": "tiny-llama", "gemma3": "gemma3-270m-q4", "deepseek4": "v4-q4"}
STAGES = (2, 3, 4, 10)  # the cuts drafted; 10: the many-stage scenario (10+ stages)
WORDS = {2: "two", 3: "three", 4: "four", 10: "ten"}
NO_TOKENIZER = ("no_vocab", "none")  # llama.cpp's vocabulary-less models: nothing can tokenize a prompt

Cut = Callable[[int], Sequence[tuple[int, int]]]  # n_stages -> contiguous [start, end) ranges


def family(architecture: str, like: str | None = None) -> Recipe:
    """The shipped recipe whose defaults a new recipe of ``architecture`` takes."""
    name = like or FAMILIES.get(architecture)
    if name is None:
        raise ConfigurationError(
            f"no shipped recipe of architecture {architecture!r} to take defaults from",
            hint=f"dgr recipe init knows {', '.join(FAMILIES)} (the architectures the patch stack stages)",
        )
    path = RECIPES / f"{name}.json"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in RECIPES.glob("*.json")))
        raise ConfigurationError(f"--like {name}: no shipped recipe of that name", hint=f"shipped: {known}")
    recipe = load_file(path)
    if recipe.architecture != architecture:
        raise ConfigurationError(
            f"--like {name}: a {recipe.architecture} recipe, and the set is a {architecture}",
            hint=f"name a shipped {architecture} recipe, or leave --like out",
        )
    return recipe


def check_certifiable(aset: ArtifactSet, variant: str) -> None:
    """Refuse a set no recipe can certify: its model has no tokenizer for the prompts."""
    tokenizer = aset.variant(variant).gguf.kv.get("tokenizer.ggml.model")
    if tokenizer in NO_TOKENIZER:
        raise ConfigurationError(
            f"artifact set {aset.name!r} ({variant}) has no tokenizer (tokenizer.ggml.model {tokenizer!r}): "
            "certify tokenizes the recipe's prompts with the model's own",
            hint="seal the model's files with their vocabulary",
        )


def destination(name: str, env: Mapping[str, str], *, force: bool) -> Path:
    """Where recipe ``name`` is written: refused over an existing one (unless ``force``) and where it
    would shadow a shipped recipe of the same name."""
    if (RECIPES / f"{name}.json").is_file():
        raise ConfigurationError(
            f"recipe {name!r} is a shipped recipe; a user recipe of that name would shadow it",
            hint="give the new recipe a name of its own (--name NAME)",
        )
    path = user_folder.recipes_dir(env) / f"{name}.json"
    if path.exists() and not force:
        raise ConfigurationError(f"recipe {name!r} already exists ({path})", hint="--force replaces it")
    return path


def placements(n_layer: int, cut: Cut) -> tuple[dict[str, Any], list[int]]:
    """The monolithic reference and each cut of STAGES the layers allow; also the stage counts left out."""
    drafted: dict[str, Any] = {
        "mono": {"description": "monolithic reference: one worker owns every layer", "stages": [[0, n_layer]]}
    }
    left_out = [n for n in STAGES if n > n_layer]
    for n in (n for n in STAGES if n <= n_layer):
        drafted[f"{WORDS[n]}-balanced"] = {
            "description": f"{n} stages cut by decode cost (as `dgr balance --stages {n}` cuts)",
            "stages": [[start, end] for start, end in cut(n)],
        }
    if len(drafted) < 2:
        raise ConfigurationError(f"a model of {n_layer} layer has no staged placement to certify")
    return drafted, left_out


def draft(
    *, name: str, aset: ArtifactSet, variant: str, n_layer: int, cut: Cut, like: Recipe
) -> dict[str, Any]:
    """The recipe document (validated by the caller's ``write``)."""
    drafted, left_out = placements(n_layer, cut)
    doc = like.document
    architecture = aset.variant(variant).gguf.architecture
    return {
        "schema_version": 1,
        "name": name,
        "description": _description(aset.name, variant, architecture, n_layer, drafted, left_out, like),
        "artifacts": aset.name,
        "variant": variant,
        "architecture": architecture,
        "n_layer": n_layer,
        "lanes": doc["lanes"],
        "placements": drafted,
        "prompts": doc["prompts"],
        "n_decode": doc["n_decode"],
        "boundary_dtype": doc["boundary_dtype"],
        "mtp": False,
        "measure": doc["measure"],
        "hardware_classes": doc["hardware_classes"],
    }


def _description(
    set_name: str,
    variant: str,
    architecture: str,
    n_layer: int,
    drafted: Mapping[str, Any],
    left_out: list[int],
    like: Recipe,
) -> str:
    staged = [f"{k} {drafted[k]['stages']}" for k in drafted if k != "mono"]
    omitted = f" No {_counts(left_out)}-stage placement: the model has {n_layer} layers." if left_out else ""
    classes = ", ".join(hc.name for hc in like.hardware_classes)
    return (
        f"Drafted by `dgr recipe init --artifacts {set_name}` for artifact set {set_name} ({variant}): a "
        f"{architecture} of {n_layer} layers. Placements: the monolithic reference and {'; '.join(staged)}, "
        "each cut by decode cost (the bytes of weights a token reads, pipeline/balance.py) as `dgr balance` "
        f"cuts them.{omitted} Prompts ({like.prompts.set}), decode length, measurement, lanes and the "
        f"thresholds of every hardware class ({classes}) are the shipped defaults of the {architecture} "
        f"family, copied from recipe {like.name}: they were measured on that recipe's model, not on this "
        "one (a speed floor may not suit it), so measure this model and edit them before a certificate is "
        "relied on. No depth scenario, route change or MTP: add them by hand."
    )


def _counts(numbers: list[int]) -> str:
    """``3-, 4- or 10``: stage counts as a sentence names them before ``-stage``."""
    head = [f"{n}-" for n in numbers[:-1]]
    return f"{', '.join(head)} or {numbers[-1]}" if head else str(numbers[-1])


def write(doc: dict[str, Any], path: Path, env: Mapping[str, str]) -> Recipe:
    """Check the recipe as certify's loader does, write it, and load it back by name from the user's
    folder (it must be what ``dgr certify --recipe NAME`` finds)."""
    from_document(doc, source=str(path))
    user_folder.make(path.parent)
    write_json(path, doc)
    recipe = load(doc["name"], env)
    if Path(recipe.source) != path:
        raise ConfigurationError(f"recipe {doc['name']!r} loads from {recipe.source}, not {path}")
    return recipe
