"""`dgr balance --stages N [--recipe NAME] [--store DIR]`: the cut of a recipe's model into N stages by
decode cost (pipeline/balance.py), printed beside the even cut, with the stages ready for a recipe or a
placement file."""

from __future__ import annotations

import argparse
import json

from core.context import Context


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


positive.__name__ = "number of stages (>= 1)"  # what argparse names in its error


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stages", type=positive, required=True, metavar="N", help="how many stages")
    parser.add_argument("--recipe", metavar="NAME", help="whose model to cut (default: tiny-llama)")
    parser.add_argument("--store", metavar="DIR", help="artifact store (default: DGR_STORE, or .work/store)")


def run(args: argparse.Namespace, ctx: Context) -> int:
    from fetch.gguf_header import read_header
    from fetch.provision import provision
    from lanes.build import fetch_tools
    from manifests import recipe_model as recipes
    from pipeline.balance import balanced_stages, decode_cost, even_stages

    recipe = recipes.load(args.recipe or recipes.DEFAULT_RECIPE, ctx.env)
    done = provision(ctx, recipe.artifacts, variant=recipe.variant, store=args.store, tools=fetch_tools(ctx))
    cost = decode_cost([read_header(f) for f in done.files])
    cut = balanced_stages(cost, args.stages)
    total = cost.total
    stages = f"{args.stages} stage{'s' if args.stages > 1 else ''}"
    print(f"balance: {recipe.name} ({done.variant}), {len(cost.layers)} layers into {stages} by "
          f"the bytes of weights a token reads ({total / 1e6:.1f} MB in all)")
    for k, (start, end) in enumerate(cut):
        print(f"  stage {k}: layers [{start}, {end}), {_share(cost.stage(start, end), total)}")
    even = even_stages(len(cost.layers), args.stages)
    print(f"costliest stage: {_share(max(cost.stage(*s) for s in cut), total)} "
          f"(the even cut {json.dumps(even)}: {_share(max(cost.stage(*s) for s in even), total)})")
    print(f'"stages": {json.dumps([list(s) for s in cut])}')
    return 0


def _share(nbytes: int, total: int) -> str:
    return f"{nbytes / 1e6:.1f} MB a token ({100 * nbytes / total:.0f}%)"
