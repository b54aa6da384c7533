"""The worker's fuzz targets start from real passes (issue 42 item 7): ``--record-passes DIR`` writes
each pass a stage reads on its pass port to DIR, and what it writes is what the pass port read.

A three-stage streamed ring on the tiny model decodes with F32 and F16 boundaries, with logits and
token-only: each stage records what crossed into it (stage 0 the passes the last stage starts,
stages 1 and 2 the boundaries), and each recording parses as a streamed ring's ForwardRequest of the
shape that stage takes.  ``DGR_FUZZ_CORPUS_OUT=tests/fuzz/corpus/passes`` also refreshes the
committed seeds (tests/fuzz/native.py) from this run: a few passes of each kind, not all.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from pipeline import drive, ring
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

THREE = [(0, 4), (4, 8), (8, 12)]
N_DECODE = 6
KEPT_PER_STAGE_AND_WAY = 2  # seeds committed: small, one of each kind is enough to start from


def test_each_stage_records_the_passes_it_read(worker_command, stubs, worker_env, tmp_path) -> None:
    pb2 = stubs.pb2
    record = tmp_path / "passes"
    record.mkdir()
    cmd = dataclasses.replace(worker_command, extra=(*worker_command.extra, "--record-passes", str(record)))
    ways = {"f32-logits": ("f32", True), "f16-tokens": ("f16", False)}
    seen: dict[str, list[Path]] = {}
    with launch(cmd, THREE, stubs=stubs, evidence=tmp_path / "ev", env=worker_env) as p:
        infos = drive.describe(p.clients)
        prompt = p.clients[0].tokenize("The quick brown fox", add_special=True)
        pids = {s.process.pid: k for k, s in enumerate(p.stages)}
        for way, (dtype, logits) in ways.items():
            before = set(record.iterdir())
            with ring.ring_route(p.clients, infos, addresses=None, sink_host="127.0.0.1") as route:
                assert route.streamed
                ring.generate(route, prompt, N_DECODE, session=way, boundary_dtype=dtype, logits=logits)
            seen[way] = sorted(set(record.iterdir()) - before)
    width = infos[1].boundary_width
    for way, files in seen.items():
        by_stage: dict[int, list[Path]] = {0: [], 1: [], 2: []}
        for f in files:
            by_stage[pids[int(f.name.split("-")[1])]].append(f)
        # every pass crosses both seams on pass ports; every pass but the first (the driver's, by gRPC)
        # comes to stage 0 from the last stage on stage 0's
        counts = [len(by_stage[k]) for k in (0, 1, 2)]
        print(f"\n[corpus] {way}: passes read per stage {counts}")
        assert counts[1] == counts[2] == counts[0] + 1 and counts[0] >= N_DECODE - 2, (way, counts)
        for k, stage_files in by_stage.items():
            for f in stage_files:
                msg = pb2.ForwardRequest()
                msg.ParseFromString(f.read_bytes())
                assert msg.ring.stream and msg.deliver_to, (way, f.name)
                assert len(msg.positions) == 1, (way, f.name)
                if k == 0:
                    assert len(msg.tokens) == 1 and not msg.HasField("boundary"), (way, f.name)
                else:
                    assert list(msg.boundary.shape) == [1, width], (way, f.name)
                    assert len(msg.boundary.data) == width * (4 if ways[way][0] == "f32" else 2), (
                        way,
                        f.name,
                    )
        _refresh_seeds(way, by_stage)


def _refresh_seeds(way: str, by_stage: dict[int, list[Path]]) -> None:
    out = os.environ.get("DGR_FUZZ_CORPUS_OUT")
    if not out:
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    for k, files in by_stage.items():
        for n, f in enumerate(
            sorted(files, key=lambda f: int(f.stem.split("-")[2]))[:KEPT_PER_STAGE_AND_WAY]
        ):
            shutil.copyfile(f, Path(out) / f"{way}-stage{k}-{n}.bin")
