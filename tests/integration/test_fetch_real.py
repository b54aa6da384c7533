"""The real sdist-mirror fetch from the package index, through the CLI, into a temp workspace.

The archive cache is a fresh temp folder too, so the download, its sha256 check and the extraction
all run for real every time (about 75 MB; a few seconds on a good link).  A second workspace then
shares that cache and must not download again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.canonical import read_json
from fetch import gittree
from fetch.source import load_pin

pytestmark = pytest.mark.slow


def _dgr(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "certify", *args], env=env, capture_output=True, text=True, timeout=900
    )
    return done, time.monotonic() - started


def test_real_sdist_fetch_then_no_op_then_patch(tmp_path: Path) -> None:
    pin = load_pin()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DGR_", "GIT_"))}
    env.update(DGR_WORK=str(tmp_path / "work"), DGR_CACHE=str(tmp_path / "cache"), DGR_FETCH_SOURCES="sdist")

    first, first_s = _dgr(env, "fetch")
    assert first.returncode == 0, first.stderr
    tree = tmp_path / "work" / "src" / f"llama.cpp-{pin.short}"
    prov = read_json(tree.parent / f"{tree.name}.provenance.json")
    assert prov["source"] == "sdist" and prov["archive"]["downloaded"] is True
    assert prov["archive"]["sha256"] == pin.sources.sdist.sha256
    assert not (tree / ".git").exists()
    assert gittree.tree_id(tree, env) == pin.tree == prov["tree"]
    assert (tmp_path / "cache" / "archives" / pin.sources.sdist.filename).is_file()

    before = tree.stat()
    second, second_s = _dgr(env, "fetch")
    assert second.returncode == 0, second.stderr
    # A no-op, told by what it left, not by the clock (a loaded box took 2.15 s for it): the same tree
    # (not extracted again) and the same provenance (not downloaded again).
    after = tree.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "the tree was made again"
    assert read_json(tree.parent / f"{tree.name}.provenance.json") == prov
    print(f"\nsecond `dgr fetch`: {second_s:.2f} s")

    patched, _ = _dgr(env, "patch")
    assert patched.returncode == 0, patched.stderr
    again, again_s = _dgr(env, "patch")
    assert again.returncode == 0 and again_s < 10.0, (again.stderr, again_s)  # 10 s: loaded-box margin

    other = dict(env, DGR_WORK=str(tmp_path / "work2"))
    third, _ = _dgr(other, "fetch")
    assert third.returncode == 0, third.stderr
    prov2 = read_json(tmp_path / "work2" / "src" / f"{tree.name}.provenance.json")
    assert prov2["archive"]["downloaded"] is False and prov2["tree"] == pin.tree
    print(f"first fetch {first_s:.1f} s, second {second_s:.2f} s, second patch {again_s:.2f} s")
