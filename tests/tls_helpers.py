"""What the TLS tests share: a client context that trusts a test CA, with or without a certificate of its
own (the ``ca`` fixture, tests/conftest.py, makes the CA and its loopback identities)."""

from __future__ import annotations

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
