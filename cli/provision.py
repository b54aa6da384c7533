"""`dgr provision [--recipe NAME | --artifacts NAME [--variant V]] [--store DIR] [--reverify]`."""

from __future__ import annotations

import argparse
import math

from core.context import Context


def seconds(text: str) -> float:
    """A wait in seconds: finite and not negative (argparse turns the ValueError into exit 2)."""
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(text)
    return value


seconds.__name__ = "number of seconds (finite, >= 0)"  # what argparse names in its error


def configure(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--recipe", metavar="NAME", help="provision the artifact set this recipe names")
    which.add_argument("--artifacts", metavar="NAME", help="provision an artifact set directly")
    parser.add_argument(
        "--variant", metavar="V", help="with --artifacts: the variant (default: the set's default)"
    )
    parser.add_argument(
        "--store", metavar="DIR", help="artifact store (default: DGR_STORE, else .work/store)"
    )
    parser.add_argument(
        "--reverify", action="store_true", help="hash every file again instead of trusting the sidecar"
    )
    parser.add_argument(
        "--lock-wait",
        type=seconds,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for another run holding a file's lock (default: fail at once)",
    )


def target(args: argparse.Namespace, ctx: Context) -> tuple[str, str | None]:
    """(set name, variant) from --recipe, --artifacts, or the embedded default recipe."""
    if args.artifacts:
        return args.artifacts, args.variant
    from manifests import recipe_model as recipes

    recipe = recipes.load(args.recipe or recipes.DEFAULT_RECIPE, ctx.env)
    return recipe.artifacts, recipe.variant


def run(args: argparse.Namespace, ctx: Context) -> int:
    from core.errors import ConfigurationError
    from fetch.provision import provision
    from lanes.build import fetch_tools

    if args.variant and not args.artifacts:
        raise ConfigurationError("--variant goes with --artifacts; a recipe names its own variant")
    set_name, variant = target(args, ctx)
    done = provision(
        ctx,
        set_name,
        variant=variant,
        store=args.store,
        reverify=args.reverify,
        lock_wait_s=args.lock_wait,
        tools=fetch_tools(ctx),
    )
    print(
        f"provisioned {done.set_name}/{done.variant} ({len(done.files)} files, {done.reused} already "
        f"verified, {done.bytes_fetched} bytes fetched) in {done.store}"
    )
    print(f"first file: {done.first}")
    return 0
