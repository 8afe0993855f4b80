"""The operator's webhook configurations carry the manifests' settings (fail closed, 10 s,
kube-system and the operator's namespace left out), whichever way it runs: in a pod, beside
the cluster, or with a phalanx-config selector. Checked on what kopf's configuration manager
builds (``kopf._core.engines.admission.build_webhooks``, as it looks it up when it
reconfigures); the manifests themselves are compared in test_operator_manifests.py."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import kopf
import pytest
from kopf._cogs.structs import references
from kopf._core.engines import admission

from phalanx.cli import operator_cmd
from phalanx.operator import webhook_policy
from phalanx.operator.configfile import ConfigFile, parse
from phalanx.operator.webhooks import register_webhooks

JOBS = references.Resource("batch", "v1", "jobs", kind="Job", namespaced=True)
URL = {"url": "https://127.0.0.1:9443"}


def _built(name: str, *, persistent_only: bool = False) -> list[dict[str, Any]]:
    registry = kopf.OperatorRegistry()
    register_webhooks(registry, validator=lambda obj: [], persistent=True)
    return list(
        admission.build_webhooks(
            registry._webhooks.get_all_handlers(),
            resources=[JOBS],
            name_suffix=name,
            client_config=URL,
            persistent_only=persistent_only,
        )
    )


def _excluded(webhook: dict[str, Any]) -> list[str]:
    (expression,) = webhook["namespaceSelector"]["matchExpressions"]
    assert expression["key"] == "kubernetes.io/metadata.name"
    assert expression["operator"] == "NotIn"
    return list(expression["values"])


def test_kopf_still_builds_its_configurations_through_the_wrapped_function():
    # If a kopf release stops, install() refuses to start; this says so before a release does.
    assert "build_webhooks" in admission.configuration_manager.__code__.co_names


def test_an_installed_policy_is_on_every_webhook_kopf_builds_and_on_what_it_leaves():
    policy = webhook_policy.WebhookPolicy(
        timeout_seconds=7,
        namespace_selector=webhook_policy.default_namespace_selector("batch-system"),
    )
    webhook_policy.install("policy-test.example.com", policy)
    for persistent_only in (False, True):
        webhooks = _built("policy-test.example.com", persistent_only=persistent_only)
        assert webhooks
        for webhook in webhooks:
            assert webhook["failurePolicy"] == "Fail"
            assert webhook["timeoutSeconds"] == 7
            assert _excluded(webhook) == ["kube-system", "batch-system"]


def test_another_configuration_is_left_as_kopf_builds_it():
    webhook_policy.install("policy-test.example.com", webhook_policy.WebhookPolicy())
    (webhook, *_) = _built("someone-else.example.com")
    assert webhook["timeoutSeconds"] == 30
    assert "namespaceSelector" not in webhook


@pytest.mark.parametrize("seconds", [0, 11, 30])
def test_a_timeout_outside_one_to_ten_seconds_is_refused(seconds: int):
    with pytest.raises(ValueError, match="--webhook-timeout-seconds"):
        webhook_policy.WebhookPolicy(timeout_seconds=seconds)
    with pytest.raises(argparse.ArgumentTypeError, match="between 1 and 10"):
        operator_cmd._webhook_timeout(str(seconds))


# -- which namespace is the operator's -------------------------------------------------------


def _own(tmp_path: Path, *, env: dict[str, str], file: str | None, service: str | None) -> Any:
    if file is not None:
        (tmp_path / "namespace").write_text(file)
    return webhook_policy.operator_namespace(env=env, service_account_dir=tmp_path, service=service)


def test_in_a_pod_the_downward_api_then_the_service_account_names_it(tmp_path: Path):
    assert _own(tmp_path, env={"POD_NAMESPACE": "a"}, file="b", service="c/x") == "a"
    assert _own(tmp_path, env={}, file="b\n", service="c/x") == "b"


def test_behind_a_service_without_a_pod_its_namespace_is_the_services(tmp_path: Path):
    assert _own(tmp_path, env={}, file=None, service="c/phalanx-webhook") == "c"


def test_beside_the_cluster_only_kube_system_is_left_out(tmp_path: Path):
    assert _own(tmp_path, env={}, file=None, service=None) is None
    selector = webhook_policy.default_namespace_selector(None)
    assert selector["matchExpressions"][0]["values"] == ["kube-system"]
    assert webhook_policy.default_namespace_selector("kube-system") == selector


def _selector(argv: list[str], settings: ConfigFile) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    operator_cmd.register(parser.add_subparsers())
    return operator_cmd.webhook_namespace_selector(parser.parse_args(argv), settings)


def test_the_config_files_selector_wins_as_the_chart_ships_it_in_both_places(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("POD_NAMESPACE", "phalanx-system")
    chosen = {"matchLabels": {"queues": "on"}}
    settings = parse(
        {
            "apiVersion": "config.kueue.x-k8s.io/v1beta1",
            "kind": "Configuration",
            "managedJobsNamespaceSelector": chosen,
        }
    )
    assert _selector(["operator"], settings) == chosen
    assert _selector(["operator"], ConfigFile())["matchExpressions"][0]["values"] == [
        "kube-system",
        "phalanx-system",
    ]
