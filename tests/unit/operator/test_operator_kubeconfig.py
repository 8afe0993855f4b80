"""Resolving credentials from kubeconfig files."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from phalanx.operator.kubeconfig import KubeconfigError, load_kubeconfig


def _write(tmp_path: Path, user: dict[str, object], **cluster: object) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "dev",
        "contexts": [{"name": "dev", "context": {"cluster": "c", "user": "u", "namespace": "ns1"}}],
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443/", **cluster}}],
        "users": [{"name": "u", "user": user}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def test_inline_data_and_token(tmp_path: Path) -> None:
    ca = b"-----BEGIN CERTIFICATE-----\nxx\n-----END CERTIFICATE-----\n"
    path = _write(
        tmp_path,
        {"token": "secret"},
        **{"certificate-authority-data": base64.b64encode(ca).decode()},
    )
    auth = load_kubeconfig(path)
    assert auth.server == "https://127.0.0.1:6443"
    assert auth.ca_data == ca
    assert auth.headers() == {"Authorization": "Bearer secret"}
    assert auth.default_namespace == "ns1"


def test_files_are_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "client.crt").write_bytes(b"CERT")
    (tmp_path / "client.key").write_bytes(b"KEY")
    path = _write(tmp_path, {"client-certificate": "client.crt", "client-key": "client.key"})
    auth = load_kubeconfig(path)
    assert auth.client_cert_data == b"CERT"
    assert auth.client_key_data == b"KEY"
    assert auth.headers() == {}


def test_missing_context_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, {"token": "t"})
    with pytest.raises(KubeconfigError, match="'other'"):
        load_kubeconfig(path, context="other")


def test_token_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("abc\n")
    path = _write(tmp_path, {"tokenFile": "tok"})
    assert load_kubeconfig(path).bearer_token() == "abc"
