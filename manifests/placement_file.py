"""The placement file (``--placement-file``): per recipe placement, each attached stage's ``host:port``,
the layers the operator says that worker owns and, optionally, the fingerprint of the TLS certificate it
must present; plus the CPU reference workers, the driver's sink host and its TLS identity.  Read and
checked on its own here (schema, addresses, ranges that tile from layer 0, one range per worker);
holding it to a recipe is certify's (``certify.attach``), attaching to it the pipeline's.
"""

from __future__ import annotations

import ipaddress
import re
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.canonical import sha256_file
from core.digits import ascii_int
from core.errors import ConfigurationError
from manifests.loader import load_json
from manifests.tiling import first_break

_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


@dataclass(frozen=True, kw_only=True)
class AttachedStage:
    address: str
    layers: tuple[int, int]
    fingerprint: str | None = None  # the certificate it must present ("sha256:HEX"), when the file pins one


@dataclass(frozen=True, kw_only=True)
class PlacementFile:
    recipe: str
    placements: Mapping[str, tuple[AttachedStage, ...]]
    reference: tuple[AttachedStage, ...] | None = None
    lane: str | None = None
    sink_host: str | None = None
    driver_tls: Path | None = None  # the certifier's TLS identity folder: every worker over mutual TLS
    source: str = ""
    sha256: str = ""


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
    host, sep, port_text = address.rpartition(":")
    port = ascii_int(port_text) if sep else None
    if not host or port is None or not 0 < port < 65536:
        raise ConfigurationError(
            f"{where}: {address!r} is not host:port with a port in 1-65535",
            hint="e.g. 10.0.0.7:7001 or [fd00::7]:7001",
        )
    if ":" in host and not host.startswith("["):
        raise ConfigurationError(f"{where}: {address!r}: write an IPv6 host in brackets, [addr]:port")
    return f"{check_host(host, where)}:{port}"


def _stages(raw: Sequence[Mapping[str, Any]], where: str) -> tuple[AttachedStage, ...]:
    layers = [(int(s["layers"][0]), int(s["layers"][1])) for s in raw]
    gap = first_break(layers)
    if gap is not None:
        raise ConfigurationError(
            f"{where}/stages/{gap.stage}/layers: [{gap.begin}, {gap.end}] does not continue the stages "
            f"before it (expected a non-empty range starting at {gap.expected}; stages must tile the layers "
            "in order)"
        )
    out = [
        AttachedStage(
            address=check_address(s["address"], f"{where}/stages/{k}/address"),
            layers=layers[k],
            fingerprint=s.get("fingerprint"),
        )
        for k, s in enumerate(raw)
    ]
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
    tls = data.get("driver", {}).get("tls")
    return PlacementFile(
        recipe=data["recipe"],
        lane=data.get("lane"),
        placements=types.MappingProxyType(placements),
        reference=reference,
        sink_host=check_host(sink, f"{src}: at /driver/sink_host") if sink else None,
        driver_tls=(path.parent / tls).absolute() if tls else None,
        source=src,
        sha256=sha256_file(path),
    )
