"""`dgr upstream [--out DIR] [--author "Name <email>"] [--date ISO]`: the patch stack as a
`git format-patch` series that `git am` applies onto the pinned llama.cpp (logic in patches.upstream)."""

from __future__ import annotations

import argparse
from pathlib import Path

from core.context import Context


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="where the mails go (default: the workspace's upstream/)")
    parser.add_argument("--author", metavar='"NAME <EMAIL>"',
                        help="author and committer of every patch (default: a placeholder to replace)")
    parser.add_argument("--date", metavar="ISO",
                        help="date of every patch (default: SOURCE_DATE_EPOCH if set, else a fixed date, "
                        "so the mails are reproducible)")


def run(args: argparse.Namespace, ctx: Context) -> int:
    from patches import upstream

    date = args.date or _source_date(ctx) or upstream.DEFAULT_DATE
    out = args.out.absolute() if args.out else ctx.workspace.ensure(ctx.workspace.upstream)
    series = upstream.write_upstream(ctx, out, author=args.author or upstream.DEFAULT_AUTHOR, date=date)
    for stat in series.stats:
        print(f"{stat.name}: {stat.files} files, +{stat.insertions} -{stat.deletions}  {stat.subject}")
    total = sum(s.insertions + s.deletions for s in series.stats)
    print(f"upstream: {len(series.stats)} patches ({total} changed lines) in {out}; "
          f"git am onto {series.pin[:12]} gives the patched tree {series.tree[:12]}")
    return 0


def _source_date(ctx: Context) -> str | None:
    """SOURCE_DATE_EPOCH (the reproducible-builds convention) as git's '@EPOCH +0000' date."""
    raw = ctx.env.get("SOURCE_DATE_EPOCH", "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        from core.errors import ConfigurationError

        raise ConfigurationError(f"SOURCE_DATE_EPOCH={raw!r} is not a number of seconds")
    return f"@{raw} +0000"
