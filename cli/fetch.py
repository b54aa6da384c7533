"""`dgr fetch`: the pinned llama.cpp tree into the workspace (thin; logic in fetch.source)."""

from __future__ import annotations

import argparse

from core.context import Context


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reverify",
        action="store_true",
        help="recompute the tree id of an existing tree instead of trusting its record",
    )
    parser.add_argument(
        "--source",
        choices=("git", "sdist"),
        action="append",
        dest="sources",
        help="try only this source (repeatable, in order); default: the pin's order "
        "(env DGR_FETCH_SOURCES=git,sdist does the same; "
        "DGR_LLAMA_GIT_URL names a git mirror)",
    )
    parser.epilog = (
        "The downloaded sdist is cached under "
        "$DGR_CACHE (default ~/.cache/dgr-certify)/archives "
        "and re-verified by sha256 before each use."
    )


def run(args: argparse.Namespace, ctx: Context) -> int:
    import time

    from fetch.source import ensure_pristine

    if args.sources:
        ctx = Context(env=dict(ctx.env, DGR_FETCH_SOURCES=",".join(args.sources)), workspace=ctx.workspace)
    started = time.monotonic()
    pristine = ensure_pristine(ctx, reverify=args.reverify)
    prov = pristine.provenance
    took = time.monotonic() - started
    print(
        f"llama.cpp {prov['commit'][:12]} tree {prov['tree']} (source: {prov['source']}) "
        f"at {pristine.path} [{took:.2f} s]"
    )
    return 0
