"""`dgr balance` as a user runs it, on the embedded tiny model (provisioned, then its headers read)."""

from __future__ import annotations

import json

import pytest

from manifests import recipe_model
from tests.integration.dgr_cli import run_dgr, user_env

pytestmark = pytest.mark.slow


def test_balance_prints_the_recipes_balanced_cut_beside_the_even_one(tiny_model) -> None:
    done = run_dgr(user_env(), "balance", "--stages", "4")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("balance: tiny-llama (f32), 12 layers into 4 stages")
    assert lines[4] == "  stage 3: layers [11, 12), 35.9 MB a token (51%)"  # the head and one layer
    assert "(the even cut [[0, 3], [3, 6], [6, 9], [9, 12]]: 42.2 MB a token (60%))" in lines[5]
    stages = json.loads("{" + lines[-1] + "}")["stages"]
    recipe = recipe_model.load("tiny-llama")
    assert [tuple(s) for s in stages] == list(recipe.placements["four-balanced-ring"].stages)


@pytest.mark.parametrize("stages,why", [("13", "cannot cut 12 layers into 13 non-empty stages"),
                                        ("0", "invalid number of stages (>= 1) value: '0'")])
def test_balance_refuses_a_cut_it_cannot_make_in_one_line(tiny_model, stages: str, why: str) -> None:
    done = run_dgr(user_env(), "balance", "--stages", stages)
    assert done.returncode == 2
    assert why in done.stderr.strip().splitlines()[-1]
