"""`dgr report [--reports DIR]`: rebuild index.html over every certificate under the reports folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from core.context import Context


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reports", type=Path, help="reports folder (default: .work/reports)")


def run(args: argparse.Namespace, ctx: Context) -> int:
    from reports.index import render_index

    reports = (args.reports or ctx.workspace.reports).resolve()
    out = render_index(ctx, reports)
    print(f"index: {out}")
    return 0
