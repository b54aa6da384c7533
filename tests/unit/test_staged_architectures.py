"""The architectures the patch stack stages are named in four places; they must agree.

- the patches: each architecture patch adds its ``case LLM_ARCH_X:`` to 0001's
  ``llm_arch_supports_layer_range()`` (a layer range of any other is refused at load);
- the worker: ``staged_architecture()`` and the ``STAGED_ARCHITECTURES`` text of its refusal
  (a capture on any other is FAILED_PRECONDITION);
- the recipe schema's ``architecture`` enum (a recipe naming another is exit 2 at load).

A new architecture patch that forgets one of them would let a recipe through that the worker refuses,
or a worker refuse what the loader stages.
"""

from __future__ import annotations

import json
import re

from core.workspace import MANIFESTS, PATCHES, WORKER


def _from_patches() -> set[str]:
    names: set[str] = set()
    for patch in sorted(PATCHES.glob("[0-9][0-9][0-9][0-9]-*.patch")):
        for section in re.split(r"^diff --git ", patch.read_text(), flags=re.M)[1:]:
            if section.startswith("a/src/llama-arch.cpp "):
                names |= {m.lower() for m in re.findall(r"^\+\s+case LLM_ARCH_(\w+):", section, re.M)}
    return names


def _worker_source() -> str:
    return (WORKER / "src" / "request_checks.cpp").read_text()


def _from_worker_check() -> set[str]:
    body = re.search(r"bool staged_architecture\([^)]*\) \{(.*?)\n\}", _worker_source(), re.S)
    assert body is not None, "staged_architecture() not found in worker/src/request_checks.cpp"
    return set(re.findall(r'arch == "(\w+)"', body.group(1)))


def _from_worker_message() -> set[str]:
    text = re.search(r'STAGED_ARCHITECTURES = "([^"]*)"', _worker_source())
    assert text is not None, "STAGED_ARCHITECTURES not found in worker/src/request_checks.cpp"
    return {name.strip() for name in text.group(1).split(",")}


def _from_recipe_schema() -> set[str]:
    schema = json.loads((MANIFESTS / "schemas" / "recipe.schema.json").read_text())
    return set(schema["properties"]["architecture"]["enum"])


def test_the_four_lists_of_staged_architectures_agree() -> None:
    staged = _from_patches()
    assert "llama" in staged and len(staged) >= 3, staged
    assert _from_worker_check() == staged
    assert _from_worker_message() == staged
    assert _from_recipe_schema() == staged
