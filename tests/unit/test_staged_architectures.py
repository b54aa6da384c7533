"""Which layer inputs a worker can capture, said in two places that must agree.

Every architecture is staged by one mechanism, 0002's stage cut, except those whose builder stages
itself (0004's deepseek4, which ``llama_model::build_graph`` does not cut).  The cut records each
layer's input as the previous layer's named output, so a capture after the first layer works wherever
the graph names its layer outputs; the first layer's input, and every input of a builder the cut does
not touch, only where the builder records them itself.  The worker's ``records_every_layer_input()`` (and the
``RECORDING_ARCHITECTURES`` text of its refusal) must therefore name every architecture that stages
itself: otherwise the worker would refuse captures the builder supports, or (without the check)
abort on one it does not.  Recipes name any architecture (the schema has no list of its own).
"""

from __future__ import annotations

import json
import re

from core.workspace import MANIFESTS, PATCHES, WORKER


def _self_staged_in_patches() -> set[str]:
    names: set[str] = set()
    for patch in sorted(PATCHES.glob("[0-9][0-9][0-9][0-9]-*.patch")):
        for section in re.split(r"^diff --git ", patch.read_text(), flags=re.M)[1:]:
            if section.startswith("a/src/llama-model.cpp "):
                found = re.findall(r"^\+.*arch != LLM_ARCH_(\w+).*stages itself", section, re.M)
                names |= {m.lower() for m in found}
    return names


def _worker_source() -> str:
    return (WORKER / "src" / "request_checks.cpp").read_text()


def _from_worker_check() -> set[str]:
    body = re.search(r"bool records_every_layer_input\([^)]*\) \{(.*?)\n\}", _worker_source(), re.S)
    assert body is not None, "records_every_layer_input() not found in worker/src/request_checks.cpp"
    return set(re.findall(r'arch == "(\w+)"', body.group(1)))


def _from_worker_message() -> set[str]:
    text = re.search(r'RECORDING_ARCHITECTURES = "([^"]*)"', _worker_source())
    assert text is not None, "RECORDING_ARCHITECTURES not found in worker/src/request_checks.cpp"
    return {name.strip() for name in text.group(1).split(",")}


def test_every_architecture_that_stages_itself_records_its_layer_inputs_in_the_worker() -> None:
    self_staged = _self_staged_in_patches()
    assert self_staged == {"deepseek4"}, self_staged
    recording = _from_worker_check()
    assert self_staged <= recording, recording
    assert _from_worker_message() == recording


def test_recipes_name_any_architecture() -> None:
    schema = json.loads((MANIFESTS / "schemas" / "recipe.schema.json").read_text())
    architecture = schema["properties"]["architecture"]
    assert "enum" not in architecture and re.fullmatch(architecture["pattern"], "falcon-h1")
