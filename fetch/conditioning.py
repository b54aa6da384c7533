"""How well conditioned a model's top-k selections are: ``dgr-topk-probe`` run on given prompts.

A selection (DeepSeek V4's lightning-indexer top-k over compressed KV blocks, a MoE router's top
experts) is contested on a row when more finite candidates than k compete. There the gap between the
k-th and (k+1)-th largest value is how far the row is from picking a different set: an exact tie (gap
0) is decided by the kernel's tie rule alone, which ggml-cpu and ggml-cuda break differently
(docs/upstream/topk-ties.md). The synthetic-model generator measures this on the recipe's prompts and
refuses to seal a model with ties at a selection boundary.

The probe (worker/tools/topk_probe.cpp, built by every lane build beside the worker) runs each prompt
as the certifier's driver does, on the CPU: prefill in one batch, greedy decode until ``n_decode``
tokens are chosen, fresh KV per prompt. Its report (kind ``dgr.topk_probe``, schema 1) has one entry per
selection op under ``selections``: ``input`` (the tensor selected from, e.g. ``lid_score_masked-2``),
``node``, ``op`` (TOP_K or ARGSORT), ``kind`` (indexer / router / other), ``layer`` (or None), ``k``,
``rows``, ``contested_rows``, ``exact_ties``, ``near_ties`` (contested rows whose relative margin is
below the report's ``near_tie_rel``, 1e-3), ``min_abs_margin`` and ``min_rel_margin`` (over contested
rows, None when there were none; relative = margin / max(|k-th|, FLT_MIN)) with ``..._at`` = {sequence,
position} where each occurred.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from core import proc
from core.canonical import BadJson, parse_json
from core.errors import ConfigurationError, RuntimeFailure

PROBE = "dgr-topk-probe"
REPORT_KIND = "dgr.topk_probe"
REPORT_VERSION = 1
# The probe runs a few hundred tiny passes; silence this long means it hangs.
NO_OUTPUT_TIMEOUT_S = 600.0


def probe_binary(build_dir: Path) -> Path:
    """``<build dir>/bin/dgr-topk-probe``; ConfigurationError when that build lacks it."""
    path = Path(build_dir) / "bin" / PROBE
    if not os.access(path, os.X_OK):
        raise ConfigurationError(
            f"{path} is missing: the build predates the probe",
            hint="rebuild the lane (`dgr build --lane cpu`)",
        )
    return path


def measure_conditioning(
    build_dir: Path,
    model_path: Path,
    prompts_token_ids: Sequence[Sequence[int] | str],
    n_decode: int,
    threads: int,
) -> dict[str, Any]:
    """The probe's report for ``model_path`` (a GGUF file, the first split of a split model)."""
    if not prompts_token_ids or any(len(p) == 0 for p in prompts_token_ids):
        raise ConfigurationError("measure_conditioning needs at least one prompt, each with tokens")
    if n_decode < 1 or threads < 1:
        raise ConfigurationError(f"n_decode ({n_decode}) and threads ({threads}) must be at least 1")
    binary = probe_binary(build_dir)
    # a text tokenizes to at most one token per byte plus BOS
    longest = max(len(p.encode()) + 2 if isinstance(p, str) else len(p) for p in prompts_token_ids)
    n_ctx = max(256, -(-(longest + n_decode) // 256) * 256)
    with tempfile.TemporaryDirectory(prefix="dgr-topk-probe-") as tmp:
        prompts = Path(tmp) / "prompts.json"
        prompts.write_text(
            json.dumps([p if isinstance(p, str) else [int(t) for t in p] for p in prompts_token_ids])
        )
        out = Path(tmp) / "report.json"
        proc.run(
            [
                binary,
                "--model",
                model_path,
                "--threads",
                str(threads),
                "--n-decode",
                str(n_decode),
                "--prompts-file",
                prompts,
                "--ctx",
                str(n_ctx),
                "--out",
                out,
            ],
            no_output_timeout=NO_OUTPUT_TIMEOUT_S,
        )
        return parse_report(out.read_bytes())


def parse_report(text: bytes | str) -> dict[str, Any]:
    """The probe's JSON (bytes as it wrote them: the reader owns the decoding), checked for its kind
    and schema version."""
    try:
        doc = parse_json(text, source=f"{PROBE}'s report")
    except BadJson as e:
        raise RuntimeFailure(f"{PROBE} wrote no valid JSON: {e.message}") from None
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind != REPORT_KIND:
        raise RuntimeFailure(f"{PROBE} report has kind {kind!r}, expected {REPORT_KIND!r}")
    if doc.get("schema_version") != REPORT_VERSION:
        raise RuntimeFailure(
            f"{PROBE} report has schema version {doc.get('schema_version')!r}, "
            f"this code reads {REPORT_VERSION}",
            hint="rebuild the lane so the probe matches this checkout",
        )
    return doc


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """Per kind of selection (indexer, router, other): rows seen, contested rows, exact and near ties
    at the selection boundary, and the smallest absolute and relative margins with the op they
    occurred in; what a manifest records and ``dgr seal`` prints."""
    kinds: dict[str, dict[str, Any]] = {}
    for sel in report.get("selections", []):
        k = kinds.setdefault(
            sel["kind"],
            {
                "ops": 0,
                "rows": 0,
                "contested_rows": 0,
                "exact_ties": 0,
                "near_ties": 0,
                "min_abs_margin": None,
                "min_rel_margin": None,
            },
        )
        k["ops"] += 1
        for key in ("rows", "contested_rows", "exact_ties", "near_ties"):
            k[key] += int(sel[key])
        for key in ("min_abs_margin", "min_rel_margin"):
            if sel[key] is not None and (k[key] is None or sel[key] < k[key]):
                k[key] = float(sel[key])
                k[f"{key}_in"] = sel["input"]
    return {"near_tie_rel": report.get("near_tie_rel"), "kinds": kinds}


def tied(report: dict[str, Any]) -> list[str]:
    """The selections with an exact tie at their boundary, as "INPUT (KIND): N of M contested rows"."""
    return [
        f"{s['input']} ({s['kind']}): {s['exact_ties']} of {s['contested_rows']} contested rows"
        for s in report.get("selections", [])
        if int(s["exact_ties"]) > 0
    ]


def describe(summ: dict[str, Any]) -> list[str]:
    """One line per kind, for the terminal."""
    lines = []
    for kind, k in sorted(summ["kinds"].items()):
        rel = (
            "n/a" if k["min_rel_margin"] is None else f"{k['min_rel_margin']:.3g} ({k['min_rel_margin_in']})"
        )
        absm = "n/a" if k["min_abs_margin"] is None else f"{k['min_abs_margin']:.3g}"
        lines.append(
            f"{kind}: {k['ops']} selections, {k['contested_rows']} of {k['rows']} rows contested, "
            f"{k['exact_ties']} exact ties, {k['near_ties']} near ties; smallest margin {absm} "
            f"absolute, {rel} relative"
        )
    return lines


def check_generated(
    ctx: Any, set_name: str, vname: str, model: Path, probe_build: Callable[[], Path]
) -> dict[str, Any]:
    """Measure a freshly generated model's selections on the prompts of every recipe that certifies
    this set and variant, with the CPU lane's probe; refuse (exit 2) a model with an exact tie at a
    selection boundary: a backend's tie rule, not the model, would decide what it attends or routes
    to.  ``probe_build`` gives the CPU build folder holding the probe.  Returns the summary the
    manifest records."""
    from manifests import recipe_model as recipes

    users = [
        r
        for r in (recipes.load(n, ctx.env) for n in recipes.available(ctx.env))
        if r.artifacts == set_name and r.variant == vname
    ]
    if not users:
        return {"measured": False, "reason": f"no recipe certifies {set_name}/{vname}"}
    texts = list(dict.fromkeys(t for r in users for t in r.prompts.texts))
    n_decode = max(r.n_decode for r in users)
    report = measure_conditioning(probe_build(), model, texts, n_decode, threads=2)
    summ = {
        "measured": True,
        "recipes": sorted(r.name for r in users),
        "prompts": len(texts),
        "n_decode": n_decode,
        "probe": PROBE,
        **summary(report),
    }
    for line in describe(summ):
        print(f"conditioning {set_name}/{vname}: {line}", flush=True)
    ties = tied(report)
    if ties:
        raise ConfigurationError(
            f"{set_name}/{vname}: exact ties at a top-k selection boundary on the recipes' prompts: "
            + "; ".join(ties[:3])
            + (f" (+{len(ties) - 3} more)" if len(ties) > 3 else ""),
            hint="the generator's parameters give a model whose selections a backend's tie rule decides; "
            "change them (seed, indexer shape) and seal again",
        )
    return summ
