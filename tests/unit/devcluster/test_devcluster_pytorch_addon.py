"""The pytorch addon: the training-operator pinned at the version it names, its own main in the
cache key, only the PyTorchJob CRD, its arguments and its loopback validating webhook."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from phalanx.devcluster import addons, pins
from phalanx.devcluster.components import Layout


def test_the_checkout_pins_the_training_operator_at_the_version_the_addon_names() -> None:
    gomod = (pins.repo_root() / "devcluster" / "pytorch" / "go.mod").read_text()
    assert f"github.com/kubeflow/training-operator {addons.PYTORCH.version}" in gomod
    assert addons.parse_names(["jobset,pytorch"]) == ("jobset", "pytorch")


def test_its_main_keys_the_cache_folder_as_its_go_mod_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PHALANX_CACHE", str(tmp_path / "cache"))
    module = tmp_path / "repo" / "devcluster" / "pytorch"
    module.mkdir(parents=True)
    for name, text in (("go.mod", "module x\n"), ("go.sum", ""), ("main.go", "package main\n")):
        (module / name).write_text(text)
    first = addons.addon_cache(addons.PYTORCH, tmp_path / "repo")
    assert first.key.startswith("pytorch-v1.9.3-")
    (module / "main.go").write_text("package main\n\nfunc main() {}\n")
    assert addons.addon_cache(addons.PYTORCH, tmp_path / "repo").key != first.key


def test_only_the_pytorchjob_crd_is_installed() -> None:
    assert addons.PYTORCH.crd_dir == "manifests/base/crds"
    assert addons.PYTORCH.crd_glob == "kubeflow.org_pytorchjobs.yaml"


def test_it_serves_on_loopback_with_the_devcluster_certificate(tmp_path: Path) -> None:
    launch = addons.Launch(
        layout=Layout(tmp_path),
        folder=tmp_path,
        cert_dir=tmp_path / "certs",
        health_port=1111,
        webhook_port=2222,
    )
    argv = addons.PYTORCH.arguments(launch)
    assert "--webhook-host=127.0.0.1" in argv and "--webhook-port=2222" in argv
    assert f"--cert-dir={tmp_path / 'certs'}" in argv
    assert "--health-probe-bind-address=127.0.0.1:1111" in argv


def test_its_webhook_is_the_pytorchjob_validator_by_loopback_url() -> None:
    (validating,) = addons.pytorch_webhooks(port=4443, ca_bundle=b"CA")
    assert validating["kind"] == "ValidatingWebhookConfiguration"
    (hook,) = validating["webhooks"]
    assert hook["name"] == "validator.pytorchjob.training-operator.kubeflow.org"
    assert hook["clientConfig"] == {
        "url": "https://127.0.0.1:4443/validate-kubeflow-org-v1-pytorchjob",
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    assert hook["rules"] == [
        {
            "apiGroups": ["kubeflow.org"],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["pytorchjobs"],
        }
    ]
