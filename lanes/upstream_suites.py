"""Upstream llama.cpp's own tests, built from the pristine and the patched tree and run side by side.

The patch stack is meant for upstream, so upstream's suites must not notice it: every test below is
built from each tree (lanes.upstream_build), run on the CPU with the same arguments and the same
model files, and the two outcomes are put in one table.  A test that passes on the pristine tree and
fails on the patched one is a bug in the stack; so is a test-llama-archs row (architecture, device,
config) that is OK on the pristine tree and not on the patched one.

Model files: test-llama-archs' own ``-o DIR`` mode (the pristine build's, run once) writes upstream's
random tiny fixtures (llama, qwen35, nemotron_h dense; it does not save gemma3), the store's
tiny-llama is a real split llama with a vocab, and its gemma-3-270m (q4_k_m) a real gemma3.  Both
sides load exactly the same files.

Writes ``<workspace>/upstream/suites.json`` and ``suites.md``; each run's output is kept under
``<workspace>/upstream/logs/SIDE/`` (the builds in ``build-SIDE-KEY/``, the models in ``models/``).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from core.canonical import read_json, write_json
from core.clock import utc_now
from core.context import Context

SCHEMA_VERSION = 1
# The architectures the certified recipes stage (llama and gemma3 by 0002's stage cut, deepseek4 by
# 0004): their test-llama-archs rows are named in the table's notes.
STAGED_ARCHS = ("llama", "deepseek4", "gemma3")
SIDES = ("pristine", "patched")
ARCHS_SEED = "1234"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Status(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    TIMEOUT = "TIMEOUT"
    NOT_BUILT = "NOT_BUILT"
    NOT_RUN = "NOT_RUN"  # not applicable here; the suite's note says why


@dataclass(frozen=True, kw_only=True)
class Suite:
    """One upstream test invocation.  ``args`` may name ``{tiny}`` (the store's tiny-llama, first
    split), ``{gen:ARCH}`` (the generator's ARCH-dense.gguf) or ``{tree}`` (the tree under test)."""

    name: str
    target: str
    args: tuple[str, ...] = ()
    timeout_s: float = 600.0
    note: str = ""
    archs_table: bool = False  # test-llama-archs: compare its result rows too


@dataclass(frozen=True, kw_only=True)
class Outcome:
    status: Status
    seconds: float = 0.0
    returncode: int | None = None
    detail: str = ""
    log: str = ""
    rows: tuple[str, ...] = ()  # test-llama-archs' result rows, ANSI stripped


@dataclass(frozen=True, kw_only=True)
class Row:
    suite: Suite
    pristine: Outcome
    patched: Outcome
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def regression(self) -> bool:
        """Fails (or times out, or is not built) only on the patched tree, or an archs row got worse."""
        bad = (Status.FAIL, Status.TIMEOUT, Status.NOT_BUILT)
        if self.pristine.status is Status.PASS and self.patched.status in bad:
            return True
        return bool(worse_rows(self.pristine.rows, self.patched.rows))


# test-backend-sampler's cases (its BACKEND_TESTS), one row each: one that fails must not hide the rest.
_SAMPLER_TESTS = (
    "greedy",
    "logit_bias",
    "penalties",
    "temp",
    "temp_ext",
    "top_k",
    "multi_sequence",
    "dist",
    "dist_and_cpu",
    "set_sampler",
    "multi_output_limit",
    "multi_sequence_multi_output_dist",
    "multi_output_dist_transaction",
    "multi_output_sampling_chain",
    "multi_output_cpu",
    "mixed",
    "min_p",
    "cpu_mixed",
    "top_p",
)
_TOKENIZER_VOCABS = ("llama-spm", "llama-bpe", "gpt-2", "qwen2", "deepseek-llm", "falcon", "phi-3", "mpt")

# test-backend-ops and test-gguf are ggml's; the stack changes no file under ggml/ (the report
# checks that), so they run to show the build is whole, not to test a patch.
SUITES: tuple[Suite, ...] = (
    Suite(
        name="test-llama-archs -s 1234",
        target="test-llama-archs",
        args=("-s", ARCHS_SEED),
        timeout_s=2400.0,
        archs_table=True,
        note="random tiny model of every architecture: logits NMSE vs CPU and a save/load roundtrip "
        "(with only the CPU the NMSE is CPU against itself: what a row shows is that the model loads, "
        "builds its graph and decodes, and that the roundtrip is bitwise)",
    ),
    Suite(name="test-gguf", target="test-gguf", timeout_s=900.0, note="ggml's GGUF reader/writer"),
    Suite(name="test-batch-alloc", target="test-batch-alloc", note="llama_batch_allocr (src/)"),
    Suite(name="test-c", target="test-c", note="include/llama.h compiled as C; building it is the test"),
    Suite(
        name="test-model-load-cancel",
        target="test-model-load-cancel",
        args=("{gen:llama}",),
        note="on the generator's llama-dense.gguf",
    ),
    Suite(
        name="test-autorelease",
        target="test-autorelease",
        args=("{gen:llama}",),
        note="on the generator's llama-dense.gguf",
    ),
    Suite(
        name="test-save-load-state (tiny-llama)",
        target="test-save-load-state",
        args=("-m", "{tiny}", "-t", "2"),
        note="KV state save/load, seq_rm, seq_cp host/device",
    ),
    Suite(
        name="test-save-load-state (gemma3-270m)",
        target="test-save-load-state",
        args=("-m", "{gemma3}", "-t", "2"),
        note="same on the store's gemma-3-270m q4_k_m (sliding-window KV, 0003's iSWA pair); "
        "upstream's generator does not save gemma3",
    ),
    Suite(
        name="test-state-restore-fragmented (tiny-llama)",
        target="test-state-restore-fragmented",
        args=("-m", "{tiny}", "-t", "2"),
        note="seq state restore into a fragmented KV cache",
    ),
    Suite(
        name="test-recurrent-state-rollback (qwen35)",
        target="test-recurrent-state-rollback",
        args=("-m", "{gen:qwen35}", "-t", "2"),
        note="upstream's ctest pairing; llama-memory-recurrent (0003)",
    ),
    Suite(
        name="test-recurrent-state-rollback (nemotron_h)",
        target="test-recurrent-state-rollback",
        args=("-m", "{gen:nemotron_h}", "-t", "2"),
        note="upstream's ctest pairing (hybrid memory)",
    ),
    Suite(
        name="test-thread-safety (tiny-llama)",
        target="test-thread-safety",
        args=(
            "-m",
            "{tiny}",
            "-ngl",
            "99",
            "-p",
            "The meaning of life is",
            "-n",
            "128",
            "-c",
            "256",
            "-ub",
            "32",
            "-np",
            "4",
            "-t",
            "2",
        ),
        note="upstream's ctest arguments on tiny-llama instead of the downloaded stories15M",
    ),
    *(
        Suite(
            name=f"test-backend-sampler --test {t} (tiny-llama)",
            target="test-backend-sampler",
            args=("--model", "{tiny}", "--test", t),
            note="backend sampling on a loaded model"
            + ("; asks a +10 logit bias to win over a random model's logits" if t == "logit_bias" else ""),
        )
        for t in _SAMPLER_TESTS
    ),
    *(
        Suite(
            name=f"test-tokenizer-0 ({v})",
            target="test-tokenizer-0",
            args=(f"{{tree}}/models/ggml-vocab-{v}.gguf",),
            note="vocab-only model load (0001's loader)",
        )
        for v in _TOKENIZER_VOCABS
    ),
    Suite(
        name="test-backend-ops grad",
        target="test-backend-ops",
        args=("grad",),
        timeout_s=900.0,
        note="ggml: gradients vs finite differences on the CPU; at the pin it aborts on both trees "
        "(REGLU has no backward pass, ggml.c:7086; an op subset meets inplace asserts and SUM misses "
        "its tolerance): upstream's own state",
    ),
    Suite(
        name="test-backend-ops test -b CPU",
        target="test-backend-ops",
        args=("test", "-b", "CPU", "-o", "MUL_MAT,SOFT_MAX,ROPE,RMS_NORM,GET_ROWS,CPY,SET_ROWS,ADD,MUL"),
        timeout_s=1800.0,
        note="ggml: the CPU backend vs its reference implementation, on the ops a llama graph runs",
    ),
)

# Upstream tests of the pin not run, and why (the table lists them so the choice is visible).
NOT_RUN: Mapping[str, str] = {
    "test-backend-ops (default: test)": "compares each non-CPU backend with the CPU; with only the CPU "
    "it prints 'Skipping CPU backend' and passes without testing (the -b CPU row above tests it)",
    "test-download-model, test-tokenizers-ggml-vocabs": "download from the network (no network here)",
    "test-gguf-model-data, test-quant-type-selection": "need cpp-httplib with OpenSSL and a remote "
    "model (LLAMA_OPENSSL is OFF in the pipeline)",
    "test-model-resolution, test-arg-parser": "common/'s argument and download resolution: no file "
    "the stack changes",
    "test-tokenizer-1-bpe, test-quantize-stats, test-export-graph-ops": "built by upstream but not "
    "registered as tests (no pass/fail in ctest)",
    "test-opt, test-rope, test-alloc, test-barrier, test-quantize-fns, test-quantize-perf, "
    "test-col2im-1d": "ggml only; the stack changes no file under ggml/",
    "test-sampling, test-grammar-*, test-chat*, test-jinja*, test-peg-parser, test-json-schema-to-grammar, "
    "test-log, test-reasoning-budget, test-llama-grammar, test-tokenizer-0 (other vocabs)": "sampling, "
    "grammar, chat templates, logging: no model load or KV state touched by the stack",
}


def targets(suites: Sequence[Suite] = SUITES) -> tuple[str, ...]:
    return tuple(dict.fromkeys(s.target for s in suites))


def placeholders(suites: Sequence[Suite]) -> set[str]:
    """The model names the suites' arguments ask for (``tiny``, ``gen:ARCH``)."""
    return {n for s in suites for a in s.args for n in re.findall(r"\{([a-z0-9_:]+)\}", a)} - {"tree"}


# --- test-llama-archs rows -----------------------------------------------------------------------------


def archs_rows(output: str) -> tuple[str, ...]:
    """The result rows of test-llama-archs' table, ANSI colours stripped and blanks squeezed:
    ``arch|device|config|OK (1.2e-07)|OK``.  Header and separator lines are left out."""
    rows = []
    for raw in output.splitlines():
        line = _ANSI.sub("", raw).strip()
        if not line.startswith("|") or line.startswith("|-") or "Model arch." in line:
            continue
        cells = [" ".join(c.split()) for c in line.strip("|").split("|")]
        if len(cells) == 5 and cells[0]:
            rows.append("|".join(cells))
    return tuple(rows)


def row_counts(rows: Sequence[str]) -> dict[str, int]:
    """How many rows say OK, FAIL or SKIP in either column (a row counts once, by its worst cell)."""
    counts = {"rows": len(rows), "OK": 0, "FAIL": 0, "SKIP": 0}
    ok_archs = set()
    for row in rows:
        cells = row.split("|")[3:]
        worst = (
            "FAIL"
            if any(c.startswith("FAIL") for c in cells)
            else ("OK" if any(c.startswith("OK") for c in cells) else "SKIP")
        )
        counts[worst] += 1
        if worst == "OK":
            ok_archs.add(row.split("|")[0])
    return {**counts, "archs": len(ok_archs)}  # architectures with an OK row


def _row_key(row: str) -> str:
    return "|".join(row.split("|")[:3])


def _verdicts(row: str) -> tuple[str, ...]:
    return tuple(c.split(" ")[0] for c in row.split("|")[3:])


def worse_rows(pristine: Sequence[str], patched: Sequence[str]) -> list[str]:
    """Rows (arch|device|config) whose verdicts differ or that one side lacks: any difference in
    upstream's own verdicts counts; NMSE figures beside an OK may differ in the last digits."""
    a = {_row_key(r): _verdicts(r) for r in pristine}
    b = {_row_key(r): _verdicts(r) for r in patched}
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


# --- running -------------------------------------------------------------------------------------------


def expand(args: Sequence[str], *, tree: Path, models: Mapping[str, Path]) -> list[str] | str:
    """The suite's arguments with its placeholders filled, or a reason it cannot run."""
    out = []
    for arg in args:
        for name in re.findall(r"\{([a-z0-9_:]+)\}", arg):
            if name == "tree":
                value = str(tree)
            elif name in models:
                value = str(models[name])
            else:
                return f"no model {name} here"
            arg = arg.replace(f"{{{name}}}", value)
        out.append(arg)
    return out


def run_one(
    suite: Suite,
    binary: Path,
    *,
    tree: Path,
    models: Mapping[str, Path],
    logs: Path,
    env: Mapping[str, str],
) -> Outcome:
    if not binary.is_file():
        return Outcome(status=Status.NOT_BUILT, detail=f"{binary.name} was not built")
    argv = expand(suite.args, tree=tree, models=models)
    if isinstance(argv, str):
        return Outcome(status=Status.NOT_RUN, detail=argv)
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / (re.sub(r"[^A-Za-z0-9._-]+", "_", suite.name).strip("_") + ".log")
    scratch = logs / "cwd"  # test-save-load-state writes dump_state.bin into its working directory
    scratch.mkdir(exist_ok=True)
    started = time.monotonic()
    with open(log, "wb") as sink:
        try:
            # ggml's abort handler attaches gdb for a backtrace: slow, and the assert line says enough
            done = subprocess.run(
                [str(binary), *argv],
                cwd=scratch,
                env={**env, "GGML_NO_BACKTRACE": "1"},
                stdout=sink,
                stderr=subprocess.STDOUT,
                timeout=suite.timeout_s,
                check=False,
            )
            code: int | None = done.returncode
        except subprocess.TimeoutExpired:
            code = None
    seconds = round(time.monotonic() - started, 2)
    output = log.read_text("utf-8", "replace")
    rows = archs_rows(output) if suite.archs_table else ()
    if code is None:
        return Outcome(
            status=Status.TIMEOUT,
            seconds=seconds,
            detail=f"killed after {suite.timeout_s:.0f} s",
            log=str(log),
            rows=rows,
        )
    detail = "" if code == 0 else _tail(output)
    if rows:
        c = row_counts(rows)
        detail = f"{c['OK']} OK rows over {c['archs']} archs, {c['FAIL']} FAIL, {c['SKIP']} SKIP; " + detail
    return Outcome(
        status=Status.PASS if code == 0 else Status.FAIL,
        seconds=seconds,
        returncode=code,
        detail=detail.strip("; "),
        log=str(log),
        rows=rows,
    )


def _tail(output: str, lines: int = 3) -> str:
    kept = [_ANSI.sub("", s).strip() for s in output.splitlines() if s.strip()]
    return " / ".join(kept[-lines:])[:400]


def compare(
    suites: Sequence[Suite], pristine: Mapping[str, Outcome], patched: Mapping[str, Outcome]
) -> list[Row]:
    rows = []
    for suite in suites:
        a = pristine.get(suite.name, Outcome(status=Status.NOT_RUN, detail="not run"))
        b = patched.get(suite.name, Outcome(status=Status.NOT_RUN, detail="not run"))
        notes = [suite.note] if suite.note else []
        if suite.archs_table:
            diff = worse_rows(a.rows, b.rows)
            notes.append(
                "rows identical pristine vs patched"
                if not diff and a.rows
                else f"rows differing: {', '.join(diff[:10])}"
                if diff
                else "no rows"
            )
            staged = [r for r in b.rows if r.split("|")[0] in STAGED_ARCHS and r.split("|")[1] != "Meta"]
            if staged:
                notes.append(
                    "the stack's architectures (patched; config, NMSE, roundtrip): "
                    + ", ".join(f"{r.split('|')[0]} {' '.join(r.split('|')[2:])}" for r in staged)
                )
        rows.append(Row(suite=suite, pristine=a, patched=b, notes=tuple(notes)))
    return rows


# --- the report ----------------------------------------------------------------------------------------


def _cell(o: Outcome) -> str:
    return (
        o.status.value
        if o.status is not Status.PASS or not o.rows
        else f"PASS ({row_counts(o.rows)['OK']} OK rows)"
    )


def render_markdown(rows: Sequence[Row], meta: Mapping[str, Any]) -> str:
    lines = [
        "# Upstream llama.cpp suites: pristine vs patched tree (CPU)",
        "",
        f"Pinned commit {meta.get('commit', '?')}; pristine tree {meta.get('pristine_tree', '?')}, "
        f"patched tree {meta.get('patched_tree', '?')}; written {meta.get('created_at', '?')}.",
        f"Files the stack changes: {', '.join(meta.get('changed_dirs', [])) or '?'} "
        f"(ggml/ unchanged: {meta.get('ggml_unchanged', '?')}).",
        "",
        "| test | pristine | patched | seconds (pristine / patched) | notes |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        details = dict.fromkeys(d for d in (r.pristine.detail, r.patched.detail) if d)  # once if alike
        notes = "; ".join((*r.notes, *details))
        if r.regression:
            notes = "**FAILS ONLY ON THE PATCHED TREE**; " + notes
        lines.append(
            f"| {r.suite.name} | {_cell(r.pristine)} | {_cell(r.patched)} | "
            f"{r.pristine.seconds:.1f} / {r.patched.seconds:.1f} | {notes.replace('|', '/')} |"
        )
    for name, why in NOT_RUN.items():
        lines.append(f"| {name} | not run | not run | - | {why} |")
    builds = meta.get("builds", {})
    if builds:
        lines += [
            "",
            "| build | this run: configure / build s | last compile: configure / build s (UTC) "
            "| dir | error |",
            "|---|---|---|---|---|",
        ]
        for side, b in builds.items():
            error = b.get("error") or "-"
            last = b.get("last_compile") or {}
            when = f"{last['configure_s']} / {last['build_s']} ({last['created_at']})" if last else "-"
            lines.append(f"| {side} | {b['configure_s']} / {b['build_s']} | {when} | {b['dir']} | {error} |")
    regressions = [r.suite.name for r in rows if r.regression]
    lines += [
        "",
        f"Tests failing only on the patched tree: {len(regressions)}"
        + (f" ({', '.join(regressions)})" if regressions else ""),
        "",
    ]
    return "\n".join(lines)


def as_json(rows: Sequence[Row], meta: Mapping[str, Any]) -> dict[str, Any]:
    def outcome(o: Outcome) -> dict[str, Any]:
        d = asdict(o)
        d["status"] = o.status.value
        d["rows"] = list(o.rows)
        return d

    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "dgr.upstream-suites",
        **meta,
        "suites": [
            {
                "name": r.suite.name,
                "target": r.suite.target,
                "args": list(r.suite.args),
                "pristine": outcome(r.pristine),
                "patched": outcome(r.patched),
                "notes": list(r.notes),
                "regression": r.regression,
            }
            for r in rows
        ],
        "not_run": dict(NOT_RUN),
        "regressions": [r.suite.name for r in rows if r.regression],
    }


@dataclass(frozen=True, kw_only=True)
class SuitesReport:
    json_path: Path
    markdown_path: Path
    regressions: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.regressions


def write_report(out: Path, rows: Sequence[Row], meta: Mapping[str, Any]) -> SuitesReport:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "suites.json", as_json(rows, meta))
    (out / "suites.md").write_text(render_markdown(rows, meta), encoding="utf-8")
    return SuitesReport(
        json_path=out / "suites.json",
        markdown_path=out / "suites.md",
        regressions=tuple(r.suite.name for r in rows if r.regression),
    )


def changed_dirs(pristine: Path, patched: Path) -> list[str]:
    """Top-level directories holding a file that differs between the trees (e.g. include, src)."""
    done = subprocess.run(
        ["diff", "-rq", str(pristine), str(patched)], capture_output=True, text=True, check=False
    )
    dirs = set()
    for line in done.stdout.splitlines():
        if line.startswith("Files "):  # "Files A and B differ"
            path = Path(line.removeprefix("Files ").split(" and ")[0])
        elif line.startswith("Only in "):  # "Only in DIR: NAME"
            where, _, name = line.removeprefix("Only in ").partition(": ")
            path = Path(where) / name
        else:
            continue
        base = pristine if path.is_relative_to(pristine) else patched
        dirs.add(path.relative_to(base).parts[0])
    return sorted(dirs)


def run_suites(
    ctx: Context,
    *,
    progress: Callable[[str], None] = print,
    suites: Sequence[Suite] = SUITES,
    jobs: int = 2,
    out: Path | None = None,
) -> SuitesReport:
    """Build both trees' test targets, make the fixture models, run every suite on both, write the table
    (``out``, default ``<workspace>/upstream``).  ``report.ok`` is False when a test fails only on the
    patched tree."""
    from fetch.source import ensure_pristine
    from lanes import upstream_models
    from patches.stack import ensure_patched

    started = time.monotonic()
    pristine = ensure_pristine(ctx)
    patched = ensure_patched(ctx)
    root = ctx.workspace.root / "upstream"  # the builds and fixture models
    out = out or root  # suites.json, suites.md, logs/
    wanted = placeholders(suites)
    trees = {"pristine": (pristine.path, pristine.tree), "patched": (patched.path, patched.digest)}
    builds = _build_both(
        ctx,
        trees,
        commit=pristine.commit,
        root=root,
        jobs=jobs,
        progress=progress,
        targets=(*targets(suites), *(("test-llama-archs",) if wanted else ())),
    )
    models = upstream_models.models(
        ctx, builds["pristine"].binary("test-llama-archs"), root / "models", wanted=wanted, say=progress
    )
    results = _run_all(ctx, suites, builds, models=models, logs=out / "logs", progress=progress)
    dirs = changed_dirs(pristine.path, patched.path)
    meta = {
        "commit": pristine.commit,
        "pristine_tree": pristine.tree,
        "patched_tree": patched.digest,
        "changed_dirs": dirs,
        "ggml_unchanged": "ggml" not in dirs,
        "created_at": utc_now(),
        "builds": {
            s: {
                "dir": str(b.dir),
                "configure_s": b.configure_s,
                "build_s": b.build_s,
                "error": b.error,
                "last_compile": dict(b.recorded),
            }
            for s, b in builds.items()
        },
        "models": {k: str(v) for k, v in models.items()},
        "seconds": round(time.monotonic() - started, 1),
    }
    report = write_report(out, compare(suites, results["pristine"], results["patched"]), meta)
    progress(f"wrote {report.markdown_path}: {len(report.regressions)} failing only on the patched tree")
    return report


def _build_both(
    ctx: Context,
    trees: Mapping[str, tuple[Path, str]],
    *,
    commit: str,
    root: Path,
    jobs: int,
    targets: Sequence[str],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Each tree's test targets (the libraries' objects are the CPU lane build's compiles: ccache)."""
    from lanes.upstream_build import ensure_test_build

    builds = {}
    for side, (tree, digest) in trees.items():
        b = ensure_test_build(
            ctx,
            side=side,
            tree=tree,
            tree_digest=digest,
            commit=commit,
            targets=tuple(dict.fromkeys(targets)),
            root=root,
            jobs=jobs,
            say=progress,
        )
        progress(
            f"{side} build: configure {b.configure_s} s, build {b.build_s} s"
            + (f"; FAILED: {b.error}" if b.error else "")
        )
        builds[side] = b
    return builds


def _run_all(
    ctx: Context,
    suites: Sequence[Suite],
    builds: Mapping[str, Any],
    *,
    models: Mapping[str, Path],
    logs: Path,
    progress: Callable[[str], None],
) -> dict[str, dict[str, Outcome]]:
    from lanes.upstream_build import environment

    results: dict[str, dict[str, Outcome]] = {side: {} for side in SIDES}
    for suite in suites:
        for side in SIDES:
            b = builds[side]
            o = run_one(
                suite,
                b.binary(suite.target),
                tree=b.tree,
                models=models,
                logs=logs / side,
                env=environment(ctx, b.tree),
            )
            results[side][suite.name] = o
            progress(f"{suite.name} [{side}]: {o.status.value} in {o.seconds:.1f} s {o.detail[:120]}")
    return results


def load(path: Path) -> dict[str, Any]:
    data = read_json(path)  # the one reader and encoding policy; BadJson is a ValueError
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {version}, expected {SCHEMA_VERSION}")
    return data
