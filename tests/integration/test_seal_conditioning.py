"""Sealing a generated model that selects by top-k measures its conditioning first (fetch.conditioning):

- the shape tiny-v4 had before (indexer 2 x 64: ReLU scores of exactly 0 tie at the top-k boundary) is
  refused with exit 2, naming the selection, and its manifest is left unchanged;
- the sealed tiny-v4 records its conditioning: no exact tie at any selection boundary.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from core.errors import ConfigurationError
from fetch.seal import seal
from lanes.build import fetch_tools
from manifests.artifact_sets import ARTIFACTS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_a_model_with_exact_ties_is_not_sealed(real_ctx, cpu_build, tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    shutil.copy(ARTIFACTS / "tiny-v4.json", root / "tiny-v4.json")
    doc = json.loads((root / "tiny-v4.json").read_text())
    doc["origins"][0]["parameters"].update(indexer_n_head=2, indexer_head_dim=64)
    (root / "tiny-v4.json").write_text(json.dumps(doc, indent=2))
    before = (root / "tiny-v4.json").read_bytes()
    with pytest.raises(ConfigurationError) as err:
        seal("tiny-v4", None, ctx=real_ctx, root=root, tools=fetch_tools(real_ctx))
    assert err.value.exit_code == 2
    assert "exact ties at a top-k selection boundary" in err.value.message
    assert "lid_score_masked-2 (indexer)" in err.value.message
    assert (root / "tiny-v4.json").read_bytes() == before


def test_the_sealed_tiny_v4_records_no_exact_tie() -> None:
    record = json.loads((ARTIFACTS / "tiny-v4.json").read_text())["variants"]["f32"]["conditioning"]
    assert record["measured"] and record["recipes"] == ["tiny-v4", "tiny-v4-mtp-file"]
    kinds = record["kinds"]
    assert set(kinds) == {"indexer", "router"}
    assert all(
        k["exact_ties"] == 0 and k["contested_rows"] > 0 and k["min_abs_margin"] > 0 for k in kinds.values()
    )
