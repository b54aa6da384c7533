"""Signing and trusted keys (Ed25519).

Signing: ``DGR_SIGNING_KEY`` names a PEM private key; without it a per-workspace dev key is created
(0600) under ``.work/keys`` and every certificate it signs says ``dev_key: true``.
Trust: ``verify`` accepts the public keys in ``manifests/keys/*.pem`` and any ``--key PEM`` given on
the command line; the workspace dev key is accepted too but reported as not trusted for publication.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from core.canonical import atomic_write_bytes, read_bounded
from core.errors import ConfigurationError, IntegrityError
from core.workspace import MANIFESTS, Workspace, refuse_links_below

TRUSTED_KEYS = MANIFESTS / "keys"
DEV_KEY_NAME = "dev-ed25519.pem"
DEV_PUBLIC_NAME = "dev-ed25519.pub.pem"  # what `verify` trusts on this machine (as a dev key)
MAX_PEM_BYTES = 64 << 10  # an Ed25519 PEM key is under 200 bytes; a key file is read bounded


def keyid(public: Ed25519PublicKey) -> str:
    """sha256 of the raw 32-byte public key, hex: stable across PEM formatting."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def public_pem(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@dataclass(frozen=True, kw_only=True)
class SigningKey:
    private: Ed25519PrivateKey
    keyid: str
    dev_key: bool
    path: Path  # the private key file (never copied into a certificate)
    public_path: Path | None

    def sign(self, message: bytes) -> bytes:
        return self.private.sign(message)


@dataclass(frozen=True, kw_only=True)
class TrustedKey:
    public: Ed25519PublicKey
    keyid: str
    source: str
    dev_key: bool = False

    def verifies(self, signature: bytes, message: bytes) -> bool:
        try:
            self.public.verify(signature, message)
        except InvalidSignature:
            return False
        return True


def _load_private(path: Path) -> Ed25519PrivateKey:
    try:
        data = read_bounded(path, max_bytes=MAX_PEM_BYTES, error=ConfigurationError)
    except OSError as exc:
        raise ConfigurationError(
            f"signing key {path} is not readable: {exc.strerror}",
            hint="DGR_SIGNING_KEY must name an Ed25519 PEM private key",
        ) from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"signing key {path} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigurationError(f"signing key {path} is not an Ed25519 key")
    return key


def load_public(path: Path) -> Ed25519PublicKey:
    try:
        data = read_bounded(path, max_bytes=MAX_PEM_BYTES, error=ConfigurationError)
    except OSError as exc:
        raise ConfigurationError(f"public key {path} is not readable: {exc.strerror}") from None
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"{path} is not a PEM public key: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigurationError(f"{path} is not an Ed25519 public key")
    return key


def signing_key(env: Mapping[str, str], ws: Workspace) -> SigningKey:
    explicit = env.get("DGR_SIGNING_KEY")
    if explicit:
        path = Path(explicit)
        key = _load_private(path)
        return SigningKey(
            private=key, keyid=keyid(key.public_key()), dev_key=False, path=path, public_path=None
        )
    return dev_key(ws)


def dev_key(ws: Workspace) -> SigningKey:
    """The workspace dev key, created on first use with owner-only permissions."""
    ws.ensure(ws.keys)
    path = ws.keys / DEV_KEY_NAME
    pub_path = ws.keys / DEV_PUBLIC_NAME
    refuse_links_below(ws.root, path)
    if path.is_file() and not path.is_symlink() and path.stat().st_size == 0:
        # left by an older dgr killed between creating and writing the key: it never signed anything
        path.unlink(missing_ok=True)
    if not path.exists():
        _create_dev_key(path)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise IntegrityError(
            f"dev signing key {path} is readable by others (mode {mode:o})", hint=f"chmod 600 {path}"
        )
    key = _load_private(path)
    pem_pub = public_pem(key.public_key())
    if not pub_path.exists() or pub_path.read_bytes() != pem_pub:
        atomic_write_bytes(pub_path, pem_pub)
    return SigningKey(
        private=key, keyid=keyid(key.public_key()), dev_key=True, path=path, public_path=pub_path
    )


def _create_dev_key(path: Path) -> None:
    """Write a new key to a temp file, then link it into place: the key file is whole or absent, and of
    two concurrent first runs the one whose link lands wins; the other reads the winner's key."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # never replaces: a key that may have signed certificates stays
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


def trusted_keys(
    extra: Iterable[Path] = (), *, ws: Workspace | None = None, directory: Path = TRUSTED_KEYS
) -> dict[str, TrustedKey]:
    """keyid -> key: the project's trusted keys, keys named on the command line, the workspace dev key."""
    found: dict[str, TrustedKey] = {}
    if directory.is_dir():
        for pem in sorted(directory.glob("*.pem")):
            pub = load_public(pem)
            found[keyid(pub)] = TrustedKey(public=pub, keyid=keyid(pub), source=str(pem))
    for pem in extra:
        pem = Path(pem)
        try:
            pub = load_public(pem)
        except ConfigurationError:
            # A private key given by mistake still names its public half unambiguously.
            pub = _load_private(pem).public_key()
        found[keyid(pub)] = TrustedKey(public=pub, keyid=keyid(pub), source=f"--key {pem}")
    if ws is not None:
        dev_pub = ws.keys / DEV_PUBLIC_NAME
        if dev_pub.is_file() and not dev_pub.is_symlink():
            pub = load_public(dev_pub)
            found.setdefault(
                keyid(pub), TrustedKey(public=pub, keyid=keyid(pub), source=str(dev_pub), dev_key=True)
            )
    return found
