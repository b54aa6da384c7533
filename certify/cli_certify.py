"""`dgr certify [--recipe NAME | --recipe-file PATH] [--lane cpu] [--store DIR]`."""

from __future__ import annotations

import argparse
from pathlib import Path

from certify.context import Context


def configure(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--recipe", default=None, help="recipe name (default: the embedded tiny-llama)")
    group.add_argument("--recipe-file", type=Path, help="a recipe JSON file outside manifests/recipes/")
    parser.add_argument("--lane", default="cpu", help="lane to certify (default: cpu)")
    parser.add_argument("--store", help="artifact store (default: DGR_STORE or .work/store)")


def run(args: argparse.Namespace, ctx: Context) -> int:
    from certify import recipes
    from certify.run import certify, gate_failed
    from certify.workspace import env_store

    if args.recipe_file is not None:
        recipe = recipes.load_file(args.recipe_file)
    else:
        recipe = recipes.load(args.recipe or recipes.DEFAULT_RECIPE, ctx.env)
    store = env_store(ctx.env, args.store, ctx.workspace)
    written = certify(ctx, recipe, args.lane, store=store)
    print(
        f"verdict: {written.verdict.status.value} ({recipe.name} on {args.lane}, run {written.run_id}, "
        f"{written.seconds:.1f} s)"
    )
    print(f"certificate: {written.certificate}")
    print(f"report: {written.html}")
    if not written.verdict.passed:
        raise gate_failed(written)
    return 0
