"""Seams that behave like network links: each stage in its own network namespace, shaped per link.

The link model and the physical bound (one access link per node, a message into node X shaped by
X's profile; stage k+1's link is seam k's, stage 0's and the driver's are seam 0's) live in
pipeline.seam_model.

Backends (``probe`` picks one):

* ``netem``: veth pairs, with kernel netem (delay, jitter, rate) on the hub-side end of each node's
  veth, i.e. on the egress toward that node.  Needs sch_netem.
* ``shaper``: for kernels without sch_netem.  Each access link is a pair of TAP devices joined by a
  ``pipeline.shaper`` process (a userspace netem) that holds every frame travelling hub -> node to the
  node's profile.  It works below IP, so anything crossing the link is shaped: a worker's server, a
  chained stage's outgoing call, the driver's gRPC sink in the root namespace, with no relay addresses
  or ports to rewrite.  The driver's link is such a pair too, between the root namespace and the hub.

Names fit the 15-byte interface limit: ``dgr<tag>h`` (hub), ``dgr<tag>s<k>`` (stage k), ``dgr<tag>d``
(the root namespace's end of the driver's link); ``tag`` is 6 hex digits.  Who owns a fabric is
written to ``/run/dgr-seams/<tag>.json`` (pid and its start time) before anything is created, so a
later run removes what a killed one left (``sweep_stale``).  Teardown runs on every exit: shapers
stopped, anything still running in a namespace killed, namespaces and the root-side link deleted.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time
from collections.abc import Generator, Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core import proc, redact
from core.canonical import parse_json, read_json
from core.digits import ascii_int
from core.errors import ConfigurationError, RuntimeFailure, ToolchainMissing
from pipeline.seam_model import Profiles, profiles
from pipeline.shaper import READY, Link

if TYPE_CHECKING:  # the probe runs in minimal environments (a test runs it as nobody): no recipe loader
    from manifests.recipe_model import Placement
    from worker.launcher import Placed, WorkerCommand

log = redact.logger("dgr.seams")

MARKERS = Path("/run/dgr-seams")
NETNS_DIR = Path("/run/netns")
DRIVER_HOST = 1  # host part of the driver's address in the fabric's /24
STAGE_HOST0 = 10  # stage k gets .(10 + k)
MAX_STAGES = 254 - STAGE_HOST0
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21
SHAPER_READY_S = 15.0

NETEM_DESCRIPTION = "kernel netem on veth (delay, jitter, rate on the hub-side end, egress toward each node)"
SHAPER_DESCRIPTION = (
    "userspace shaper (this kernel has no sch_netem): delay, jitter and rate applied per direction by "
    "a pipeline.shaper process joining each node's TAP pair, on frames travelling into the node"
)


# Names, addresses, tc command lines --------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Names:
    tag: str

    @property
    def hub(self) -> str:
        return f"dgr{self.tag}h"

    def stage(self, k: int) -> str:
        return f"dgr{self.tag}s{k}"

    @property
    def root_link(self) -> str:
        return f"dgr{self.tag}d"

    @staticmethod
    def hub_port(k: int | None) -> str:
        """The hub-side end of node k's link (None: the driver's)."""
        return "drv" if k is None else f"n{k}"

    NODE_LINK = "f0"  # the node-side end, inside each stage's namespace


def used_networks(
    addr_json: Sequence[Mapping[str, Any]], route_json: Sequence[Mapping[str, Any]]
) -> list[ipaddress.IPv4Network]:
    """IPv4 networks in use here, from ``ip -j addr`` and ``ip -j route`` (not the default route)."""
    nets: list[ipaddress.IPv4Network] = []
    for iface in addr_json:
        for a in iface.get("addr_info", []):
            if a.get("family") == "inet":
                net = ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False)
                if isinstance(net, ipaddress.IPv4Network):  # what ip calls inet
                    nets.append(net)
    for r in route_json:
        dst = r.get("dst", "default")
        if dst != "default":
            net = ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False)
            if isinstance(net, ipaddress.IPv4Network):
                nets.append(net)
    return nets


def choose_subnet(used: Iterable[ipaddress.IPv4Network], seed: int) -> ipaddress.IPv4Network:
    """A private /24 in 10.0.0.0/8 that overlaps nothing in ``used``, starting the scan at ``seed``."""
    taken = list(used)
    for i in range(1 << 16):
        n = (seed + i) % (1 << 16)
        cand = ipaddress.IPv4Network(f"10.{n >> 8}.{n & 255}.0/24")
        if not any(cand.overlaps(u) for u in taken):
            return cand
    raise RuntimeFailure("no free private /24 left in 10.0.0.0/8 for a seam fabric")


def host(subnet: ipaddress.IPv4Network, k: int | None) -> str:
    """The driver's address (k None) or stage k's."""
    return str(subnet.network_address + (DRIVER_HOST if k is None else STAGE_HOST0 + k))


def netem_argv(netns: str, dev: str, link: Link) -> list[str]:
    """The tc command that shapes egress of ``dev`` (in ``netns``) to ``link`` with kernel netem."""
    argv = [
        "tc",
        "-n",
        netns,
        "qdisc",
        "add",
        "dev",
        dev,
        "root",
        "netem",
        "delay",
        f"{link.delay_s * 1e6:.0f}us",
    ]
    if link.jitter_s:
        argv.append(f"{link.jitter_s * 1e6:.0f}us")
    if link.rate_bps is not None:
        argv += ["rate", f"{link.rate_bps:.0f}bit"]
    # netem's default queue of 1000 packets drops a high bandwidth-delay product; hold 2 x BDP (>= 1000).
    bdp_packets = 0 if link.rate_bps is None else int(link.rate_bps * max(link.delay_s, 1e-3) / 8 / 1500)
    return argv + ["limit", str(max(1000, 2 * bdp_packets))]


def netem_links(names: Names, links: Profiles) -> list[list[str]]:
    """The netem backend's links: a veth per stage (hub end ``n<k>``, node end ``f0`` in the stage's
    namespace) and one from the root namespace to the hub (``drv``), netem on every hub-side end."""
    out: list[list[str]] = []
    for k, link in enumerate(links.stages):
        out.append(
            [
                "ip",
                "-n",
                names.hub,
                "link",
                "add",
                Names.hub_port(k),
                "type",
                "veth",
                "peer",
                "name",
                Names.NODE_LINK,
                "netns",
                names.stage(k),
            ]
        )
        out.append(netem_argv(names.hub, Names.hub_port(k), link))
    out.append(
        [
            "ip",
            "link",
            "add",
            names.root_link,
            "type",
            "veth",
            "peer",
            "name",
            Names.hub_port(None),
            "netns",
            names.hub,
        ]
    )
    out.append(netem_argv(names.hub, Names.hub_port(None), links.driver))
    return out


def shaper_argv(
    python: str, link: Link, *, inner: str, inner_ns: str, outer: str, outer_ns: str
) -> list[str]:
    """The command of one link's userspace shaper (pipeline.shaper)."""
    ms = link.in_ms()
    argv = [
        python,
        "-m",
        "pipeline.shaper",
        "--inner",
        inner,
        "--inner-ns",
        inner_ns,
        "--outer",
        outer,
        "--outer-ns",
        outer_ns,
        "--delay-ms",
        repr(ms["delay_ms"]),
        "--jitter-ms",
        repr(ms["jitter_ms"]),
    ]
    if ms["rate_mbit"] is not None:
        argv += ["--rate-mbit", repr(ms["rate_mbit"])]
    return argv


# Probe -------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class SeamSupport:
    backend: str | None  # "netem" | "shaper" | None
    reason: str = ""  # one line, when backend is None
    description: str = ""

    @property
    def available(self) -> bool:
        return self.backend is not None


def _capabilities() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def _ip(env: Mapping[str, str], *args: str, check: bool = True) -> proc.Completed:
    return proc.run(["ip", *args], env=env, check=check, no_output_timeout=30)


def _last_line(text: str) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else "no output"


def probe(env: Mapping[str, str]) -> SeamSupport:
    """Can this machine build a seam fabric, and with which backend?  Tries it (a throwaway namespace)."""
    if env.get("DGR_SEAMS") == "off":
        return SeamSupport(backend=None, reason="seam fabrics are turned off (DGR_SEAMS=off)")
    if not sys.platform.startswith("linux"):
        return SeamSupport(backend=None, reason=f"network namespaces need Linux, this is {sys.platform}")
    caps = _capabilities()
    if not (caps >> CAP_NET_ADMIN & 1 and caps >> CAP_SYS_ADMIN & 1):
        return SeamSupport(
            backend=None, reason="needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network namespaces"
        )
    try:
        proc.resolve("ip", env)
    except ToolchainMissing:
        return SeamSupport(backend=None, reason="needs iproute2 (`ip` is not on PATH)")
    ns = f"dgrp{os.getpid():x}"[:15]
    made = _ip(env, "netns", "add", ns, check=False)
    if made.returncode != 0:
        return SeamSupport(
            backend=None, reason=f"cannot create a network namespace: {_last_line(made.output)}"
        )
    try:
        veth = _ip(env, "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1", check=False)
        if veth.returncode != 0:
            return SeamSupport(backend=None, reason=f"cannot create veth pairs: {_last_line(veth.output)}")
        bridge = _ip(env, "-n", ns, "link", "add", "b0", "type", "bridge", check=False)
        if bridge.returncode != 0:
            return SeamSupport(backend=None, reason=f"cannot create a bridge: {_last_line(bridge.output)}")
        forced = env.get("DGR_SEAMS_BACKEND", "")
        try:
            has_tc = bool(proc.resolve("tc", env))
        except ToolchainMissing:
            has_tc = False
        if forced != "shaper" and has_tc:
            tc = proc.run(
                netem_argv(ns, "p0", Link(delay_s=1e-3)), env=env, check=False, no_output_timeout=30
            )
            if tc.returncode == 0:
                return SeamSupport(backend="netem", description=NETEM_DESCRIPTION)
        if forced == "netem":
            return SeamSupport(
                backend=None, reason="DGR_SEAMS_BACKEND=netem but this kernel has no sch_netem"
            )
        if not os.access("/dev/net/tun", os.R_OK | os.W_OK):
            return SeamSupport(
                backend=None, reason="no sch_netem in this kernel and no /dev/net/tun for the shaper"
            )
        return SeamSupport(backend="shaper", description=SHAPER_DESCRIPTION)
    finally:
        _ip(env, "netns", "del", ns, check=False)


# Ownership markers and the stale sweep --------------------------------------------------------------
def _start_ticks(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _owner_alive(marker: Mapping[str, Any]) -> bool:
    ticks = _start_ticks(int(marker.get("pid", 0)))
    return ticks is not None and ticks == marker.get("start")


def _netns_pids(env: Mapping[str, str], ns: str) -> list[int]:
    done = _ip(env, "netns", "pids", ns, check=False)
    pids = [ascii_int(x) for x in done.output.split()] if done.returncode == 0 else []
    return [pid for pid in pids if pid is not None]


def _kill_shaper(pid: int, tag: str) -> None:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return
    if b"pipeline.shaper" in cmdline and tag.encode() in cmdline:  # never a reused pid of someone else's
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def remove(env: Mapping[str, str], marker: Mapping[str, Any]) -> list[str]:
    """Take down what a marker lists; the problems met (empty when everything went)."""
    problems: list[str] = []
    for pid in marker.get("shapers", []):
        _kill_shaper(int(pid), marker["tag"])
    for ns in marker.get("namespaces", []):
        if not (NETNS_DIR / ns).exists():
            continue
        for pid in _netns_pids(env, ns):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        gone = _ip(env, "netns", "del", ns, check=False)
        if gone.returncode != 0:
            problems.append(f"netns {ns}: {_last_line(gone.output)}")
    for link in marker.get("root_links", []):
        if Path(f"/sys/class/net/{link}").exists():
            _ip(env, "link", "del", link, check=False)
            if Path(f"/sys/class/net/{link}").exists():
                problems.append(f"link {link} is still there")
    return problems


def sweep_stale(env: Mapping[str, str], markers: Path = MARKERS) -> list[str]:
    """Remove the fabrics of runs whose owner is gone; the tags removed."""
    removed: list[str] = []
    for path in sorted(markers.glob("*.json")) if markers.is_dir() else []:
        try:
            marker = read_json(path)
        except (OSError, ValueError):
            continue
        if _owner_alive(marker):
            continue
        log.warning("removing seam fabric %s left by pid %s", marker.get("tag"), marker.get("pid"))
        if not remove(env, marker):
            path.unlink(missing_ok=True)
            removed.append(str(marker.get("tag")))
    return removed


# The fabric ----------------------------------------------------------------------------------------
@dataclass(kw_only=True, eq=False)
class Shaper:
    node: int | None  # None: the driver's link
    process: subprocess.Popen[bytes]


@dataclass(kw_only=True, eq=False)
class Fabric:
    """A hub namespace with a bridge, one namespace per stage, every node's access link shaped.

    Use as a context manager; on exit (any exception, KeyboardInterrupt, core.errors.Terminated)
    everything it made is removed.  ``addresses[k]`` is stage k's IP, ``driver_address`` the root
    namespace's (the driver's) IP on the fabric.
    """

    links: Profiles
    support: SeamSupport
    env: Mapping[str, str]
    evidence: Path | None = None
    python: str = sys.executable
    markers: Path = MARKERS
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    subnet: ipaddress.IPv4Network | None = None
    shapers: list[Shaper] = field(default_factory=list[Shaper])
    _marker: dict[str, Any] = field(default_factory=dict[str, Any])

    @property
    def names(self) -> Names:
        return Names(tag=self.tag)

    @property
    def n_stages(self) -> int:
        return len(self.links.stages)

    @property
    def namespaces(self) -> list[str]:
        return [self.names.stage(k) for k in range(self.n_stages)]

    @property
    def addresses(self) -> list[str]:
        assert self.subnet is not None
        return [host(self.subnet, k) for k in range(self.n_stages)]

    @property
    def driver_address(self) -> str:
        assert self.subnet is not None
        return host(self.subnet, None)

    @property
    def backend(self) -> str:
        assert self.support.backend is not None
        return self.support.backend

    def places(self) -> list[Placed]:
        """Where stage k's worker runs on this fabric: in namespace k, listening on its address there (a
        host only this machine reaches)."""
        from worker.launcher import Placed

        return [
            Placed(prefix=("ip", "netns", "exec", ns), host=addr, private=True)
            for ns, addr in zip(self.namespaces, self.addresses, strict=True)
        ]

    def describe(self) -> dict[str, Any]:
        stages = zip(self.namespaces, self.addresses, self.links.stages, strict=True)
        return {
            "backend": self.support.backend,
            "description": self.support.description,
            "subnet": str(self.subnet),
            "driver": {"address": self.driver_address, **self.links.driver.in_ms()},
            "stages": [{"namespace": ns, "address": a, **link.in_ms()} for ns, a, link in stages],
        }

    # lifecycle -----------------------------------------------------------------------------------
    def __enter__(self) -> Fabric:
        if not self.support.available:
            raise ToolchainMissing(f"seam fabric unavailable: {self.support.reason}")
        if not 1 <= self.n_stages <= MAX_STAGES:
            raise RuntimeFailure(f"a seam fabric holds 1..{MAX_STAGES} stages, not {self.n_stages}")
        sweep_stale(self.env, self.markers)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _save_marker(self) -> None:
        self.markers.mkdir(parents=True, exist_ok=True)
        tmp = self.markers / f".{self.tag}.tmp"
        tmp.write_text(json.dumps(self._marker))
        os.replace(tmp, self.markers / f"{self.tag}.json")

    def _build(self) -> None:
        env, names = self.env, self.names
        if self.subnet is None:
            addrs = parse_json(_ip(env, "-j", "addr").output or "[]", source="`ip -j addr`")
            routes = parse_json(_ip(env, "-j", "route").output or "[]", source="`ip -j route`")
            self.subnet = choose_subnet(used_networks(addrs, routes), int(self.tag, 16))
        # The marker comes first: whatever exists later is listed in it.
        self._marker = {
            "tag": self.tag,
            "pid": os.getpid(),
            "start": _start_ticks(os.getpid()),
            "namespaces": [*self.namespaces, names.hub],
            "root_links": [names.root_link],
            "shapers": [],
        }
        self._save_marker()
        _ip(env, "netns", "add", names.hub)
        _ip(env, "-n", names.hub, "link", "set", "lo", "up")
        _ip(env, "-n", names.hub, "link", "add", "br0", "type", "bridge")
        _ip(env, "-n", names.hub, "link", "set", "br0", "up")
        for ns in self.namespaces:
            _ip(env, "netns", "add", ns)
            _ip(env, "-n", ns, "link", "set", "lo", "up")
        if self.backend == "netem":
            self._links_netem()
        else:
            self._links_shaper()
        for k, ns in enumerate(self.namespaces):
            cidr = f"{self.addresses[k]}/{self.subnet.prefixlen}"
            _ip(env, "-n", ns, "addr", "add", cidr, "dev", Names.NODE_LINK)
            _ip(env, "-n", ns, "link", "set", Names.NODE_LINK, "up")
            _ip(env, "-n", names.hub, "link", "set", Names.hub_port(k), "master", "br0", "up")
        _ip(env, "addr", "add", f"{self.driver_address}/{self.subnet.prefixlen}", "dev", names.root_link)
        _ip(env, "link", "set", names.root_link, "up")
        _ip(env, "-n", names.hub, "link", "set", Names.hub_port(None), "master", "br0", "up")
        log.info("seam fabric %s up: %s, %d stages on %s", self.tag, self.backend, self.n_stages, self.subnet)

    def _links_netem(self) -> None:
        for argv in netem_links(self.names, self.links):
            proc.run(argv, env=self.env, no_output_timeout=30)

    def _links_shaper(self) -> None:
        names = self.names
        hub = os.fspath(NETNS_DIR / names.hub)
        nodes: list[tuple[int | None, Link, str, str]] = [
            (k, link, os.fspath(NETNS_DIR / ns), Names.NODE_LINK)
            for k, (ns, link) in enumerate(zip(self.namespaces, self.links.stages, strict=True))
        ]
        nodes.append((None, self.links.driver, "", names.root_link))
        for k, link, inner_ns, inner in nodes:
            argv = shaper_argv(
                self.python, link, inner=inner, inner_ns=inner_ns, outer=Names.hub_port(k), outer_ns=hub
            )
            argv += ["--seed", str(int(self.tag, 16) * 1000 + (k if k is not None else 999))]
            stderr: Any = subprocess.DEVNULL
            if self.evidence is not None:
                self.evidence.mkdir(parents=True, exist_ok=True)
                stderr = open(self.evidence / f"shaper-{'driver' if k is None else k}.stderr", "ab")
            try:
                p = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    env=dict(self.env),
                    start_new_session=True,
                    cwd=_package_root(),
                )
            finally:
                if stderr is not subprocess.DEVNULL:
                    stderr.close()
            self.shapers.append(Shaper(node=k, process=p))
            self._marker["shapers"].append(p.pid)
            self._save_marker()
        until = time.monotonic() + SHAPER_READY_S
        for s in self.shapers:  # all started together, then awaited in turn
            _await_ready(s, until)

    def close(self) -> None:
        """Remove everything; safe to call twice.  Raises RuntimeFailure only when something stayed."""
        for s in self.shapers:
            if s.process.poll() is None:
                s.process.terminate()
        for s in self.shapers:
            try:
                s.process.wait(timeout=3)
            except subprocess.TimeoutExpired:
                s.process.kill()
                s.process.wait()
            if s.process.stdout is not None:
                s.process.stdout.close()
        if not self._marker:
            return
        problems = remove(self.env, self._marker)
        if problems:
            raise RuntimeFailure(
                f"seam fabric {self.tag} not fully removed: {'; '.join(problems)}",
                hint=f"the next run removes it; by hand: ip netns del {self.names.hub} ...",
            )
        (self.markers / f"{self.tag}.json").unlink(missing_ok=True)
        self._marker = {}


def _package_root() -> str:
    """Where ``python -m pipeline.shaper`` finds this very package."""
    return os.fspath(Path(__file__).resolve().parent.parent)


def _await_ready(s: Shaper, until: float) -> None:
    assert s.process.stdout is not None
    fd = s.process.stdout.fileno()
    seen = b""
    while READY.encode() not in seen:
        left = until - time.monotonic()
        if s.process.poll() is not None or left <= 0:
            code = s.process.poll()
            what = f"exited with code {code}" if code is not None else "gave no ready line"
            node = "the driver" if s.node is None else f"stage {s.node}"
            raise RuntimeFailure(
                f"the shaper of {node}'s link {what}", hint="its stderr is in the run's evidence folder"
            )
        ready, _, _ = select.select([fd], [], [], min(left, 0.2))
        if ready:
            chunk = os.read(fd, 4096)
            seen += chunk


# Pipelines in namespaces (the certify.measure.Pipelines protocol) --------------------------------
@dataclass(kw_only=True, eq=False)
class NetnsPipeline:
    """A placement's workers, each in its own namespace behind its shaped link.

    ``addresses[k]`` is how the driver or another stage reaches stage k (host:port, on the fabric);
    ``sink_host`` is the driver's address on the fabric: a sink bound there is reached by the last stage
    through the driver's link.
    """

    pipeline: Any  # worker.launcher.Pipeline
    fabric: Fabric

    @property
    def clients(self) -> list[Any]:
        return self.pipeline.clients

    @property
    def pids(self) -> list[int]:
        return self.pipeline.pids

    @property
    def stages(self) -> list[Any]:
        return self.pipeline.stages

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.pipeline.stages]

    @property
    def sink_host(self) -> str:
        return self.fabric.driver_address

    def check_alive(self) -> None:
        self.pipeline.check_alive()


def _fabric_tls(cmd: WorkerCommand, fabric: Fabric, tag: str) -> WorkerCommand:
    """``cmd`` for this fabric's stages: with TLS on (the run's own CA, ``cmd.tls_ca``), the workers get
    an identity for their fabric addresses and the driver one for its address on the fabric, issued now:
    the addresses are the fabric's, chosen as it was made."""
    if cmd.tls is None:
        return cmd
    from worker import tls_ca

    ca = cmd.tls_ca
    if ca is None or not (ca / tls_ca.CA_KEY).is_file():
        raise ConfigurationError(
            f"TLS over a seam fabric needs the run's own CA to issue the fabric's identities "
            f"(no {tls_ca.CA_KEY} in {ca or 'a CA the run made'})"
        )
    workers = tls_ca.issue(ca, f"{tag}-workers", names=fabric.addresses)
    driver = tls_ca.issue(ca, f"{tag}-driver", names=[fabric.driver_address])
    return dataclasses.replace(cmd, tls=workers.cert.parent, driver_tls=driver)


@dataclass(frozen=True, kw_only=True)
class NetnsPipelines:
    """Start each placement's stages in namespaces joined by links shaped from the recipe's seams."""

    stubs: Any  # worker.stubs.Stubs
    evidence: Path
    env: Mapping[str, str]
    support: SeamSupport  # probe()'s answer (certify.measure probes once per process)
    start_timeout: float = 120.0
    call_deadline: float = 120.0

    @contextmanager
    def start(self, cmd: WorkerCommand, placement: Placement, tag: str) -> Generator[NetnsPipeline]:
        from core.canonical import write_json
        from worker.launcher import launch

        evidence = self.evidence / tag
        fabric = Fabric(links=profiles(placement), support=self.support, env=self.env, evidence=evidence)
        with fabric:
            write_json(evidence / "fabric.json", fabric.describe())
            cmd = _fabric_tls(cmd, fabric, tag)
            with launch(
                cmd,
                placement.stages,
                stubs=self.stubs,
                evidence=evidence,
                env=self.env,
                start_timeout=self.start_timeout,
                call_deadline=self.call_deadline,
                placed=fabric.places(),
            ) as pipeline:
                yield NetnsPipeline(pipeline=pipeline, fabric=fabric)
