"""`python -m device COMMAND`: the off-device bundle and the small steps the device script calls.

    bundle        make the bundle (`nox -s device-bundle -- ...`; docs/device.md)
    verify DIR    check a bundle against its manifest (standard library only: runs before any install)
    python-check  exit 0 when this interpreter satisfies pyproject's dependencies, else 4 and what is unmet
    build         `dgr build` of the worker and libllama only (no llama-bench / quantize / gguf-split)

Exit codes are dgr's (README): 2 usage, 3 integrity, 4 toolchain missing, 6 runtime failure.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from core.errors import DgrError

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
# What a device run needs from a lane build: the shard worker and libllama it links, and the ring floor
# (one small program: the stages' floor on this GPU with nothing of ours in the way, issue 19).  The
# other tools in lanes.build.TARGETS serve provisioning (llama-gguf-split for package-index sets,
# carried ready-made in the bundle) and tests; certify reuses this build because targets are not part
# of the build key.
WORKER_TARGETS = ("llama", "dgr-shard-worker", "dgr-ring-floor")


def _parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m device", description=(__doc__ or "").partition("\n")[0])
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser("bundle", help="make the offline bundle for a GPU box")
    b.add_argument(
        "--out", type=Path, help="bundle folder to create (default: .work/device/bundle-<commit>-<time>)"
    )
    b.add_argument(
        "--python",
        dest="pythons",
        action="append",
        metavar="X.Y",
        help="CPython version to carry wheels for (repeatable; default 3.11, 3.12 and 3.13)",
    )
    b.add_argument(
        "--recipe",
        dest="recipes",
        action="append",
        metavar="NAME",
        help="recipe whose artifacts to carry (repeatable; default: tiny-llama, tiny-v4 and gemma3-270m-q4)",
    )
    b.add_argument(
        "--allow-dirty",
        action="store_true",
        help="bundle HEAD although tracked files have uncommitted changes (they are named)",
    )
    b.add_argument(
        "--carry-generated",
        action="append",
        default=[],
        metavar="SET",
        help="carry this generated set's files instead of regenerating them on the device (repeatable)",
    )
    b.add_argument(
        "--omit-wheel",
        dest="omit_wheels",
        action="append",
        default=[],
        metavar="NAME",
        help="leave this wheel out (the device's own Python must have it; repeatable)",
    )
    b.add_argument("--no-sysroot", action="store_true", help="carry no gRPC/protobuf sysroot")
    b.add_argument(
        "--archive",
        choices=("none", "tar", "xz"),
        default="none",
        help="also pack the folder into <out>.tar or <out>.tar.xz (default: none)",
    )
    b.add_argument(
        "--split-mib",
        type=int,
        metavar="N",
        help="cut the archive into parts of at most N MiB (<archive>.partNNN, joined by cat)",
    )

    v = sub.add_parser("verify", help="check a bundle against its manifest")
    v.add_argument("bundle", type=Path)

    p = sub.add_parser("python-check", help="does this interpreter satisfy pyproject's dependencies?")
    p.add_argument("--pyproject", type=Path, default=PYPROJECT)

    w = sub.add_parser("build", help="build a lane's worker and libllama only")
    w.add_argument("--lane", required=True)
    w.add_argument("--jobs", "-j", type=int, default=None)
    return top


def _bundle(args: argparse.Namespace) -> int:
    from core.context import Context
    from device import bundle, wheels

    ctx = Context.from_env()
    out = args.out
    if out is None:
        from device.snapshot import head

        commit = head(bundle.PROJECT_ROOT, ctx.env)[:12]
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        out = ctx.workspace.root / "device" / f"bundle-{commit}-{stamp}"
    options = bundle.Options(
        out=out,
        pythons=tuple(args.pythons or wheels.DEFAULT_PYTHONS),
        recipes=tuple(args.recipes or bundle.RECIPES),
        allow_dirty=args.allow_dirty,
        carry_generated=tuple(args.carry_generated),
        omit_wheels=tuple(args.omit_wheels),
        with_sysroot=not args.no_sysroot,
        archive=args.archive,
        split_mib=args.split_mib,
    )
    made = bundle.build(ctx, options, log=lambda line: print(line, flush=True))
    for line in bundle.describe(made):
        print(line)
    return 0


def _verify(args: argparse.Namespace) -> int:
    from device import manifest

    started = time.monotonic()
    doc = manifest.verify(args.bundle)
    took = time.monotonic() - started
    print(
        f"bundle {args.bundle}: {len(doc['files'])} files, {doc['total_bytes']} bytes match BUNDLE.json "
        f"(project {doc['project']['commit'][:12]}, made {doc['created_at']}) [{took:.1f} s]"
    )
    return 0


def _python_check(args: argparse.Namespace) -> int:
    from device import wheels

    missing = wheels.unmet(wheels.requirements(args.pyproject))
    v = sys.version_info
    if v < (3, 11):
        missing.insert(0, f"Python {v.major}.{v.minor} at {sys.executable}: the project needs >= 3.11")
    for line in missing:
        print(f"python-check: {line}")
    print(
        f"python-check: {sys.executable} ({v.major}.{v.minor}.{v.micro}) "
        + ("lacks what the project needs" if missing else "has everything the project needs")
    )
    return 4 if missing else 0


def _build(args: argparse.Namespace) -> int:
    from core.context import Context
    from lanes.base import BuildOptions
    from lanes.build import ensure_build

    ctx = Context.from_env()
    options = BuildOptions.from_env(ctx.env, jobs=args.jobs)
    started = time.monotonic()
    build = ensure_build(ctx, args.lane, options=options, targets=WORKER_TARGETS)
    state = "unchanged (no-op)" if build.reused else "built"
    print(
        f"build: {build.lane} lane ({' '.join(WORKER_TARGETS)}) {state} in "
        f"{time.monotonic() - started:.1f} s: {build.dir}"
    )
    print(f"build: key {build.key}")
    return 0


COMMANDS = {"bundle": _bundle, "verify": _verify, "python-check": _python_check, "build": _build}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except DgrError as exc:
        print(exc.one_line(), file=sys.stderr)
        return exc.exit_code


def entry() -> None:
    sys.exit(main())
