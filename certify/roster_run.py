"""`dgr roster`'s run: every fixture of the pinned tree's generator staged on the CPU lane's worker.

Per fixture of L layers: the monolithic worker runs the prompts once (the reference), then each
placement runs them on workers of its own: two stages at every cut (1 .. L-1) and one placement of
three or four stages (none below three layers), each compared with the reference bit for bit (the
logits of every position, then the greedy tokens).  Placements are launched one after another, the
monolithic reference once per fixture: on the generator's models (n_embd 256, a 128-token vocabulary)
starting a placement's workers takes about a tenth of a second, so the whole roster is a worker set per
placement without a worker pool of its own (the driver would route through any chain of running
stages, but the launcher starts whole placements).

A worker that will not load a layer range exits with llama's own line ("error loading model: ...");
that line is the row's reason, taken from its stderr in the evidence folder.  A worker that crashed (a
signal), hung, or loaded and then failed a pass fails its placement, as a mismatch does.  Evidence
(every worker's stdout and stderr) stays in ``runs/roster-<run-id>/<fixture>/<placement>/``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from certify import metrics
from certify.roster import Placed, Roster, Row, Status, cuts_passed, not_staged, reduce
from certify.run import new_run_id
from core.canonical import read_json
from core.context import Context
from core.environment import worker_load
from core.errors import ConfigurationError, RuntimeFailure
from lanes import arch_fixtures
from pipeline import drive
from worker.client import StageFailed
from worker.launcher import WorkerCommand, launch
from worker.stubs import Stubs

# Token ids below 128, the smallest vocabulary the generator writes; two prompt lengths, so prefill
# passes of two shapes cross every seam, then greedy decode one position at a time.
PROMPTS = ((1, 5, 9, 17, 33, 65, 100, 7), (3, 14, 15, 92, 65))
N_DECODE = 4
CTX = 128  # the generator's trained context (test-llama-archs: n_ctx 128)
MAX_STAGES = 4  # the placement beyond two stages: this many stages (fewer when the model is shallower)

Say = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class Workers:
    """How the roster starts workers: the CPU lane's command (its model set per fixture), the stubs,
    the environment, and where every worker's output is kept."""

    command: WorkerCommand
    stubs: Stubs
    env: Mapping[str, str]
    evidence: Path
    prompts: tuple[tuple[int, ...], ...] = PROMPTS
    n_decode: int = N_DECODE
    start_timeout: float = 60.0
    call_deadline: float = 60.0


def placements(n_layer: int) -> list[tuple[tuple[int, int], ...]]:
    """Two stages at every cut, then one placement of ``min(4, n_layer)`` stages cut as evenly as the
    layers allow (none when the model has fewer than three layers)."""
    out: list[tuple[tuple[int, int], ...]] = [((0, cut), (cut, n_layer)) for cut in range(1, n_layer)]
    k = min(MAX_STAGES, n_layer)
    if k >= 3:
        bounds = [round(i * n_layer / k) for i in range(k + 1)]
        out.append(tuple((bounds[i], bounds[i + 1]) for i in range(k)))
    return out


def run_prompts(
    workers: Workers, command: WorkerCommand, stages: Sequence[tuple[int, int]], evidence: Path
) -> drive.Trace:
    """The prompts through ``stages``, each on a worker of its own started for it (and stopped after)."""
    with launch(
        command,
        stages,
        stubs=workers.stubs,
        evidence=evidence,
        env=workers.env,
        start_timeout=workers.start_timeout,
        call_deadline=workers.call_deadline,
    ) as running:
        return drive.run_placement(running.clients, workers.prompts, workers.n_decode)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def mismatch(ref: Sequence[drive.PromptTrace], cur: Sequence[drive.PromptTrace]) -> str | None:
    """Where ``cur`` first differs from the reference, bit for bit (None: nowhere): the prompt and the
    position of the first logits row that differs, else the first greedy token that does."""
    for i, (r, c) in enumerate(zip(ref, cur, strict=True)):
        if r.logits.shape != c.logits.shape:
            return f"prompt {i}: logits {c.logits.shape}, the monolithic worker's {r.logits.shape}"
        rows = np.flatnonzero((_bits(r.logits) != _bits(c.logits)).any(axis=1))
        if rows.size:
            row = int(rows[0])
            diff = metrics.max_abs_diff(r.logits[row], c.logits[row])
            return (
                f"prompt {i}, position {r.logit_positions[row]}: logits differ (max |diff| {diff:.3g}; "
                f"{rows.size} of {len(r.logit_positions)} rows)"
            )
        if r.tokens != c.tokens:
            k = metrics.common_prefix(r.tokens, c.tokens)
            return f"prompt {i}: greedy token {k} is {c.tokens[k]}, the monolithic worker's {r.tokens[k]}"
    return None


def refusal(stderr: str) -> str:
    """The worker's own reason for not loading: llama's "error loading model: ..." line, or the reason
    llama gave for not creating a context (the stage cut's refusal, naming what the stage lacks), else
    the worker's last line of its own, else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        for mark in ("error loading model: ", "failed to initialize the context: "):
            if mark in line:
                return line.split(mark, 1)[1]
    own = [line.removeprefix("dgr-shard-worker: ") for line in lines if line.startswith("dgr-shard-worker: ")]
    return (own or lines or ["no output"])[-1]


def _exit_of(evidence: Path, stage: int) -> tuple[int | None, str]:
    """The return code and stderr of stage ``stage`` as the launcher recorded them (stages.json)."""
    try:
        recorded = read_json(evidence / "stages.json")["stages"][stage]
        return recorded["returncode"], (evidence / recorded["stderr"]).read_text(errors="replace")
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None, ""


def failure(exc: StageFailed, evidence: Path) -> tuple[Status, str]:
    """A placement that did not run: refused when a worker exited at load by itself (its own line),
    FAIL when one crashed, hung, or failed a pass after it loaded."""
    where = f"stage {exc.stage} ({exc.layers[0]}:{exc.layers[1]})"
    if exc.code == "DIED" and "before listening" in exc.detail:
        code, stderr = _exit_of(evidence, exc.stage)
        if code is not None and code > 0:
            return Status.REFUSED, refusal(stderr)
        return Status.FAIL, f"{where} crashed at load: {exc.detail}"
    return Status.FAIL, f"{where} {exc.code}: {exc.detail}"


def placed(
    workers: Workers,
    command: WorkerCommand,
    stages: tuple[tuple[int, int], ...],
    ref: drive.Trace,
    evidence: Path,
) -> tuple[Placed, tuple[str, ...]]:
    """One placement run and judged against ``ref``, with what crossed its seams beside the boundary."""
    try:
        trace = run_prompts(workers, command, stages, evidence)
    except StageFailed as exc:
        status, detail = failure(exc, evidence)
        return Placed(stages=stages, status=status, detail=detail), ()
    differs = mismatch(ref.prompts, trace.prompts)
    sideband = ("token ids",) if any(i.needs_token_sideband for i in trace.infos) else ()
    status = Status.FAIL if differs else Status.PASS
    return Placed(stages=stages, status=status, detail=differs or ""), sideband


def _n_layer(model: Path) -> int:
    from fetch.gguf_header import read_header

    return int(read_header(model).arch_value("block_count") or 0)


def stage_fixture(workers: Workers, arch: str, model: Path) -> Row:
    """One fixture: the monolithic reference, then every placement against it."""
    started = time.monotonic()
    n_layer = _n_layer(model)
    command = replace(workers.command, model=model)
    evidence = workers.evidence / model.stem
    whole = ((0, n_layer),)
    try:
        ref = run_prompts(workers, command, whole, evidence / "0-whole")
    except StageFailed as exc:  # refused at load by itself, or FAIL: a crash is never a refusal
        status, why = failure(exc, evidence / "0-whole")
        reason = f"0:{n_layer} (the whole model): {why}"
        return Row(arch=arch, fixture=model.name, status=status, reason=reason, n_layer=n_layer)
    judged: list[Placed] = []
    sideband: set[str] = set()
    for stages in placements(n_layer):
        name = "+".join(f"{b}-{e}" for b, e in stages)
        one, crossed = placed(workers, command, stages, ref, evidence / name)
        judged.append(one)
        sideband |= set(crossed)
    status, reason = reduce(judged)
    return Row(
        arch=arch,
        fixture=model.name,
        status=status,
        reason=reason,
        n_layer=n_layer,
        placements=tuple(judged),
        boundary_width=ref.infos[0].boundary_width,
        sideband=tuple(sorted(sideband)),
        seconds=time.monotonic() - started,
    )


def rows_of(workers: Workers, got: arch_fixtures.Fixtures) -> list[Row]:
    """The rows of one architecture: not generated (the generator's reason), not staged (why it is no
    decoder-only text model), or each fixture staged."""
    kind = not_staged(got.arch)
    if not got.models:
        reason = got.note + (f"; {kind}" if kind else "")
        return [Row(arch=got.arch, status=Status.NOT_GENERATED, reason=reason)]
    if kind:
        return [
            Row(arch=got.arch, fixture=m.name, status=Status.NOT_STAGED, reason=kind, n_layer=_n_layer(m))
            for m in got.models.values()
        ]
    return [stage_fixture(workers, got.arch, m) for m in got.models.values()]


def progress(k: int, n: int, row: Row) -> str:
    """One line per row as the roster goes: what, its status, its cuts, its time, why."""
    what = row.fixture or row.arch
    cuts = cuts_passed([p.record() for p in row.placements])
    ran = f" {cuts:16} {row.seconds:5.2f} s" if row.placements else ""
    why = f"  {row.reason}" if row.reason else ""
    return f"roster [{k:3}/{n}] {what:26} {row.status.value:13}{ran}{why}"


# --- the whole run ----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Setup:
    """What every fixture of one roster run shares."""

    workers: Workers
    worker: Path
    generator: Path
    fixtures: Path  # the generator's models, kept once per generator (its lane build key and depth)
    archs: tuple[str, ...]  # the architectures to run: those named, else every one the tree knows
    skipped: Mapping[str, str]  # why the generator writes none of some, as the tree's sources say
    identity: Mapping[str, str]


def prepare(ctx: Context, *, n_layer: int, run_id: str, wanted: Sequence[str] = ()) -> Setup:
    """The patched tree (a name it does not know stops here, before any build), the CPU lane built (a
    no-op when it is), the generator, the worker command."""
    from certify.inputs import worker_threads
    from lanes.build import ensure_build
    from patches.stack import ensure_patched
    from worker.stubs import load as load_stubs

    patched = ensure_patched(ctx)
    archs = select(arch_fixtures.architectures(patched.path), wanted)
    build = ensure_build(ctx, "cpu")
    if build.worker is None:
        raise RuntimeFailure("the CPU lane built no dgr-shard-worker", hint="run `dgr build --lane cpu`")
    folder = ctx.workspace.ensure(arch_fixtures.folder(ctx.workspace.root, build.key, n_layer))
    command = WorkerCommand(
        program=(str(build.worker),),
        model=build.worker,  # replaced by each fixture
        threads=worker_threads(ctx.env, 1),  # one count for every worker: bitwise needs the same
        ctx_size=CTX,
        load=worker_load(ctx.env),
        lane="cpu",
    )
    workers = Workers(
        command=command,
        stubs=load_stubs(ctx.workspace),
        env=dict(ctx.env),
        evidence=ctx.workspace.runs / f"roster-{run_id}",
    )
    return Setup(
        workers=workers,
        worker=build.worker,
        generator=arch_fixtures.generator_in(folder, patched.path, build.dir, n_layer),
        fixtures=folder / "fixtures",
        archs=archs,
        skipped=arch_fixtures.skipped(patched.path),
        identity={
            "llama_cpp_commit": patched.pristine.commit,
            "patched_tree": patched.digest,
            "build_key": build.key,
        },
    )


def select(known: Sequence[str], wanted: Sequence[str]) -> tuple[str, ...]:
    """The architectures named (all the tree knows when none is); ConfigurationError for a name the
    tree does not know, with the closest it does."""
    import difflib

    for name in wanted:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]}?" if close else "`dgr roster` with no --arch covers them all"
            raise ConfigurationError(f"--arch {name}: the pinned tree knows no such architecture", hint=hint)
    return tuple(sorted(set(wanted))) if wanted else tuple(known)


def run_roster(ctx: Context, *, n_layer: int, wanted: Sequence[str], say: Say) -> Roster:
    """Every architecture named (all by default): its fixtures generated, each staged or listed."""
    started = time.monotonic()
    run_id = new_run_id()
    setup = prepare(ctx, n_layer=n_layer, run_id=run_id, wanted=wanted)
    archs = setup.archs
    rows: list[Row] = []
    for k, arch in enumerate(archs, 1):
        got = arch_fixtures.fixtures(setup.generator, arch, setup.fixtures, known=setup.skipped.get(arch))
        for row in rows_of(setup.workers, got):
            rows.append(row)
            say(progress(k, len(archs), row))
    loaded = [r.fixture for r in rows if r.status in (Status.PASS, Status.FAIL, Status.REFUSED)]
    subjects = {
        "worker/dgr-shard-worker": setup.worker,
        "generator/test-llama-archs": setup.generator,
        **{f"fixtures/{name}": setup.fixtures / name for name in loaded},
    }
    settings = {
        "lane": "cpu",
        "n_layer": n_layer,
        "seed": arch_fixtures.SEED,
        "threads": setup.workers.command.threads,
        "ctx": CTX,
        "prompts": [list(p) for p in setup.workers.prompts],
        "n_decode": setup.workers.n_decode,
    }
    return Roster(
        run_id=run_id,
        made=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        seconds=time.monotonic() - started,
        identity=setup.identity,
        settings=settings,
        rows=rows,
        subjects=subjects,
    )
