"""The report's Depth section: the recipe's context scenario (certify.depth), per placement and prompt length.

Reads ``figures["depth"]``: the scenario (context per stage, prompt lengths, ubatch), the monolithic
worker's run and each placement's: the depth-parity figures (the judged rows against the monolithic run
at the same depth), the longest prompt's prefill pipelined and not, the KV bytes each stage allocated
for the scenario's context against the monolithic worker's, and prefill and decode speed per prompt
length.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
from markupsafe import Markup

from reports import charts


def depth_note(depth: Mapping[str, Any] | None) -> str | None:
    """One sentence on the scenario, or why none ran; None where the certificate says nothing of depth."""
    if not depth or (not depth.get("applies") and not depth.get("scenario")):
        return None  # the recipe names no scenario: nothing to say
    if not depth.get("applies"):
        return f"The recipe's scenario was not run: {depth.get('reason', 'no reason recorded')}."
    s = depth["scenario"]
    lengths = ", ".join(str(n) for n in s["prompt_tokens"])
    return (
        f"Every stage allocates {s['context']} positions; prompts of {lengths} tokens (generated from seed "
        f"{s['seed']}) run in passes of {s['ubatch']} positions, then {s['decode_tokens']} tokens are "
        "decoded greedily. Judged against the monolithic run at the same depth: the last position of every "
        "prefill pass and every decoded position."
    )


def route_change_note(depth: Mapping[str, Any] | None) -> str | None:
    """What a route change cost at depth, in one sentence; None where none ran."""
    rc = (depth or {}).get("route_change")
    if not rc:
        return None
    seconds = rc.get("reprefill_s")
    cost = "its time was not recorded" if seconds is None else f"in {seconds:.2f} s"
    same = "the same tokens as" if rc["switched"] == rc["expected"] else "OTHER tokens than"
    uninterrupted = "the same as" if rc["switched_equals_uninterrupted"] else "not the same as"
    return (
        f"Route change at depth ({rc['placement']}): after a {rc['prefix_tokens']}-token prompt and "
        f"{rc['switch_at']} decoded tokens the route epoch changed; the stages answered the old KV with "
        f"{rc['cache_miss']} and re-prefilled {rc['reprefill_tokens']} positions {cost}, then chose {same} "
        f"the {rc['expected_from']} ({uninterrupted} the uninterrupted session: a re-prefill batches "
        "what the session decoded one position at a time)."
    )


def depth_frame(depth: Mapping[str, Any] | None) -> pd.DataFrame | None:
    """A row per placement (the monolithic worker first) and prompt length."""
    if not depth or not depth.get("applies"):
        return None
    rows = _rows("monolithic", depth["monolithic"], None)
    for p in depth.get("placements", []):
        rows += _rows(p["name"], p, p)
    return pd.DataFrame(rows) if rows else None


def runs(depth: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The scenario's runs in the order the report shows them: the monolithic worker, then each placement."""
    return [("monolithic", depth["monolithic"]), *((p["name"], p) for p in depth.get("placements", []))]


def _rows(name: str, run: Mapping[str, Any], judged: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    kv = run.get("kv_bytes", [])
    out = []
    for prompt in run.get("prompts", []):
        row = {
            "placement": name,
            "prompt tokens": prompt["tokens"],
            "passes": prompt["passes"],
            "KV bytes per stage": " + ".join(f"{b:,}" for b in kv),
            "KV total": f"{sum(kv):,}",
            "prefill tok/s": f"{prompt['prefill_tok_s']:.1f}",
            "decode tok/s": "—" if prompt.get("decode_tok_s") is None else f"{prompt['decode_tok_s']:.1f}",
            "state held": f"{sum(prompt['held_bytes']):,}" if prompt.get("held_bytes") else "—",
        }
        prefill = (judged or {}).get("prefill") or {}
        if prefill.get("prompt_tokens") == prompt["tokens"]:
            row["prefill tok/s pipelined"] = f"{prefill['pipelined_tok_s']:.1f} ({prefill['speedup']:.2f}x)"
        if judged is not None:
            parity = judged["parity"]
            row["bitwise"] = "yes" if parity["bitwise_logits"] else "no"
            row["max |Δ logit|"] = f"{parity['max_abs_logit_diff']:.3g}"
            row["greedy match"] = f"{parity['greedy_match']:.2f}"
        out.append(row)
    return out


def state_frame(figures: Mapping[str, Any]) -> pd.DataFrame | None:
    """What each run filled of the model's compressed state, as its workers counted it (certify/state.py):
    the recipe's own prompts, then the monolithic worker and each placement at depth.  None where no
    run kept a census."""
    rows = []
    prompts = figures.get("state") or {}
    if prompts.get("applies"):
        rows.append(_state_row("recipe's prompts (monolithic)", prompts["positions_max"], prompts))
    d = figures.get("depth") or {}
    if d.get("applies"):
        positions = max(d["scenario"]["prompt_tokens"]) + d["scenario"]["decode_tokens"]
        for name, run in runs(d):
            if run.get("state", {}).get("layers"):
                rows.append(_state_row(f"{name} at depth", positions, run["state"]))
    return pd.DataFrame(rows) if rows else None


def _state_row(name: str, positions: int, census: Mapping[str, Any]) -> dict[str, Any]:
    kinds = census.get("kinds", {})
    hca, csa = kinds.get("hca") or {}, kinds.get("csa") or {}
    fraction = csa.get("selected_fraction_max")
    return {
        "run": name,
        "positions": positions,
        "ratio-128 entries (least layer)": hca.get("entries_min", 0),
        "ratio-4 entries (least layer)": csa.get("entries_min", 0),
        "indexer candidates (widest row)": csa.get("candidates_max", 0),
        "selected of them": "—" if fraction is None else f"{fraction:.1%}",
        "rows that left candidates out": csa.get("excluding_rows", 0),
        "window entries": max(hca.get("window_max", 0), csa.get("window_max", 0)),
        "window cells": max(hca.get("raw_cells", 0), csa.get("raw_cells", 0)),
    }


def depth_charts(depth: Mapping[str, Any] | None) -> list[Markup]:
    """What holding a longer context costs, per run: the session state the stages held at the end of
    each prompt (summed over the stages, as the workers measured it) and the decode speed there."""
    if not depth or not depth.get("applies"):
        return []
    held, decode = [], []
    for name, run in runs(depth):
        prompts = run.get("prompts", [])
        held.append(
            (name, [(p["tokens"], sum(p["held_bytes"]) / 2**20) for p in prompts if p.get("held_bytes")])
        )
        decode.append((name, [(p["tokens"], p["decode_tok_s"]) for p in prompts if p.get("decode_tok_s")]))
    return [
        charts.lines(
            held, title="Session state held at the end of each prompt (all stages), MiB", unit="MiB"
        ),
        charts.lines(decode, title="Decode tokens/s after each prompt length", unit="tok/s"),
    ]
