"""Serving certificates for the webhook and metrics servers: made, renewed, reloaded.

The API server only calls webhooks over TLS and verifies them against the ``caBundle`` of the
webhook configuration. Two ways to have a certificate:

- **Self-managed** (a writable folder; the local control plane, or a cluster without
  cert-manager): the operator makes a private CA and a serving certificate there on first start
  and keeps them, so a restart reuses them and cached webhook configurations stay valid. While
  it runs, :func:`renew_if_due` re-issues the serving certificate before it expires (with a third
  of its lifetime left, as cert-manager does), signed by the same CA and for the same key: only
  ``tls.crt`` changes, in one atomic rename, so a reader never sees a certificate without its
  key and the ``caBundle`` stays valid. A CA near its own end (or a folder made before the CA
  key was kept) gets a new CA; the webhook server publishes the new ``caBundle``.
- **Mounted** (a read-only folder: a Secret written by cert-manager or by hand): nothing is
  written; the servers re-read the files when they change (:class:`ReloadingCert`, and kopf's
  webhook server by itself).

(kopf can self-sign too, but only through the optional ``certbuilder``/``oscrypto`` packages,
which do not load on OpenSSL 3; ``cryptography`` is already a dependency.)
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import ipaddress
import logging
import os
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CA_VALIDITY",
    "SERVING_VALIDITY",
    "ReloadingCert",
    "WebhookCerts",
    "ensure_webhook_certs",
    "renew_if_due",
]

logger = logging.getLogger(__name__)

SERVING_VALIDITY = datetime.timedelta(days=90)
CA_VALIDITY = datetime.timedelta(days=3650)
_BACKDATE = datetime.timedelta(minutes=5)

Clock = Callable[[], datetime.datetime]


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True)
class WebhookCerts:
    ca_file: Path
    cert_file: Path
    key_file: Path

    @property
    def ca_key_file(self) -> Path:
        return self.ca_file.with_name("ca.key")

    @property
    def ca_data(self) -> bytes:
        return self.ca_file.read_bytes()

    @classmethod
    def in_folder(cls, directory: Path) -> WebhookCerts:
        return cls(
            ca_file=directory / "ca.crt",
            cert_file=directory / "tls.crt",
            key_file=directory / "tls.key",
        )


def ensure_webhook_certs(
    directory: Path,
    *,
    hosts: Sequence[str],
    validity: datetime.timedelta = SERVING_VALIDITY,
    ca_validity: datetime.timedelta = CA_VALIDITY,
    clock: Clock = _utcnow,
) -> WebhookCerts:
    """Reuse the certificates in ``directory`` when they cover ``hosts`` and are not due for
    renewal; otherwise issue what is missing there (a read-only folder is an error then)."""
    certs = WebhookCerts.in_folder(directory)
    if _serving_ok(certs, hosts, clock()):
        return certs
    if directory.exists() and not os.access(directory, os.W_OK):
        raise OSError(
            f"{directory}: the webhook certificate there is missing, expired or not valid for "
            f"{', '.join(hosts)}, and the folder is read-only; mount a Secret with ca.crt, "
            "tls.crt and tls.key for those names (docs/operator.md)"
        )
    directory.mkdir(parents=True, exist_ok=True)
    _issue(certs, hosts, validity=validity, ca_validity=ca_validity, now=clock())
    return certs


def renew_if_due(
    directory: Path,
    *,
    validity: datetime.timedelta = SERVING_VALIDITY,
    ca_validity: datetime.timedelta = CA_VALIDITY,
    clock: Clock = _utcnow,
) -> bool:
    """Re-issue a self-managed serving certificate, for the names it has, when a third of its
    lifetime (or less) is left. A read-only (mounted) folder is left alone: whoever mounts it
    renews it. Returns whether anything was written."""
    certs = WebhookCerts.in_folder(directory)
    if not os.access(directory, os.W_OK):
        return False
    try:
        cert = x509.load_pem_x509_certificate(certs.cert_file.read_bytes())
    except (OSError, ValueError):
        return False
    if not _due(cert, clock()):
        return False
    hosts = _hosts(cert)
    _issue(certs, hosts, validity=validity, ca_validity=ca_validity, now=clock())
    logger.info(
        "event=certificate_renewed folder=%s hosts=%s not_after=%s",
        directory,
        ",".join(hosts),
        x509.load_pem_x509_certificate(
            certs.cert_file.read_bytes()
        ).not_valid_after_utc.isoformat(),
    )
    return True


def _issue(
    certs: WebhookCerts,
    hosts: Sequence[str],
    *,
    validity: datetime.timedelta,
    ca_validity: datetime.timedelta,
    now: datetime.datetime,
) -> None:
    """Write a serving certificate for ``hosts``; keep the CA and the serving key when they are
    usable, so that only ``tls.crt`` changes (one atomic rename)."""
    ca = _load_ca(certs, now)
    if ca is None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _ca_certificate(ca_key, now=now, validity=ca_validity)
        _write(certs.ca_key_file, _key_pem(ca_key), private=True)
        _write(certs.ca_file, ca_cert.public_bytes(serialization.Encoding.PEM))
    else:
        ca_cert, ca_key = ca
    key = _load_key(certs.key_file)
    if key is None:
        key = ec.generate_private_key(ec.SECP256R1())
        _write(certs.key_file, _key_pem(key), private=True)
    end = min(now + validity, ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(_sans(hosts)), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write(certs.cert_file, cert.public_bytes(serialization.Encoding.PEM))


def _ca_certificate(
    key: ec.EllipticCurvePrivateKey, *, now: datetime.datetime, validity: datetime.timedelta
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "phalanx-webhook-ca")])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )


def _load_ca(
    certs: WebhookCerts, now: datetime.datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    """The CA and its key, if both are there and the CA is not itself due for renewal."""
    try:
        ca_cert = x509.load_pem_x509_certificate(certs.ca_file.read_bytes())
        ca_key = serialization.load_pem_private_key(certs.ca_key_file.read_bytes(), None)
    except (OSError, ValueError):
        return None
    if _due(ca_cert, now) or not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        return None
    return ca_cert, ca_key


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey | None:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), None)
    except (OSError, ValueError):
        return None
    return key if isinstance(key, ec.EllipticCurvePrivateKey) else None


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    """Write beside, then rename: a reader sees the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    os.replace(tmp, path)


def _due(cert: x509.Certificate, now: datetime.datetime) -> bool:
    """A third of the lifetime or less left (cert-manager's default renewBefore)."""
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    return cert.not_valid_after_utc - now <= lifetime / 3


def _sans(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _hosts(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ["localhost"]
    dns = [str(v) for v in san.get_values_for_type(x509.DNSName)]
    ips = [str(v) for v in san.get_values_for_type(x509.IPAddress)]
    # The subject's name first: it is the one the certificate was made for.
    common = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    ordered = [str(c) for c in common if str(c) in dns + ips]
    return ordered + [h for h in dns + ips if h not in ordered] or ["localhost"]


def _serving_ok(certs: WebhookCerts, hosts: Sequence[str], now: datetime.datetime) -> bool:
    if not (certs.ca_file.exists() and certs.cert_file.exists() and certs.key_file.exists()):
        return False
    try:
        cert = x509.load_pem_x509_certificate(certs.cert_file.read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    if not os.access(certs.cert_file.parent, os.W_OK):
        # Mounted: usable until it expires; renewing it is its owner's job.
        if cert.not_valid_after_utc <= now:
            return False
    elif _due(cert, now):
        return False
    return set(_sans(hosts)) <= set(san)


class ReloadingCert:
    """A server-side SSL context whose certificate and key are re-read when the files change.

    New connections get the new certificate; open ones keep theirs. Files are compared by
    content (a mounted Secret's files change through a symlink swap that keeps mtimes), every
    ``interval`` seconds. A half-updated pair that does not load is retried next time."""

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._digest = self._read_digest()
        self.context.load_cert_chain(str(cert_file), str(key_file))
        self.reloads = 0

    def _read_digest(self) -> str:
        hasher = hashlib.sha256()
        for path in (self.cert_file, self.key_file):
            hasher.update(path.read_bytes())
        return hasher.hexdigest()

    def reload_if_changed(self) -> bool:
        try:
            digest = self._read_digest()
            if digest == self._digest:
                return False
            self.context.load_cert_chain(str(self.cert_file), str(self.key_file))
        except (OSError, ssl.SSLError) as error:
            logger.warning(
                "event=certificate_reload_failed cert=%s error=%r action=retry",
                self.cert_file,
                error,
            )
            return False
        self._digest = digest
        self.reloads += 1
        logger.info("event=certificate_reloaded cert=%s", self.cert_file)
        return True

    async def watch(self, *, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.reload_if_changed()
