"""The git source against a real local bare repository (file:// URL, real git)."""

from __future__ import annotations

import dataclasses
import os
import stat
import time
from pathlib import Path

import pytest

from core.context import Context
from core.errors import IntegrityError, RuntimeFailure
from fetch import gittree
from fetch.source import SourceUnavailable, ensure_pristine, fetch_git, provenance_file, tree_dir


def _leftovers(ctx: Context) -> list[str]:
    return sorted(p.name for p in ctx.workspace.sources.iterdir() if not p.name.endswith(".lock"))


def test_right_commit_gives_the_pinned_tree_with_provenance(ctx: Context, upstream, upstream_pin) -> None:
    pristine = ensure_pristine(ctx, pin=upstream_pin)
    assert pristine.path == tree_dir(ctx, upstream_pin)
    assert pristine.path == ctx.workspace.sources / f"llama.cpp-{upstream.commit[:12]}"
    # The committed-but-ignored file and the executable bit survive; no .git is left in the tree.
    assert (pristine.path / "src" / "table.gen").read_text() == "committed although ignored\n"
    assert (pristine.path / "run.sh").stat().st_mode & stat.S_IXUSR
    assert (pristine.path / "docs").is_symlink()
    assert not (pristine.path / ".git").exists()
    assert gittree.tree_id(pristine.path, ctx.env) == upstream.tree
    prov = pristine.provenance
    assert prov["source"] == "git" and prov["commit"] == upstream.commit and prov["tree"] == upstream.tree
    assert prov["git_url"] == upstream.url and prov["archive"] is None
    assert pristine.provenance_path == provenance_file(ctx, upstream_pin)
    assert _leftovers(ctx) == [pristine.path.name, pristine.provenance_path.name]


def test_tree_id_needs_force_add(ctx: Context, upstream, upstream_pin) -> None:
    pristine = ensure_pristine(ctx, pin=upstream_pin)
    # Without -f the ignored-but-committed file drops out and the id differs: the reason for force-add.
    scratch = gittree.init_scratch(ctx.workspace.root, ctx.env)
    env = gittree.git_env(ctx.env, GIT_DIR=str(scratch), GIT_WORK_TREE=str(pristine.path))
    gittree.git(["add", "-A", "."], env=env, cwd=pristine.path)
    assert gittree.git(["write-tree"], env=env, cwd=pristine.path) != upstream.tree


def test_env_url_override_and_second_call_is_a_no_op(tmp_path: Path, upstream, upstream_pin) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DGR_", "GIT_"))}
    env.update(DGR_WORK=str(tmp_path / "w"), DGR_CACHE=str(tmp_path / "c"), DGR_LLAMA_GIT_URL=upstream.url)
    ctx = Context.from_env(env)
    pin = dataclasses.replace(upstream_pin, upstream="https://invalid.invalid/llama.cpp")
    first = ensure_pristine(ctx, pin=pin)
    assert first.provenance["git_url"] == upstream.url
    # Take the upstream away: a second call must not need it.
    Path(upstream.url.removeprefix("file://")).rename(tmp_path / "gone.git")
    started = time.monotonic()
    second = ensure_pristine(ctx, pin=pin)
    assert time.monotonic() - started < 2
    assert second.provenance == first.provenance


def test_missing_commit_is_unavailable_and_nothing_is_left(ctx: Context, upstream_pin) -> None:
    pin = dataclasses.replace(upstream_pin, commit="1" * 40)
    with pytest.raises(RuntimeFailure, match="no source could provide") as err:
        ensure_pristine(ctx, pin=pin)
    assert "git source" in err.value.message and "not our ref" in err.value.message
    assert err.value.exit_code == 6
    assert _leftovers(ctx) == []


def test_unreachable_git_url_is_unavailable(ctx: Context, tmp_path: Path, upstream_pin) -> None:
    pin = dataclasses.replace(upstream_pin, upstream=(tmp_path / "nowhere.git").as_uri())
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(SourceUnavailable):
        fetch_git(ctx, pin, dest)
    assert list(dest.iterdir()) == []


def test_other_commit_has_another_tree_integrity_error(ctx: Context, upstream, upstream_pin) -> None:
    pin = dataclasses.replace(upstream_pin, commit=upstream.other_commit)
    with pytest.raises(IntegrityError) as err:
        ensure_pristine(ctx, pin=pin)
    assert upstream.other_commit in err.value.message and upstream.tree in err.value.message
    assert err.value.exit_code == 3
    assert _leftovers(ctx) == []


def test_tree_mismatch_with_pin_is_an_integrity_error(ctx: Context, upstream_pin) -> None:
    pin = dataclasses.replace(upstream_pin, tree="2" * 40)
    with pytest.raises(IntegrityError, match="the pin says 2222"):
        ensure_pristine(ctx, pin=pin)
    assert not tree_dir(ctx, pin).exists() and not provenance_file(ctx, pin).exists()


def test_modified_tree_is_detected_and_never_silently_used(ctx: Context, upstream_pin) -> None:
    pristine = ensure_pristine(ctx, pin=upstream_pin)
    # Only touched: the stamp changes, the tree id still matches, the record is refreshed.
    os.utime(pristine.path / "README.md", ns=(1, 1))
    again = ensure_pristine(ctx, pin=upstream_pin)
    assert "reverified_at" in again.provenance
    # Edited: refused, with the way out in the hint.
    (pristine.path / "src" / "model.cpp").write_text("int layers() { return 5; }\n")
    with pytest.raises(IntegrityError, match="was modified") as err:
        ensure_pristine(ctx, pin=upstream_pin)
    assert "remove" in (err.value.hint or "")


def test_reverify_recomputes_even_when_the_stamp_matches(ctx: Context, upstream_pin) -> None:
    pristine = ensure_pristine(ctx, pin=upstream_pin)
    # Same size and mtime, different bytes: only --reverify can see it.
    target = pristine.path / "src" / "model.h"
    st = target.stat()
    target.write_text("int lazers();\n")
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert ensure_pristine(ctx, pin=upstream_pin).path == pristine.path
    with pytest.raises(IntegrityError, match="was modified"):
        ensure_pristine(ctx, pin=upstream_pin, reverify=True)


def test_tree_without_record_is_refused(ctx: Context, upstream_pin) -> None:
    final = tree_dir(ctx, upstream_pin)
    final.mkdir(parents=True)
    (final / "planted").write_text("x")
    with pytest.raises(IntegrityError, match="without its provenance record"):
        ensure_pristine(ctx, pin=upstream_pin)
    assert sorted(p.name for p in final.iterdir()) == ["planted"]


def test_symlinked_source_dir_is_refused(ctx: Context, tmp_path: Path, upstream_pin) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ctx.workspace.root.mkdir(parents=True)
    ctx.workspace.sources.symlink_to(elsewhere)
    with pytest.raises(IntegrityError, match="symbolic link"):
        ensure_pristine(ctx, pin=upstream_pin)
    assert list(elsewhere.iterdir()) == []


def test_bad_source_order_env_is_a_configuration_error(ctx: Context, upstream_pin) -> None:
    from core.errors import ConfigurationError

    bad = Context(env=dict(ctx.env, DGR_FETCH_SOURCES="git,carrier-pigeon"), workspace=ctx.workspace)
    with pytest.raises(ConfigurationError, match="carrier-pigeon"):
        ensure_pristine(bad, pin=upstream_pin)


def test_concurrent_fetches_agree(ctx: Context, upstream_pin) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: ensure_pristine(ctx, pin=upstream_pin), range(2)))
    assert results[0].provenance == results[1].provenance
    assert _leftovers(ctx) == [results[0].path.name, results[0].provenance_path.name]


def test_git_dir_planted_in_the_tree_is_an_integrity_error(ctx: Context, upstream_pin) -> None:
    pristine = ensure_pristine(ctx, pin=upstream_pin)
    (pristine.path / ".git").mkdir()
    with pytest.raises(IntegrityError, match="contains a .git entry"):
        ensure_pristine(ctx, pin=upstream_pin)


def test_credentials_in_a_mirror_url_are_not_recorded(tmp_path: Path, upstream_pin) -> None:
    from core.redact import redact_url

    assert (
        redact_url("https://user:s3cret@mirror.example:8443/llama.cpp.git")
        == "https://***@mirror.example:8443/llama.cpp.git"
    )
    assert redact_url("file:///srv/llama.cpp.git") == "file:///srv/llama.cpp.git"


def test_leftovers_of_a_killed_run_are_swept(ctx: Context, upstream_pin) -> None:
    leftover = tree_dir(ctx, upstream_pin).parent / f".{tree_dir(ctx, upstream_pin).name}.tmp-killed"
    (leftover / "src").mkdir(parents=True)
    ensure_pristine(ctx, pin=upstream_pin)
    assert not leftover.exists()
