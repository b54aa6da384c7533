"""`dgr matrix [--self-hosted] [--recipe NAME] [--github-output FILE]`: the CI matrix as JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from core.context import Context


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--self-hosted",
        action="store_true",
        help="GPU lanes certify on their self-hosted runner labels instead of compiling only",
    )
    parser.add_argument("--recipe", help="the recipe CI certifies (default: the embedded tiny-llama)")
    parser.add_argument(
        "--github-output",
        type=Path,
        metavar="FILE",
        help="also append `matrix=<json>` to this file (GitHub Actions' $GITHUB_OUTPUT)",
    )


def run(args: argparse.Namespace, ctx: Context) -> int:
    import json

    from reports.matrix import matrix

    data = matrix(ctx, self_hosted=args.self_hosted, recipe=args.recipe)
    text = json.dumps(data, separators=(",", ":"), sort_keys=True)
    if args.github_output is not None:
        with open(args.github_output, "a", encoding="utf-8") as fh:
            fh.write(f"matrix={text}\n")
    print(json.dumps(data, indent=2, sort_keys=True))
    return 0
