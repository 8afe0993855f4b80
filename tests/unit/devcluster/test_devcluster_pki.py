"""The devcluster's certificates: one CA, the right identities and names, reused on restart;
and the API server's flags that depend on them."""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from phalanx.devcluster import components
from phalanx.devcluster.kubeconfig import write_kubeconfig, write_private_yaml
from phalanx.devcluster.pki import ensure_pki


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _verify(cert: x509.Certificate, ca: x509.Certificate) -> None:
    public = ca.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert cert.signature_hash_algorithm is not None
    public.verify(
        cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
    )


def test_devcluster_certificates_chain_to_the_ca_with_the_right_subjects(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki", service_ip="10.96.0.1")
    ca = _load(pki.ca.cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    serving = _load(pki.serving.cert)
    _verify(serving, ca)
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "kubernetes.default.svc"} <= set(sans.get_values_for_type(x509.DNSName))
    assert set(sans.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("10.96.0.1"),
    }
    eku = serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku

    def subject(name: str) -> tuple[str, list[str]]:
        cert = _load(pki.clients[name].cert)
        _verify(cert, ca)
        cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        orgs = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
        return str(cn), [str(o) for o in orgs]

    assert subject("admin")[1] == ["system:masters"]
    assert subject("controller-manager") == ("system:kube-controller-manager", [])
    assert subject("scheduler") == ("system:kube-scheduler", [])
    assert subject("kwok")[1] == []  # no group shortcut: bound to a role explicitly


def test_devcluster_keys_are_private_and_reused(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki", service_ip="10.96.0.1")
    for key in (pki.ca.key, pki.serving.key, pki.service_account_key, pki.clients["admin"].key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    before = {p: p.read_bytes() for p in (tmp_path / "pki").iterdir()}
    ensure_pki(tmp_path / "pki", service_ip="10.96.0.1")
    assert {p: p.read_bytes() for p in (tmp_path / "pki").iterdir()} == before


def test_devcluster_kubeconfig_embeds_credentials(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki", service_ip="10.96.0.1")
    path = write_kubeconfig(
        tmp_path / "admin.yaml",
        server="https://127.0.0.1:16443",
        ca_cert=pki.ca.cert,
        client=pki.clients["admin"],
        user="admin",
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    doc = yaml.safe_load(path.read_text())
    assert doc["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:16443"
    assert doc["users"][0]["user"]["client-key-data"]
    assert doc["current-context"] == "admin@phalanx-dev"


def test_a_secret_file_is_never_readable_by_others_not_even_while_written(
    tmp_path: Path,
) -> None:
    # Catches a write-then-chmod (the file exists under the umask first) and a rewrite that
    # keeps an earlier file's looser mode. The umask here lets everybody read a new file.
    path = tmp_path / "token.yaml"
    path.write_text("old: secret\n")
    path.chmod(0o644)
    leftover = tmp_path / ".token.yaml.tmp"
    leftover.write_text("half")
    leftover.chmod(0o666)
    modes: list[int] = []
    real_fdopen = os.fdopen

    def fdopen(fd: int, *args: object, **kwargs: object) -> object:
        modes.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real_fdopen(fd, *args, **kwargs)  # type: ignore[call-overload]

    old_umask = os.umask(0)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(os, "fdopen", fdopen)
            write_private_yaml(path, {"token": "t"})
    finally:
        os.umask(old_umask)
    assert modes == [0o600], "created 0600 before a byte of it is written"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert yaml.safe_load(path.read_text()) == {"token": "t"}
    assert not leftover.exists()


def test_the_api_server_serves_pprof_only_when_asked(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki", service_ip="10.96.0.1")
    layout = components.Layout(tmp_path)

    def apiserver(**kwargs: bool) -> list[str]:
        return components.argv(
            "kube-apiserver",
            bin_dir=tmp_path / "bin",
            layout=layout,
            ports=components.DEFAULT_PORTS,
            pki=pki,
            **kwargs,
        )

    assert "--profiling=false" in apiserver()
    assert "--profiling=true" in apiserver(profiling=True)
    assert "--profiling=true" not in apiserver()


def _flag(argv: list[str], name: str) -> str:
    values = [arg.split("=", 1)[1] for arg in argv if arg.startswith(f"--{name}=")]
    assert len(values) == 1, f"--{name} given {len(values)} times"
    return values[0]


def test_a_kwok_node_is_never_lost_between_two_lease_renewals(tmp_path: Path) -> None:
    """KWOK renews each Lease every quarter of its duration; the node lifecycle controller
    must wait longer than two renewals, or every KWOK node would flap to NotReady."""
    pki = ensure_pki(tmp_path / "pki", service_ip="10.96.0.1")
    layout = components.Layout(tmp_path)

    def argv(component: str) -> list[str]:
        return components.argv(
            component,
            bin_dir=tmp_path / "bin",
            layout=layout,
            ports=components.DEFAULT_PORTS,
            pki=pki,
        )

    lease_s = int(_flag(argv("kwok"), "node-lease-duration-seconds"))
    grace = _flag(argv("kube-controller-manager"), "node-monitor-grace-period")
    assert grace.endswith("m"), grace
    grace_s = int(grace[:-1]) * 60
    renewal_s = lease_s / 4
    assert grace_s >= 2 * renewal_s, (grace_s, renewal_s)
    # One renewal per node every 5 minutes at most: 640 nodes cost ~2 writes a second.
    assert renewal_s >= 300
