"""`dgr verify PATH [--key PEM] [--html PATH] [--store DIR]`: exit 0 when authentic, 3 otherwise."""

from __future__ import annotations

import argparse
from pathlib import Path

from core.context import Context


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help="certificate.json, a catalog or a roster (a DSSE envelope)")
    add_key_option(parser)
    parser.add_argument(
        "--html", type=Path, help="report HTML (a roster's table) to check (default: the one beside PATH)"
    )
    parser.add_argument("--store", help="artifact store to recompute artifact digests from")


def add_key_option(parser: argparse.ArgumentParser) -> None:
    """--key PEM (repeatable): a public key trusted beside manifests/keys/ and the workspace's."""
    parser.add_argument(
        "--key",
        type=Path,
        action="append",
        default=[],
        metavar="PEM",
        help="also trust this Ed25519 public key (repeatable)",
    )


def run(args: argparse.Namespace, ctx: Context) -> int:
    from certify import transport
    from certify.keys import trusted_keys
    from certify.verify import verify
    from core.errors import IntegrityError
    from core.workspace import env_store

    keys = trusted_keys(args.key, ws=ctx.workspace)
    store = env_store(ctx.env, args.store, ctx.workspace)
    # A store the user named (--store or DGR_STORE) is the one checked, not the paths recorded.
    named = bool(args.store or ctx.env.get("DGR_STORE"))
    result = verify(args.path, keys, html=args.html, store=store, store_only=named)
    kind = "catalog" if result.catalog else "roster" if result.roster else "certificate"
    print(f"{kind}: {args.path.resolve()}")
    for line in result.lines:
        print(f"  {line.text()}")
    if not result.ok:
        first = result.failures[0]
        more = f" (+{len(result.failures) - 1} more, listed above)" if len(result.failures) > 1 else ""
        raise IntegrityError(f"{args.path}: {first.what} {first.detail}{more}")
    if result.catalog:
        entries, failures = len(result.predicate["entries"]), len(result.predicate["failures"])
        print(f"verified: catalog of {entries} certified placements, {failures} failures")
        return 0
    if result.roster:
        from certify.roster import summary_line

        print(f"verified: roster {result.predicate['run_id']}: {summary_line(result.predicate['summary'])}")
        return 0
    verdict = result.predicate.get("verdict", {}).get("status", "?")
    recipe = result.predicate.get("recipe", {}).get("name", "?")
    print(f"verified: {recipe} on {result.predicate.get('lane', '?')}, verdict {verdict}")
    for line in transport.lines(result.predicate):
        print(f"  transport: {line}")
    return 0
