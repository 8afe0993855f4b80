"""The benchmark operator's kubeconfig: the admin's cluster, the ServiceAccount's token."""

from __future__ import annotations

import pytest

from phalanx.bench.identity import with_token

ADMIN = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [
        {
            "name": "phalanx-dev",
            "cluster": {"server": "https://127.0.0.1:16443", "certificate-authority-data": "Q0E="},
        }
    ],
    "users": [
        {"name": "admin", "user": {"client-certificate-data": "Qw==", "client-key-data": "Sw=="}}
    ],
    "contexts": [
        {"name": "admin@phalanx-dev", "context": {"cluster": "phalanx-dev", "user": "admin"}}
    ],
    "current-context": "admin@phalanx-dev",
}


def test_the_current_context_authenticates_by_the_token_alone() -> None:
    config = with_token(ADMIN, "tok", "phalanx-bench-operator")
    assert config["clusters"] == ADMIN["clusters"]
    assert config["users"] == [{"name": "phalanx-bench-operator", "user": {"token": "tok"}}]
    assert config["contexts"][0]["context"] == {
        "cluster": "phalanx-dev",
        "user": "phalanx-bench-operator",
    }
    # The admin's certificate is not carried over, and the admin's file is untouched.
    assert "client-key-data" not in str(config)
    assert ADMIN["contexts"][0]["context"]["user"] == "admin"


def test_a_kubeconfig_without_its_current_context_is_refused() -> None:
    broken = {**ADMIN, "current-context": "elsewhere"}
    with pytest.raises(ValueError, match="elsewhere"):
        with_token(broken, "tok", "phalanx-bench-operator")
