"""`dgr patch`: apply patches/series onto a copy of the pristine tree (thin; logic in patches.stack).

`--dev DIR` and `--refresh DIR` are the patch-writer's loop (see patches/dev.py); `--rebase-onto
COMMIT` replays the series onto a candidate llama.cpp commit (see patches/rebase.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from core.context import Context
from core.errors import ConfigurationError, GateFailed

_REBASE_ONLY = ("from_git", "tree", "sdist", "out", "write_patches")


def configure(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--dev",
        metavar="DIR",
        type=Path,
        help="create a git work tree at DIR: a 'pristine <commit>' base plus one commit per patch",
    )
    mode.add_argument(
        "--refresh",
        metavar="DIR",
        type=Path,
        help="regenerate patches/NNNN-*.patch and patches/series from the commits in DIR",
    )
    mode.add_argument(
        "--reverify",
        action="store_true",
        help="recompute the patched tree's digest instead of trusting its record",
    )
    mode.add_argument(
        "--rebase-onto",
        metavar="COMMIT",
        help="replay the series onto llama.cpp COMMIT (40 hex): which patches apply "
        "cleanly, need a 3-way merge or conflict; writes the refreshed series",
    )
    rebase = parser.add_argument_group("--rebase-onto options")
    rebase.add_argument(
        "--from-git",
        metavar="URL|DIR",
        help="git repository holding COMMIT (default: DGR_LLAMA_GIT_URL, else the pin's upstream)",
    )
    rebase.add_argument("--tree", metavar="DIR", type=Path, help="a directory holding COMMIT's files")
    rebase.add_argument(
        "--sdist",
        metavar="VERSION|FILE",
        help="the llama-cpp-python sdist (a file, or a version from the package index) "
        "whose vendored llama.cpp is COMMIT",
    )
    rebase.add_argument(
        "--out",
        metavar="DIR",
        type=Path,
        help="where the report and refreshed series go (default .work/rebase/<commit>)",
    )
    rebase.add_argument(
        "--write-patches",
        action="store_true",
        help="also replace patches/ with the refreshed series (only when nothing conflicts)",
    )


def run(args: argparse.Namespace, ctx: Context) -> int:
    if args.rebase_onto is not None:
        return _rebase(args, ctx)
    given = [f"--{n.replace('_', '-')}" for n in _REBASE_ONLY if getattr(args, n) not in (None, False)]
    if given:
        raise ConfigurationError(f"{', '.join(given)} only go with --rebase-onto COMMIT")
    if args.dev is not None:
        from patches.dev import make_dev_tree

        base = make_dev_tree(ctx, args.dev.absolute())
        print(
            f"dev tree at {args.dev} (base commit {base[:12]}); commit your changes there, "
            f"then `dgr patch --refresh {args.dev}`"
        )
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


def _rebase(args: argparse.Namespace, ctx: Context) -> int:
    from patches.rebase import CONFLICT, rebase_onto, table

    result = rebase_onto(
        ctx,
        args.rebase_onto,
        from_git=args.from_git,
        tree=args.tree,
        sdist=args.sdist,
        out=args.out,
        write_patches=args.write_patches,
    )
    print(table(result))
    print(f"report: {result.out / 'rebase.json'}")
    if not result.ok:
        bad = [o.name for o in result.outcomes if o.status == CONFLICT]
        raise GateFailed(
            f"{len(bad)} of {len(result.outcomes)} patch(es) conflict on "
            f"{args.rebase_onto[:12]}: {', '.join(bad)}; no refreshed series written",
            hint=f"resolve them in {result.kept_tree}: see docs/upstream/rebase.md",
        )
    kept = sum(o.refreshed is not None for o in result.outcomes)
    print(
        f"refreshed series: {result.out / 'patches'} ({kept} patch(es))"
        + ("; patches/ replaced" if args.write_patches else "")
    )
    return 0
