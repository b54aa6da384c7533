"""The roster: which architectures stage, as one table signed like a certificate.

``dgr roster`` (certify/roster_run.py) stages every model the pinned tree's fixture generator writes
(lanes/arch_fixtures.py) at every cut and in one placement of three or four stages, bitwise against the
monolithic worker.  This module is the table: one row per fixture (or per architecture the generator
writes nothing for), each row's status reduced from its placements, the summary (architectures staged
bitwise of those generated), the Markdown page, and the signed envelope: an in-toto Statement of its own
predicate type (certificate.ROSTER_TYPE, manifests/schemas/roster.schema.json) whose subjects are the
worker, the generator and every fixture it staged, in a DSSE envelope `dgr verify` checks.

A row says what happened, never what should have: PASS (every placement bitwise), FAIL (a placement
loaded and gave other logits or tokens, or its worker crashed: the cut and position named), refused (the
worker's own line saying why it would not load a range), not staged (an architecture that is not a
decoder-only text model, with the reason) or not generated (the generator's reason).  Refusals are data;
only a FAIL fails the roster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from certify import certificate as cert
from certify.keys import SigningKey
from core.canonical import atomic_write_bytes, sha256_bytes
from core.errors import GateFailed

ENVELOPE_FILE = "roster.json"
TABLE_FILE = "roster.md"


class Status(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    REFUSED = "refused"
    NOT_STAGED = "not staged"
    NOT_GENERATED = "not generated"


# An architecture's status from its fixtures': the first of these any of them has.
_WORST_FIRST = (Status.FAIL, Status.REFUSED, Status.NOT_STAGED, Status.PASS, Status.NOT_GENERATED)

ENCODER_ONLY = "encoder-only: bidirectional attention, embeddings out; no next token to pipeline"
ENCODER_DECODER = "encoder-decoder: the decoder cross-attends to an encoder's output, not one residual stream"
DIFFUSION = "diffusion LM: non-causal attention over the whole sequence, decoded by unmasking, not by token"
DRAFT_HEAD = "speculative draft head: reads the target model's hidden states, not a model of its own"

# Architectures that are not decoder-only text models, with the reason they are listed, not staged.
# Names are the tree's own (src/llama-arch.cpp); one the tree does not know is never looked up.
NOT_STAGED: Mapping[str, str] = {
    **dict.fromkeys(
        (
            "bert",
            "eurobert",
            "gemma-embedding",
            "jina-bert-v2",
            "jina-bert-v3",
            "llama-embed",
            "modern-bert",
            "neo-bert",
            "nomic-bert",
            "nomic-bert-moe",
            "t5encoder",
        ),
        ENCODER_ONLY,
    ),
    "t5": ENCODER_DECODER,
    **dict.fromkeys(("dream", "llada", "llada-moe", "rnd1"), DIFFUSION),
    **dict.fromkeys(("eagle3", "dflash"), DRAFT_HEAD),
    "clip": "non-text: a vision encoder (the multimodal projector's), no token stream",
    "wavtokenizer-dec": "non-text: an audio codec decoder (codes to spectral frames)",
    "pockettts": "non-text: the backbone of a text-to-speech flow model; no output head, its hidden states "
    "feed the audio flow net",
    "qwen3tts": "non-text: a speech talker predicting audio codec tokens beside a code predictor outside it",
}


def not_staged(arch: str) -> str | None:
    """Why ``arch`` is listed and not staged (None: a decoder-only text model, staged)."""
    return NOT_STAGED.get(arch)


@dataclass(frozen=True, kw_only=True)
class Placed:
    """One placement of one fixture: its stages and what happened."""

    stages: tuple[tuple[int, int], ...]
    status: Status  # PASS, FAIL or REFUSED
    detail: str = ""  # FAIL: the placement, prompt and position; refused: the worker's own line

    def record(self) -> dict[str, Any]:
        return {"stages": [list(s) for s in self.stages], "status": self.status.value, "detail": self.detail}


@dataclass(frozen=True, kw_only=True)
class Row:
    """One fixture (or one architecture without any): the table's line."""

    arch: str
    fixture: str = ""  # the model file's name; "" when the generator wrote none
    status: Status
    reason: str = ""
    n_layer: int = 0
    placements: tuple[Placed, ...] = ()
    boundary_width: int = 0  # floats per token crossing a seam, as the worker reports it (0: not run)
    sideband: tuple[str, ...] = ()  # what crosses a seam beside the boundary (the workers' Info)
    seconds: float = 0.0

    def record(self) -> dict[str, Any]:
        return {
            "architecture": self.arch,
            "fixture": self.fixture,
            "status": self.status.value,
            "reason": self.reason,
            "n_layer": self.n_layer,
            "placements": [p.record() for p in self.placements],
            "boundary_width": self.boundary_width,
            "sideband": list(self.sideband),
            "seconds": round(self.seconds, 3),
        }


def reduce(placed: Sequence[Placed]) -> tuple[Status, str]:
    """A fixture's status and reason from its placements': any FAIL fails it (the first named), any
    refusal refuses it (the first refusal's line, and how many placements passed), else PASS."""
    for status in (Status.FAIL, Status.REFUSED):
        hit = [p for p in placed if p.status is status]
        if hit:
            passed = sum(p.status is Status.PASS for p in placed)
            also = f" ({passed} of {len(placed)} placements passed)" if passed else ""
            return status, f"{_layers(hit[0].stages)}: {hit[0].detail}{also}"
    return Status.PASS, ""


def _layers(stages: Iterable[Sequence[int]]) -> str:
    return " + ".join(f"{b}:{e}" for b, e in stages)


def arch_status(rows: Sequence[Mapping[str, Any]]) -> Status:
    """One architecture's status from its rows: the worst of them (FAIL, refused, not staged, PASS)."""
    have = {Status(r["status"]) for r in rows}
    return next(s for s in _WORST_FIRST if s in have)


def summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts per architecture (each the worst of its fixtures) and per fixture."""
    by_arch: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_arch.setdefault(str(r["architecture"]), []).append(r)
    archs = [arch_status(rs) for rs in by_arch.values()]
    fixtures = [Status(r["status"]) for r in rows if r["fixture"]]
    return {
        "architectures": len(archs),
        "generated": sum(s is not Status.NOT_GENERATED for s in archs),
        "staged_bitwise": archs.count(Status.PASS),
        "failed": archs.count(Status.FAIL),
        "refused": archs.count(Status.REFUSED),
        "not_staged": archs.count(Status.NOT_STAGED),
        "not_generated": archs.count(Status.NOT_GENERATED),
        "fixtures": len(fixtures),
        "fixtures_staged_bitwise": fixtures.count(Status.PASS),
    }


def summary_line(s: Mapping[str, Any]) -> str:
    return (
        f"{s['staged_bitwise']} of {s['generated']} generated architectures staged bitwise "
        f"({s['fixtures_staged_bitwise']} of {s['fixtures']} fixtures); {s['failed']} failed, "
        f"{s['refused']} refused, {s['not_staged']} not decoder-only text models; "
        f"{s['not_generated']} of the tree's {s['architectures']} architectures not generated"
    )


def failures(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """``fixture: reason`` of every FAIL row."""
    return [f"{r['fixture']}: {r['reason']}" for r in rows if r["status"] == Status.FAIL.value]


def gate(rows: Sequence[Mapping[str, Any]], envelope: Path) -> None:
    """GateFailed (exit 5) when an architecture that stages gave other logits or tokens than the
    monolithic worker, or one of its workers crashed or hung; refusals and unstaged architectures are
    data, not failures."""
    failed = failures(rows)
    if failed:
        more = f" (+{len(failed) - 3} more)" if len(failed) > 3 else ""
        raise GateFailed(
            f"{len(failed)} fixtures failed (a bitwise mismatch, or a worker that crashed or hung): "
            + "; ".join(failed[:3])
            + more,
            hint=f"the signed roster is {envelope}",
        )


# --- the page -------------------------------------------------------------------------------------
def cuts_passed(placements: Sequence[Mapping[str, Any]]) -> str:
    """``3/3 + 4 stages``: two-stage placements (one per cut) that passed of those run, and the
    placement of more stages when it passed ("4 stages refused" / "FAIL" otherwise); "" when none ran."""
    if not placements:
        return ""
    cuts = [p for p in placements if len(p["stages"]) == 2]
    text = f"{sum(p['status'] == Status.PASS.value for p in cuts)}/{len(cuts)}"
    for p in placements:
        if len(p["stages"]) > 2:
            verdict = "" if p["status"] == Status.PASS.value else f" {p['status']}"
            text += f" + {len(p['stages'])} stages{verdict}"
    return text


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


COLUMNS = (
    "architecture",
    "fixture",
    "layers",
    "status",
    "cuts passed",
    "boundary width",
    "side-band tensors",
    "wall s",
    "reason",
)


def cells(r: Mapping[str, Any]) -> tuple[str, ...]:
    """One row's cells under COLUMNS, as the page and the report index show them."""
    staged = bool(r["placements"])
    return tuple(
        str(c)
        for c in (
            r["architecture"],
            r["fixture"] or "—",
            r["n_layer"] or "—",
            r["status"],
            cuts_passed(r["placements"]) or "—",
            r["boundary_width"] or "—",
            ", ".join(r["sideband"]) or ("none" if r["status"] == Status.PASS.value else "—"),
            f"{r['seconds']:.2f}" if staged else "—",
            r["reason"],
        )
    )


def table_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return lines + ["| " + " | ".join(_cell(c) for c in cells(r)) + " |" for r in rows]


def render(predicate: Mapping[str, Any]) -> str:
    """The roster as Markdown: what was run, the summary, the table (its digest is signed)."""
    ident, settings = predicate["identity"], predicate["settings"]
    lines = [
        "# Roster: every architecture the pinned tree's fixture generator writes, staged",
        "",
        f"llama.cpp {ident['llama_cpp_commit'][:12]} with the patch stack (patched tree "
        f"{ident['patched_tree'][:12]}), CPU lane build {ident['build_key'][:16]}; fixtures "
        f"{settings['n_layer']} layers deep (seed {settings['seed']}), threads per worker: "
        f"{settings['threads']}; {len(settings['prompts'])} prompts + {settings['n_decode']} greedy tokens, "
        "every placement against the monolithic worker, bitwise (logits of every position, and the tokens).",
        f"Run {predicate['run_id']}, {predicate['made']}, {predicate['seconds']:.1f} s.",
        "",
        f"**{summary_line(predicate['summary'])}.**",
        "",
        *table_lines(predicate["rows"]),
        "",
    ]
    return "\n".join(lines)


# --- the signed document ----------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Roster:
    """What a roster run produced, before it is signed."""

    run_id: str
    made: str  # UTC, ISO 8601
    seconds: float
    identity: Mapping[str, str]  # llama_cpp_commit, patched_tree, build_key
    settings: Mapping[str, Any]  # n_layer, seed, threads, ctx, prompts, n_decode, lane
    rows: Sequence[Row]
    subjects: Mapping[str, Path] = field(default_factory=dict[str, Path])  # name -> file, hashed at signing

    def predicate(self) -> dict[str, Any]:
        rows = [r.record() for r in self.rows]
        return {
            "schema_version": cert.ROSTER_SCHEMA_VERSION,
            "run_id": self.run_id,
            "made": self.made,
            "seconds": round(self.seconds, 1),
            "identity": dict(self.identity),
            "settings": dict(self.settings),
            "summary": summary(rows),
            "rows": rows,
            "local_paths": {name: str(path.resolve()) for name, path in self.subjects.items()},
        }


def sign(roster: Roster, key: SigningKey) -> tuple[dict[str, Any], str]:
    """The envelope and the page: the page rendered first, its sha256 signed in the predicate; every
    subject hashed now.  The predicate is held to its schema before anything is signed."""
    from manifests.loader import validate

    predicate = roster.predicate()
    page = render(predicate)
    predicate["table"] = {"file": TABLE_FILE, "sha256": sha256_bytes(page.encode("utf-8"))}
    predicate["signer"] = {"keyid": key.keyid, "dev_key": key.dev_key}
    validate(predicate, "roster", source="the roster")
    subjects = [cert.subject(name, cert.file_digests(path)) for name, path in roster.subjects.items()]
    return cert.sign(cert.statement(subjects, predicate, predicate_type=cert.ROSTER_TYPE), key), page


def write(folder: Path, envelope: Mapping[str, Any], page: str) -> Path:
    """``roster.md`` and ``roster.json`` (the envelope, last: a folder with it holds the whole roster)."""
    atomic_write_bytes(folder / TABLE_FILE, page.encode("utf-8"))
    cert.write(folder / ENVELOPE_FILE, envelope)
    return folder / ENVELOPE_FILE
