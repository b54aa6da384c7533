"""What the TLS tests share: a client context that trusts a test CA, with or without a certificate of its
own (the ``ca`` fixture, tests/conftest.py, makes the CA and its loopback identities)."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

from worker import tls


def trusting_client(ca: Path, identity: tls.Identity | None) -> ssl.SSLContext:
    """Trusts ``ca``'s certificate, so only this end's side (its certificate, or none) can fail."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=str(ca / tls.CA))
    if identity is not None:
        context.load_cert_chain(str(identity.cert), str(identity.key))
    return context


def untrusted_clients(ca: Path, scratch: Path, name: str = "driver") -> dict[str, ssl.SSLContext]:
    """The clients a port of ``ca``'s identities must refuse, each trusting ``ca``: one without a
    certificate, one with a certificate ``name`` of another CA (made in ``scratch``), and one with an
    expired certificate of ``ca`` itself."""
    from worker import tls_ca

    tls_ca.ensure_ca(scratch / "other")
    ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=3)
    return {
        "no certificate": trusting_client(ca, None),
        "another CA": trusting_client(ca, tls_ca.issue(scratch / "other", name, names=["127.0.0.1"])),
        "expired": trusting_client(
            ca, tls_ca.issue(ca, "expired", names=["127.0.0.1"], days=1, valid_from=ago)
        ),
    }
