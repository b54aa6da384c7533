"""Attached workers: certify stages an operator already runs on other hosts (``--placement-file``).

Operators start ``dgr-shard-worker --model M --layers b:e --listen HOST:PORT --identity FILE`` with
their own tooling (systemd, a CI runner per host); FILE comes from ``dgr certify --write-identity``.
The placement file names, per recipe placement, each stage's ``host:port`` and the layers the operator
says that worker owns.  Before a worker is trusted the certifier asks it for Info and holds what it
reports (its identity file, lane, commit, model shape, owned range) to what this certifier computed
for the recipe: any difference is a ConfigurationError (exit 2) naming the worker, the placement, the
field, expected and got; a worker that does not answer is a RuntimeFailure (exit 6).  What a worker
reports is self-reported: the certificate says so and says the binaries were not hashed here.

Attached workers are not ours: leaving a placement closes our channels and resets the sessions we
opened, and never stops a worker.
"""

from __future__ import annotations

import socket
from collections.abc import Generator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from core import redact
from core.canonical import BadJson, is_json_object, parse_json, sha256_bytes
from core.errors import ConfigurationError, RuntimeFailure
from manifests.placement_file import REFERENCE, AttachedStage, PlacementFile
from manifests.recipe_model import Placement, Recipe
from pipeline.worker_identity import COMPARED, Expect, check_worker, stable_identity
from worker.client import StageClient, StageFailed, StageInfo
from worker.tls import Identity, presented_fingerprint
from worker.tls import load as load_identity

log = redact.logger("dgr.placement")

INFO_DEADLINE = 10.0  # Info is cheap; a worker that cannot answer it in 10 s is not usable


# Attaching -----------------------------------------------------------------------------------------
class _Client(StageClient):
    """A StageClient that remembers the sessions still open on its worker, so leaving can Reset them
    (the driver resets its sessions itself; what is left is what an error interrupted)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sessions: set[str] = set()
        self.pipeline: list[_Client] = [self]

    def forward(self, session_id: str, *args: Any, **kwargs: Any) -> Any:
        self.sessions.add(session_id)
        return super().forward(session_id, *args, **kwargs)

    def forward_chained(self, session_id: str, *args: Any, **kwargs: Any) -> Any:
        # A chained pass opens the session on every stage downstream too.
        for c in self.pipeline:
            c.sessions.add(session_id)
        return super().forward_chained(session_id, *args, **kwargs)

    def reset(self, session_id: str, **kwargs: Any) -> bool:
        existed = super().reset(session_id, **kwargs)
        self.sessions.discard(session_id)
        return existed


def local_address_towards(host: str) -> str:
    """This machine's address on the route to ``host`` (nothing is sent: a UDP connect only routes)."""
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((bare, 9))
            return str(s.getsockname()[0])
    except OSError as exc:
        raise ConfigurationError(
            f"no route from this machine to {host} for the driver's sink ({exc})",
            hint='set "driver": {"sink_host": "<an address of this machine the workers reach>"}',
        ) from None


@dataclass(kw_only=True, eq=False)
class Attached:
    """One placement's attached stages, checked (what ``Pipelines.start`` yields)."""

    placement: str
    addresses: tuple[str, ...]
    clients: list[StageClient]
    infos: tuple[StageInfo, ...]
    sink_host: str  # where the driver's sink binds in chained mode (never all interfaces)
    fabric = None  # real links between the operator's machines: nothing shaped here


@dataclass(kw_only=True)
class AttachedPipelines:
    """certify.measure.Pipelines over workers the operator runs: attach, check, release (never stop)."""

    file: PlacementFile
    recipe: Recipe  # the recipe as certified (architecture, n_layer)
    lane: str  # the lane under certification; a command for another lane is the CPU reference
    identity: Mapping[str, Any]  # the certifier's identity chain (Prepared.identity)
    stubs: Any
    reference_lane: str | None = None  # "cpu" when the class holds the lane to the CPU reference
    shape: Mapping[str, Any] = field(default_factory=dict[str, Any])  # model_shape() of the local first file
    min_ctx: int = 0
    call_deadline: float = 120.0
    # address -> what it reported
    seen: dict[str, dict[str, Any]] = field(default_factory=dict[str, dict[str, Any]])

    def _entry(self, cmd: Any, placement: Placement) -> tuple[str, str, tuple[AttachedStage, ...]]:
        lane = getattr(cmd, "lane", None) or self.lane
        if lane != self.lane:
            if self.file.reference is None:
                raise ConfigurationError(
                    f'{self.file.source}: no "reference" workers for the {lane} reference'
                )
            return REFERENCE, lane, self.file.reference
        if placement.name not in self.file.placements:
            raise ConfigurationError(f"{self.file.source}: placement {placement.name} is not listed")
        return placement.name, lane, self.file.placements[placement.name]

    def _connect(self, name: str, lane: str, stages: Sequence[AttachedStage]) -> Attached:
        want_id = stable_identity(self.recipe, lane, self.identity)
        clients: list[_Client] = []
        infos: list[StageInfo] = []
        identity = load_identity(self.file.driver_tls) if self.file.driver_tls is not None else None
        try:
            for k, s in enumerate(stages):
                presented = self._presented(name, k, s, identity)
                client = _Client(
                    s.address,
                    self.stubs.pb2,
                    self.stubs.pb2_grpc,
                    stage=k,
                    layers=s.layers,
                    deadline=self.call_deadline,
                    tls=identity,
                )
                clients.append(client)
                info = self._checked_info(
                    client, name, k, s, len(stages), want_id, infos[0] if infos else None
                )
                infos.append(info)
                self._record(s, name, info, presented)
        except BaseException:
            for c in clients:
                c.close()
            raise
        for c in clients:
            c.pipeline = clients
        sink = self.file.sink_host or local_address_towards(stages[-1].address.rpartition(":")[0])
        return Attached(
            placement=name,
            addresses=tuple(s.address for s in stages),
            clients=list(clients),
            infos=tuple(infos),
            sink_host=sink,
        )

    def _presented(self, name: str, k: int, s: AttachedStage, identity: Identity | None) -> str | None:
        """The fingerprint of the certificate stage k presents (mutual TLS with ``identity``, the
        placement file's driver), held to the file's pin for it; None without TLS, where a pin is refused."""
        where = f"attached worker {s.address} (placement {name}, stage {k})"
        if identity is None:
            if s.fingerprint is not None:
                raise ConfigurationError(
                    f"{self.file.source}: {where} pins a TLS certificate but the file names no "
                    '"driver": {"tls": DIR} to reach it with (`dgr tls --host driver`)'
                )
            return None
        try:
            got = presented_fingerprint(s.address, identity)
        except RuntimeFailure as exc:
            raise RuntimeFailure(f"{where}: {exc.message}") from None
        if s.fingerprint is not None and got != s.fingerprint:
            raise ConfigurationError(
                f"{where} presents TLS certificate {got}; the placement file pins {s.fingerprint}"
            )
        return got

    def _checked_info(
        self,
        client: _Client,
        name: str,
        k: int,
        s: AttachedStage,
        n_stages: int,
        want_id: Mapping[str, Any],
        first: StageInfo | None,
    ) -> StageInfo:
        """Stage k's Info, held to what the recipe and the placement expect of it (and to stage 0's
        boundary width): a worker that does not match is refused before anything is measured on it."""
        try:
            info = client.info(deadline=INFO_DEADLINE)
        except StageFailed as exc:
            raise RuntimeFailure(
                f"attached worker {s.address} (placement {name}, stage {k}, layers "
                f"{s.layers[0]}:{s.layers[1]}) is unreachable: {exc.code}: {exc.detail}",
                hint="is it running and listening there? the certifier never starts attached workers",
            ) from None
        want = Expect(
            identity=want_id,
            placement=name,
            stage=k,
            n_stages=n_stages,
            layers=s.layers,
            architecture=self.recipe.architecture,
            n_layer=self.recipe.n_layer,
            n_embd=self.shape.get("n_embd"),
            n_vocab=self.shape.get("n_vocab"),
            min_ctx=self.min_ctx,
        )
        check_worker(info, want, s.address)
        if first is not None and info.boundary_width != first.boundary_width:
            raise ConfigurationError(
                f"attached worker {s.address} (placement {name}, stage {k}) does not match the "
                f"recipe: boundary_width: expected {first.boundary_width} (stage 0), "
                f"got {info.boundary_width}"
            )
        return info

    def _record(self, s: AttachedStage, name: str, info: StageInfo, presented: str | None) -> None:
        """What a worker said about itself, kept from the first time it is met (preflight)."""
        row = self.seen.get(s.address)
        if row is None:
            try:
                doc = parse_json(info.identity_json, source="identity")
            except BadJson:
                doc = None
            build = doc.get("build") if is_json_object(doc) else None
            row = self.seen[s.address] = {
                "address": s.address,
                "layers": list(s.layers),
                "placements": [],
                "lane": info.lane,
                "llama_commit": info.llama_commit,
                "worker_version": info.worker_version,
                "backend_devices": info.backend_devices,
                "model_path": info.model_path,
                "identity_sha256": sha256_bytes(info.identity_json.encode("utf-8")),
                "build": build,
                "transport": info.transport or "unknown (a worker older than Info's transport)",
                "tls_fingerprint": presented,  # what it presented in our handshake; None: no TLS
                "tls_pinned": s.fingerprint is not None,
            }
        if name not in row["placements"]:
            row["placements"].append(name)

    def preflight(self) -> None:
        """Check every listed worker before any measurement (a mismatch costs no reference run)."""
        for name in self.file.placements:
            self._release(self._connect(name, self.lane, self.file.placements[name]))
        if self.file.reference is not None and self.reference_lane is not None:
            self._release(self._connect(REFERENCE, self.reference_lane, self.file.reference))

    @staticmethod
    def _release(att: Attached) -> None:
        for c in att.clients:
            for sid in sorted(getattr(c, "sessions", ())):
                try:
                    c.reset(sid, deadline=5.0)
                except StageFailed as exc:  # leaving must not hide why we leave; the worker drops it later
                    log.warning("could not reset session %s on %s: %s", sid, c.address, exc.detail)
            c.close()

    @contextmanager
    def start(self, cmd: Any, placement: Placement, tag: str) -> Generator[Attached]:
        name, lane, stages = self._entry(cmd, placement)
        att = self._connect(name, lane, stages)  # Info again: a worker may have been restarted since
        try:
            yield att
        finally:
            self._release(att)

    def record(self) -> dict[str, Any]:
        """For the predicate: where the workers were and what they said about themselves."""
        return {
            "placement_file": self.file.source,
            "placement_file_sha256": self.file.sha256,
            "checked": "Info of every worker (identity file, lane, llama commit, architecture, n_layer, "
            "owned range, first/last, boundary width) against this certifier's identity for the recipe",
            "self_reported": True,
            "binaries_hashed": False,
            "compared_identity_fields": list(COMPARED),
            "workers": [self.seen[a] for a in sorted(self.seen)],
        }
