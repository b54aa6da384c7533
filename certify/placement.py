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

import dataclasses
import ipaddress
import json
import logging
import re
import socket
import types
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from certify.canonical import sha256_bytes, sha256_file, write_json
from certify.errors import ConfigurationError, RuntimeFailure
from certify.recipes import Placement, Recipe
from certify.verdict import Result, Status
from manifests.loader import load_json
from worker.client import StageClient, StageFailed, StageInfo

log = logging.getLogger("dgr.placement")

IDENTITY_KIND = "dgr.worker-identity"
IDENTITY_VERSION = 1
INFO_DEADLINE = 10.0  # Info is cheap; a worker that cannot answer it in 10 s is not usable
# Fields of the worker's identity file that must equal the certifier's, in the order they are reported.
# The build (key, binaries) is per machine and only recorded: each host compiles with its own toolchain,
# so its build key differs while source, patch stack and worker sources are the same; whether that build
# computes the same numbers is exactly what the parity gates measure.
COMPARED = (
    "kind",
    "schema_version",
    "recipe.name",
    "recipe.digest",
    "lane",
    "artifacts.set",
    "artifacts.variant",
    "artifacts.manifest_digest",
    "source.commit",
    "source.tree",
    "patches.digest",
    "worker_source",
)
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_HEX = re.compile(r"^[0-9a-f]{32,}$")


# The file ------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class AttachedStage:
    address: str
    layers: tuple[int, int]


@dataclass(frozen=True, kw_only=True)
class PlacementFile:
    recipe: str
    placements: Mapping[str, tuple[AttachedStage, ...]]
    reference: tuple[AttachedStage, ...] | None = None
    lane: str | None = None
    sink_host: str | None = None
    source: str = ""
    sha256: str = ""

    def stages_of(self, name: str) -> tuple[AttachedStage, ...]:
        return self.reference if name == REFERENCE else self.placements[name]


REFERENCE = "reference"  # the key of the cross-lane CPU reference workers


def check_host(host: str, where: str) -> str:
    """An IPv4/IPv6 literal or a DNS name; returns it in the form gRPC targets want."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        if host != bare or not _HOSTNAME.match(host) or re.fullmatch(r"[0-9.]+", host):
            raise ConfigurationError(f"{where}: {host!r} is not an IP address or host name") from None
        return host
    if ip.is_unspecified:
        raise ConfigurationError(f"{where}: {host!r} is the unspecified address; name the worker's host")
    return f"[{ip}]" if ip.version == 6 else str(ip)


def check_address(address: str, where: str) -> str:
    """``host:port`` (``[v6]:port`` for IPv6), port 1-65535; returns the normalised address."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigurationError(
            f"{where}: {address!r} is not host:port with a port in 1-65535",
            hint="e.g. 10.0.0.7:7001 or [fd00::7]:7001",
        )
    if ":" in host and not host.startswith("["):
        raise ConfigurationError(f"{where}: {address!r}: write an IPv6 host in brackets, [addr]:port")
    return f"{check_host(host, where)}:{int(port)}"


def _stages(raw: Sequence[Mapping[str, Any]], where: str) -> tuple[AttachedStage, ...]:
    out, expect = [], 0
    for k, s in enumerate(raw):
        at = f"{where}/stages/{k}"
        begin, end = int(s["layers"][0]), int(s["layers"][1])
        if begin != expect or end <= begin:
            raise ConfigurationError(
                f"{at}/layers: [{begin}, {end}] does not continue the stages before it "
                f"(expected a non-empty range starting at {expect}; stages must tile the layers in order)"
            )
        out.append(AttachedStage(address=check_address(s["address"], f"{at}/address"), layers=(begin, end)))
        expect = end
    seen: dict[str, int] = {}
    for k, s in enumerate(out):
        if s.address in seen:
            raise ConfigurationError(
                f"{where}/stages/{k}/address: {s.address} is also stage {seen[s.address]}; "
                "one worker is one stage"
            )
        seen[s.address] = k
    return tuple(out)


def load_file(path: Path) -> PlacementFile:
    """Read and check a placement file on its own (schema, addresses, ranges tile from layer 0)."""
    path = Path(path)
    data = load_json(path, "placement-file")
    src = str(path)
    placements = {
        name: _stages(p["stages"], f"{src}: at /placements/{name}") for name, p in data["placements"].items()
    }
    reference = _stages(data["reference"]["stages"], f"{src}: at /reference") if "reference" in data else None
    owner: dict[str, tuple[str, tuple[int, int]]] = {}
    for name, stages in [*placements.items(), *([(REFERENCE, reference)] if reference else [])]:
        for s in stages:
            other = owner.setdefault(s.address, (name, s.layers))
            if other[1] != s.layers:
                raise ConfigurationError(
                    f"{src}: {s.address} owns layers {list(other[1])} in {other[0]} but {list(s.layers)} in "
                    f"{name}; a worker owns one range (list it only where the ranges agree)"
                )
    sink = data.get("driver", {}).get("sink_host")
    return PlacementFile(
        recipe=data["recipe"],
        lane=data.get("lane"),
        placements=types.MappingProxyType(placements),
        reference=reference,
        sink_host=check_host(sink, f"{src}: at /driver/sink_host") if sink else None,
        source=src,
        sha256=sha256_file(path),
    )


def restrict(
    pf: PlacementFile, recipe: Recipe, lane: str, *, cross_lane: bool
) -> tuple[Recipe, list[Result]]:
    """The recipe cut to the placements the file lists, and a SKIPPED result for each one it does not.

    The reference (and the route-change placement) must be listed: without them nothing can pass.
    """
    src = pf.source
    if pf.recipe != recipe.name:
        raise ConfigurationError(
            f"{src}: at /recipe: the file is for recipe {pf.recipe!r}, not {recipe.name!r}"
        )
    if pf.lane is not None and pf.lane != lane:
        raise ConfigurationError(f"{src}: at /lane: the file's workers run lane {pf.lane}, not --lane {lane}")
    import difflib

    for name, stages in pf.placements.items():
        if name not in recipe.placements:
            close = difflib.get_close_matches(name, list(recipe.placements), n=1)
            tip = (
                f" (did you mean {close[0]!r}?)"
                if close
                else f" (its placements: {', '.join(recipe.placements)})"
            )
            raise ConfigurationError(
                f"{src}: at /placements: recipe {recipe.name} has no placement {name!r}{tip}"
            )
        want = recipe.placements[name].stages
        got = tuple(s.layers for s in stages)
        if got != want:
            raise ConfigurationError(
                f"{src}: at /placements/{name}: layers {[list(g) for g in got]} are not the recipe's "
                f"{[list(w) for w in want]}"
            )
    needed = [recipe.monolithic.name] + ([recipe.route_change.placement] if recipe.route_change else [])
    missing = [n for n in needed if n not in pf.placements]
    if missing:
        raise ConfigurationError(
            f"{src}: at /placements: {', '.join(missing)} must be listed (the monolithic reference every "
            "placement is compared to, and the route-change placement)"
        )
    if cross_lane:
        if pf.reference is None:
            raise ConfigurationError(
                f"{src}: lane {lane} is compared against a CPU monolithic reference: list its workers under "
                '"reference" (started with --lane cpu)'
            )
        if tuple(s.layers for s in pf.reference) != recipe.monolithic.stages:
            raise ConfigurationError(
                f"{src}: at /reference: must own the monolithic range {list(recipe.monolithic.stages)}"
            )
    kept = {n: p for n, p in recipe.placements.items() if n in pf.placements}
    skipped = [
        Result(
            name=f"placement/{n}",
            status=Status.SKIPPED,
            reason=f"not listed in the placement file {Path(src).name}; no attached workers, not run",
        )
        for n in recipe.placements
        if n not in pf.placements
    ]
    return dataclasses.replace(recipe, placements=types.MappingProxyType(kept)), skipped


# Identity ------------------------------------------------------------------------------------------
def stable_identity(recipe: Recipe, lane: str, identity: Mapping[str, Any]) -> dict[str, Any]:
    """What a worker serving ``recipe`` on ``lane`` must carry (``--identity``): no run id, nothing that
    differs between certifier and worker host except the recorded build."""
    from lanes.build import worker_digest

    src = identity.get("source") or {}
    art = identity.get("artifacts") or {}
    build = identity.get("build") or None
    return {
        "kind": IDENTITY_KIND,
        "schema_version": IDENTITY_VERSION,
        "recipe": {"name": recipe.name, "digest": recipe.digest},
        "lane": lane,
        "artifacts": {k: art.get(k) for k in ("set", "variant", "manifest_digest")},
        "source": {"commit": src.get("commit"), "tree": src.get("tree")},
        "patches": {"digest": (identity.get("patches") or {}).get("digest")},
        "worker_source": worker_digest(),
        "build": {"lane": build.get("lane"), "key": build.get("key")} if build else None,
    }


def model_shape(first_file: Path) -> dict[str, Any]:
    """n_embd and n_vocab from the (provisioned, verified) model's GGUF header: a worker that loaded
    another model is caught by its shape even when it was handed a copy of the right identity file."""
    from fetch.gguf_header import read_header

    header = read_header(Path(first_file))
    tokens = header.kv.get("tokenizer.ggml.tokens")
    n_embd = header.arch_value("embedding_length")
    return {
        "n_embd": int(n_embd) if isinstance(n_embd, int) else None,
        "n_vocab": int(tokens.count) if hasattr(tokens, "count") and isinstance(tokens.count, int) else None,
    }


def _get(doc: Any, path: str) -> Any:
    for part in path.split("."):
        doc = doc.get(part) if isinstance(doc, Mapping) else None
    return doc


def _show(value: Any) -> str:
    if isinstance(value, str) and _HEX.match(value):
        return value[:16] + "…"
    return json.dumps(value) if not isinstance(value, str) else value


@dataclass(frozen=True, kw_only=True)
class Expect:
    """What one attached stage must report."""

    identity: Mapping[str, Any]  # stable_identity() for the worker's lane
    placement: str
    stage: int
    n_stages: int
    layers: tuple[int, int]
    architecture: str
    n_layer: int
    n_embd: int | None = (
        None  # from the verified local GGUF header: a model's shape, whatever its identity file says
    )
    n_vocab: int | None = None
    min_ctx: int = 0


def mismatches(info: StageInfo, want: Expect) -> list[tuple[str, str, str]]:
    """(field, expected, got) for every way ``info`` differs from ``want``; empty when it matches."""
    out: list[tuple[str, str, str]] = []

    def differ(name: str, expected: Any, got: Any) -> None:
        if expected != got:
            out.append((name, _show(expected), _show(got)))

    try:
        doc = json.loads(info.identity_json) if info.identity_json.strip() else None
    except ValueError:
        doc = "not JSON"
    if not isinstance(doc, dict):
        out.append(
            (
                "identity",
                f"a {IDENTITY_KIND} document (dgr certify --write-identity)",
                "none" if doc is None else "not a JSON object",
            )
        )
    else:
        for path in COMPARED:
            differ(f"identity.{path}", _get(want.identity, path), _get(doc, path))
    differ("lane", want.identity.get("lane"), info.lane)
    differ("llama_commit", _get(want.identity, "source.commit"), info.llama_commit)
    differ("architecture", want.architecture, info.architecture)
    differ("n_layer", want.n_layer, info.n_layer)
    if want.n_embd is not None:
        differ("n_embd", want.n_embd, info.n_embd)
    if want.n_vocab is not None:
        differ("n_vocab", want.n_vocab, info.n_vocab)
    differ("layers", f"{want.layers[0]}:{want.layers[1]}", f"{info.layer_begin}:{info.layer_end}")
    differ("first_stage", want.stage == 0, info.first_stage)
    differ("last_stage", want.stage == want.n_stages - 1, info.last_stage)
    if info.n_ctx < want.min_ctx:
        out.append(("n_ctx", f">= {want.min_ctx}", str(info.n_ctx)))
    return out


def check_worker(info: StageInfo, want: Expect, address: str) -> None:
    """ConfigurationError (exit 2), one line: worker, placement, the first field, expected vs got."""
    found = mismatches(info, want)
    if not found:
        return
    name, expected, got = found[0]
    more = f" (also: {', '.join(f[0] for f in found[1:])})" if len(found) > 1 else ""
    raise ConfigurationError(
        f"attached worker {address} (placement {want.placement}, stage {want.stage}) does not match the "
        f"recipe: {name}: expected {expected}, got {got}{more}",
        hint="start it with --layers and --identity from `dgr certify --recipe R --lane L --write-identity "
        "FILE` made from this checkout; the certifier never trusts a worker it cannot match",
    )


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


@dataclass(kw_only=True)
class AttachedPipelines:
    """certify.measure.Pipelines over workers the operator runs: attach, check, release (never stop)."""

    file: PlacementFile
    recipe: Recipe  # the recipe as certified (architecture, n_layer)
    lane: str  # the lane under certification; a command for another lane is the CPU reference
    identity: Mapping[str, Any]  # the certifier's identity chain (Prepared.identity)
    stubs: Any
    reference_lane: str | None = None  # "cpu" when the class compares against a CPU reference
    shape: Mapping[str, Any] = field(default_factory=dict)  # model_shape() of the local first file
    min_ctx: int = 0
    call_deadline: float = 120.0
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)  # address -> what it reported

    def _expected(self, lane: str) -> dict[str, Any]:
        return stable_identity(self.recipe, lane, self.identity)

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
        want_id = self._expected(lane)
        clients: list[_Client] = []
        infos: list[StageInfo] = []
        try:
            for k, s in enumerate(stages):
                client = _Client(
                    s.address,
                    self.stubs.pb2,
                    self.stubs.pb2_grpc,
                    stage=k,
                    layers=s.layers,
                    deadline=self.call_deadline,
                )
                clients.append(client)
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
                    n_stages=len(stages),
                    layers=s.layers,
                    architecture=self.recipe.architecture,
                    n_layer=self.recipe.n_layer,
                    n_embd=self.shape.get("n_embd"),
                    n_vocab=self.shape.get("n_vocab"),
                    min_ctx=self.min_ctx,
                )
                check_worker(info, want, s.address)
                if infos and info.boundary_width != infos[0].boundary_width:
                    raise ConfigurationError(
                        f"attached worker {s.address} (placement {name}, stage {k}) does not match the "
                        f"recipe: boundary_width: expected {infos[0].boundary_width} (stage 0), "
                        f"got {info.boundary_width}"
                    )
                infos.append(info)
                self._record(s, name, k, info)
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

    def _record(self, s: AttachedStage, name: str, k: int, info: StageInfo) -> None:
        try:
            build = (json.loads(info.identity_json) or {}).get("build")
        except (ValueError, AttributeError):
            build = None
        row = self.seen.setdefault(
            s.address,
            {
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
            },
        )
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

    def start(self, cmd: Any, placement: Placement, tag: str) -> AbstractContextManager[Attached]:
        name, lane, stages = self._entry(cmd, placement)
        return self._attached(name, lane, stages)

    @contextmanager
    def _attached(self, name: str, lane: str, stages: Sequence[AttachedStage]) -> Iterator[Attached]:
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


def attach_plan(
    plan: Any, pf: PlacementFile, identity: Mapping[str, Any], ctx_size: int
) -> tuple[Any, AttachedPipelines, list[Result]]:
    """``plan`` (certify.measure.Plan) run on the file's workers: the recipe cut to the listed
    placements, stages attached instead of started; plus the SKIPPED results of the others."""
    cross = plan.hardware_class.parity.reference_lane == "cpu" and plan.lane != "cpu"
    recipe, skipped = restrict(pf, plan.recipe, plan.lane, cross_lane=cross)
    pipes = AttachedPipelines(
        file=pf,
        recipe=plan.recipe,
        lane=plan.lane,
        identity=identity,
        stubs=plan.stubs,
        reference_lane="cpu" if cross else None,
        shape=model_shape(plan.worker.model),
        min_ctx=ctx_size,
        call_deadline=plan.call_deadline,
    )
    # The measurement picks the reference by its command's lane; no program is ever run from it.
    reference = dataclasses.replace(plan.worker, lane="cpu") if cross else plan.reference_worker
    return (
        dataclasses.replace(plan, recipe=recipe, pipelines=pipes, reference_worker=reference),
        pipes,
        skipped,
    )


# Preparation ---------------------------------------------------------------------------------------
def prepare_attached(ctx: Any, recipe: Recipe, lane: str, *, store: Path | None) -> Any:
    """The identity chain and subjects without a local build: the workers' binaries live on their hosts.

    The artifacts are provisioned (verified) here, so the certificate's subjects are files this machine
    hashed; source and patch stack come from this checkout's own verified trees, since those digests are
    what every worker's identity is held to.
    """
    import os

    from certify import certificate as cert
    from certify.run import Prepared
    from fetch.artifacts import load_set
    from fetch.provision import provision
    from fetch.source import ensure_pristine
    from patches.stack import ensure_patched

    provisioned = provision(ctx, recipe.artifacts, store=store, variant=recipe.variant)
    patched = ensure_patched(ctx)
    pristine = ensure_pristine(ctx)
    entries = load_set(recipe.artifacts).variant(provisioned.variant).files
    store_root = provisioned.store.parent.parent
    subjects, paths = [], {}
    for entry, path in zip(entries, provisioned.files, strict=True):
        name = "artifacts/" + Path(os.path.relpath(path, store_root)).as_posix()
        subjects.append(cert.subject(name, {"sha256": entry.sha256, "blake3": entry.blake3}))
        paths[name] = str(Path(path).resolve())
    identity = {
        "source": {k: v for k, v in dict(pristine.provenance).items() if k != "stamp"},
        "patches": {**dict(patched.provenance), "digest": patched.digest},
        "build": None,  # on the workers' hosts: see identity.attached.workers[].build (self-reported)
        "reference_build": None,
        "artifacts": {
            "set": recipe.artifacts,
            "variant": recipe.variant,
            "manifest_digest": provisioned.manifest_digest,
            **dict(provisioned.provenance),
        },
    }
    verified = [
        f"artifacts: {len(provisioned.files)} files of set {recipe.artifacts} ({recipe.variant}) verified "
        f"against manifest {provisioned.manifest_digest[:16]}… by provisioning on the certifying machine",
        "build: not hashed here; the workers are attached (started by the operator on their hosts), their "
        "identity and owned range were checked through Info (self-reported)",
    ]
    return Prepared(
        model=Path(provisioned.files[0]),
        worker=(),
        identity=identity,
        subjects=subjects,
        local_paths=paths,
        verified=verified,
    )


def write_identity(ctx: Any, recipe: Recipe, lane: str, path: Path, *, store: Path | None) -> list[str]:
    """Write the identity file a worker of ``recipe`` on ``lane`` is started with; returns the worker's
    command line to print (model, layers placeholder, ctx the certifier needs)."""
    from certify.run import _ctx_size, prepare

    prepared = prepare(ctx, recipe, lane, store=store, need_cpu_reference=False)
    doc = stable_identity(recipe, lane, prepared.identity)
    write_json(Path(path), doc)
    ctx_size = _ctx_size(recipe, max(len(t.encode()) for t in recipe.prompts.texts))
    return [
        *prepared.worker,
        "--model",
        str(prepared.model),
        "--layers",
        "BEGIN:END",
        "--listen",
        "HOST:PORT",
        "--ctx",
        str(ctx_size),
        "--identity",
        str(Path(path).resolve()),
        "--lane",
        lane,
    ]
