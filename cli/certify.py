"""`dgr certify [--recipe NAME | --recipe-file PATH] [--lane cpu] [--store DIR]
[--placement-file FILE | --write-identity FILE] [--reference REF.json]`."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from core.context import Context
from core.errors import ConfigurationError


def recipe_arguments(parser: argparse.ArgumentParser, lane_help: str) -> None:
    """--recipe | --recipe-file, --lane, --store: what `dgr certify` and `dgr reference` both take."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--recipe", default=None, help="recipe name (default: the embedded tiny-llama)")
    group.add_argument("--recipe-file", type=Path, help="a recipe JSON file outside manifests/recipes/")
    parser.add_argument("--lane", default="cpu", help=lane_help)
    parser.add_argument("--store", help="artifact store (default: DGR_STORE or .work/store)")


def recipe_and_store(args: argparse.Namespace, ctx: Context) -> tuple[Any, Path]:
    """The recipe the arguments name (loaded and checked) and the artifact store."""
    from core.workspace import env_store
    from manifests import recipe_model as recipes

    if args.recipe_file is not None:
        recipe = recipes.load_file(args.recipe_file)
    else:
        recipe = recipes.load(args.recipe or recipes.DEFAULT_RECIPE, ctx.env)
    return recipe, env_store(ctx.env, args.store, ctx.workspace)


def configure(parser: argparse.ArgumentParser) -> None:
    recipe_arguments(parser, "lane to certify (default: cpu)")
    parser.add_argument(
        "--reference",
        type=Path,
        metavar="REF.json",
        help="a sealed reference's manifest (dgr reference): every placement is compared with it "
        "instead of a monolithic run, and no monolithic worker is started; recorded in the certificate",
    )
    parser.add_argument(
        "--tls",
        nargs="?",
        const="tls",
        choices=("tls", "mac"),
        metavar="FRAMES",
        help="start every worker with mutual TLS on all its ports, from a CA made for the run in its "
        "evidence folder, and reach it so; `--tls mac`: their pass ports in authenticated frames (not "
        "encrypted; docs/multi-host.md); the certificate records each stage's transport",
    )
    parser.add_argument(
        "--worker-tls",
        type=Path,
        metavar="DIR",
        help="with --write-identity: the worker host's TLS identity folder (`dgr tls`); the printed "
        "command starts the worker with it, and the fingerprint its placement-file entries pin is printed",
    )
    attach = parser.add_mutually_exclusive_group()
    attach.add_argument(
        "--placement-file",
        type=Path,
        metavar="FILE",
        help="certify workers the operator already runs (host:port per stage, docs/multi-host.md); "
        "each is checked through Info before it is trusted, none is started or stopped",
    )
    attach.add_argument(
        "--write-identity",
        type=Path,
        metavar="FILE",
        help="write the identity file a worker of this recipe and lane is started with (--identity FILE) "
        "and print its command line; certifies nothing",
    )


def _tls_flags(folder: Path | None) -> list[str]:
    return [] if folder is None else ["--tls", str(folder.resolve())]


def _print_transport(folder: Path | None) -> None:
    """The pin for the placement file when the worker has an identity, else how to get one."""
    if folder is None:
        print(
            "a HOST other hosts can reach also needs --tls DIR (mutual TLS: `dgr tls`, and the placement "
            'file\'s "driver": {"tls": DIR} and "fingerprint" per stage) or --insecure (plaintext, a '
            "private network only); docs/multi-host.md"
        )
        return
    from worker.tls import load

    print(f'in the placement file, each stage of this host: "fingerprint": "{load(folder).fingerprint}"')


def run(args: argparse.Namespace, ctx: Context) -> int:
    from certify.run import certify, gate_failed
    from reports.render import render

    recipe, store = recipe_and_store(args, ctx)
    if args.worker_tls is not None and args.write_identity is None:
        raise ConfigurationError("--worker-tls goes with --write-identity (the worker command it prints)")
    if args.write_identity is not None:
        from certify.inputs import write_identity

        recipe.require_lane(args.lane)
        lines = write_identity(ctx, recipe, args.lane, args.write_identity, store=store)
        print(f"identity: {args.write_identity.resolve()} ({recipe.name} on {args.lane})")
        print(f"start each stage with: {shlex.join(lines.every_stage + _tls_flags(args.worker_tls))}")
        if lines.last_stage_also:
            print(f"and the last stage also with: {shlex.join(lines.last_stage_also)}")
        _print_transport(args.worker_tls)
        return 0
    written = certify(
        ctx,
        recipe,
        args.lane,
        render=render,
        store=store,
        placement_file=args.placement_file,
        reference=args.reference,
        tls=args.tls,
    )
    print(
        f"verdict: {written.verdict.status.value} ({recipe.name} on {args.lane}, run {written.run_id}, "
        f"{written.seconds:.1f} s)"
    )
    print(f"certificate: {written.certificate}")
    print(f"report: {written.html}")
    if not written.verdict.passed:
        raise gate_failed(written)
    return 0
