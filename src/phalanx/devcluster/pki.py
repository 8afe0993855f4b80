"""Certificates and keys of the local control plane: one CA, serving and client certificates.

Every identity is a client certificate signed by the cluster CA, so RBAC sees real users:
``admin`` in ``system:masters``, and the controller-manager and scheduler under their
``system:`` names that the default RBAC bootstrap policy already grants. One serving
certificate (loopback names, the in-cluster service names and the service IP) serves the API
server, the controller-manager and the scheduler, so their health endpoints are verified
against the same CA. ECDSA P-256 keys keep generation fast. Existing files are reused, so a
restart keeps every kubeconfig valid.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_CA_DAYS = 3650
_LEAF_DAYS = 825


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class ClientIdentity:
    """A client certificate's subject: CN is the user name, O the groups."""

    name: str
    common_name: str
    organizations: tuple[str, ...] = ()


# The identities a devcluster issues, by file name.
CLIENTS = (
    ClientIdentity("admin", "phalanx-admin", ("system:masters",)),
    ClientIdentity("controller-manager", "system:kube-controller-manager"),
    ClientIdentity("scheduler", "system:kube-scheduler"),
    # KWOK plays every kubelet; it is bound to a ClusterRole at start-up (see cluster.py).
    ClientIdentity("kwok", "phalanx:kwok"),
    # The API server's identity when proxying to aggregated APIs (requestheader auth).
    ClientIdentity("front-proxy-client", "front-proxy-client"),
)


@dataclass(frozen=True)
class Pki:
    ca: CertPair
    serving: CertPair
    clients: dict[str, CertPair]
    service_account_key: Path
    service_account_pub: Path


def _write_private(path: Path, data: bytes) -> None:
    # Keys are written 0600 from the start, never world-readable even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path} is not an EC private key; delete the state dir's pki/")
    return key


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)


def _ensure_ca(pki_dir: Path) -> tuple[CertPair, x509.Certificate, ec.EllipticCurvePrivateKey]:
    pair = CertPair(pki_dir / "ca.crt", pki_dir / "ca.key")
    if pair.cert.is_file() and pair.key.is_file():
        cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
        return pair, cert, _load_key(pair.key)
    key = _new_key()
    name = _name("phalanx-devcluster-ca")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + dt.timedelta(days=_CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(pair.key, _key_pem(key))
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return pair, cert, key


def _issue(
    *,
    pair: CertPair,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName] | None = None,
) -> None:
    if pair.cert.is_file() and pair.key.is_file():
        return
    key = _new_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + dt.timedelta(days=_LEAF_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_private(pair.key, _key_pem(key))
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def serving_sans(service_ip: str) -> list[x509.GeneralName]:
    names = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    ips = ["127.0.0.1", service_ip]
    return [x509.DNSName(n) for n in names] + [
        x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips
    ]


def ensure_pki(pki_dir: Path, *, service_ip: str) -> Pki:
    """Create (or reuse) every certificate and key of the cluster under ``pki_dir``."""
    pki_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(pki_dir, 0o700)
    ca, ca_cert, ca_key = _ensure_ca(pki_dir)
    serving = CertPair(pki_dir / "serving.crt", pki_dir / "serving.key")
    _issue(
        pair=serving,
        ca_cert=ca_cert,
        ca_key=ca_key,
        subject=_name("kube-apiserver"),
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=serving_sans(service_ip),
    )
    clients: dict[str, CertPair] = {}
    for ident in CLIENTS:
        pair = CertPair(pki_dir / f"{ident.name}.crt", pki_dir / f"{ident.name}.key")
        _issue(
            pair=pair,
            ca_cert=ca_cert,
            ca_key=ca_key,
            subject=_name(ident.common_name, ident.organizations),
            usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        )
        clients[ident.name] = pair
    sa_key = pki_dir / "service-account.key"
    sa_pub = pki_dir / "service-account.pub"
    if not (sa_key.is_file() and sa_pub.is_file()):
        key = _new_key()
        _write_private(sa_key, _key_pem(key))
        sa_pub.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return Pki(
        ca=ca,
        serving=serving,
        clients=clients,
        service_account_key=sa_key,
        service_account_pub=sa_pub,
    )
