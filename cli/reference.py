"""`dgr reference --recipe R --lane L [--store DIR] [--out DIR] [--against CPU_REF.json]` makes a sealed
reference; `dgr reference --recipe R --compare CPU_REF.json OTHER_REF.json` scores two of them through
the backend-agreement gate without running either."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cli.certify import recipe_and_store, recipe_arguments
from core.context import Context


def configure(parser: argparse.ArgumentParser) -> None:
    recipe_arguments(parser, "lane whose monolithic run is stored (default: cpu)")
    parser.add_argument(
        "--out",
        type=Path,
        help="folder for the reference and its manifest (default: .work/references/<set>/)",
    )
    parser.add_argument(
        "--against",
        type=Path,
        metavar="CPU_REF",
        help="a sealed CPU reference's manifest: also teacher-force on its tokens, so "
        "--compare can hold this lane to it later",
    )
    parser.add_argument(
        "--compare",
        type=Path,
        nargs=2,
        metavar=("CPU_REF", "OTHER_REF"),
        help="score OTHER_REF against CPU_REF (backend agreement); runs no worker",
    )


def run(args: argparse.Namespace, ctx: Context) -> int:
    from certify import reference
    from core.errors import GateFailed

    recipe, store = recipe_and_store(args, ctx)
    if args.compare:
        result = reference.compare(ctx, recipe, args.compare[0], args.compare[1], store=store)
        print(json.dumps(result.as_dict(), indent=2, sort_keys=True, default=str))
        print(f"backend agreement: {result.status.value} ({result.name})")
        if result.status.value != "PASS":
            raise GateFailed(f"{result.name}: {result.reason}")
        return 0
    made = reference.make(ctx, recipe, args.lane, store=store, out=args.out, against=args.against)
    per_k = made.size / made.positions * 1000
    print(
        f"reference: {made.file} ({made.size} bytes, {made.positions} positions, "
        f"{per_k / 2**20:.1f} MiB per 1k positions; monolithic run {made.seconds:.1f} s, "
        f"write + seal {made.seal_seconds:.1f} s)"
    )
    print(f"manifest: {made.manifest}")
    print(
        f"certify against it: dgr certify --recipe {recipe.name} --lane {args.lane} "
        f"--reference {made.manifest}"
    )
    return 0
