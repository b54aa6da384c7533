"""`dgr`: one thin subcommand per stage; logic lives in the stage packages.

Every stage module named in COMMANDS exposes ``configure(parser)`` and ``run(args, ctx) -> int``.
Those modules import their heavy dependencies inside ``run`` so that ``dgr --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
from collections.abc import Sequence

from core.context import Context
from core.errors import DISK_FULL_ERRNOS, DgrError, DiskFull, Terminated

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "fetch": ("cli.fetch", "fetch llama.cpp at the pinned commit into the workspace (verified)"),
    "patch": ("cli.patch", "apply the numbered patch stack onto a copy of the pristine tree"),
    "upstream": ("cli.upstream", "write the patch stack as a series `git am` applies onto the pin"),
    "build": ("cli.build", "configure and build a lane (libllama + the shard worker)"),
    "doctor": ("cli.doctor", "probe every lane's toolchain and print a table"),
    "seal": ("cli.seal", "compute an artifact set's digests and write them into its manifest"),
    "provision": ("cli.provision", "provision a recipe's artifact set into the store (resumable)"),
    "reference": ("cli.reference", "make a sealed reference (the monolithic run stored once) or compare two"),
    "balance": ("cli.balance", "cut a recipe's model into stages by the bytes of weights a token reads"),
    "recipe": ("cli.recipe", "write a recipe for an artifact set (init: placements, prompts, thresholds)"),
    "certify": ("cli.certify", "run the parity and speed gates and write a signed certificate"),
    "verify": ("cli.verify", "verify a certificate's (or a catalog's) signature, digests and HTML"),
    "catalog": ("cli.catalog", "one signed document of what is certified, read from the certificates"),
    "roster": ("cli.roster", "stage every architecture the pinned tree's fixtures cover; a signed table"),
    "admit": ("cli.admit", "is a proposed split certified? (a router's admission check against a catalog)"),
    "report": ("cli.report", "rebuild the report index (lane x recipe matrix)"),
    "matrix": ("cli.matrix", "print the CI matrix (lane, recipe, runner labels) as JSON"),
    "tls": ("cli.tls", "make a small CA and a TLS identity per host for workers and the certifier"),
}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="dgr",
        description="dgr-certify: build, provision and certify Distributed GGUF Runtime shard workers.",
        epilog="exit codes: 0 ok, 2 usage/configuration, 3 integrity, 4 toolchain missing, "
        "5 gate failed, 6 runtime failure",
    )
    top.add_argument("-v", "--verbose", action="store_true", help="log every command run")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod = importlib.import_module(module)
        mod.configure(p)
        p.set_defaults(_module=module)
    return top


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


def _run_stage(args: argparse.Namespace) -> int:
    """The stage's exit code.  A full disk is an answer, not a bug: whatever was being written, the
    OSError becomes DiskFull here, the one place, instead of a handler at every call site that writes."""
    ctx = Context.from_env()
    try:
        return int(importlib.import_module(args._module).run(args, ctx) or 0)
    except OSError as exc:
        if exc.errno not in DISK_FULL_ERRNOS:
            raise
        raise DiskFull.from_os_error(exc, during=f"`dgr {args.command}`") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s", stream=sys.stderr
    )
    try:
        return _run_stage(args)
    except DgrError as exc:
        print(exc.one_line(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("dgr: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("dgr: terminated", file=sys.stderr)
        return 143


def entry() -> None:
    sys.exit(main())
