"""`dgr balance --stages N [--recipe NAME] [--store DIR] [--fit SIZE] [--certificate FILE]`: the cut of a
recipe's model into N stages by decode cost (pipeline/balance.py), printed beside the even cut with what
each stage holds, and the stages ready for a recipe or a placement file.  ``--fit``: each stage may hold
at most SIZE of weights (a host's memory for them), and the cut is the best of those that fit.
``--certificate``: a certificate of the recipe, verified first, whose depth scenario says what moving a
session to another route costs at depth (the route change's re-prefill: every position again)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from core.context import Context

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?$", re.IGNORECASE)
_UNIT = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


positive.__name__ = "number of stages (>= 1)"  # what argparse names in its error


def size(text: str) -> int:
    """Bytes from ``512MB``, ``96GiB``, ``1.5TB`` or a plain count of bytes."""
    match = _SIZE.match(text.strip())
    if match is None:
        raise ValueError(text)
    nbytes = int(float(match.group(1)) * _UNIT[(match.group(2) or "b").lower()])
    if nbytes < 1:
        raise ValueError(text)
    return nbytes


size.__name__ = "size (bytes, or a number with B, kB, MB, GB, TB, KiB, MiB, GiB or TiB)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stages", type=positive, required=True, metavar="N", help="how many stages")
    parser.add_argument("--recipe", metavar="NAME", help="whose model to cut (default: tiny-llama)")
    parser.add_argument("--store", metavar="DIR", help="artifact store (default: DGR_STORE, or .work/store)")
    parser.add_argument(
        "--fit",
        type=size,
        metavar="SIZE",
        help="each stage holds at most SIZE of weights (96GiB, 500MB): what its host has",
    )
    parser.add_argument(
        "--certificate",
        type=Path,
        metavar="FILE",
        help="a certificate of the recipe (verified first): what a route change cost at its depth",
    )


def run(args: argparse.Namespace, ctx: Context) -> int:
    from manifests import recipe_model as recipes
    from pipeline.balance import balanced_stages, decode_cost, even_stages, held_bytes, megabytes

    recipe = recipes.load(args.recipe or recipes.DEFAULT_RECIPE, ctx.env)
    headers = set_headers(ctx, recipe.artifacts, recipe.variant, args.store)
    mtp = recipe.mtp if isinstance(recipe.mtp, recipes.Mtp) else None
    mtp_set = mtp.artifacts if mtp is not None else None  # an MTP-only set the last stage loads beside
    mtp_file = set_headers(ctx, mtp_set, mtp.variant, args.store) if mtp is not None and mtp_set else []
    cost, held = decode_cost(headers), held_bytes(headers, mtp=bool(recipe.mtp), mtp_file=mtp_file)
    cut = balanced_stages(cost, args.stages, held=held, limit=args.fit)
    total = cost.total
    stages = f"{args.stages} stage{'s' if args.stages > 1 else ''}"
    fit = f", each holding at most {megabytes(args.fit)}" if args.fit else ""
    print(
        f"balance: {recipe.name} ({recipe.variant}), {len(cost.layers)} layers into {stages} by "
        f"the bytes of weights a token reads ({megabytes(total)} in all){fit}"
    )
    for k, (start, end) in enumerate(cut):
        print(
            f"  stage {k}: layers [{start}, {end}), {_share(cost.stage(start, end), total)}, "
            f"holds {megabytes(held.stage(start, end))}"
        )
    even = even_stages(len(cost.layers), args.stages)
    print(
        f"costliest stage: {_share(max(cost.stage(*s) for s in cut), total)} "
        f"(the even cut {json.dumps(even)}: {_share(max(cost.stage(*s) for s in even), total)})"
    )
    most_held = max(held.stage(*s) for s in cut)
    print(
        f"most held by a stage: {megabytes(most_held)} of weights, before its KV cache "
        f"(the even cut: {megabytes(max(held.stage(*s) for s in even))})"
    )
    print(f'"stages": {json.dumps([list(s) for s in cut])}')
    if args.certificate is not None:
        print(route_change_cost(ctx, args.certificate, recipe.name))
    return 0


def route_change_cost(ctx: Context, path: Path, recipe: str) -> str:
    """One line: what the certificate's route change at depth cost (IntegrityError when it does not
    verify, ConfigurationError when it certifies another recipe)."""
    from certify.keys import trusted_keys
    from certify.verify import verify
    from core.errors import ConfigurationError, IntegrityError

    checked = verify(path, trusted_keys(ws=ctx.workspace), subjects=False)
    if not checked.ok:
        first = checked.failures[0]
        raise IntegrityError(f"{path}: {first.what} {first.detail}")
    pred = checked.predicate
    if pred.get("recipe", {}).get("name") != recipe:
        raise ConfigurationError(
            f"{path} certifies recipe {pred.get('recipe', {}).get('name')!r}, not {recipe!r}"
        )
    rc = (pred.get("figures", {}).get("depth") or {}).get("route_change")
    if not rc or rc.get("reprefill_s") is None:
        return f"route change: {path.name} records none at depth (no depth scenario, or made before one)"
    return (
        f"route change at {rc['prefix_tokens']} tokens ({rc['placement']}, lane {pred.get('lane', '?')}): "
        f"re-prefilling {rc['reprefill_tokens']} positions took {rc['reprefill_s']:.2f} s"
    )


def set_headers(ctx: Context, artifacts: str, variant: str | None, store: str | None) -> list:
    """The GGUF headers of every file of a set, provisioned first (a verified set is not read again)."""
    from fetch.gguf_header import read_header
    from fetch.provision import provision
    from lanes.build import fetch_tools

    done = provision(ctx, artifacts, variant=variant, store=store, tools=fetch_tools(ctx))
    return [read_header(f) for f in done.files]


def _share(nbytes: int, total: int) -> str:
    from pipeline.balance import megabytes

    return f"{megabytes(nbytes)} a token ({100 * nbytes / total:.0f}%)"
