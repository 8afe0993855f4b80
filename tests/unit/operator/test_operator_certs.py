"""Webhook certificates: made once, reused, and checked against the names they must cover."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from cryptography import x509

from phalanx.operator import certs as certs_module
from phalanx.operator.certs import ensure_webhook_certs


def _sans(path: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(v) for v in san.get_values_for_type(x509.DNSName)} | {
        str(v) for v in san.get_values_for_type(x509.IPAddress)
    }


def test_certificates_are_made_signed_by_the_ca_and_reused(tmp_path: Path) -> None:
    certs = ensure_webhook_certs(tmp_path / "c", hosts=["127.0.0.1", "webhook.ns.svc"])
    assert _sans(certs.cert_file) == {str(ipaddress.ip_address("127.0.0.1")), "webhook.ns.svc"}
    ca = x509.load_pem_x509_certificate(certs.ca_file.read_bytes())
    leaf = x509.load_pem_x509_certificate(certs.cert_file.read_bytes())
    leaf.verify_directly_issued_by(ca)
    before = certs.cert_file.read_bytes()
    again = ensure_webhook_certs(tmp_path / "c", hosts=["127.0.0.1"])
    assert again.cert_file.read_bytes() == before, "a valid certificate must be reused"
    ensure_webhook_certs(tmp_path / "c", hosts=["other.ns.svc"])
    assert "other.ns.svc" in _sans(certs.cert_file), "a new name needs a new certificate"


def test_a_read_only_folder_with_the_wrong_certificate_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "secret"
    ensure_webhook_certs(folder, hosts=["a.ns.svc"])
    # A mounted Secret: os.access reports it read-only (chmod cannot show that to root).
    monkeypatch.setattr(certs_module.os, "access", lambda path, mode: False)
    assert ensure_webhook_certs(folder, hosts=["a.ns.svc"]).cert_file.exists()
    with pytest.raises(OSError, match=r"read-only; mount a Secret"):
        ensure_webhook_certs(folder, hosts=["b.ns.svc"])
