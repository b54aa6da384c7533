"""`dgr doctor`: probe every lane's toolchain and print one table (a report: exit 0 even when lanes miss)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping

from core.context import Context


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the probes as JSON instead of a table")


def rows(env: Mapping[str, str]) -> list[dict[str, object]]:
    from lanes.base import all_lanes, certifiable

    out = []
    for lane in all_lanes():
        probe = lane.probe(env)
        can, why = certifiable(lane, env, probe)
        out.append(
            {
                **probe.as_dict(),
                "certifiable": can,
                "certifiable_reason": why,
                "runner_labels": list(lane.runner_labels),
            }
        )
    return out


def table(data: list[dict[str, object]]) -> str:
    header = ("lane", "status", "tool", "version", "certifiable here", "path or reason")
    lines: list[tuple[str, ...]] = [header]
    for r in data:
        where = r["path"] if r["status"] == "ok" else r["reason"]
        if r["status"] == "ok" and r["reason"]:  # a note (an optional part missing), not a failure
            where = f"{where}; {r['reason']}"
        cert = ("yes: " if r["certifiable"] else "no: ") + str(r["certifiable_reason"])
        lines.append(
            (
                str(r["lane"]),
                str(r["status"]),
                str(r["tool"]),
                str(r["version"] or "-"),
                cert,
                str(where or "-"),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join([*(c.ljust(w) for c, w in zip(line[:-1], widths, strict=True)), line[-1]]) for line in lines
    )


def install_hint(env: Mapping[str, str]) -> str | None:
    """The one line that installs what the CPU lane (the worker every lane builds) lacks here."""
    from lanes import packages

    lacking = [p for p in packages.missing(packages.parts("cpu"), env) if not p.optional]
    if not lacking:
        return None
    return f"cpu lane: {packages.describe(lacking)}; `nox -s deps` installs them as root"


def run(args: argparse.Namespace, ctx: Context) -> int:
    data = rows(ctx.env)
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(table(data))
        hint = install_hint(ctx.env)
        if hint:
            print(hint)
    return 0
