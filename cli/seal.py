"""`dgr seal --artifacts NAME [--from DIR | --from hub:OWNER/REPO@REVISION [--include PATTERN]]
[--variant V]`: hash files into an artifact-set manifest.  A NAME no manifest folder has is a new set:
described from its files' GGUF headers into the user's manifests folder (fetch.describe), then sealed."""

from __future__ import annotations

import argparse
from pathlib import Path

from core.context import Context


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--artifacts",
        required=True,
        metavar="NAME",
        help="artifact set (NAME.json in the user's manifests folder or manifests/artifacts; a new NAME "
        "with --from: described from the files' GGUF headers into DGR_MANIFESTS_DIR/artifacts)",
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
    from manifests.artifact_sets import find_set

    source = args.source
    hub_ref = source[len("hub:") :] if source is not None and source.startswith("hub:") else None
    if hub_ref is None and (args.include or args.allow_host):
        raise ConfigurationError("--include and --allow-host go with --from hub:OWNER/REPO@REVISION")
    found = find_set(args.artifacts, ctx.env)
    if found is None:
        return _seal_new(args, ctx, hub_ref)
    if hub_ref is not None:
        from fetch.seal import seal_hub

        path, commit = seal_hub(
            args.artifacts,
            hub_ref,
            include=args.include,
            variant=args.variant,
            allow_hosts=args.allow_host,
            ctx=ctx,
            root=found.parent,
        )
        print(f"sealed {args.artifacts} -> {path} ({hub_ref.partition('@')[0]} at {commit})")
        return 0
    from fetch.describe import hold_to_existing
    from fetch.seal import seal
    from lanes.build import fetch_tools
    from manifests.artifact_sets import load_set

    if source is not None:  # another model in DIR: said up front, before anything is hashed
        hold_to_existing(found, load_set(args.artifacts, root=found.parent), args.variant, Path(source))
    path = seal(
        args.artifacts,
        Path(source) if source is not None else None,
        variant=args.variant,
        ctx=ctx,
        tools=fetch_tools(ctx),
        root=found.parent,
    )
    print(f"sealed {args.artifacts} -> {path}")
    return 0


def _seal_new(args: argparse.Namespace, ctx: Context, hub_ref: str | None) -> int:
    """A set no manifest folder has: described from its files' headers into the user's folder
    (fetch.describe), then sealed."""
    from core.errors import ConfigurationError
    from fetch import describe
    from fetch.seal import seal_hub, seal_new

    if args.source is None:
        raise ConfigurationError(
            f"unknown artifact set {args.artifacts!r}",
            hint=f"describe a new set from its files: dgr seal --artifacts {args.artifacts} --from DIR "
            "(or --from hub:OWNER/REPO@REVISION)",
        )
    if hub_ref is None:
        path = seal_new(args.artifacts, Path(args.source), variant=args.variant, ctx=ctx)
        where = args.source
    else:
        draft = describe.HubDraft(name=args.artifacts, ref=hub_ref, chosen=args.variant)
        path, commit = seal_hub(
            args.artifacts,
            hub_ref,
            include=args.include,
            allow_hosts=args.allow_host,
            ctx=ctx,
            root=describe.target(args.artifacts, ctx.env).parent,
            draft=draft,
        )
        where = f"{hub_ref.partition('@')[0]} at {commit}"
    print(f"described and sealed a new artifact set {args.artifacts} from {where} -> {path}")
    print(f"next: dgr recipe init --artifacts {args.artifacts}")
    return 0
