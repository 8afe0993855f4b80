"""A private CA and a serving certificate for the operator's webhook server.

The API server only calls webhooks over TLS and verifies them against the ``caBundle`` of the
webhook configuration. On a local control plane there is no cert-manager, so the operator makes
its own CA on first start and keeps it in a folder: a restart reuses it, so webhook
configurations that the API server has cached stay valid.
(kopf can self-sign too, but only through the optional ``certbuilder``/``oscrypto`` packages,
which do not load on OpenSSL 3; ``cryptography`` is already a dependency.)
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["WebhookCerts", "ensure_webhook_certs"]

_VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class WebhookCerts:
    ca_file: Path
    cert_file: Path
    key_file: Path

    @property
    def ca_data(self) -> bytes:
        return self.ca_file.read_bytes()


def ensure_webhook_certs(directory: Path, *, hosts: Sequence[str]) -> WebhookCerts:
    """Reuse the certificates in ``directory`` when they cover ``hosts`` and are not about to
    expire; otherwise write a new CA and serving certificate there."""
    certs = WebhookCerts(
        ca_file=directory / "ca.crt",
        cert_file=directory / "tls.crt",
        key_file=directory / "tls.key",
    )
    if _still_valid(certs, hosts):
        return certs
    if directory.exists() and not os.access(directory, os.W_OK):
        raise OSError(
            f"{directory}: the webhook certificate there is missing, expired or not valid for "
            f"{', '.join(hosts)}, and the folder is read-only; mount a Secret with ca.crt, "
            "tls.crt and tls.key for those names (docs/operator.md)"
        )
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "phalanx-webhook-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
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
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.SubjectAlternativeName(_sans(hosts)), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    certs.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    certs.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    certs.key_file.touch(mode=0o600)
    certs.key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return certs


def _sans(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _still_valid(certs: WebhookCerts, hosts: Sequence[str]) -> bool:
    if not (certs.ca_file.exists() and certs.cert_file.exists() and certs.key_file.exists()):
        return False
    try:
        cert = x509.load_pem_x509_certificate(certs.cert_file.read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    if cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC) < datetime.timedelta(days=7):
        return False
    return set(_sans(hosts)) <= set(san)
