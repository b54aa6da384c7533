"""`dgr build --lane L`: configure and build one lane (patched libllama, tools, the shard worker)."""

from __future__ import annotations

import argparse
import sys
import time

from core.context import Context
from lanes.base import LANE_NAMES


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lane", required=True, choices=LANE_NAMES, help="backend lane to build")
    parser.add_argument(
        "--jobs", "-j", type=int, default=None, help="parallel compile jobs (default: all CPUs)"
    )
    parser.add_argument(
        "--cuda-architectures",
        default=None,
        metavar="LIST",
        help="CUDA lane: compute capabilities, e.g. '80;86;89;90' (env DGR_CUDA_ARCHITECTURES)",
    )
    parser.add_argument(
        "--hip-targets",
        default=None,
        metavar="LIST",
        help="ROCm lane: GPU targets, e.g. 'gfx90a;gfx1100' (env DGR_HIP_TARGETS)",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        default=None,
        help="tune for this machine's CPU (GGML_NATIVE=ON; changes the build key)",
    )
    parser.add_argument(
        "--reverify",
        action="store_true",
        default=None,
        help="re-hash the recorded binaries instead of trusting size and mtime",
    )


def run(args: argparse.Namespace, ctx: Context) -> int:
    from lanes.base import BuildOptions
    from lanes.build import ensure_build

    options = BuildOptions.from_env(
        ctx.env,
        jobs=args.jobs,
        cuda_architectures=args.cuda_architectures,
        hip_targets=args.hip_targets,
        native=args.native,
        reverify=args.reverify,
    )
    started = time.monotonic()
    build = ensure_build(ctx, args.lane, options=options)
    seconds = time.monotonic() - started
    state = "unchanged (no-op)" if build.reused else "built"
    print(f"build: {build.lane} lane {state} in {seconds:.1f} s: {build.dir}")
    print(f"build: key {build.key}")
    if build.worker is not None:
        digest = build.provenance["binaries"][build.worker.name]["sha256"]
        print(f"build: worker {build.worker} sha256 {digest}")
    sys.stdout.flush()
    return 0
