"""`dgr roster [--arch NAME ...] [--layers N]`: which architectures stage, bitwise, as a signed table.

Generates the pinned tree's model fixtures (every architecture its test-llama-archs writes), stages each
on the CPU lane's worker at every cut and in one placement of three or four stages, compares each with
the monolithic worker bit for bit, and writes ``REPORTS/roster/<run-id>/roster.md`` (the table) and
``roster.json`` (signed like a certificate; `dgr verify` checks it, `dgr report` shows the latest).
Exit 0 when the roster ran (a refusal is a row, not a failure); 5 when a fixture that stages gave other
logits or tokens than the monolithic worker (the roster is written and signed first).
"""

from __future__ import annotations

import argparse

from core.context import Context

DEFAULT_LAYERS = 4  # 3 cuts and a placement of 4 stages; the generator's own default (2) has one cut


def _layers(text: str) -> int:
    value = int(text) if text.isdigit() else 0
    if value < 2:
        raise argparse.ArgumentTypeError(f"invalid layer count {text!r}: a cut needs at least 2 layers")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--arch",
        action="append",
        default=[],
        metavar="NAME",
        help="only this architecture, as the tree names it (repeatable; default: every one the tree knows)",
    )
    parser.add_argument(
        "--layers",
        type=_layers,
        default=DEFAULT_LAYERS,
        metavar="N",
        help=f"the fixtures' depth where the generator sets none of its own (default {DEFAULT_LAYERS})",
    )


def run(args: argparse.Namespace, ctx: Context) -> int:
    from certify import roster
    from certify.keys import signing_key
    from certify.roster_run import run_roster

    key = signing_key(ctx.env, ctx.workspace)  # a bad DGR_SIGNING_KEY fails before any work
    made = run_roster(ctx, n_layer=args.layers, wanted=args.arch, say=lambda line: print(line, flush=True))
    envelope, page = roster.sign(made, key)
    folder = ctx.workspace.ensure(ctx.workspace.reports / "roster" / made.run_id)
    written = roster.write(folder, envelope, page)
    rows = [r.record() for r in made.rows]
    print(f"roster: {roster.summary_line(roster.summary(rows))} ({made.seconds:.1f} s)")
    print(f"table: {folder / roster.TABLE_FILE}")
    print(f"signed: {written}")
    roster.gate(rows, written)
    return 0
