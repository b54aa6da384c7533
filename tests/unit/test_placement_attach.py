"""AttachedPipelines against real loopback gRPC servers that answer Info like an operator's workers:
attach checks each worker, yields clients / addresses / sink host, resets the sessions it opened and
leaves the workers serving; a worker that does not match is exit 2, one that does not answer exit 6."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from certify import attach
from core.errors import ConfigurationError, RuntimeFailure
from manifests import placement_file as pfile
from manifests import recipe_model as recipes
from pipeline import attached as pl
from pipeline import worker_identity as wi
from tests.unit.fake_stages import load_stubs
from worker.client import StageClient, StageFailed

RECIPE = recipes.load("tiny-llama", {})
IDENTITY = {
    "source": {"commit": "4df29be4f4c3673f428170fda944a5b19f743bb8", "tree": "5" * 40},
    "patches": {"digest": "d" * 40},
    "build": {"key": "b" * 64, "lane": "cpu"},
    "artifacts": {"set": "tiny-llama", "variant": "f32", "manifest_digest": "a" * 64},
}


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_stubs(tmp_path_factory.mktemp("stubs"))


def _servicer(stubs: Any, begin: int, end: int, identity: str, resets: list[str], **over: Any) -> Any:
    pb = stubs.pb2

    class Worker(stubs.pb2_grpc.ShardWorkerServicer):
        def Health(self, request: Any, context: Any) -> Any:
            return pb.HealthReply(serving=True, status="ok")

        def Info(self, request: Any, context: Any) -> Any:
            fields = dict(
                worker_version="0.1.0",
                llama_commit=IDENTITY["source"]["commit"],
                lane="cpu",
                backend_devices="CPU",
                model_path="/m.gguf",
                architecture="llama",
                n_layer=12,
                layer_begin=begin,
                layer_end=end,
                first_stage=begin == 0,
                last_stage=end == 12,
                n_embd=256,
                boundary_width=256,
                n_vocab=32000,
                n_ctx=256,
                n_threads=1,
                identity_json=identity,
            )
            fields.update(over)
            return pb.InfoReply(**fields)

        def Reset(self, request: Any, context: Any) -> Any:
            resets.append(request.session_id)
            return pb.ResetReply(existed=True)

        def Forward(self, request: Any, context: Any) -> Any:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "not in this test")

    return Worker()


class Operator:
    """Servers started by the test ("the operator"); only the test stops them."""

    def __init__(self, stubs: Any) -> None:
        self.stubs = stubs
        self.servers: list[grpc.Server] = []
        self.resets: dict[str, list[str]] = {}

    def start(self, begin: int, end: int, identity: str, **over: Any) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        port = server.add_insecure_port("127.0.0.1:0")
        address = f"127.0.0.1:{port}"
        self.resets[address] = []
        self.stubs.pb2_grpc.add_ShardWorkerServicer_to_server(
            _servicer(self.stubs, begin, end, identity, self.resets[address], **over), server
        )
        server.start()
        self.servers.append(server)
        return address


@pytest.fixture
def operator(stubs: Any) -> Iterator[Operator]:
    op = Operator(stubs)
    yield op
    for s in op.servers:
        s.stop(0)


Stages = list[tuple[str, tuple[int, int]]]


def _placement_file(tmp: Path, placements: dict[str, Stages], **more: Any) -> pfile.PlacementFile:
    """A placement file for tiny-llama: placement -> [(address, layers)], plus top-level keys."""

    def stages(st: Stages) -> dict[str, Any]:
        return {"stages": [{"address": a, "layers": list(r)} for a, r in st]}

    data = {"schema_version": 1, "recipe": "tiny-llama", **more}
    data["placements"] = {n: stages(st) for n, st in placements.items()}
    if "reference" in data:
        data["reference"] = stages(data["reference"])
    path = tmp / "p.json"
    path.write_text(json.dumps(data))
    return pfile.load_file(path)


def _pipelines(tmp: Path, stubs: Any, placements: dict[str, Stages]) -> Any:
    return pl.AttachedPipelines(
        file=_placement_file(tmp, placements),
        recipe=RECIPE,
        lane="cpu",
        identity=IDENTITY,
        stubs=stubs,
        shape={"n_embd": 256, "n_vocab": 32000},
        min_ctx=256,
    )


def _good() -> str:
    return json.dumps(wi.stable_identity(RECIPE, "cpu", IDENTITY))


def test_attach_checks_yields_clients_resets_sessions_and_never_stops(
    tmp_path: Path, operator: Operator, stubs: Any
) -> None:
    ident = _good()
    a, b = operator.start(0, 6, ident), operator.start(6, 12, ident)
    mono = operator.start(0, 12, ident)
    pipes = _pipelines(
        tmp_path, stubs, {"mono": [(mono, (0, 12))], "two-middle": [(a, (0, 6)), (b, (6, 12))]}
    )
    pipes.preflight()
    with pipes.start(None, RECIPE.placements["two-middle"], "two-middle") as att:
        assert att.addresses == (a, b) and [c.address for c in att.clients] == [a, b]
        assert [i.layer_begin for i in att.infos] == [0, 6]
        assert att.sink_host == "127.0.0.1"  # the route to a loopback worker, never all interfaces
        with pytest.raises(StageFailed, match="UNIMPLEMENTED"):
            att.clients[0].forward("dgr-test-session", 1, [0], tokens=[1])
    assert operator.resets[a] == ["dgr-test-session"] and operator.resets[b] == []
    # A session the driver reset itself is not reset again; a chained pass opened it on every stage.
    with pipes.start(None, RECIPE.placements["two-middle"], "two-middle") as att:
        att.clients[0].forward_chained(
            "dgr-chained", 1, [0], tokens=[1], downstream=[b], deliver_to="127.0.0.1:9", request_id="r"
        ).exception()
        att.clients[1].reset("dgr-chained")
    assert operator.resets[a] == ["dgr-test-session", "dgr-chained"] and operator.resets[b] == ["dgr-chained"]
    # The operator's workers still serve after we left.
    with StageClient(a, stubs.pb2, stubs.pb2_grpc, stage=0, layers=(0, 6)) as c:
        assert c.health() == (True, "ok")
    rec = pipes.record()
    assert rec["self_reported"] is True and rec["binaries_hashed"] is False
    assert [w["address"] for w in rec["workers"]] == sorted([a, b, mono])
    assert next(w for w in rec["workers"] if w["address"] == a)["placements"] == ["two-middle"]


def test_a_mismatching_worker_is_exit_2_and_a_silent_one_exit_6(
    tmp_path: Path, operator: Operator, stubs: Any
) -> None:
    ident = _good()
    mono = operator.start(0, 12, ident, n_vocab=129280)
    pipes = _pipelines(tmp_path, stubs, {"mono": [(mono, (0, 12))]})
    with pytest.raises(ConfigurationError) as err:
        pipes.preflight()
    assert f"attached worker {mono} (placement mono, stage 0)" in err.value.message
    assert "n_vocab: expected 32000, got 129280" in err.value.message

    a, b = operator.start(0, 6, ident), operator.start(6, 12, ident, boundary_width=512)
    pipes = _pipelines(tmp_path, stubs, {"two-middle": [(a, (0, 6)), (b, (6, 12))]})
    with pytest.raises(ConfigurationError, match=r"boundary_width: expected 256 \(stage 0\), got 512"):
        with pipes.start(None, RECIPE.placements["two-middle"], "two-middle"):
            pass

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{s.getsockname()[1]}"
    pipes = _pipelines(tmp_path, stubs, {"mono": [(nobody, (0, 12))]})
    with pytest.raises(RuntimeFailure) as gone:
        pipes.preflight()
    assert gone.value.exit_code == 6
    assert f"attached worker {nobody} (placement mono, stage 0, layers 0:12) is unreachable: UNAVAILABLE" in (
        gone.value.message
    )


def test_a_cross_lane_plan_attaches_its_cpu_reference(tmp_path: Path, operator: Operator, stubs: Any) -> None:
    """Vulkan is compared against a CPU monolithic reference: the measurement asks for it with a
    command of lane cpu, which attaches the file's "reference" workers (identity of lane cpu)."""
    from certify import measure
    from tests.unit import ggufmaker as g
    from worker.launcher import WorkerCommand

    model = tmp_path / "m.gguf"
    kvs = [
        g.kv("general.architecture", g.STRING, "llama"),
        g.kv("llama.embedding_length", g.U32, 256),
        g.kv_string_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(32000)]),
    ]
    model.write_bytes(g.gguf_bytes(kvs, [("token_embd.weight", 8)]))
    cpu = operator.start(0, 12, json.dumps(wi.stable_identity(RECIPE, "cpu", IDENTITY)), lane="cpu")
    vk = json.dumps(wi.stable_identity(RECIPE, "vulkan", IDENTITY))
    mono, a, b, c = (
        operator.start(r0, r1, vk, lane="vulkan") for r0, r1 in ((0, 12), (0, 1), (1, 6), (6, 12))
    )
    pf = _placement_file(
        tmp_path,
        {"mono": [(mono, (0, 12))], "three-first-middle": [(a, (0, 1)), (b, (1, 6)), (c, (6, 12))]},
        lane="vulkan",
        reference=[(cpu, (0, 12))],
    )
    cmd = WorkerCommand(program=(), model=model, lane="vulkan", threads=2)
    plan = measure.Plan(
        recipe=RECIPE,
        lane="vulkan",
        hardware_class=RECIPE.hardware_class("vulkan", 2),
        worker=cmd,
        stubs=stubs,
        evidence=tmp_path,
        env={},
    )
    assert plan.started_threads() == 2
    plan, pipes, skipped = attach.attach_plan(plan, pf, IDENTITY, 256)
    assert plan.started_threads() is None  # the operator's workers run at their own count
    listed = {"mono", "three-first-middle"}
    assert set(plan.recipe.placements) == listed
    unlisted = sorted(f"placement/{n}" for n in RECIPE.placements if n not in listed)
    assert sorted(r.name for r in skipped) == unlisted
    assert plan.reference_worker is not None and plan.reference_worker.lane == "cpu"
    assert plan.where() is pipes and pipes.shape == {"n_embd": 256, "n_vocab": 32000}
    pipes.preflight()  # the reference is checked against an identity of lane cpu, the rest vulkan
    with pipes.start(plan.reference_worker, RECIPE.monolithic, "mono-reference-cpu") as att:
        assert att.addresses == (cpu,)
    with pipes.start(plan.worker, RECIPE.monolithic, "mono") as att:
        assert att.addresses == (mono,)
