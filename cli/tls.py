"""`dgr tls --ca DIR --host NAME [--host NAME ...] [--name NAME=ADDR ...] [--days N]`: a small CA (made
once in DIR, kept after) and an identity per host for workers and the certifier, with the fingerprint
line a placement file pins (docs/multi-host.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from core.context import Context


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ca", type=Path, required=True, metavar="DIR", help="the CA's folder (made when absent)"
    )
    parser.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host to issue an identity for, in DIR/hosts/NAME (repeatable; the certifier's own is one "
        "more, e.g. --host driver)",
    )
    parser.add_argument(
        "--name",
        action="append",
        default=[],
        metavar="HOST=ADDR",
        help="another DNS name or IP address HOST is reached by (repeatable; a worker's --listen address)",
    )
    parser.add_argument(
        "--days", type=int, default=365, help="validity of each host's certificate (default 365)"
    )


def run(args: argparse.Namespace, ctx: Context) -> int:
    from core.errors import ConfigurationError
    from worker import tls_ca

    if not args.host:
        raise ConfigurationError("dgr tls: name at least one --host")
    if args.days < 1:
        raise ConfigurationError(f"dgr tls: --days must be at least 1, got {args.days}")
    also: dict[str, list[str]] = {}
    for pair in args.name:
        host, sep, addr = pair.partition("=")
        if not sep or not host or not addr:
            raise ConfigurationError(f"dgr tls: --name expects HOST=ADDR, got {pair!r}")
        if host not in args.host:
            raise ConfigurationError(f"dgr tls: --name {pair}: {host} is not one of the --host names")
        also.setdefault(host, []).append(addr)
    print(f"CA: {tls_ca.ensure_ca(args.ca)}")
    for host in args.host:
        made = tls_ca.issue(args.ca, host, names=also.get(host, ()), days=args.days)
        print(f"{host}: --tls {made.cert.parent}  fingerprint {made.fingerprint}")
    return 0
