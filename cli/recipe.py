"""`dgr recipe init --artifacts NAME [--variant V] [--name RECIPE] [--like RECIPE] [--store DIR] [--force]`:
a first recipe for an artifact set (manifests/recipe_draft.py), written into the user's recipes folder.

Its staged placements are cut by decode cost from the set's own files, as `dgr balance` cuts them: the
set is provisioned (verified) first, and its headers read (cli/balance.py, pipeline/balance.py)."""

from __future__ import annotations

import argparse

from core.context import Context


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    text = "write a recipe for an artifact set into the user's recipes folder (DGR_RECIPES_DIR)"
    init = sub.add_parser("init", help=text, description=text)
    init.add_argument("--artifacts", required=True, metavar="NAME", help="the artifact set, sealed")
    init.add_argument("--variant", metavar="V", help="its variant (default: the set's default)")
    init.add_argument("--name", metavar="RECIPE", help="the recipe's name (default: the set's)")
    init.add_argument(
        "--like",
        metavar="RECIPE",
        help="the shipped recipe whose prompts, measurement and thresholds to take (default, by "
        "architecture: llama tiny-llama, gemma3 gemma3-270m-q4, deepseek4 v4-q4)",
    )
    init.add_argument(
        "--store", metavar="DIR", help="artifact store (default: DGR_STORE, or the workspace's)"
    )
    init.add_argument(
        "--force", action="store_true", help="replace a recipe of that name in the user's folder"
    )


def run(args: argparse.Namespace, ctx: Context) -> int:
    from cli.balance import set_headers
    from manifests import recipe_draft
    from manifests.artifact_sets import load_set, require_sealed
    from pipeline.balance import balanced_stages, decode_cost

    aset = load_set(args.artifacts, env=ctx.env)
    variant = aset.variant_name(args.variant)
    require_sealed(aset, variant)
    # every refusal that needs no file before the set is provisioned
    recipe_draft.check_certifiable(aset, variant)
    like = recipe_draft.family(aset.variant(variant).gguf.architecture, args.like)
    name = args.name or aset.name
    path = recipe_draft.destination(name, ctx.env, force=args.force)
    cost = decode_cost(set_headers(ctx, aset.name, variant, args.store))
    doc = recipe_draft.draft(
        name=name,
        aset=aset,
        variant=variant,
        n_layer=len(cost.layers),
        cut=lambda n: balanced_stages(cost, n),
        like=like,
    )
    recipe = recipe_draft.write(doc, path, ctx.env)
    staged = ", ".join(p.name for p in recipe.staged)
    print(f"wrote recipe {recipe.name} -> {path}")
    print(f"  {aset.name} ({variant}), {recipe.n_layer} layers; placements: mono, {staged}")
    print(f"  prompts, measurement and thresholds: the shipped defaults of {like.name}")
    print(f"next: dgr certify --recipe {recipe.name}")
    return 0
