"""`dgr upstream [--out DIR] [--author "Name <email>"] [--date ISO] [--suites]`: the patch stack as a
`git format-patch` series that `git am` applies onto the pinned llama.cpp (logic in patches.upstream);
``--suites`` also runs upstream's own tests on both trees (lanes.upstream_suites)."""

from __future__ import annotations

import argparse
from pathlib import Path

from core.context import Context
from core.digits import ascii_int


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", type=Path, metavar="DIR", help="where the mails go (default: the workspace's upstream/)"
    )
    parser.add_argument(
        "--author",
        metavar='"NAME <EMAIL>"',
        help="author and committer of every patch (default: a placeholder to replace)",
    )
    parser.add_argument(
        "--date",
        metavar="ISO",
        help="date of every patch (default: SOURCE_DATE_EPOCH if set, else a fixed date, "
        "so the mails are reproducible)",
    )
    parser.add_argument(
        "--suites",
        action="store_true",
        help="also build upstream's own tests from the pristine and the patched tree and run "
        "them side by side on the CPU (suites.md beside the mails; tens of minutes on 2 "
        "cores); exit 5 when one fails only on the patched tree",
    )


def run(args: argparse.Namespace, ctx: Context) -> int:
    from patches import upstream

    date = args.date or _source_date(ctx) or upstream.DEFAULT_DATE
    out = args.out.absolute() if args.out else ctx.workspace.ensure(ctx.workspace.upstream)
    series = upstream.write_upstream(ctx, out, author=args.author or upstream.DEFAULT_AUTHOR, date=date)
    for stat in series.stats:
        print(f"{stat.name}: {stat.files} files, +{stat.insertions} -{stat.deletions}  {stat.subject}")
    total = sum(s.insertions + s.deletions for s in series.stats)
    print(
        f"upstream: {len(series.stats)} patches ({total} changed lines) in {out}; "
        f"git am onto {series.pin[:12]} gives the patched tree {series.tree[:12]}"
    )
    return _suites(ctx, out) if args.suites else 0


def _suites(ctx: Context, out: Path) -> int:
    """upstream's tests, pristine vs patched (logic in lanes.upstream_suites)."""
    import sys

    from core.errors import GateFailed
    from lanes import upstream_suites

    def say(text: str) -> None:
        print(f"upstream suites: {text}", file=sys.stderr)

    report = upstream_suites.run_suites(ctx, out=out, progress=say)
    print(f"upstream suites: {report.markdown_path}")
    if not report.ok:
        raise GateFailed(
            f"{len(report.regressions)} upstream test(s) fail only on the patched tree: "
            f"{', '.join(report.regressions)}",
            hint=f"see {report.markdown_path} and logs/ beside it",
        )
    return 0


def _source_date(ctx: Context) -> str | None:
    """SOURCE_DATE_EPOCH (the reproducible-builds convention) as git's '@EPOCH +0000' date."""
    raw = ctx.env.get("SOURCE_DATE_EPOCH", "").strip()
    if not raw:
        return None
    if ascii_int(raw) is None:
        from core.errors import ConfigurationError

        raise ConfigurationError(f"SOURCE_DATE_EPOCH={raw!r} is not a number of seconds")
    return f"@{raw} +0000"
