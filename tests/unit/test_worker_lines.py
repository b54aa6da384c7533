"""The command lines `dgr certify --write-identity` prints for attached workers (certify.inputs):
with MTP on, every stage allows the recipe's rewind and the last stage drafts, from the main file
(--mtp) or from the block's own file (--mtp-model); without it, nothing of MTP appears."""

from __future__ import annotations

from pathlib import Path

from certify.inputs import Prepared, worker_lines
from manifests.recipe_model import load


def _lines(recipe: str, mtp_model: Path | None = None):
    prepared = Prepared(model=Path("/s/main.gguf"), mtp_model=mtp_model, worker=("/b/dgr-shard-worker",))
    return worker_lines(load(recipe, {}), "cpu", prepared, Path("/e/identity.json"))


def test_an_alpha_recipe_prints_no_mtp_flag() -> None:
    lines = _lines("tiny-llama")
    assert lines.last_stage_also == []
    start = ["/b/dgr-shard-worker", "--model", "/s/main.gguf", "--layers", "BEGIN:END"]
    assert lines.every_stage[:5] == start
    assert not any(a.startswith(("--mtp", "--max-rewind")) for a in lines.every_stage)


def test_mtp_recipes_print_the_rewind_and_the_last_stage_s_drafting_flag() -> None:
    in_file = _lines("tiny-v4-mtp")
    assert in_file.every_stage[-2:] == ["--max-rewind", "3"] and in_file.last_stage_also == ["--mtp"]
    own_file = _lines("tiny-v4-mtp-file", mtp_model=Path("/s/mtp-tiny-v4-f32.gguf"))
    assert own_file.last_stage_also == ["--mtp-model", "/s/mtp-tiny-v4-f32.gguf"]
    assert "--mtp" not in own_file.every_stage
