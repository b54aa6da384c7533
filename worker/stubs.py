"""Python stubs for worker/proto/shard.proto, generated into the workspace by grpcio-tools.

The stubs are a build output, never hand-edited or committed: they live under
``<workspace>/gen/python/<proto sha256[:12]>/dgr_shard_pb/`` and are regenerated only when the proto
(or the grpcio-tools that generated them) changes.  The generator and the protobuf runtime are pinned
as a pair in pyproject, because generated ``_pb2`` modules refuse a runtime older than their gencode.

The proto is copied into a package folder (``dgr_shard_pb``) before generation so the generated gRPC
module imports its messages as ``dgr_shard_pb.shard_pb2`` instead of a bare top-level ``shard_pb2``
that could collide with anything else on ``sys.path``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from core import proc
from core.canonical import read_json, sha256_bytes, write_json
from core.errors import ToolchainMissing
from core.workspace import WORKER, Workspace

PROTO = WORKER / "proto" / "shard.proto"
PACKAGE = "dgr_shard_pb"
STAMP = "stubs.json"


@dataclass(frozen=True, kw_only=True)
class Stubs:
    """The generated modules plus where they came from."""

    root: Path  # the folder to put on sys.path (holds the ``dgr_shard_pb`` package)
    proto_sha256: str
    pb2: ModuleType  # messages: ForwardRequest, Tensor, DType ...
    pb2_grpc: ModuleType  # ShardWorkerStub, ShardWorkerServicer, add_ShardWorkerServicer_to_server


def _tools_version() -> str:
    try:
        return importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError as exc:
        raise ToolchainMissing(
            "grpcio-tools is not installed; it generates the worker's Python stubs",
            hint="install the project (`pip install -e .`), which pins grpcio-tools with protobuf",
        ) from exc


def stubs_dir(workspace: Workspace, proto: Path = PROTO) -> Path:
    digest = sha256_bytes(proto.read_bytes())
    return workspace.root / "gen" / "python" / digest[:12]


def _fresh(root: Path, digest: str, tools: str) -> bool:
    stamp = root / STAMP
    if not stamp.is_file():
        return False
    try:
        data = read_json(stamp)
    except (OSError, ValueError):
        return False
    return (
        isinstance(data, dict)
        and data.get("proto_sha256") == digest
        and data.get("grpcio_tools") == tools
        and all((root / PACKAGE / name).is_file() for name in ("shard_pb2.py", "shard_pb2_grpc.py"))
    )


def generate(workspace: Workspace, proto: Path = PROTO) -> Path:
    """Generate the stubs when missing or stale; return the folder to put on ``sys.path``.

    Generation happens in a temp folder beside the destination, then one rename publishes it, so a
    concurrent run or an interrupted one never leaves a half-written package under the final name.
    """
    data = proto.read_bytes()
    digest = sha256_bytes(data)
    tools = _tools_version()
    root = stubs_dir(workspace, proto)
    if _fresh(root, digest, tools):
        return root
    workspace.ensure(root.parent)
    scratch = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        pkg = scratch / PACKAGE
        pkg.mkdir()
        (pkg / "__init__.py").write_text('"""Generated from worker/proto/shard.proto; do not edit."""\n')
        (pkg / "shard.proto").write_bytes(data)
        proc.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{scratch}",
                f"--python_out={scratch}",
                f"--grpc_python_out={scratch}",
                f"{PACKAGE}/shard.proto",
            ],
            cwd=scratch,
            no_output_timeout=120,
        )
        write_json(scratch / STAMP, {"proto_sha256": digest, "grpcio_tools": tools, "package": PACKAGE})
        if root.exists():
            shutil.rmtree(root)  # stale: other tools version, or a partial copy from an old layout
        try:
            os.replace(scratch, root)
        except OSError:
            # Someone else published the same digest meanwhile; theirs is as good as ours.
            if not _fresh(root, digest, tools):
                raise
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)
    return root


def load(workspace: Workspace, proto: Path = PROTO) -> Stubs:
    """Generate if needed, then import the stubs (once per process)."""
    root = generate(workspace, proto)
    digest = sha256_bytes(proto.read_bytes())
    entry = str(root)
    if entry not in sys.path:
        sys.path.insert(0, entry)
    loaded = sys.modules.get(f"{PACKAGE}.shard_pb2")
    if loaded is not None:
        # A process imports one copy; another workspace's copy is fine only for the same proto.
        stamp = Path(loaded.__file__ or "").resolve().parent.parent / STAMP
        theirs = read_json(stamp).get("proto_sha256") if stamp.is_file() else None
        if theirs != digest:
            raise ToolchainMissing(
                f"stubs of another shard.proto are already imported from {loaded.__file__}",
                hint="one process can load one version of worker/proto/shard.proto",
            )
    try:
        pb2 = importlib.import_module(f"{PACKAGE}.shard_pb2")
        pb2_grpc = importlib.import_module(f"{PACKAGE}.shard_pb2_grpc")
    except (ImportError, RuntimeError) as exc:
        # The generated modules check the grpcio and protobuf runtimes against their gencode.
        raise ToolchainMissing(
            f"the generated worker stubs do not import: {exc}",
            hint="reinstall the project so grpcio, grpcio-tools and protobuf match the pins",
        ) from exc
    return Stubs(root=root, proto_sha256=digest, pb2=pb2, pb2_grpc=pb2_grpc)
