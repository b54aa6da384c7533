"""The CI matrix: one job per lane, with the recipe it certifies, the runner labels it needs, what the
job does (certify / compile / probe) and whether the pair is certified today.

Only a lane with a verified PASS certificate for the exact recipe (same recipe digest) is reported as
certified; every other lane is compile-only, whatever its job does.
"""

from __future__ import annotations

from typing import Any

from core.context import Context

HOSTED_FALLBACK = ("ubuntu-latest",)
# Lanes whose toolchain a hosted runner cannot get in a CI job's time: the job only probes it.
PROBE_ONLY_HOSTED = {"rocm"}


def entries(ctx: Context, *, self_hosted: bool = False, recipe: str | None = None) -> list[dict[str, Any]]:
    from certify.keys import trusted_keys
    from core.errors import DgrError
    from lanes.base import LANE_NAMES, get
    from manifests import recipe_model as rmod
    from reports.index import cell, scan

    # CI certifies one recipe (the embedded default unless told): the one it can provision itself.
    name = recipe or rmod.DEFAULT_RECIPE
    try:
        certified: rmod.Recipe | None = rmod.load(name, ctx.env)
    except DgrError:
        if recipe:
            raise
        certified = None
    certs = (
        scan(ctx.workspace.reports, trusted_keys(ws=ctx.workspace)) if ctx.workspace.reports.is_dir() else []
    )
    out = []
    for lane_name in LANE_NAMES:
        lane = get(lane_name)
        labels = tuple(lane.runner_labels)
        chosen = name if certified is not None and lane_name in certified.lanes else None
        needs_own_runner = "self-hosted" in labels
        if needs_own_runner and not self_hosted:
            mode = "probe" if lane_name in PROBE_ONLY_HOSTED else "compile"
            runs_on = HOSTED_FALLBACK
            why = f"certifying needs a self-hosted runner ({', '.join(labels)}); this job {mode}s only"
        elif chosen is None:
            mode, runs_on = "compile", labels
            why = "no recipe CI runs lists this lane"
        else:
            mode, runs_on, why = "certify", labels, f"certifies {chosen} on {', '.join(labels)}"
        status = "compile-only"
        if chosen is not None and certified is not None:
            c = cell(
                certs,
                lane=lane_name,
                recipe=chosen,
                digest=certified.digest,
                built=False,
                listed=True,
                root=ctx.workspace.reports,
            )
            status = "certified" if c.state == "certified" else "compile-only"
        out.append(
            {
                "lane": lane_name,
                "recipe": chosen or "",
                "runs-on": list(runs_on),
                # What certifying this lane needs, even when this job runs elsewhere (compile-only).
                "runner-labels": list(labels),
                "mode": mode,
                "status": status,
                "reason": why,
            }
        )
    return out


def matrix(ctx: Context, **kw: Any) -> dict[str, Any]:
    return {"include": entries(ctx, **kw)}
