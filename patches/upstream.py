"""The patch stack as a series upstream can take: mails that ``git am`` applies onto the pin.

`dgr upstream` writes OUT (default ``.work/upstream/``): ``0000-cover-letter.patch`` and one
``000N-<subject>.patch`` per patch of ``patches/series`` (``git format-patch``), each carrying the
llama.cpp-style commit message kept beside the stack in ``patches/upstream/NNNN-name.msg`` (subject
"area : what", then why, how, and how it was tested), plus ``series.json`` (pin, mails, per-patch
diffstat, tree ids).  It then applies the mails with ``git am`` onto a fresh repository of the
pristine tree and checks that the result has the patched tree's git tree id: what a maintainer
applies is byte for byte what the pipeline builds and certifies.

The mails are reproducible: commit hashes are zeroed (``--zero-commit``) and the date is fixed
(``SOURCE_DATE_EPOCH`` or ``--date``), so the same stack writes the same bytes on every machine.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from core.canonical import read_text, write_json
from core.context import Context
from core.errors import CommandFailed, ConfigurationError, IntegrityError, RuntimeFailure
from core.workspace import PATCHES
from fetch import gittree
from fetch.source import Pristine, ensure_pristine
from patches.dev import make_dev_tree
from patches.stack import PatchEntry, ensure_patched, read_series

MESSAGES = PATCHES / "upstream"
# llama.cpp's subject style: "area : what it does" (lower-case area words, at most ~72 characters).
SUBJECT = re.compile(r"^[a-z0-9_-]+(?: [a-z0-9_-]+)* : \S.{0,68}$")
DEFAULT_AUTHOR = "dgr-certify <noreply@dgr-certify.invalid>"  # replace with yours before sending
DEFAULT_DATE = "2026-01-01T00:00:00Z"
COVER = "0000-cover-letter.patch"


@dataclass(frozen=True, kw_only=True)
class PatchStat:
    name: str
    subject: str
    files: int
    insertions: int
    deletions: int


@dataclass(frozen=True, kw_only=True)
class Series:
    out: Path
    mails: tuple[Path, ...]  # the cover letter first
    pin: str
    tree: str  # the git tree id `git am` gives, equal to the patched tree's
    stats: tuple[PatchStat, ...]


def messages(entries: Sequence[PatchEntry], messages_dir: Path = MESSAGES) -> dict[str, str]:
    """Each patch's upstream commit message; a missing one or a subject not in llama.cpp's style is
    the stack's error, named."""
    found: dict[str, str] = {}
    for entry in entries:
        path = messages_dir / entry.name.replace(".patch", ".msg")
        if not path.is_file():
            raise ConfigurationError(
                f"patch {entry.name} has no upstream commit message at {path}",
                hint="a subject 'area : what', a blank line, then why, how, tested",
            )
        text = read_text(path).strip() + "\n"
        subject = text.splitlines()[0]
        if not SUBJECT.match(subject):
            raise ConfigurationError(
                f"{path.name}: subject {subject!r} is not in llama.cpp's style",
                hint="'area : what it does', lower-case area, at most 72 characters",
            )
        found[entry.name] = text
    return found


def identity(author: str, date: str) -> dict[str, str]:
    """GIT_AUTHOR_*/GIT_COMMITTER_* for ``"Name <email>"`` at ``date``."""
    m = re.fullmatch(r"\s*([^<>]+?)\s*<([^<>\s]+)>\s*", author)
    if not m:
        raise ConfigurationError(f"author {author!r} is not 'Name <email>'")
    name, email = m.groups()
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
        "GIT_COMMITTER_DATE": date,
    }


def write_upstream(
    ctx: Context, out: Path, *, author: str = DEFAULT_AUTHOR, date: str = DEFAULT_DATE
) -> Series:
    """Write the series into ``out`` and prove ``git am`` reproduces the patched tree."""
    pristine = ensure_pristine(ctx)
    patched = ensure_patched(ctx)
    entries = read_series()
    texts = messages(entries)
    who = identity(author, date)
    out.mkdir(parents=True, exist_ok=True)
    scratch = ctx.workspace.ensure(ctx.workspace.staging)
    with tempfile.TemporaryDirectory(prefix=".upstream-", dir=scratch) as tmp:
        dev = Path(tmp) / "tree"
        base = make_dev_tree(ctx, dev, message=lambda name, _data: texts[name], identity=who)
        stats = _stats(ctx, dev, base, entries)
        mails = _format_patch(ctx, dev, base, out, who)
        _write_cover(out / COVER, pristine, stats)
        applied = am_tree_id(ctx, dev, base, mails[1:], who)
    if applied != patched.digest:
        raise IntegrityError(
            f"git am of the series gives tree {applied}, not the patched {patched.digest}",
            hint="the mails lost something the patches carry (whitespace, modes, binary)",
        )
    series = Series(out=out, mails=tuple(mails), pin=pristine.commit, tree=applied, stats=tuple(stats))
    _write_record(series)
    return series


def _stats(ctx: Context, dev: Path, base: str, entries: Sequence[PatchEntry]) -> list[PatchStat]:
    env = gittree.git_env(ctx.env)
    commits = gittree.git(["rev-list", "--reverse", f"{base}..HEAD"], env=env, cwd=dev).split()
    stats = []
    for entry, commit in zip(entries, commits, strict=True):
        rows = gittree.git(["diff", "--numstat", "--no-renames", f"{commit}^", commit], env=env, cwd=dev)
        counts = [line.split("\t")[:2] for line in rows.splitlines()]
        subject = gittree.git(["log", "-1", "--format=%s", commit], env=env, cwd=dev)
        stats.append(
            PatchStat(
                name=entry.name,
                subject=subject,
                files=len(counts),
                insertions=sum(int(a) for a, _ in counts if a.isdigit()),
                deletions=sum(int(d) for _, d in counts if d.isdigit()),
            )
        )
    return stats


def _format_patch(ctx: Context, dev: Path, base: str, out: Path, who: dict[str, str]) -> list[Path]:
    """``git format-patch`` of base..HEAD into ``out`` (stale mails of a longer series removed first)."""
    for old in out.glob("[0-9][0-9][0-9][0-9]-*.patch"):
        old.unlink()
    env = gittree.git_env(ctx.env, **who)
    options = [
        "--cover-letter",
        "--zero-commit",
        "--no-signature",
        "--full-index",
        "--no-renames",
        "--numbered",
    ]
    listing = gittree.git(["format-patch", *options, "-o", str(out), f"{base}..HEAD"], env=env, cwd=dev)
    mails = [Path(line) for line in listing.splitlines() if line.endswith(".patch")]
    if not mails or mails[0].name != COVER:
        raise RuntimeFailure("git format-patch wrote no cover letter", hint=listing[-500:])
    return mails


def _write_cover(path: Path, pristine: Pristine, stats: Sequence[PatchStat]) -> None:
    """Fill git's cover-letter placeholders from the series itself (nothing is claimed that the
    per-patch messages do not say)."""
    total = sum(s.insertions + s.deletions for s in stats)
    per_patch = ", ".join(f"{s.insertions}+/{s.deletions}-" for s in stats)
    subject = f"llama : pipeline-stage hooks ({len(stats)} patches)"
    blurb = "\n".join(
        [
            "Hooks that let one model run as a pipeline of processes, each holding a contiguous range of",
            "layers, its own weights and its own KV cache, with only the residual between layers crossing",
            "the process boundary. Generic: layer-range loading (other stages' tensors as placeholders",
            "without data), the stage cut of the whole model's graph at the layer outputs every builder",
            "names (what else a stage would read is derived from the graph and refused by name), a later",
            "stage's input in llama_batch.embd and an earlier stage's residual as its embeddings, and KV",
            "and recurrent state for the owned layers only. One architecture stages itself (DeepSeek V4,",
            "whose residual between layers no layer output names).",
            "No routing, transport or scheduling policy is included.",
            "",
            f"The series applies with `git am` onto llama.cpp {pristine.commit}.",
            f"Footprint: {total} changed lines in all ({per_patch}).",
            "Each commit message says how that patch was tested.",
        ]
    )
    text = path.read_text(encoding="utf-8")
    if "*** SUBJECT HERE ***" not in text or "*** BLURB HERE ***" not in text:
        raise RuntimeFailure(f"{path.name}: git's cover-letter placeholders were not found")
    path.write_text(
        text.replace("*** SUBJECT HERE ***", subject).replace("*** BLURB HERE ***", blurb), encoding="utf-8"
    )


def am_tree_id(ctx: Context, repo: Path, base: str, mails: Sequence[Path], who: dict[str, str]) -> str:
    """The git tree id after ``git am`` of ``mails`` onto ``base`` of ``repo`` (a dev tree, whose base
    make_dev_tree has already held to the pristine tree id), detached so the patch commits stay."""
    env = gittree.git_env(ctx.env, **who)
    gittree.git(["checkout", "-q", "--detach", base], env=env, cwd=repo)
    try:
        gittree.git(["am", "--quiet", "--whitespace=nowarn", *map(str, mails)], env=env, cwd=repo)
    except CommandFailed as exc:
        why = [ln.strip() for ln in exc.tail.splitlines() if ln.startswith(("error:", "Patch failed"))]
        raise IntegrityError(
            f"git am does not apply the series onto the pin ({base[:12]}): "
            f"{'; '.join(why) or exc.tail.strip()[-300:]}"
        ) from None
    return gittree.git(["rev-parse", "HEAD^{tree}"], env=env, cwd=repo)


def _write_record(series: Series) -> None:
    record = {
        "pin": series.pin,
        "tree": series.tree,
        "mails": [m.name for m in series.mails],
        "patches": [asdict(s) for s in series.stats],
        "changed_lines": sum(s.insertions + s.deletions for s in series.stats),
    }
    write_json(series.out / "series.json", record)
