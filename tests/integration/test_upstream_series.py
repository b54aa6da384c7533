"""Issue 18 item 1 with real git and the real pinned tree: the patch stack as mails `git am` applies.

`dgr upstream` writes a cover letter and one mail per patch; `git am` of the mails onto a fresh
repository of the pristine tree must give the patched tree's git tree id (the command checks it, and
this test checks it again on its own repository), the bytes are the same on a second run, and a mail
that lost a line is refused (exit 3).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from fetch.source import ensure_pristine
from patches.stack import ensure_patched, read_series
from tests.integration.dgr_cli import run_dgr, user_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _git(repo: Path, *args: str) -> str:
    env = {
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
        "PATH": "/usr/bin:/bin",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("upstream")
    done = run_dgr(user_env(), "upstream", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"\n[upstream] {done.stdout.strip()}")
    return out


def test_git_am_onto_the_pin_gives_the_patched_tree(series, real_ctx, tmp_path) -> None:
    pristine, patched = ensure_pristine(real_ctx), ensure_patched(real_ctx)
    repo = tmp_path / "llama.cpp"
    shutil.copytree(pristine.path, repo, symlinks=True)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A", "-f")
    _git(repo, "commit", "-q", "-m", "pin")
    mails = sorted(str(p) for p in series.glob("000[1-9]-*.patch"))
    assert len(mails) == len(read_series())
    _git(repo, "am", "--quiet", *mails)
    assert _git(repo, "rev-parse", "HEAD^{tree}") == patched.digest
    subjects = _git(repo, "log", "--format=%s", f"HEAD~{len(mails)}..HEAD").splitlines()
    assert all(" : " in s for s in subjects), subjects
    record = json.loads((series / "series.json").read_text())
    assert record["tree"] == patched.digest and record["pin"] == pristine.commit
    assert record["changed_lines"] == sum(p["insertions"] + p["deletions"] for p in record["patches"])


def test_the_mails_are_reproducible(series, tmp_path) -> None:
    again = tmp_path / "again"
    done = run_dgr(user_env(), "upstream", "--out", str(again))
    assert done.returncode == 0, done.stderr[-3000:]
    names = sorted(p.name for p in series.glob("*.patch"))
    assert names == sorted(p.name for p in again.glob("*.patch"))
    for name in names:
        assert (series / name).read_bytes() == (again / name).read_bytes(), name


def test_a_mail_that_lost_a_line_is_refused(series, real_ctx, tmp_path) -> None:
    from core.errors import IntegrityError
    from patches import upstream

    broken = tmp_path / "broken"
    shutil.copytree(series, broken)
    mail = sorted(broken.glob("0003-*.patch"))[0]
    lines = mail.read_text().splitlines(keepends=True)
    added = next(i for i, ln in enumerate(lines) if ln.startswith("+") and not ln.startswith("+++"))
    mail.write_text("".join(lines[:added] + lines[added + 1 :]))
    from patches.dev import make_dev_tree

    who = upstream.identity(upstream.DEFAULT_AUTHOR, upstream.DEFAULT_DATE)
    base = make_dev_tree(real_ctx, tmp_path / "dev")
    with pytest.raises(IntegrityError, match="git am does not apply") as caught:
        upstream.am_tree_id(real_ctx, tmp_path / "dev", base, sorted(broken.glob("000[1-9]-*.patch")), who)
    print(f"\n[upstream] broken mail: {caught.value.one_line()}")
    assert caught.value.exit_code == 3 and "0003" in str(caught.value)
