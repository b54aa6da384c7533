"""Certificate statement -> one self-contained HTML page (inline CSS and SVG, no script, no network).

The page is rendered from the statement *before* it is signed (the signed predicate carries the page's
sha256), so it shows what will be signed, by which key, and what was verified while the run happened.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
from markupsafe import Markup

from certify import transport
from reports import charts, depth, mtp, seams, throughput

TEMPLATES = Path(__file__).with_name("templates")


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,  # every template is HTML; nothing from a run reaches the page unescaped
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["short"] = lambda s, n=16: (str(s)[:n] + "…") if s and len(str(s)) > n else (s or "—")
    env.filters["num"] = fmt
    return env


def fmt(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return str(x)
        if x == 0 or 1e-3 <= abs(x) < 1e6:
            return f"{x:.4g}"
        return f"{x:.3e}"
    return str(x)


def table(frame: pd.DataFrame, *, classes: str = "") -> Markup:
    """pandas' HTML with escaping on; the markup is then trusted by the template."""
    html = frame.to_html(index=False, escape=True, border=0, classes=classes or None, na_rep="—")
    return Markup(html)


def _optional_table(frame: pd.DataFrame | None) -> Markup | None:
    return None if frame is None else table(frame)


def _column(check: str) -> str:
    # One column for every cut's boundary NMSE: the table keeps one row per placement.
    return "boundary NMSE (worst cut)" if check.startswith("boundary NMSE at layer") else check


def gate_frame(results: Sequence[Mapping[str, Any]], gate: str) -> pd.DataFrame:
    """One row per placement, one column per check: "value ✓" or "value ✗"; a first row of thresholds."""
    columns: list[str] = []
    limits: dict[str, str] = {}
    rows: list[dict[str, str]] = []
    for r in results:
        details = r.get("details") or {}
        if details.get("gate") != gate:
            continue
        row: dict[str, str] = {"placement": str(details.get("placement"))}
        worst: dict[str, tuple[float, bool, str]] = {}
        for c in details.get("rows", []):
            col = _column(c["check"])
            if col not in columns:
                columns.append(col)
            limits.setdefault(col, f"{c['op']} {fmt(c['limit'])}")
            value = c["value"]
            if col != c["check"]:  # keep the worst cut, and name it
                key = -1.0 if value is None else float(value)
                prev = worst.get(col)
                if prev is None or (not c["ok"] and prev[1]) or (c["ok"] == prev[1] and key > prev[0]):
                    worst[col] = (key, c["ok"], f"{fmt(value)} @ layer {c['check'].rsplit(' ', 1)[-1]}")
                continue
            row[col] = f"{fmt(value)} {'✓' if c['ok'] else '✗ FAIL'}"
        for col, (_, ok, text) in worst.items():
            row[col] = f"{text} {'✓' if ok else '✗ FAIL'}"
        row["result"] = "pass" if r["status"] == "PASS" else str(r["status"])
        rows.append(row)
    header = {"placement": "threshold", **limits, "result": ""}
    return (
        pd.DataFrame([header, *rows], columns=["placement", *columns, "result"])
        if rows
        else pd.DataFrame(columns=["placement", "result"])
    )


def gate_rows_frame(results: Sequence[Mapping[str, Any]], gate: str) -> pd.DataFrame:
    """Every check of a gate on its own row (the long form, for small gates)."""
    rows = []
    for r in results:
        details = r.get("details") or {}
        if details.get("gate") != gate:
            continue
        for row in details.get("rows", []):
            rows.append(
                {
                    "placement": details.get("placement"),
                    "check": row["check"],
                    "value": fmt(row["value"]),
                    "threshold": f"{row['op']} {fmt(row['limit'])}",
                    "result": (
                        "NOT APPLICABLE: " + row["message"].removeprefix("NOT_APPLICABLE: ")
                        if row.get("status") == "NOT_APPLICABLE"
                        else "pass"
                        if row["ok"]
                        else "FAIL"
                    ),
                }
            )
    return pd.DataFrame(rows, columns=["placement", "check", "value", "threshold", "result"])


def agreement_view(
    agreement: Mapping[str, Any] | None, results: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The backend-agreement section: whether it applies, its checks, and the figures around them
    (rows counted, where the divergence starts, the free-running greedy match that is not gated)."""
    if not agreement or not agreement.get("applies"):
        reason = (agreement or {}).get("reason", "not measured in this run")
        return {"applies": False, "reason": reason}
    margin = fmt(agreement.get("top1_margin_min"))
    start = agreement.get("divergence_starts_at")
    facts = {
        "compared": f"{agreement.get('placement')} on {agreement.get('lane')} against "
        f"{agreement.get('placement')} on {agreement.get('reference_lane')}, teacher-forced on "
        "the reference's prompt + continuation tokens",
        "rows compared": agreement.get("rows_compared"),
        "rows with a clear top-1 margin": f"{agreement.get('clear_rows')} (top-1 − top-2 > {margin})",
        "max abs logit difference": agreement.get("max_abs_logit_diff"),
        "top-1 agreement, every row (not gated)": agreement.get("top1_agreement"),
        "free-running greedy match (not gated)": agreement.get("free_running_greedy_match"),
        "divergence starts": f"before layer {start}" if start is not None else "no cut out of bounds",
    }
    if agreement.get("per_placement"):  # a sealed reference of another lane or build: one row set each
        facts = {
            "compared": f"each staged placement on {agreement.get('lane')} against the "
            f"{agreement.get('placement')} reference of lane "
            f"{agreement.get('reference_lane')}, teacher-forced on its tokens "
            "(figures per placement in the certificate)"
        }
    return {
        "applies": True,
        "checks": table(gate_rows_frame(results, "backend-agreement"), classes="gate"),
        "facts": table(kv_frame(facts)),
    }


def _spread(s: Mapping[str, Any] | None) -> str:
    if not s:
        return "—"
    return f"{fmt(s['median'])} ± {fmt(s['iqr'] / 2)} (n={s['n']})"


def speed_frame(placements: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    rows = []
    for p in placements:
        sp = p.get("speed") or {}
        rows.append(
            {
                "placement": p["name"],
                "lane": p.get("lane", ""),
                "stages": p["n_stages"],
                "boundary": p.get("boundary_dtype", ""),
                "prefill tok/s (median ± IQR/2)": _spread(sp.get("prefill_tok_s")),
                "decode tok/s (median ± IQR/2)": _spread(sp.get("decode_tok_s")),
                "seam bytes / token": ", ".join(fmt(b) for b in sp.get("seam_bytes_per_token", [])) or "—",
                "seam ms / token": ", ".join(f"{s * 1e3:.3f}" for s in sp.get("seam_s", [])) or "—",
                "stage CPUs": _stage_cpus(p),
                "stage weights": _stage_weights(p),
            }
        )
    return pd.DataFrame(rows)


def _stage_cpus(placement: Mapping[str, Any]) -> str:
    """Each stage's --cpus as it reported it ("0 | 0 | 1-2"), or "any" where none was held: a ring's
    speed on a host that runs several stages depends on it (worker/README.md, "CPU affinity")."""
    cpus = placement.get("cpus") or []
    return " | ".join(c or "any" for c in cpus) if any(cpus) else "any"


def _stage_weights(placement: Mapping[str, Any]) -> str:
    """How each stage held its weights ("none, 98 MiB huge | mmap"): read onto huge pages or mapped
    moves decode speed by a tenth or more (worker/README.md, "Weights in memory"); "—" from older
    workers, which did not say."""
    modes = placement.get("load_mode") or []
    huge = placement.get("huge_page_bytes") or [-1] * len(modes)
    cells = [
        (m + (f", {h >> 20} MiB huge" if h >= 0 else "")) if m else "—"
        for m, h in zip(modes, huge, strict=False)
    ]
    return " | ".join(cells) or "—"


def physical_frame(figures: Mapping[str, Any]) -> pd.DataFrame | None:
    phys = figures.get("physical_model")
    if not phys:
        return None
    rows = [
        {
            "model": r["label"],
            "boundary width": fmt(r["boundary_width"]),
            "dtype": r["dtype"],
            "sideband bytes": fmt(r.get("sideband_bytes_per_token", 0)),
            "bytes / token / seam": fmt(r["bytes_per_token"]),
            "source": r["source"],
        }
        for r in phys
    ]
    return pd.DataFrame(rows)


def result_frame(results: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    rows = [
        {
            "step": r["name"],
            "status": r["status"],
            "seconds": f"{r.get('duration_s', 0):.2f}",
            "reason": r.get("reason", ""),
        }
        for r in results
    ]
    return pd.DataFrame(rows, columns=["step", "status", "seconds", "reason"])


def subject_frame(subjects: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    rows = [
        {
            "subject": s["name"],
            "sha256": s["digest"].get("sha256", ""),
            "blake3": s["digest"].get("blake3", ""),
        }
        for s in subjects
    ]
    return pd.DataFrame(rows, columns=["subject", "sha256", "blake3"])


def kv_frame(mapping: Mapping[str, Any]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"field": k, "value": fmt(v) if not isinstance(v, (dict, list)) else str(v)}
            for k, v in mapping.items()
        ],
        columns=["field", "value"],
    )


def _charts(figures: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> list[Markup]:
    placements = figures.get("placements", [])
    limits: dict[str, tuple[float | None, bool]] = {}
    for r in results:
        d = r.get("details") or {}
        if d.get("gate") == "speed":
            for row in d.get("rows", []):
                if row["metric"] == "decode_tok_s" and row["op"] == ">=" and "staged" not in row["check"]:
                    limits[d["placement"]] = (row["limit"], r["status"] == "PASS")
    speed_rows = []
    time_rows = []
    for p in placements:
        sp = p.get("speed") or {}
        if not sp.get("decode_tok_s"):
            continue
        limit, ok = limits.get(p["name"], (None, True))
        label = f"{p['name']} ({p.get('lane', '')})" if p.get("role") == "backend-reference" else p["name"]
        speed_rows.append((label, float(sp["decode_tok_s"]["median"]), limit, ok))
        if sp.get("stage_compute_s"):
            time_rows.append((label, sp["stage_compute_s"], sp.get("seam_s", [])))
    return [
        charts.decode_speed(
            speed_rows, title="Decode tokens/s per placement (median of the timed repetitions)"
        ),
        charts.stage_seam_time(time_rows, title="Time per decoded token: stage compute and seams (median)"),
    ]


def render(stmt: Mapping[str, Any], *, signer: Mapping[str, Any]) -> str:
    """The report page for ``stmt`` (its predicate must not yet carry the report digest)."""
    pred = stmt["predicate"]
    results = pred.get("results", [])
    figures = pred.get("figures", {})
    placements = figures.get("placements", [])
    template = environment().get_template("report.html.j2")
    return template.render(
        pred=pred,
        signer=signer,
        verdict=pred["verdict"],
        subjects=table(subject_frame(stmt["subject"]), classes="digests"),
        n_subjects=len(stmt["subject"]),
        parity=table(gate_frame(results, "staging-parity"), classes="gate"),
        agreement=agreement_view(figures.get("backend_agreement"), results),
        speed_gate=table(gate_frame(results, "speed"), classes="gate"),
        other_gates=table(gate_rows_frame(results, "route-change"), classes="gate"),
        speed=table(speed_frame(placements)),
        physical=_optional_table(physical_frame(figures)),
        seam_tokens=_optional_table(seams.token_frame(placements)),
        seam_rows=_optional_table(seams.seam_frame(placements)),
        floor_rows=_optional_table(seams.floor_frame(placements, figures.get("transport_floor"))),
        concurrency_rows=_optional_table(throughput.concurrency_frame(placements)),
        concurrency_single=throughput.concurrency_note(placements),
        mtp_rows=_optional_table(mtp.mtp_frame(placements)),
        mtp_gate=table(gate_frame(results, "mtp"), classes="gate"),
        depth_note=depth.depth_note(figures.get("depth")),
        depth_ran=bool((figures.get("depth") or {}).get("applies")),
        depth_route_change=depth.route_change_note(figures.get("depth")),
        depth_gate=table(gate_frame(results, "depth-parity"), classes="gate"),
        depth_kv_gate=table(gate_frame(results, "kv-at-depth"), classes="gate"),
        depth_rows=_optional_table(depth.depth_frame(figures.get("depth"))),
        depth_charts=depth.depth_charts(figures.get("depth")),
        state_gate=table(gate_rows_frame(results, "state-at-depth"), classes="gate"),
        state_rows=_optional_table(depth.state_frame(figures)),
        floor_note=seams.floor_note(figures.get("transport_floor")),
        shaping_notes=seams.shaping_notes(placements),
        scaling=seams.scaling_chart(
            placements, title="Scaling with the stage count: decode tok/s and seam share"
        ),
        transport=transport.lines(pred),
        steps=table(result_frame(results)),
        hardware=table(kv_frame(pred.get("hardware", {}))),
        charts=_charts(figures, results),
        identity=identity_rows(pred),
        ref={
            "placement": figures.get("reference", {}).get("placement", "—"),
            "lane": figures.get("reference", {}).get("lane", "—"),
            "sealed": figures.get("sealed_reference") or {},
            "prompts": figures.get("prompts", "—"),
            "n_decode": figures.get("n_decode", "—"),
        },
        measure={
            k: figures.get("measure", {}).get(k, "—")
            for k in ("warmup", "repetitions", "prompt_tokens", "decode_tokens")
        },
    )


Row = tuple[str, str, str]  # link in the chain, its digest or id, a short description


def identity_rows(pred: Mapping[str, Any]) -> list[Row]:
    """(link in the chain, its digest or id, a short description) for the identity table: what was
    built, what was compared with, what was loaded, who ran it, under which recipe."""
    ident = pred.get("identity", {})
    rec = pred.get("recipe", {})
    recipe = (
        "recipe",
        str(rec.get("digest", "—")),
        f"{rec.get('name', '—')}, hardware class {rec.get('hardware_class', '—')}",
    )
    return [*_build_rows(ident, pred), *_artifact_rows(ident), *_attached_rows(ident), recipe]


def _build_rows(ident: Mapping[str, Any], pred: Mapping[str, Any]) -> list[Row]:
    """Source, patch stack, build, and the reference the run compared with (built or sealed)."""
    src = ident.get("source") or {}
    pat = ident.get("patches") or {}
    bld = ident.get("build") or {}
    rows = [
        (
            "llama.cpp source",
            str(src.get("commit", "—")),
            f"tree {src.get('tree', '—')} via {src.get('source', '—')}",
        ),
        ("patch stack", str(pat.get("digest", "—")), f"{len(pat.get('patches', []))} patches"),
        ("build", str(bld.get("key", "—")), f"lane {bld.get('lane', pred.get('lane', '—'))}"),
    ]
    ref = ident.get("reference_build")
    if ref:
        rows.append(("reference build", str(ref.get("key", "—")), f"lane {ref.get('lane', '—')}"))
    sealed = ident.get("sealed_reference")
    if sealed:  # the monolithic run this certificate compares with was stored, not run here
        made = (sealed.get("identity") or {}).get("build") or {}
        rows.append(
            (
                "sealed reference",
                str(sealed.get("sha256", "—")),
                f"set {sealed.get('set', '—')}, made on lane {sealed.get('lane', '—')} by build "
                f"{str(made.get('key', '—'))[:16]}… ({sealed.get('made', '—')}), provisioned from "
                f"{', '.join(sealed.get('origins', [])) or '—'}; "
                f"manifest {sealed.get('manifest', '—')}",
            )
        )
    return rows


def _artifact_rows(ident: Mapping[str, Any]) -> list[Row]:
    """The artifact set (and the MTP block's), and what real weights say of themselves: name,
    upstream file, source and terms (the set's manifest carries them)."""
    art = ident.get("artifacts") or {}
    rows = [
        (
            "artifacts",
            str(art.get("manifest_digest", "—")),
            f"set {art.get('set', '—')} variant {art.get('variant', '—')}",
        )
    ]
    mtp = ident.get("mtp_artifacts")
    if mtp:  # the nextn block's own file, which the last stage loads with --mtp-model (docs/mtp.md)
        rows.append(
            (
                "MTP block artifacts",
                str(mtp.get("manifest_digest", "—")),
                f"set {mtp.get('set', '—')} variant {mtp.get('variant', '—')}, loaded by the last stage",
            )
        )
    up = art.get("upstream") or {}
    if art.get("model"):
        rows.append(("model", "", str(art["model"])))
    if up:
        wheels = ", ".join(f"{p.get('name')}=={p.get('version')}" for p in up.get("packages", []))
        what = f"{up.get('file', '—')} ({up.get('size', '—')} bytes) rebuilt from {wheels}"
        rows.append(("upstream file", str(up.get("sha256", "—")), what))
    if art.get("source"):
        rows.append(("model source", "", str(art["source"])))
    if art.get("license"):
        rows.append(("model license", "", str(art["license"])))
    return rows


def _attached_rows(ident: Mapping[str, Any]) -> list[Row]:
    """Workers the operator runs elsewhere: what they said about themselves, not hashed here."""
    att = ident.get("attached")
    if not att:
        return []
    where = ", ".join(str(w.get("address")) for w in att.get("workers", []))
    return [
        (
            "attached workers",
            str(att.get("placement_file_sha256", "—")),
            f"{len(att.get('workers', []))} workers at {where}, started by the operator; identity and "
            "owned range checked through Info (self-reported); their binaries were not hashed here",
        )
    ]
