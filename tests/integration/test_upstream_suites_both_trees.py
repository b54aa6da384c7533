"""Upstream's own test-llama-archs and test-gguf, built from the pristine and the patched tree, both pass
and agree row for row (lanes.upstream_suites; the full table is `dgr upstream --suites`).

CI cost (measured on the 2-core box, load 3-5): the patched test build reuses the CPU lane build's
objects through ccache (80 s for all 13 targets of the full table, mostly the tests themselves); the
pristine one recompiles src/ and common/ (every file includes the patched include/llama.h, so none is
a cache hit; ggml/ is) and took 1619 s for all 13 targets, most of it libllama and libllama-common,
which these two tests need too.  Then test-llama-archs -s 1234 runs 20-35 s per tree and test-gguf
0.3 s.  A warm workspace (both builds present) runs this test in about a minute.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from core.context import Context

pytestmark = [pytest.mark.slow, pytest.mark.timeout(5400)]

# Not in the default test command: on CI's cold 2 cores the pristine build alone is 15-25 min, which
# would put the run at 60-70 of its 90 minutes for a check of upstream's tests, not ours.  The patches'
# own upstream-style tests (test_upstream_ctests.py) stay in it.  Opt in, or run `dgr upstream --suites`.
OPT_IN = "DGR_TEST_UPSTREAM_SUITES"


def test_llama_archs_and_gguf_pass_on_both_trees_row_for_row(real_ctx: Context, tmp_path: Path) -> None:
    if real_ctx.env.get(OPT_IN) != "1":
        pytest.skip(f"builds the pristine tree's tests (15-25 min cold): set {OPT_IN}=1 to run it")
    from lanes import upstream_suites as us

    chosen = [s for s in us.SUITES if s.target in ("test-llama-archs", "test-gguf")]
    report = us.run_suites(real_ctx, suites=chosen, out=tmp_path, progress=lambda _text: None)
    data = us.load(report.json_path)
    by_name = {s["name"]: s for s in data["suites"]}
    assert data["ggml_unchanged"] and "src" in data["changed_dirs"]
    for entry in by_name.values():
        assert entry["pristine"]["status"] == "PASS", entry
        assert entry["patched"]["status"] == "PASS", entry
    archs = by_name["test-llama-archs -s 1234"]
    assert not us.worse_rows(archs["pristine"]["rows"], archs["patched"]["rows"])  # row for row
    counts = us.row_counts(archs["patched"]["rows"])
    assert counts["FAIL"] == 0 and counts["OK"] >= 100 and counts["archs"] >= 100, counts
    assert report.ok, report.regressions
