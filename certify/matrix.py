"""The CI matrix: one job per lane, with the recipe it certifies, the runner labels it needs, what the
job does (certify / compile / probe) and whether the pair is certified today.

Only a lane with a verified PASS certificate for the exact recipe (same recipe digest) is reported as
certified; every other lane is compile-only, whatever its job does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from certify.context import Context

HOSTED_FALLBACK = ("ubuntu-latest",)
# Lanes whose toolchain a hosted runner cannot get in a CI job's time: the job only probes it.
PROBE_ONLY_HOSTED = {"rocm"}


def _recipe_for(lane: str, recipes: Mapping[str, Any], name: str) -> str | None:
    """CI certifies one recipe (the embedded default unless told): the one it can provision itself."""
    r = recipes.get(name)
    return name if r is not None and lane in r.lanes else None


def entries(ctx: Context, *, self_hosted: bool = False, recipe: str | None = None) -> list[dict[str, Any]]:
    from certify import recipes as rmod
    from certify.errors import DgrError
    from certify.keys import trusted_keys
    from lanes.base import LANE_NAMES, get
    from reports.index import cell, scan

    names = [recipe] if recipe else rmod.available(ctx.env)
    loaded: dict[str, Any] = {}
    for name in names:
        try:
            loaded[name] = rmod.load(name, ctx.env)
        except DgrError:
            if recipe:
                raise
            loaded[name] = None
    certs = (
        scan(ctx.workspace.reports, trusted_keys(ws=ctx.workspace)) if ctx.workspace.reports.is_dir() else []
    )
    out = []
    for lane_name in LANE_NAMES:
        lane = get(lane_name)
        labels = tuple(lane.runner_labels)
        chosen = _recipe_for(lane_name, loaded, recipe or rmod.DEFAULT_RECIPE)
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
        if chosen is not None and loaded.get(chosen) is not None:
            c = cell(
                certs,
                lane=lane_name,
                recipe=chosen,
                digest=loaded[chosen].digest,
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
