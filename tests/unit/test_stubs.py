"""worker/stubs.py: generated into the workspace, keyed by the proto digest, regenerated only on change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.context import Context
from core.errors import ToolchainMissing
from worker import stubs


def _workspace(tmp_path: Path):
    return Context.from_env({"DGR_WORK": str(tmp_path / "work"), "HOME": str(tmp_path)}).workspace


def test_generated_under_workspace_by_proto_digest(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    root = stubs.generate(ws)
    digest = stubs.sha256_bytes(stubs.PROTO.read_bytes())
    assert root == ws.root / "gen" / "python" / digest[:12]
    assert (root / "dgr_shard_pb" / "shard_pb2.py").is_file()
    assert (root / "dgr_shard_pb" / "shard_pb2_grpc.py").is_file()
    assert "DO NOT EDIT" in (root / "dgr_shard_pb" / "shard_pb2.py").read_text()


def test_not_regenerated_when_unchanged(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    root = stubs.generate(ws)
    target = root / "dgr_shard_pb" / "shard_pb2.py"
    before = target.stat().st_mtime_ns
    os.utime(target, ns=(before - 10**9, before - 10**9))
    assert stubs.generate(ws) == root
    assert target.stat().st_mtime_ns == before - 10**9


def test_proto_change_gives_a_new_folder(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    edited = tmp_path / "shard.proto"
    edited.write_text(stubs.PROTO.read_text() + "\n// a comment changes the digest\n")
    assert stubs.generate(ws, edited) != stubs.generate(ws)


def test_damaged_stubs_are_regenerated(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    root = stubs.generate(ws)
    (root / "dgr_shard_pb" / "shard_pb2_grpc.py").unlink()
    assert stubs.generate(ws) == root
    assert (root / "dgr_shard_pb" / "shard_pb2_grpc.py").is_file()


def test_load_gives_working_messages_and_stub(tmp_path: Path) -> None:
    loaded = stubs.load(_workspace(tmp_path))
    msg = loaded.pb2.ForwardRequest(session_id="s", epoch=3, positions=[0, 1], capture_layers=[4])
    again = loaded.pb2.ForwardRequest.FromString(msg.SerializeToString())
    assert (again.session_id, again.epoch, list(again.positions)) == ("s", 3, [0, 1])
    assert hasattr(loaded.pb2_grpc, "ShardWorkerStub")
    assert loaded.pb2.DType.Value("F16") == 2


def test_bad_proto_fails_with_the_compiler_message(tmp_path: Path) -> None:
    broken = tmp_path / "shard.proto"
    broken.write_text('syntax = "proto3";\nmessage { oops }\n')
    with pytest.raises(Exception, match="exited"):
        stubs.generate(_workspace(tmp_path), broken)
    assert not any((tmp_path / "work" / "gen" / "python").glob("*/dgr_shard_pb"))


def test_other_proto_already_imported_is_refused(tmp_path: Path) -> None:
    stubs.load(_workspace(tmp_path / "a"))
    edited = tmp_path / "shard.proto"
    edited.write_text(stubs.PROTO.read_text() + "\n// different\n")
    with pytest.raises(ToolchainMissing, match="another shard.proto"):
        stubs.load(_workspace(tmp_path / "b"), edited)


def test_chained_forwarding_messages_and_sink_service(tmp_path: Path) -> None:
    loaded = stubs.load(_workspace(tmp_path))
    pb2 = loaded.pb2
    hop = pb2.Hop(stage=1, layer_begin=3, layer_end=6, received_ns=5, sent_ns=9, boundary_bytes=64)
    req = pb2.ForwardRequest(
        session_id="s",
        downstream=["10.0.0.2:1"],
        deliver_to="10.0.0.1:2",
        request_id="r",
        keep_boundaries=True,
        trace=[hop],
    )
    again = pb2.ForwardRequest.FromString(req.SerializeToString())
    assert list(again.downstream) == ["10.0.0.2:1"] and again.trace[0].sent_ns == 9
    # additive only: the relayed fields keep their numbers
    fields = pb2.ForwardRequest.DESCRIPTOR.fields_by_name
    numbers = (fields["capture_layers"].number, fields["downstream"].number, fields["trace"].number)
    assert numbers == (8, 9, 13)
    assert pb2.Delivery(request_id="r", trace=[hop]).reply.kv_used == 0
    assert hasattr(loaded.pb2_grpc, "PipelineSinkStub")
    assert hasattr(loaded.pb2_grpc, "add_PipelineSinkServicer_to_server")
