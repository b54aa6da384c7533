"""worker.tls, worker.tls_ca and `dgr tls` (issue 43): a CA and per-host identities that real TLS
accepts and refuses as mutual TLS must: a real gRPC server on loopback requiring client certificates,
and clients with the right identity, none, another CA's and an expired one."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import ssl
import stat
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509 import verification

from cli.main import main as dgr
from worker import tls, tls_ca

METHOD = "/dgr.test.Echo/Say"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ca")
    tls_ca.ensure_ca(folder)
    tls_ca.issue(folder, "worker-a", names=["127.0.0.1", "localhost"])
    tls_ca.issue(folder, "driver")
    return folder


@pytest.fixture(scope="module")
def echo_port(ca: Path) -> Iterator[int]:
    """A gRPC server on loopback with worker-a's identity, client certificates required."""
    handler = grpc.method_handlers_generic_handler(
        "dgr.test.Echo", {"Say": grpc.unary_unary_rpc_method_handler(lambda request, context: request)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_secure_port(
        "127.0.0.1:0", tls.server_credentials(tls.load(ca / tls_ca.HOSTS / "worker-a"))
    )
    server.start()
    yield port
    server.stop(grace=None)


def _say(port: int, credentials: grpc.ChannelCredentials) -> bytes:
    with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        return channel.unary_unary(METHOD)(b"hello", timeout=20)


def test_a_client_with_an_identity_of_the_same_ca_is_answered(ca: Path, echo_port: int) -> None:
    assert _say(echo_port, tls.channel_credentials(tls.load(ca / tls_ca.HOSTS / "driver"))) == b"hello"


def test_a_client_without_a_certificate_is_refused_in_the_handshake(ca: Path, echo_port: int) -> None:
    only_trust = grpc.ssl_channel_credentials(root_certificates=(ca / tls.CA).read_bytes())
    with pytest.raises(grpc.RpcError) as refused:
        _say(echo_port, only_trust)
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE


def test_a_client_of_another_ca_is_refused(ca: Path, echo_port: int, tmp_path: Path) -> None:
    tls_ca.ensure_ca(tmp_path, name="someone else's CA")
    stranger = tls_ca.issue(tmp_path, "driver")
    own = (ca / tls.CA).read_bytes()  # it trusts our CA, so only its own certificate can fail
    credentials = grpc.ssl_channel_credentials(own, stranger.key.read_bytes(), stranger.cert.read_bytes())
    with pytest.raises(grpc.RpcError) as refused:
        _say(echo_port, credentials)
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE


def test_a_client_with_an_expired_certificate_is_refused(ca: Path, echo_port: int) -> None:
    two_days_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2)
    expired = tls_ca.issue(ca, "expired-driver", days=1, valid_from=two_days_ago)
    with pytest.raises(grpc.RpcError) as refused:
        _say(echo_port, tls.channel_credentials(expired))
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE


def test_an_issued_certificate_chains_to_its_ca_for_its_names(ca: Path) -> None:
    store = verification.Store([x509.load_pem_x509_certificate((ca / tls.CA).read_bytes())])
    leaf = x509.load_pem_x509_certificate((ca / tls_ca.HOSTS / "worker-a" / tls.CERT).read_bytes())
    builder = verification.PolicyBuilder().store(store)
    for name in (x509.DNSName("worker-a"), x509.DNSName("localhost")):
        builder.build_server_verifier(name).verify(leaf, [])
    with pytest.raises(verification.VerificationError):
        builder.build_server_verifier(x509.DNSName("worker-b")).verify(leaf, [])


def test_the_fingerprint_is_sha256_of_the_der_and_keys_are_the_owners_alone(ca: Path) -> None:
    made = tls.load(ca / tls_ca.HOSTS / "worker-a")
    der = ssl.PEM_cert_to_DER_cert(made.cert.read_text())
    assert made.fingerprint == "sha256:" + hashlib.sha256(der).hexdigest()
    for key in (made.key, ca / tls_ca.CA_KEY):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key


def test_the_ca_is_kept_when_more_hosts_are_issued(tmp_path: Path, capsys) -> None:
    assert dgr(["tls", "--ca", str(tmp_path), "--host", "a", "--name", "a=10.0.0.5"]) == 0
    first = (tmp_path / tls.CA).read_bytes()
    assert dgr(["tls", "--ca", str(tmp_path), "--host", "b"]) == 0
    assert (tmp_path / tls.CA).read_bytes() == first
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("a: "))
    assert line.endswith(tls.load(tmp_path / tls_ca.HOSTS / "a").fingerprint)
    sans = x509.load_pem_x509_certificate((tmp_path / tls_ca.HOSTS / "a" / tls.CERT).read_bytes()).extensions
    names = sans.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(n.value) for n in names} == {"a", "10.0.0.5"}


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "name at least one --host"),
        (["--host", "a", "--name", "a10.0.0.5"], "--name expects HOST=ADDR"),
        (["--host", "a", "--name", "b=10.0.0.5"], "b is not one of the --host names"),
        (["--host", "a", "--days", "0"], "--days must be at least 1"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(tmp_path: Path, capsys, argv: list[str], says: str) -> None:
    assert dgr(["tls", "--ca", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err


def test_a_folder_without_one_of_its_files_is_named(tmp_path: Path) -> None:
    (tmp_path / tls.CERT).write_text("x")
    (tmp_path / tls.CA).write_text("x")
    from core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="no key.pem"):
        tls.load(tmp_path)


def test_worker_tls_goes_with_write_identity(tmp_path: Path, capsys) -> None:
    assert dgr(["certify", "--worker-tls", str(tmp_path)]) == 2
    assert "--worker-tls goes with --write-identity" in capsys.readouterr().err


def test_certify_tls_does_not_go_with_a_placement_file(tmp_path: Path, capsys) -> None:
    """--tls starts the certifier's own workers over TLS; attached ones take the placement file's."""
    assert dgr(["certify", "--tls", "--placement-file", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--tls starts the certifier's own workers over TLS" in err and '"driver": {"tls": DIR}' in err


def test_certify_tls_names_the_pass_ports_frames(tmp_path: Path, capsys) -> None:
    """`--tls mac` asks for authenticated frames on the pass ports; any other word is a usage error."""
    assert dgr(["certify", "--tls", "mac", "--placement-file", str(tmp_path / "p.json")]) == 2
    assert "--tls starts the certifier's own workers over TLS" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:  # argparse's own usage error
        dgr(["certify", "--tls", "aes"])
    assert usage.value.code == 2 and "invalid choice: 'aes'" in capsys.readouterr().err


def test_tls_options_carry_the_pass_frames_to_the_worker_command(tmp_path: Path) -> None:
    from certify.run import tls_options
    from worker.launcher import WorkerCommand

    plain = WorkerCommand(program=("w",), model=tmp_path / "m.gguf")
    for frames, flags in (("tls", []), ("mac", ["--pass-frames", "mac"])):
        argv = dataclasses.replace(plain, **tls_options(tmp_path / frames, frames)).argv((0, 1))
        assert "--tls" in argv
        tail = argv[argv.index("--tls") + 2 :]
        assert tail[: len(flags)] == flags and ("--pass-frames" in argv) == bool(flags), frames
