"""`dgr seal --artifacts NAME [--from DIR | --from hub:OWNER/REPO@REVISION [--include PATTERN]]
[--variant V]`: hash files into an artifact-set manifest."""

from __future__ import annotations

import argparse
from pathlib import Path

from core.context import Context


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--artifacts", required=True, metavar="NAME", help="artifact set (manifests/artifacts/NAME.json)"
    )
    parser.add_argument(
        "--from",
        dest="source",
        metavar="DIR|hub:OWNER/REPO@REVISION",
        help="directory holding the produced files (default for generated sets: regenerate them), or a "
        "Hugging Face Hub repository at a commit, branch or tag (a branch is resolved once and recorded "
        "as its commit; HF_ENDPOINT for a mirror, HF_TOKEN for a gated repo)",
    )
    parser.add_argument(
        "--include",
        metavar="PATTERN",
        action="append",
        help="with --from hub:...: the repo paths to seal (fnmatch, repeatable; default: the files the "
        "variant lists, else *.gguf)",
    )
    parser.add_argument(
        "--allow-host",
        metavar="HOST[:PORT]",
        action="append",
        help="with --from hub:...: a storage host the hub may redirect to, recorded in the origin "
        "(default: the public hub's storage hosts)",
    )
    parser.add_argument("--variant", metavar="V", help="seal only this variant (default: every variant)")


def run(args: argparse.Namespace, ctx: Context) -> int:
    from core.errors import ConfigurationError

    source = args.source
    if source is not None and source.startswith("hub:"):
        from fetch.seal import seal_hub

        path, commit = seal_hub(
            args.artifacts,
            source[len("hub:") :],
            include=args.include,
            variant=args.variant,
            allow_hosts=args.allow_host,
            ctx=ctx,
        )
        print(f"sealed {args.artifacts} -> {path} ({source[len('hub:') :].partition('@')[0]} at {commit})")
        return 0
    if args.include or args.allow_host:
        raise ConfigurationError("--include and --allow-host go with --from hub:OWNER/REPO@REVISION")
    from fetch.seal import seal
    from lanes.build import fetch_tools

    path = seal(
        args.artifacts,
        Path(source) if source is not None else None,
        variant=args.variant,
        ctx=ctx,
        tools=fetch_tools(ctx),
    )
    print(f"sealed {args.artifacts} -> {path}")
    return 0
