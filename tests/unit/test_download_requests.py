"""Issue 16 item 1: the downloader over requests honours the environment's proxies and CA bundle.

- HTTP_PROXY: a loopback proxy receives the absolute-form GET (NO_PROXY set empty: nothing bypasses);
- HTTPS_PROXY: the proxy receives a CONNECT to the TLS origin, whose self-signed certificate is
  trusted through REQUESTS_CA_BUNDLE; without the bundle the certificate is an integrity error;
- no .netrc credentials are sent.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from core.context import Context
from core.errors import IntegrityError
from fetch.download import RetryPolicy
from fetch.provision import provision
from tests.fakehub import Proxy
from tests.unit.ggufmaker import split_set, write_set
from tests.unit.httpfault import FaultServer

CHUNK = 64 << 10
FAST = RetryPolicy(attempts=2, backoff_s=0.0, timeout_s=5.0)
_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture
def clean_proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    # requests (urllib) would bypass nothing here anyway, but an inherited NO_PROXY=127.0.0.1 would
    # make the test pass without the proxy: set it empty, so the request must go through.
    monkeypatch.setenv("NO_PROXY", "")
    monkeypatch.setenv("no_proxy", "")
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _set(tmp_path: Path, base_url: str) -> tuple[str, bytes]:
    blob = split_set(1, [(3 * CHUNK + 100) // 4 - 40])[0]
    entries = write_set(
        tmp_path / "src",
        tmp_path / "m",
        "web",
        [blob],
        chunk_size=CHUNK,
        origins=[{"kind": "http", "base_url": base_url}],
    )
    return entries[0]["name"], blob


def _provision(ctx: Context, tmp_path: Path) -> Path:
    done = provision(
        ctx, "web", store=tmp_path / "store", manifests=tmp_path / "m", policy=FAST, progress=None
    )
    return done.first


def test_http_proxy_is_honoured(tmp_path: Path, ctx: Context, clean_proxy_env: pytest.MonkeyPatch) -> None:
    with FaultServer() as server, Proxy() as proxy:
        name, blob = _set(tmp_path, server.base_url)
        server.files[name] = blob
        clean_proxy_env.setenv("HTTP_PROXY", f"http://{proxy.netloc}")
        clean_proxy_env.setenv("http_proxy", f"http://{proxy.netloc}")
        published = _provision(ctx, tmp_path)
        assert published.read_bytes() == blob
        assert [s.path for s in proxy.seen] == [f"{server.base_url}/{name}"]  # absolute form: via the proxy
        assert proxy.seen[0].headers.get("Range") == f"bytes=0-{len(blob) - 1}"
        assert len(server.log) == 1


def _tls_files(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[FaultServer, str, Path]]:
    cert, key = _tls_files(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = FaultServer()
    server.httpd.socket = context.wrap_socket(server.httpd.socket, server_side=True)
    with server:
        yield server, f"https://127.0.0.1:{server.port}/files", cert


def test_https_proxy_and_ca_bundle_are_honoured(
    tmp_path: Path,
    ctx: Context,
    clean_proxy_env: pytest.MonkeyPatch,
    tls_server: tuple[FaultServer, str, Path],
) -> None:
    server, base_url, cert = tls_server
    with Proxy() as proxy:
        name, blob = _set(tmp_path, base_url)
        server.files[name] = blob
        clean_proxy_env.setenv("HTTPS_PROXY", f"http://{proxy.netloc}")
        clean_proxy_env.setenv("https_proxy", f"http://{proxy.netloc}")
        clean_proxy_env.setenv("REQUESTS_CA_BUNDLE", str(cert))
        published = _provision(ctx, tmp_path)
        assert published.read_bytes() == blob
        assert [(s.method, s.path) for s in proxy.seen] == [("CONNECT", f"127.0.0.1:{server.port}")]
        assert len(server.log) == 1


def test_untrusted_certificate_is_an_integrity_error(
    tmp_path: Path,
    ctx: Context,
    clean_proxy_env: pytest.MonkeyPatch,
    tls_server: tuple[FaultServer, str, Path],
) -> None:
    server, base_url, _cert = tls_server
    name, blob = _set(tmp_path, base_url)
    server.files[name] = blob
    with pytest.raises(IntegrityError, match="TLS certificate not trusted"):
        _provision(ctx, tmp_path)


def test_netrc_credentials_are_not_sent(
    tmp_path: Path, ctx: Context, clean_proxy_env: pytest.MonkeyPatch
) -> None:
    with FaultServer() as server, Proxy() as proxy:  # the proxy shows every header the origin got
        name, blob = _set(tmp_path, server.base_url)
        server.files[name] = blob
        netrc = tmp_path / "netrc"
        netrc.write_text("machine 127.0.0.1 login someone password secret\n")
        netrc.chmod(0o600)
        clean_proxy_env.setenv("NETRC", str(netrc))
        clean_proxy_env.setenv("HTTP_PROXY", f"http://{proxy.netloc}")
        clean_proxy_env.setenv("http_proxy", f"http://{proxy.netloc}")
        assert _provision(ctx, tmp_path).read_bytes() == blob
        assert "Authorization" not in proxy.seen[0].headers


def test_retry_after_is_capped_and_an_unreadable_one_falls_back_to_the_backoff(
    tmp_path: Path, ctx: Context, clean_proxy_env: pytest.MonkeyPatch
) -> None:
    from fetch.download import open_session

    with open_session(RetryPolicy(max_retry_after_s=2.0)) as session:
        retry = session.get_adapter("http://127.0.0.1/").max_retries
        assert retry.parse_retry_after("3600") == 2 and retry.parse_retry_after("soon") == 0.0
    with FaultServer() as server:
        name, blob = _set(tmp_path, server.base_url)
        server.files[name] = blob
        server.faults.status, server.faults.status_times = 503, 1
        server.faults.status_headers = {"Retry-After": "soon"}
        assert _provision(ctx, tmp_path).read_bytes() == blob
        assert [s.status for s in server.log] == [503, 206]
