"""`dgr certify` end to end with the real CPU build and real workers on the embedded tiny-llama:
PASS + verify; a stage killed mid-run (exit 6, nothing signed, evidence kept, no worker left);
thresholds tightened past what the lane reaches (exit 5, signed FAIL); refused recipes (exit 2)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.workspace import PROJECT_ROOT, Workspace
from manifests.recipe_model import RECIPES
from tests.integration.conftest import live_workers
from tests.integration.dgr_cli import run_dgr, user_env, verified

pytestmark = pytest.mark.slow

# The project's own workspace: the CPU build and the provisioned model are shared with the other
# slow tests and with `nox -s certify` (building them again here would double the suite's time).
ENV = user_env()
WS = Workspace.from_env(ENV)


def paths_from(stdout: str) -> dict[str, Path]:
    found = {}
    for line in stdout.splitlines():
        key, _, value = line.partition(": ")
        if key in ("certificate", "report"):
            found[key] = Path(value.strip())
    return found


def small_recipe(tmp: Path, name: str, **changes: object) -> Path:
    doc = json.loads((RECIPES / "tiny-llama.json").read_text())
    doc["name"] = name
    doc.pop("depth", None)  # its placements are not all kept; depth is the default certification's to show
    doc["placements"] = {
        k: v for k, v in doc["placements"].items() if k in ("mono", "two-middle", "three-first-middle")
    }
    # Several sessions at once are the default certification's to show (and the fake suite's); these
    # recipes test other things, so they keep to single-stream speed.
    doc["measure"].pop("concurrency", None)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = doc
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        node[leaf] = value
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.quick
def test_default_certify_passes_and_verifies(live_certification) -> None:
    live = live_certification()  # plain `dgr certify`: the embedded recipe on the CPU lane
    done, wall = live.done, live.wall_s
    verify_out = verified(ENV, live)  # PASS, or a FAIL only from speed checks a loaded machine missed
    paths = paths_from(done.stdout)
    assert paths["certificate"].is_absolute() and paths["certificate"].is_file()
    assert paths["report"].is_absolute() and paths["report"].is_file()
    assert paths["certificate"].parent.parent == WS.reports / "tiny-llama" / "cpu"
    status = live.predicate["verdict"]["status"]
    assert f"verified: tiny-llama on cpu, verdict {status}" in verify_out
    assert not [ln for ln in verify_out.splitlines() if ln.startswith("FAIL ")]  # no check of verify's failed
    assert verify_out.count("ok   subject") >= 4
    # Real workers held several sessions at once, up to one per stage, each bitwise the session alone.
    env = json.loads(paths["certificate"].read_text())
    figures = json.loads(base64.b64decode(env["payload"]))["predicate"]["figures"]
    twelve = next(p for p in figures["placements"] if p["name"] == "twelve-single")
    levels = {lv["sessions"]: lv for lv in twelve["speed"]["concurrency"]["levels"]}
    assert sorted(levels) == [1, 4, 12] and all(lv["diverging_sessions"] == 0 for lv in levels.values())
    # The ring placement's passes crossed on the workers' pass ports, sessions at once included, and
    # its deliveries came as frames on the driver's delivery port.
    ring = next(p for p in figures["placements"] if p["name"] == "twelve-single-ring")
    assert ring["forwarding"] == "ring" and ring["ring_transport"] == "tcp pass port"
    assert ring["speed"]["ring_deliveries"] == "frames"
    assert all(lv["diverging_sessions"] == 0 for lv in ring["speed"]["concurrency"]["levels"])
    assert ring["seam_model"]["crossings_per_token"] == 12
    assert {row["bytes"] for row in figures["transport_floor"]["sizes"]} == {512, 1024}  # f16 and f32 seams
    # Each size's floor between two processes, on one core and (where there are two) on two.
    for row in figures["transport_floor"]["sizes"]:
        assert row["tcp_one_core_round_trip_s"]["median"] > 0
        assert len(os.sched_getaffinity(0)) < 2 or row["tcp_two_cores_round_trip_s"]["median"] > 0
    html = paths["report"].read_text()
    assert "<th>process floor ms (1 core / 2 cores)</th>" in html
    # Each stage said how it holds its weights: read into memory on the CPU lane, and how much on huge pages.
    for p in figures["placements"]:
        assert p["load_mode"] == ["none"] * p["n_stages"], p["name"]
        assert len(p["huge_page_bytes"]) == p["n_stages"] and all(b >= -1 for b in p["huge_page_bytes"])
    assert "<th>stage weights</th>" in html
    # At depth (2,048 tokens in 16 passes of 128): bitwise, pipelined prefill too, and KV that adds up.
    depth = figures["depth"]
    assert [p["name"] for p in depth["placements"]] == ["two-middle", "twelve-single"]
    for p in depth["placements"]:
        assert p["parity"]["bitwise_logits"] and p["prefill"]["bitwise"] and p["prefill"]["passes"] == 16
        assert p["kv_bytes_sum"] == p["kv_bytes_monolithic"] > 0
    print(f"\n`dgr certify` (tiny-llama, cpu, build present): {wall:.1f} s wall; {paths['certificate']}")


# The recipe the interrupted runs certify: tiny-llama's monolithic and middle cut first, the fewest
# speed repetitions the schema allows and no concurrency series, so stage 1 of two-middle comes up
# soon instead of after the default recipe's whole monolithic speed series (what is interrupted is
# the same code path either way).
KILLED = "tiny-llama-killed"
SIGKILLED = "tiny-llama-sigkilled"  # the certifier killed, not a stage


def _start_certify(tmp: Path, name: str = KILLED) -> tuple[subprocess.Popen[str], set[str]]:
    """``dgr certify`` (a recipe file named ``name``) as a user starts it, and the runs that existed
    before it."""
    recipe = small_recipe(tmp, name, **{"measure.warmup": 1, "measure.repetitions": 5})
    WS.runs.mkdir(parents=True, exist_ok=True)
    before = set(os.listdir(WS.runs))
    proc = subprocess.Popen(
        [sys.executable, "-m", "certify", "certify", "--recipe-file", str(recipe)],
        cwd=PROJECT_ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, before


def _stage_listening(
    proc: subprocess.Popen[str], before: set[str], name: str = KILLED
) -> tuple[Path, int] | None:
    """Wait until stage 1 (layers 6:12) of two-middle serves: the run's folder and that worker's pid."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        run_dir = _run_of(name, WS.runs, before)
        if run_dir is not None:
            out = run_dir / "two-middle" / "stage-1-layers-6-12.stdout"
            if out.is_file() and "DGR-WORKER-LISTENING" in out.read_text(errors="replace"):
                pids = [
                    p
                    for p in live_workers(str(run_dir))
                    if "6:12" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
                ]
                if pids:
                    return run_dir, pids[0]
        time.sleep(0.01)
    return None


def _run_of(recipe: str, runs: Path, before: set[str]) -> Path | None:
    """The run folder made since ``before`` whose identity.json (written before any worker starts) names
    ``recipe``: under pytest-xdist another test's certification starts its own run beside this one, and
    taking the first new folder by name once killed that run's worker instead of this one's."""
    for name in sorted(set(os.listdir(runs)) - before):
        try:
            identity = json.loads((runs / name / "identity.json").read_text())
        except (OSError, ValueError):
            continue  # not written yet, or being written
        if identity.get("recipe") == recipe:
            return runs / name
    return None


def test_the_interrupted_run_is_found_by_its_recipe_not_by_its_folder_name(tmp_path: Path) -> None:
    for run_id, recipe in (("20261206T174214Z-90705b", "tiny-llama"), ("20261206T174234Z-e641ee", KILLED)):
        (tmp_path / run_id).mkdir()
        (tmp_path / run_id / "identity.json").write_text(json.dumps({"recipe": recipe}))
    (tmp_path / "20261206T174200Z-000000").mkdir()  # a run whose identity is not written yet
    assert _run_of(KILLED, tmp_path, set()) == tmp_path / "20261206T174234Z-e641ee"
    assert _run_of(KILLED, tmp_path, {"20261206T174234Z-e641ee"}) is None


def test_stage_killed_mid_run_exits_6_and_signs_nothing(tmp_path: Path) -> None:
    proc, before = _start_certify(tmp_path)
    try:
        found = _stage_listening(proc, before)
        assert found is not None, "never saw stage 1 of two-middle running"
        run_dir, stage = found
        os.kill(stage, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 6, stdout + stderr
    line = stderr.strip().splitlines()[-1]
    assert "stage 1 (layers 6:12) failed" in line and "nothing was signed" in line, stderr
    assert not (WS.reports / KILLED / "cpu" / run_dir.name).exists()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "ERROR"
    assert (run_dir / "two-middle" / "stage-1-layers-6-12.stderr").is_file()
    assert (run_dir / "two-middle" / "stages.json").is_file()
    assert live_workers(str(run_dir)) == []


def test_a_sigkilled_certifier_leaves_no_worker_running(tmp_path: Path) -> None:
    # SIGKILL runs no cleanup in the certifier; its workers see their stdin (the launcher pipe) end.
    # Before, they served on, orphaned, and a later test's scan for leftover workers failed on them.
    # A recipe name of its own: the killed-stage test may run beside it on another xdist worker.
    proc, before = _start_certify(tmp_path, SIGKILLED)
    try:
        found = _stage_listening(proc, before, SIGKILLED)
        assert found is not None, "never saw stage 1 of two-middle running"
        run_dir, _ = found
        assert len(live_workers(str(run_dir))) == 2
        proc.kill()
        proc.communicate(timeout=60)
        deadline = time.monotonic() + 60  # generous for a loaded box: they stop at once when idle
        while live_workers(str(run_dir)) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = live_workers(str(run_dir))
        stderr = (run_dir / "two-middle" / "stage-1-layers-6-12.stderr").read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in live_workers(str(run_dir)) if found else []:
            os.kill(pid, signal.SIGKILL)
    assert left == [], f"workers {left} outlived their SIGKILLed certifier"
    assert "stdin ended (the launcher is gone); stopping" in stderr


@dataclass(frozen=True)
class TightRun:
    """One certification of a small tiny-llama recipe whose decode floor no machine reaches, its stages
    held to one CPU and their weights mapped: the signed FAIL and the pinning are both read from it."""

    recipes: Path  # the folder holding the recipe file
    done: subprocess.CompletedProcess[str]
    reports: Path  # the recipe's own report folder
    cpu: str


@pytest.fixture(scope="module")
def tight_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TightRun]:
    """The tightened recipe is this module's own: its signed FAILs do not stay in the project's index."""
    folder = tmp_path_factory.mktemp("tight")
    recipe = small_recipe(folder, "tiny-llama-tight", **{"hardware_classes.0.speed.decode_tok_s_min": 1e9})
    cpu = str(min(os.sched_getaffinity(0)))
    done = run_dgr(
        dict(ENV, DGR_WORKER_CPUS=cpu, DGR_WORKER_LOAD="mmap"), "certify", "--recipe-file", str(recipe)
    )
    where = WS.reports / "tiny-llama-tight"
    yield TightRun(recipes=folder, done=done, reports=where, cpu=cpu)
    made = paths_from(done.stdout).get("certificate")
    if made is not None:
        shutil.rmtree(made.parent, ignore_errors=True)  # this run's folder only, not another's
    for empty in (where / "cpu", where):
        if empty.is_dir() and not any(empty.iterdir()):
            empty.rmdir()


def test_tightened_thresholds_exit_5_with_signed_fail(tmp_path: Path, tight_run: TightRun) -> None:
    done = tight_run.done
    assert done.returncode == 5, done.stdout + done.stderr
    assert "verdict: FAIL" in done.stdout
    assert "decode tok/s (median)" in done.stderr and "limit >= 1.000e+09" in done.stderr
    paths = paths_from(done.stdout)
    assert paths["certificate"].parent.parent.parent == tight_run.reports
    check = run_dgr(ENV, "verify", str(paths["certificate"]))
    assert check.returncode == 0 and "verdict FAIL" in check.stdout, check.stdout + check.stderr
    # The same recipe through DGR_RECIPES_DIR, by name: it resolves to the recipe just certified (same
    # digest in the worker identity it writes; a second whole certification would add nothing).
    env = dict(ENV, DGR_RECIPES_DIR=str(tight_run.recipes))
    identity = tmp_path / "identity.json"
    by_name = run_dgr(env, "certify", "--recipe", "tiny-llama-tight", "--write-identity", str(identity))
    assert by_name.returncode == 0, by_name.stderr
    envelope = json.loads(paths["certificate"].read_text())
    predicate = json.loads(base64.b64decode(envelope["payload"]))["predicate"]
    assert json.loads(identity.read_text())["recipe"] == {
        "name": "tiny-llama-tight",
        "digest": predicate["recipe"]["digest"],
    }


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        ({"mtp": True}, "at /mtp: multi-token prediction is off (false) unless"),
        ({"mtp": {"draft_tokens": 3}}, "holds no nextn block"),
        ({"n_decodee": 3}, "unknown key 'n_decodee' (did you mean 'n_decode'?)"),
    ],
)
def test_refused_recipes_exit_2(tmp_path: Path, change: dict[str, object], expect: str) -> None:
    recipe = small_recipe(tmp_path, "tiny-llama-bad", **change)
    done = run_dgr(ENV, "certify", "--recipe-file", str(recipe), timeout=120)
    assert done.returncode == 2 and expect in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("recipe", ["v4-q4", "v4-q4-mtp"])
def test_v4_q4_stops_at_its_unsealed_artifact_set(recipe: str) -> None:
    done = run_dgr(ENV, "certify", "--recipe", recipe, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "deepseek-v4-flash-q4" in lines[0] and "not sealed" in lines[0]
    assert "dgr seal --artifacts deepseek-v4-flash-q4 --from DIR" in lines[0]


def test_the_v4_mtp_file_set_is_refused_until_sealed() -> None:
    done = run_dgr(ENV, "provision", "--artifacts", "deepseek-v4-flash-q4-mtp", timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "not sealed" in lines[0] and "dgr seal --artifacts deepseek-v4-flash-q4-mtp --from DIR" in lines[0]


def test_stages_held_to_cpus_say_so_in_the_certificate(tight_run: TightRun) -> None:
    """DGR_WORKER_CPUS and DGR_WORKER_LOAD reach every worker as --cpus and --load, and each stage's
    own Info puts them in the certificate's placement record and the report (worker/README.md, "CPU
    affinity" and "Weights in memory").  Read from the tightened run, which was started with both."""
    cpu, done = tight_run.cpu, tight_run.done
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: the tightened floor (and load)
    paths = paths_from(done.stdout)
    envelope = json.loads(paths["certificate"].read_text())
    placements = json.loads(base64.b64decode(envelope["payload"]))["predicate"]["figures"]["placements"]
    assert placements and all(p["cpus"] == [cpu] * p["n_stages"] for p in placements)
    assert all(p["load_mode"] == ["mmap"] * p["n_stages"] for p in placements)
    assert f"<td>{cpu} | {cpu}</td>" in paths["report"].read_text()  # the 2-stage row of the speed table
