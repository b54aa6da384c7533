"""A small CA and per-host TLS identities for an operator who has none (`dgr tls`, issue 43), made by
``cryptography``: nothing of X.509 or ASN.1 is written by hand here.  Each identity lands in the CA
folder's ``hosts/NAME`` in the layout worker.tls reads (``--tls DIR``)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from core.errors import ConfigurationError
from worker.tls import CA, CERT, KEY, Identity, load

CA_KEY = "ca.key"  # beside ca.pem in the CA's own folder, never copied into a host's
HOSTS = "hosts"  # the CA folder's sub-folder of issued identities, one per name
DEFAULT_DAYS = 365
# A certificate starts being valid a little before it is made: clocks of the hosts differ.
CLOCK_SKEW = datetime.timedelta(minutes=5)


def ensure_ca(folder: Path, *, name: str = "dgr-certify CA", days: int = 10 * DEFAULT_DAYS) -> Path:
    """The CA in ``folder`` (ca.pem, ca.key), made when absent and kept when present: issuing another
    host later must not replace the CA every running worker trusts."""
    cert_path, key_path = folder / CA, folder / CA_KEY
    if cert_path.is_file() and key_path.is_file():
        return cert_path
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path


def issue(
    ca_folder: Path,
    host: str,
    *,
    names: Sequence[str] = (),
    days: int = DEFAULT_DAYS,
    valid_from: datetime.datetime | None = None,
) -> Identity:
    """A key and certificate for ``host`` (and ``names``: DNS names or IP addresses it is reached by),
    signed by the CA in ``ca_folder``, in ``ca_folder/hosts/HOST``; ``days`` from ``valid_from`` (now)."""
    ca_cert = x509.load_pem_x509_certificate((ca_folder / CA).read_bytes())
    ca_key = serialization.load_pem_private_key((ca_folder / CA_KEY).read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ConfigurationError(f"{ca_folder / CA_KEY}: not the EC key `dgr tls` makes")
    start = valid_from or datetime.datetime.now(datetime.UTC) - CLOCK_SKEW
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(
            x509.SubjectAlternativeName([_general_name(n) for n in dict.fromkeys((host, *names))]), False
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(ca=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    folder = ca_folder / HOSTS / host
    folder.mkdir(parents=True, exist_ok=True)
    _write_private(folder / KEY, key)
    (folder / CERT).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / CA).write_bytes((ca_folder / CA).read_bytes())
    return load(folder)


def _usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _write_private(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """The key in PKCS#8 PEM, readable by its owner only from the moment it exists."""
    raw = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file that existed keeps its mode through O_CREAT
    with os.fdopen(fd, "wb") as out:
        out.write(raw)


LOOPBACK = ("127.0.0.1", "localhost")


def loopback(folder: Path) -> tuple[Path, Identity]:
    """A CA in ``folder`` and the two identities a run on one machine uses: the workers' folder (their
    --tls) and the driver's identity (its sink serves the workers on loopback too), both for LOOPBACK."""
    ensure_ca(folder)
    worker = issue(folder, "worker", names=LOOPBACK)
    return worker.cert.parent, issue(folder, "driver", names=LOOPBACK)
