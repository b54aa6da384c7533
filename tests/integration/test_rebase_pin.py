"""Issue 18 item 5 on the real pinned tree and the real patch stack, with real git, nothing fetched.

(a) `dgr patch --rebase-onto <the pin>` with the pristine tree as the candidate: every patch clean and
    the refreshed series byte-identical to patches/.
(b) a synthetic "upstream moved" tree (a copy of the pristine tree, edited where the patches are read
    from the patch files themselves): lines inserted above a hunk of 0001 (clean, with its offset), a
    context line changed near a hunk of 0002 (3-way), the lines where a hunk of 0003 changes the file
    changed too (conflict, that file named; exit 5 through the CLI).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.context import Context
from fetch.source import ensure_pristine, load_pin
from patches import rebase
from patches.stack import PATCHES, read_series
from tests.integration.dgr_cli import run_dgr, user_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
MOVED = "0" * 39 + "1"  # a made-up candidate commit: its tree comes from the directory
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@")


@dataclass(frozen=True)
class Hunk:
    path: str
    old_start: int
    lines: list[str]  # its ' ', '-', '+' lines as in the patch


def hunks(data: bytes) -> list[Hunk]:
    """The hunks of a git diff that change an existing file (new files have no pristine lines)."""
    out: list[Hunk] = []
    path: str | None = None
    cur: Hunk | None = None
    for line in data.decode("utf-8", "replace").split("\n"):
        if line.startswith("diff --git "):
            path = cur = None
        elif cur is None and line.startswith("+++ "):
            path = line[len("+++ b/") :] if line.startswith("+++ b/") else None
        elif (m := _HUNK.match(line)) and path:
            cur = Hunk(path, int(m[1]), [])
            if cur.old_start > 0:
                out.append(cur)
        elif cur is not None and line[:1] in (" ", "-", "+"):
            cur.lines.append(line)
        elif not line.startswith("\\"):
            cur = None
    return out


@pytest.fixture(scope="module")
def stack() -> dict[str, list[Hunk]]:
    return {e.name[:4]: hunks(e.path.read_bytes()) for e in read_series(PATCHES)}


def _only_in(stack: dict[str, list[Hunk]], number: str) -> list[Hunk]:
    """The hunks of patch ``number`` in files no earlier patch touches (the pristine line numbers hold)
    and no other of the first three (each edit below is seen by its own patch only)."""
    others = {h.path for n, hs in stack.items() if n != number and (n < number or n <= "0003") for h in hs}
    return [h for h in stack[number] if h.path not in others]


def _edit(tree: Path, path: str, line_no: int, fn) -> str:
    f = tree / path
    lines = f.read_text().split("\n")
    before = lines[line_no - 1]
    lines[line_no - 1 : line_no] = fn(before)
    f.write_text("\n".join(lines))
    return before


@pytest.fixture(scope="module")
def moved(real_ctx: Context, stack, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The pristine tree copied once, then edited three times; returns it and the edited paths."""
    tree = tmp_path_factory.mktemp("moved") / "llama.cpp"
    shutil.copytree(ensure_pristine(real_ctx).path, tree, symlinks=True)
    h1 = _only_in(stack, "0001")[0]
    _edit(
        tree,
        h1.path,
        h1.old_start,
        lambda ln: ["// upstream moved 1", "// upstream moved 2", "// upstream moved 3", ln],
    )
    # 0002: a hunk whose first line is leading context, at least two lines before its first change,
    # and unique in its file (the 3-way merge must see two separate changes, not one touching).
    h2 = next(
        h
        for h in _only_in(stack, "0002")
        if all(x.startswith(" ") for x in h.lines[:3])
        and h.lines[0].strip()
        and (tree / h.path).read_text().split("\n").count(h.lines[0][1:]) == 1
    )
    _edit(tree, h2.path, h2.old_start, lambda ln: [ln + " // upstream touched this context line"])
    # 0003: where one of its hunks changes the file (the first line it removes, or the two lines its
    # first insertion goes between: 0003 only adds), upstream changed those lines too.
    h3 = _only_in(stack, "0003")[0]
    at = h3.old_start
    for x in h3.lines:
        if x[:1] in "-+":
            break
        at += 1
    span = 1 if h3.lines[at - h3.old_start].startswith("-") else 2
    for n in range(at - 1 if span == 2 else at, at + 1):
        _edit(tree, h3.path, n, lambda ln: [ln + " // upstream rewrote this line"])
    return tree, {"0001": h1.path, "0002": h2.path, "0003": h3.path}


def test_onto_the_pin_itself_every_patch_is_clean_and_byte_identical(real_ctx: Context, tmp_path) -> None:
    pin = load_pin()
    out = tmp_path / "out"
    result = rebase.rebase_onto(real_ctx, pin.commit, tree=ensure_pristine(real_ctx).path, out=out)
    print("\n" + rebase.table(result))
    assert result.candidate_tree == pin.tree
    assert [o.status for o in result.outcomes] == ["clean"] * len(read_series(PATCHES))
    assert all(not o.offsets for o in result.outcomes)
    for entry in read_series(PATCHES):
        assert (out / "patches" / entry.name).read_bytes() == entry.path.read_bytes(), entry.name
    assert (out / "patches" / "series").read_bytes() == (PATCHES / "series").read_bytes()


def test_upstream_moved_each_classification(real_ctx: Context, moved, tmp_path) -> None:
    tree, paths = moved
    out = tmp_path / "out"
    done = run_dgr(user_env(), "patch", "--rebase-onto", MOVED, "--tree", str(tree), "--out", str(out))
    print(f"\nedited: {paths}\n{done.stdout}{done.stderr}")
    assert done.returncode == 5, done.stderr[-2000:]
    assert "gate failed" in done.stderr and "0003-" in done.stderr
    record = json.loads((out / "rebase.json").read_text())
    by = {p["name"][:4]: p for p in record["patches"]}
    assert by["0001"]["status"] == "clean" and any(
        o.startswith(f"{paths['0001']}: ") and o.endswith("(offset +3)") for o in by["0001"]["offsets"]
    )
    assert by["0002"]["status"] == "3-way" and by["0002"]["conflicts"] == []
    assert by["0003"]["status"] == "conflict" and paths["0003"] in by["0003"]["conflicts"]
    assert not (out / "patches").exists() and (out / "tree" / ".git").is_dir()
    unmerged = subprocess.run(
        ["git", "ls-files", "-u"],
        cwd=out / "tree",
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1"},
    ).stdout
    assert paths["0003"] in unmerged  # the kept tree stops at 0003 with its markers in place
    assert record["candidate"]["commit"] == MOVED and record["pin"]["commit"] == load_pin().commit
