"""`dgr catalog [PATH ...] [--out FILE] [--key PEM]`: one signed document of what is certified.

Reads every certificate under the reports folder (or the certificates and folders named), verifies
each, and writes the catalog (certify/catalog.py) signed with this workspace's key; `dgr verify FILE`
checks it.  Exit 0 when written, 2 when no certificate was found.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.verify import add_key_option
from core.context import Context


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="*", type=Path, metavar="PATH", help="certificates or folders (default: REPORTS)"
    )
    parser.add_argument("--out", type=Path, help="where to write it (default: REPORTS/catalog.json)")
    add_key_option(parser)


def run(args: argparse.Namespace, ctx: Context) -> int:
    from certify import catalog
    from certify.certificate import write
    from certify.keys import signing_key, trusted_keys
    from core.errors import ConfigurationError

    key = signing_key(ctx.env, ctx.workspace)
    paths = catalog.certificate_paths(args.paths or [ctx.workspace.reports])
    if not paths:
        where = ", ".join(map(str, args.paths or [ctx.workspace.reports]))
        raise ConfigurationError(f"no certificate.json under {where}", hint="run `dgr certify` first")
    read, refused = catalog.read_all(paths, trusted_keys(args.key, ws=ctx.workspace))
    if not read:
        raise ConfigurationError(f"none of the {len(paths)} certificates verified: {refused[0]['reason']}")
    doc = catalog.build(read, refused)
    out = args.out or ctx.workspace.reports / "catalog.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write(out, catalog.sign(doc, read, key))
    for e in doc["entries"]:
        print(f"  certified  {e['lane']:8} {e['recipe']:24} {e['hardware_class']:12} {e['placement']}")
    for r in refused:
        print(f"  refused    {r['path']}: {r['reason']}")
    print(
        f"catalog: {len(doc['entries'])} certified placements, {len(doc['failures'])} failures, "
        f"{len(refused)} certificates refused, from {len(read)} certificates -> {out}"
    )
    return 0
