"""`dgr seal --artifacts NAME [--from DIR] [--variant V]`: hash files into an artifact-set manifest."""

from __future__ import annotations

import argparse
from pathlib import Path

from core.context import Context


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--artifacts", required=True, metavar="NAME", help="artifact set (manifests/artifacts/NAME.json)"
    )
    parser.add_argument(
        "--from",
        dest="source",
        metavar="DIR",
        type=Path,
        help="directory holding the produced files (default for generated sets: regenerate them)",
    )
    parser.add_argument("--variant", metavar="V", help="seal only this variant (default: every variant)")


def run(args: argparse.Namespace, ctx: Context) -> int:
    from fetch.seal import seal
    from lanes.build import fetch_tools

    path = seal(args.artifacts, args.source, variant=args.variant, ctx=ctx, tools=fetch_tools(ctx))
    print(f"sealed {args.artifacts} -> {path}")
    return 0
