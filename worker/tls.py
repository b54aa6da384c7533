"""Mutual TLS for the workers' ports (issue 43): the three files each end of a channel presents, the
gRPC credentials made of them, and certificate fingerprints, the pins a placement file names.  Standard
library and gRPC only (every client imports this); making a CA and keys is worker.tls_ca's.

A host's folder holds what a worker's ``--tls DIR`` (and the certifier's) reads: ``cert.pem`` (its
certificate, for server and client use: a worker answers the driver and calls its neighbours), ``key.pem``
(its private key, mode 0600) and ``ca.pem`` (the CA every peer's certificate must chain to).
"""

from __future__ import annotations

import hashlib
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from core.errors import ConfigurationError, RuntimeFailure

CERT, KEY, CA = "cert.pem", "key.pem", "ca.pem"  # a host's folder (what --tls DIR reads)


@dataclass(frozen=True, kw_only=True)
class Identity:
    """The files one end of a channel presents: its certificate, its key and the CA it trusts."""

    cert: Path
    key: Path
    ca: Path

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.cert.read_bytes())

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(CA, key, certificate) PEM bytes, the order gRPC's credential constructors take them in."""
        return self.ca.read_bytes(), self.key.read_bytes(), self.cert.read_bytes()


def fingerprint(pem: bytes) -> str:
    """``sha256:HEX`` of a PEM certificate's DER encoding (what `openssl x509 -fingerprint -sha256`
    prints, without the colons): the pin a placement file names."""
    return _der_fingerprint(ssl.PEM_cert_to_DER_cert(pem.decode("ascii")))


def _der_fingerprint(der: bytes) -> str:
    return "sha256:" + hashlib.sha256(der).hexdigest()


def load(folder: Path) -> Identity:
    """A host's folder as an Identity; a missing file is one line naming it."""
    found = Identity(cert=folder / CERT, key=folder / KEY, ca=folder / CA)
    for path in (found.cert, found.key, found.ca):
        if not path.is_file():
            raise ConfigurationError(f"TLS folder {folder}: no {path.name} (`dgr tls` makes one)")
    return found


def channel_credentials(identity: Identity) -> grpc.ChannelCredentials:
    """A client's side of mutual TLS: the peer must chain to the identity's CA, and this end presents
    its own certificate."""
    ca, key, cert = identity.read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def server_credentials(identity: Identity) -> grpc.ServerCredentials:
    """A server's side of mutual TLS: a client without a certificate chaining to the CA is refused in the
    handshake, before any call reaches a handler."""
    ca, key, cert = identity.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


def presented_fingerprint(address: str, identity: Identity, *, timeout: float = 10.0) -> str:
    """The fingerprint of the certificate the server at ``address`` presents in a mutual TLS handshake
    with ``identity`` (its name checked against the address, its chain against the identity's CA, as the
    gRPC channel will): the pin a placement file names is held to it before any call is trusted.
    RuntimeFailure naming the address when there is no such handshake (refused, another CA, not TLS)."""
    host, _, port = address.rpartition(":")
    bare = host.strip("[]")
    context = client_context(identity)
    context.set_alpn_protocols(["h2"])  # what a gRPC server speaks
    try:
        with socket.create_connection((bare, int(port)), timeout=timeout) as raw:
            with context.wrap_socket(raw, server_hostname=bare) as tls_socket:
                der = tls_socket.getpeercert(binary_form=True)
    except (OSError, ValueError) as exc:
        raise RuntimeFailure(f"no mutual TLS handshake with {address}: {exc}") from None
    if der is None:
        raise RuntimeFailure(f"{address} presented no certificate in its TLS handshake")
    return _der_fingerprint(der)


def client_context(identity: Identity) -> ssl.SSLContext:
    """The dialing side of mutual TLS on a raw TCP connection: TLS 1.3, the peer's chain checked against
    the identity's CA and its name against the address dialed, this end's certificate presented."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_verify_locations(cafile=str(identity.ca))
    context.load_cert_chain(str(identity.cert), str(identity.key))
    return context


def server_context(identity: Identity) -> ssl.SSLContext:
    """The accepting side of mutual TLS on a raw TCP port of the driver's (the ring's delivery port), as
    the workers' own raw ports are: TLS 1.3, a client certificate of the identity's CA required."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(str(identity.cert), str(identity.key))
    context.load_verify_locations(cafile=str(identity.ca))
    context.verify_mode = ssl.CERT_REQUIRED
    return context
