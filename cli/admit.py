"""`dgr admit --catalog FILE --recipe R --lane L (--placement-file P | --layers B:E,...)`: is this split
certified?

A router's admission check: the catalog must verify (its signature; the certificates it names need
not be here), then each proposed split (every placement of the placement file, or the one --layers
names) must be a PASS entry of the same recipe, lane (and --hardware-class) and layer ranges, with
the artifacts it would load (by default this checkout's manifest of the recipe's set, or
--artifacts-digest) and under the same recipe digest (this checkout's recipe where it has it, or
--recipe-digest; else the line says it was not compared).  Exit 0 when every split is admitted, 5
naming why one is not, 3 when the catalog does not verify.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.verify import add_key_option
from core.context import Context


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--catalog", type=Path, required=True, help="a catalog written by `dgr catalog`")
    parser.add_argument("--recipe", help="the recipe (default: the placement file's)")
    parser.add_argument("--lane", help="the lane the stages run (default: the placement file's)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--placement-file", type=Path, help="each of its placements is one proposal")
    which.add_argument("--layers", help="one proposal: each stage's layers, B:E,B:E,... (e.g. 0:6,6:12)")
    parser.add_argument("--hardware-class", help="admit only entries certified on this hardware class")
    parser.add_argument("--artifacts-digest", help="the manifest digest of the artifacts the stages load")
    parser.add_argument(
        "--recipe-digest",
        help="the digest of the recipe the stages run under (default: this checkout's recipe, if it has it)",
    )
    add_key_option(parser)


def run(args: argparse.Namespace, ctx: Context) -> int:
    from certify.admit import NotAdmitted, admit

    catalog = _verified_catalog(args, ctx)
    proposals = _proposals(args, ctx)
    refused = []
    for name, proposal in proposals.items():
        got = admit(catalog, proposal)
        print(f"{'admitted' if got.admitted else 'refused '} {name}: {got.reason}")
        if not got.admitted:
            refused.append(got.reason)
    if refused:
        more = f" (+{len(refused) - 1} more, above)" if len(refused) > 1 else ""
        raise NotAdmitted(refused[0] + more)
    return 0


def _verified_catalog(args: argparse.Namespace, ctx: Context) -> dict:
    from certify.keys import trusted_keys
    from certify.verify import verify
    from core.errors import ConfigurationError, IntegrityError

    v = verify(args.catalog, trusted_keys(args.key, ws=ctx.workspace), subjects=False)
    if not v.ok:
        first = v.failures[0]
        raise IntegrityError(f"{args.catalog}: {first.what} {first.detail}")
    if not v.catalog:
        raise ConfigurationError(
            f"{args.catalog} is a certificate, not a catalog", hint="make one with `dgr catalog`"
        )
    return dict(v.predicate)


def _proposals(args: argparse.Namespace, ctx: Context) -> dict:
    """Proposal per name: the placement file's placements, or the one split --layers gives."""
    from certify.admit import Proposal
    from core.errors import ConfigurationError
    from manifests.placement_file import load_file

    if args.placement_file:
        pf = load_file(args.placement_file)
        recipe, lane = args.recipe or pf.recipe, args.lane or pf.lane
        splits = {n: tuple(s.layers for s in stages) for n, stages in pf.placements.items()}
    else:
        recipe, lane = args.recipe, args.lane
        splits = {"--layers": _layers(args.layers)}
    if not recipe or not lane:
        raise ConfigurationError("name the recipe and the lane (--recipe, --lane, or in the placement file)")
    digest = args.artifacts_digest or _this_checkouts_digest(recipe, ctx)
    recipe_digest = args.recipe_digest or _this_checkouts_recipe_digest(recipe, ctx)
    return {
        name: Proposal(
            recipe=recipe,
            lane=lane,
            stages=stages,
            artifacts_digest=digest,
            recipe_digest=recipe_digest,
            hardware_class=args.hardware_class,
        )
        for name, stages in splits.items()
    }


def _layers(text: str) -> tuple[tuple[int, int], ...]:
    from core.digits import ascii_int
    from core.errors import ConfigurationError

    stages = []
    for part in text.split(","):
        begin, sep, end = part.partition(":")
        b, e = ascii_int(begin), ascii_int(end)
        if not sep or b is None or e is None:
            raise ConfigurationError(
                f"--layers {text!r}: each stage is BEGIN:END in whole numbers, e.g. 0:6,6:12"
            )
        stages.append((b, e))
    return tuple(stages)


def _this_checkouts_digest(recipe: str, ctx: Context) -> str:
    """The manifest digest of the recipe's artifact set as this checkout has it."""
    from manifests.artifact_sets import load_set
    from manifests.recipe_model import load

    return load_set(load(recipe, ctx.env).artifacts, env=ctx.env).digest


def _this_checkouts_recipe_digest(recipe: str, ctx: Context) -> str | None:
    """The digest of the recipe as this checkout has it; None where it has no such recipe (a router
    checking a split of a recipe it only knows by name: the admission line says it was not compared)."""
    from core.errors import ConfigurationError
    from manifests.recipe_model import find, load

    try:
        find(recipe, ctx.env)
    except ConfigurationError:
        return None
    return load(recipe, ctx.env).digest
