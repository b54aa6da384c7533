"""`dgr patch`: apply patches/series onto a copy of the pristine tree (thin; logic in patches.stack).

`--dev DIR` and `--refresh DIR` are the patch-writer's loop (see patches/dev.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from core.context import Context


def configure(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dev", metavar="DIR", type=Path,
                      help="create a git work tree at DIR: a 'pristine <commit>' base "
                      "plus one commit per patch")
    mode.add_argument("--refresh", metavar="DIR", type=Path,
                      help="regenerate patches/NNNN-*.patch and patches/series from the commits in DIR")
    mode.add_argument("--reverify", action="store_true",
                      help="recompute the patched tree's digest instead of trusting its record")


def run(args: argparse.Namespace, ctx: Context) -> int:
    if args.dev is not None:
        from patches.dev import make_dev_tree

        base = make_dev_tree(ctx, args.dev.absolute())
        print(f"dev tree at {args.dev} (base commit {base[:12]}); commit your changes there, "
              f"then `dgr patch --refresh {args.dev}`")
        return 0
    if args.refresh is not None:
        from patches.dev import refresh

        written = refresh(ctx, args.refresh.absolute())
        for name, digest in written:
            print(f"{name} {digest}")
        print(f"patches/series: {len(written)} patch(es)")
        return 0
    from patches.stack import ensure_patched

    patched = ensure_patched(ctx, reverify=args.reverify)
    n = len(patched.provenance["patches"])
    print(f"patched tree {patched.digest} ({n} patch(es)) at {patched.path}")
    return 0
