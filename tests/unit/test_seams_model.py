"""pipeline.seams: the pure parts (profiles, the physical bound, names, addresses, tc/shaper command lines,
ownership markers).  The fabric itself needs root and runs in tests/integration/test_seams.py."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import RuntimeFailure
from manifests.recipe_model import Placement, Seam
from pipeline import seam_model, seams
from pipeline.shaper import Link

MiB = 1 << 20
FOUR = ((0, 3), (3, 6), (6, 9), (9, 12))


def _placement(*seam_list: Seam, stages=FOUR) -> Placement:
    return Placement(name="p", stages=stages, seams=tuple(seam_list))


def test_one_listed_seam_shapes_every_link_and_the_driver_takes_seam_0() -> None:
    prof = seam_model.profiles(_placement(Seam(delay_ms=5, rate_mbit=100)))
    want = Link(delay_s=0.005, rate_bps=100e6)
    assert prof.driver == want and prof.stages == (want,) * 4


def test_stage_k_plus_1_takes_seam_k() -> None:
    p = _placement(
        Seam(delay_ms=1, rate_mbit=10000), Seam(delay_ms=20, jitter_ms=2, rate_mbit=1000), Seam(delay_ms=3)
    )
    prof = seam_model.profiles(p)
    rack = Link(delay_s=0.001, rate_bps=1e10)
    metro = Link(delay_s=0.020, jitter_s=0.002, rate_bps=1e9)
    plain = Link(delay_s=0.003)
    assert prof.stages == (rack, rack, metro, plain)
    assert prof.driver == rack


def test_no_seams_is_an_unshaped_fabric() -> None:
    prof = seam_model.profiles(Placement(name="mono", stages=((0, 12),)))
    assert prof.driver == Link() and prof.stages == (Link(),)


def test_crossing_bound_is_min_delay_plus_payload_serialisation() -> None:
    lan = Link(delay_s=0.005, rate_bps=100e6)
    assert seam_model.crossing_bound_s(MiB, lan) == pytest.approx(0.005 + MiB * 8 / 100e6)
    assert seam_model.crossing_bound_s(MiB, Link(delay_s=0.010, jitter_s=0.004)) == pytest.approx(0.006)
    assert seam_model.crossing_bound_s(0, Link()) == 0.0


def test_names_fit_the_interface_limit() -> None:
    n = seams.Names(tag="a1b2c3")
    longest = [n.hub, n.root_link, n.stage(seams.MAX_STAGES - 1), seams.Names.hub_port(seams.MAX_STAGES - 1)]
    assert all(len(x) <= 15 for x in longest)
    assert (n.hub, n.stage(3), n.root_link, n.hub_port(None), n.hub_port(7)) == (
        "dgra1b2c3h",
        "dgra1b2c3s3",
        "dgra1b2c3d",
        "drv",
        "n7",
    )


def test_used_networks_and_a_free_subnet() -> None:
    addr = [
        {
            "ifname": "lo",
            "addr_info": [
                {"family": "inet", "local": "127.0.0.1", "prefixlen": 8},
                {"family": "inet6", "local": "::1", "prefixlen": 128},
            ],
        },
        {"ifname": "eth0", "addr_info": [{"family": "inet", "local": "10.1.2.7", "prefixlen": 24}]},
    ]
    route = [
        {"dst": "default", "gateway": "192.0.2.1"},
        {"dst": "10.1.3.0/24"},
        {"dst": "10.1.4.9"},
        {"dst": "fd00::/64"},
    ]
    used = seams.used_networks(addr, route)
    assert ipaddress.ip_network("10.1.2.0/24") in used and ipaddress.ip_network("10.1.4.9/32") in used
    seed = (1 << 8) + 2  # the scan starts at 10.1.2.0/24
    assert seams.choose_subnet(used, seed) == ipaddress.ip_network("10.1.5.0/24")
    assert seams.choose_subnet(used, 0) == ipaddress.ip_network("10.0.0.0/24")
    assert seams.choose_subnet(used, (1 << 16) - 1) == ipaddress.ip_network("10.255.255.0/24")
    with pytest.raises(RuntimeFailure, match="no free private /24"):
        seams.choose_subnet([ipaddress.ip_network("10.0.0.0/8")], 5)


def test_addresses_in_the_subnet() -> None:
    net = ipaddress.ip_network("10.9.8.0/24")
    assert seams.host(net, None) == "10.9.8.1"
    last = seams.MAX_STAGES - 1
    assert [seams.host(net, k) for k in (0, 1, last)] == ["10.9.8.10", "10.9.8.11", "10.9.8.253"]


def test_netem_command_lines() -> None:
    # The kernel-netem backend cannot run on a kernel without sch_netem; its exact argv is held here.
    assert seams.netem_argv("dgrabch", "n2", Link(delay_s=0.005, rate_bps=100e6)) == [
        "tc",
        "-n",
        "dgrabch",
        "qdisc",
        "add",
        "dev",
        "n2",
        "root",
        "netem",
        "delay",
        "5000us",
        "rate",
        "100000000bit",
        "limit",
        "1000",
    ]
    assert seams.netem_argv("h", "drv", Link(delay_s=0.020, jitter_s=0.002, rate_bps=1e9)) == [
        "tc",
        "-n",
        "h",
        "qdisc",
        "add",
        "dev",
        "drv",
        "root",
        "netem",
        "delay",
        "20000us",
        "2000us",
        "rate",
        "1000000000bit",
        "limit",
        "3332",
    ]
    assert seams.netem_argv("h", "n0", Link()) == [
        "tc",
        "-n",
        "h",
        "qdisc",
        "add",
        "dev",
        "n0",
        "root",
        "netem",
        "delay",
        "0us",
        "limit",
        "1000",
    ]


def test_shaper_command_line() -> None:
    argv = seams.shaper_argv(
        "/py",
        Link(delay_s=0.005, jitter_s=0.001, rate_bps=100e6),
        inner="f0",
        inner_ns="/run/netns/a",
        outer="n0",
        outer_ns="/run/netns/h",
    )
    assert argv == [
        "/py",
        "-m",
        "pipeline.shaper",
        "--inner",
        "f0",
        "--inner-ns",
        "/run/netns/a",
        "--outer",
        "n0",
        "--outer-ns",
        "/run/netns/h",
        "--delay-ms",
        "5.0",
        "--jitter-ms",
        "1.0",
        "--rate-mbit",
        "100.0",
    ]
    plain = seams.shaper_argv("/py", Link(), inner="a", inner_ns="", outer="b", outer_ns="/h")
    assert "--rate-mbit" not in plain


def test_probe_can_be_turned_off() -> None:
    support = seams.probe({"DGR_SEAMS": "off", "PATH": os.environ.get("PATH", "")})
    assert not support.available and support.reason == "seam fabrics are turned off (DGR_SEAMS=off)"


def test_sweep_removes_markers_of_dead_owners_only(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    gone_pid = int(dead.stdout)
    (tmp_path / "aaaaaa.json").write_text(
        json.dumps(
            {
                "tag": "aaaaaa",
                "pid": gone_pid,
                "start": 1,
                "namespaces": ["dgraaaaaah"],
                "root_links": ["dgraaaaaad"],
                "shapers": [],
            }
        )
    )
    mine = seams._start_ticks(os.getpid())
    (tmp_path / "bbbbbb.json").write_text(
        json.dumps(
            {
                "tag": "bbbbbb",
                "pid": os.getpid(),
                "start": mine,
                "namespaces": [],
                "root_links": [],
                "shapers": [],
            }
        )
    )
    # Same pid, other start time: the pid was reused, the owner is gone.
    (tmp_path / "cccccc.json").write_text(
        json.dumps(
            {
                "tag": "cccccc",
                "pid": os.getpid(),
                "start": (mine or 0) + 1,
                "namespaces": [],
                "root_links": [],
                "shapers": [],
            }
        )
    )
    removed = seams.sweep_stale(dict(os.environ), tmp_path)
    assert sorted(removed) == ["aaaaaa", "cccccc"]
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["bbbbbb.json"]


def test_netem_fabric_links() -> None:
    names = seams.Names(tag="00abcd")
    wan, lan = Link(delay_s=0.020, rate_bps=1e9), Link(delay_s=0.001)
    got = seams.netem_links(names, seam_model.Profiles(driver=wan, stages=(wan, lan)))
    assert got == [
        [
            "ip",
            "-n",
            "dgr00abcdh",
            "link",
            "add",
            "n0",
            "type",
            "veth",
            "peer",
            "name",
            "f0",
            "netns",
            "dgr00abcds0",
        ],
        seams.netem_argv("dgr00abcdh", "n0", wan),
        [
            "ip",
            "-n",
            "dgr00abcdh",
            "link",
            "add",
            "n1",
            "type",
            "veth",
            "peer",
            "name",
            "f0",
            "netns",
            "dgr00abcds1",
        ],
        seams.netem_argv("dgr00abcdh", "n1", lan),
        ["ip", "link", "add", "dgr00abcdd", "type", "veth", "peer", "name", "drv", "netns", "dgr00abcdh"],
        seams.netem_argv("dgr00abcdh", "drv", wan),
    ]


def test_stage_k_runs_in_namespace_k_at_its_address() -> None:
    """Fabric.places: what the certifier's pipelines and the RPC bench both start stage k with."""
    fabric = seams.Fabric(
        links=seam_model.Profiles(driver=Link(), stages=(Link(), Link())),
        support=seams.SeamSupport(backend="netem", reason=""),
        env={},
        tag="a1b2c3",
        subnet=ipaddress.ip_network("10.77.5.0/24"),
    )
    places = fabric.places()
    assert [p.prefix for p in places] == [
        ("ip", "netns", "exec", "dgra1b2c3s0"),
        ("ip", "netns", "exec", "dgra1b2c3s1"),
    ]
    assert [p.host for p in places] == ["10.77.5.10", "10.77.5.11"] and all(p.private for p in places)
