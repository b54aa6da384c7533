"""Mutual TLS on the real worker's gRPC port (issue 43), the CPU lane and the embedded tiny model.

Workers started with ``--tls`` (a CA and identities made by worker.tls_ca, as `dgr tls` makes them):
- staged == monolithic bit for bit with TLS on every gRPC channel: relayed, chained (stage to stage and
  to the driver's sink over TLS) and the ring's gRPC path and streamed ring, at 2, 4 and 12 stages;
- a client without a certificate, with one of another CA and with an expired one is refused in the
  handshake, and the session a trusted client holds is unchanged by their tries;
- Info says the port's security; a worker asked to listen where other hosts can reach it, without
  --tls or --insecure, refuses to start (exit 2, one line naming both ways out).
The streamed ring runs its pass ports and the driver's delivery port over TLS too; the refusals on those
ports are test_worker_tls_ports.py's and test_delivery_port_tls.py's.
"""

from __future__ import annotations

import dataclasses
import datetime
import subprocess
from pathlib import Path

import grpc
import numpy as np
import pytest

from pipeline import drive, routes
from worker import tls, tls_ca
from worker.client import StageClient, StageFailed
from worker.launcher import WorkerCommand, launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Once upon a time"]
N_DECODE = 8
N_LAYER = 12
PLACEMENTS = {
    "2-stages": [(0, 6), (6, 12)],
    "4-stages": [(0, 3), (3, 6), (6, 9), (9, 12)],
    "12-stages": [(k, k + 1) for k in range(N_LAYER)],
}
ROUTES = {
    "relayed": routes.RELAYED,
    "chained": routes.Chained(),
    "ring-grpc": routes.Ring(streams=False, delivery_stream=False),
    "ring-streamed": routes.Ring(),  # pass ports and the driver's delivery port, over TLS too
}


def _identity(ca: Path, name: str) -> tls.Identity:
    return tls.load(ca / tls_ca.HOSTS / name)


@pytest.fixture(scope="module")
def secured(worker_command: WorkerCommand, ca: Path) -> WorkerCommand:
    worker = ca / tls_ca.HOSTS / "worker"
    return dataclasses.replace(worker_command, tls=worker, driver_tls=_identity(ca, "driver"))


@pytest.fixture(scope="module")
def mono(secured: WorkerCommand, ca: Path, stubs, worker_env, tmp_path_factory) -> tuple[list, drive.Trace]:
    evidence = tmp_path_factory.mktemp("mono")
    with launch(secured, [(0, N_LAYER)], stubs=stubs, evidence=evidence, env=worker_env) as p:
        assert p.clients[0].info().transport == "mtls"
        prompts = [p.clients[0].tokenize(text, add_special=True) for text in TEXTS]
        return prompts, drive.run_placement(p.clients, prompts, N_DECODE)


@pytest.mark.parametrize("name", list(PLACEMENTS))
def test_staged_equals_monolithic_over_tls_on_every_route(
    name: str, mono, secured: WorkerCommand, ca: Path, stubs, worker_env, tmp_path: Path
) -> None:
    prompts, reference = mono
    placement = PLACEMENTS[name]
    with launch(secured, placement, stubs=stubs, evidence=tmp_path, env=worker_env) as p:
        assert {c.info().transport for c in p.clients} == {"mtls"}
        for route_name, route in ROUTES.items():
            got = drive.run_placement(p.clients, prompts, N_DECODE, route=route)
            for g, m in zip(got.prompts, reference.prompts, strict=True):
                assert g.tokens == m.tokens, (name, route_name)
                assert np.array_equal(g.logits, m.logits), (name, route_name)
    assert [s.process.returncode for s in p.stages] == [0] * len(placement)


def test_clients_without_a_trusted_certificate_are_refused_and_change_nothing(
    secured: WorkerCommand, ca: Path, stubs, worker_env, tmp_path: Path
) -> None:
    tls_ca.ensure_ca(tmp_path / "other")
    stranger = tls_ca.issue(tmp_path / "other", "driver", names=["127.0.0.1"])
    ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=3)
    expired = tls_ca.issue(ca, "expired", names=["127.0.0.1"], days=1, valid_from=ago)
    ours = ca / tls.CA
    hostile = {  # each trusts our CA, so only its own certificate (or none) can fail the handshake
        "another CA": dataclasses.replace(stranger, ca=ours),
        "expired": dataclasses.replace(expired, ca=ours),
    }
    with launch(secured, [(0, N_LAYER)], stubs=stubs, evidence=tmp_path / "ev", env=worker_env) as p:
        trusted = p.clients[0]
        prompt = trusted.tokenize(TEXTS[0], add_special=True)
        trusted.forward("held", 1, list(range(len(prompt))), tokens=prompt)
        before = trusted.session("held")
        for what, identity in hostile.items():
            client = StageClient(
                trusted.address,
                stubs.pb2,
                stubs.pb2_grpc,
                stage=0,
                layers=(0, N_LAYER),
                deadline=10,
                tls=identity,
            )
            with client, pytest.raises(StageFailed) as refused:
                client.forward("held", 1, [len(prompt)], tokens=[prompt[-1]])
            assert "UNAVAILABLE" in str(refused.value), (what, str(refused.value))
        no_certificate = grpc.ssl_channel_credentials(root_certificates=ours.read_bytes())
        for creds in (no_certificate, None):  # and plaintext onto the TLS port
            channel = (
                grpc.insecure_channel(trusted.address)
                if creds is None
                else grpc.secure_channel(trusted.address, creds)
            )
            with channel, pytest.raises(grpc.RpcError) as refused_rpc:
                stubs.pb2_grpc.ShardWorkerStub(channel).Reset(
                    stubs.pb2.ResetRequest(session_id="held"), timeout=10
                )
            assert refused_rpc.value.code() is grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        assert trusted.session("held") == before and before.n_past == len(prompt)


@pytest.mark.parametrize(
    ("flags", "transport"), [([], "plaintext-loopback"), (["--insecure"], "plaintext-insecure")]
)
def test_a_plaintext_worker_says_so(flags, transport, worker_command, stubs, worker_env, tmp_path) -> None:
    cmd = dataclasses.replace(worker_command, extra=tuple(flags))
    with launch(cmd, [(0, N_LAYER)], stubs=stubs, evidence=tmp_path, env=worker_env) as p:
        assert p.clients[0].info().transport == transport


def test_listening_beyond_loopback_needs_tls_or_insecure(worker_command: WorkerCommand, ca: Path) -> None:
    argv = dataclasses.replace(worker_command).argv((0, N_LAYER), listen="0.0.0.0:0")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    said = [ln for ln in done.stderr.splitlines() if "--listen 0.0.0.0:0" in ln]
    assert said and "--tls DIR" in said[0] and "--insecure" in said[0]
    both = [*argv, "--tls", str(ca / tls_ca.HOSTS / "worker"), "--insecure"]
    done = subprocess.run(both, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "--tls and --insecure: choose one" in done.stderr
