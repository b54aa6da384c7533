"""The upstream series' commit messages (patches/upstream/*.msg) and author parsing (issue 18 item 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigurationError
from patches import upstream
from patches.stack import PatchEntry, read_series


def test_every_patch_of_the_series_has_a_message_in_llama_cpp_style() -> None:
    entries = read_series()
    texts = upstream.messages(entries)
    assert sorted(texts) == sorted(e.name for e in entries)
    for name, text in texts.items():
        subject, blank, *body = text.splitlines()
        assert upstream.SUBJECT.match(subject) and blank == "", name
        assert any(line.startswith("Tested") for line in body), f"{name} does not say how it was tested"
    # and no message is left over from a patch that no longer exists
    assert {p.name for p in upstream.MESSAGES.glob("*.msg")} == {n.replace(".patch", ".msg") for n in texts}


def _entry(tmp_path: Path) -> PatchEntry:
    return PatchEntry(number=1, name="0001-x.patch", sha256="0" * 64, path=tmp_path / "0001-x.patch")


def test_a_missing_message_is_named(tmp_path) -> None:
    with pytest.raises(ConfigurationError, match="0001-x.patch has no upstream commit message"):
        upstream.messages([_entry(tmp_path)], tmp_path)


@pytest.mark.parametrize(
    "subject",
    ["Add layer ranges", "llama: no space before the colon", "Llama : capital area", "llama : " + "x" * 80],
)
def test_a_subject_not_in_upstream_style_is_refused(tmp_path, subject) -> None:
    (tmp_path / "0001-x.msg").write_text(f"{subject}\n\nbody\n")
    with pytest.raises(ConfigurationError, match="not in llama.cpp's style"):
        upstream.messages([_entry(tmp_path)], tmp_path)


def test_a_message_that_is_not_utf8_is_refused(tmp_path) -> None:
    (tmp_path / "0001-x.msg").write_bytes(b"llama : caf\xe9 support\n\nbody\n")  # Latin-1, not UTF-8
    with pytest.raises(ConfigurationError, match="0001-x.msg is not UTF-8 text"):
        upstream.messages([_entry(tmp_path)], tmp_path)


def test_author_is_name_and_email() -> None:
    who = upstream.identity("Ada Lovelace <ada@example.org>", "@0 +0000")
    assert (who["GIT_AUTHOR_NAME"], who["GIT_AUTHOR_EMAIL"], who["GIT_COMMITTER_DATE"]) == (
        "Ada Lovelace",
        "ada@example.org",
        "@0 +0000",
    )
    with pytest.raises(ConfigurationError, match="is not 'Name <email>'"):
        upstream.identity("ada@example.org", "@0 +0000")
