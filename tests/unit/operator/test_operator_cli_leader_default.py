"""``phalanx operator`` turns leader election on by itself in a pod (in-cluster credentials),
so that a Deployment's replicas, or old and new pods during a rolling update, never run two
schedulers; ``--no-leader-elect`` turns it off, ``--leader-elect`` on anywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from phalanx.cli import operator_cmd
from phalanx.cli.main import build_parser, main
from phalanx.cli.operator_cmd import leader_election_default, leader_election_enabled
from phalanx.operator import kubeconfig

IN_POD = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("a-token\n")
    return path


def test_the_token_path_is_the_one_the_kubeconfig_loader_uses():
    assert kubeconfig._SA_DIR / "token" == operator_cmd.SERVICE_ACCOUNT_TOKEN


def test_default_is_on_in_a_pod_with_its_service_account(token: Path):
    assert leader_election_default(IN_POD, token)


@pytest.mark.parametrize(
    ("env", "has_token", "explicit_kubeconfig"),
    [
        ({}, False, False),  # a workstation
        ({}, True, False),  # a token file but no in-cluster service
        (IN_POD, False, False),  # service env without a mounted token (automount off)
        ({**IN_POD, "KUBECONFIG": "/etc/other.yaml"}, True, False),  # another cluster's creds
        (IN_POD, True, True),  # --kubeconfig
        ({**IN_POD, "KUBERNETES_SERVICE_HOST": ""}, True, False),
    ],
)
def test_default_is_off_unless_credentials_are_in_cluster(
    tmp_path: Path, env: dict[str, str], has_token: bool, explicit_kubeconfig: bool
):
    token = tmp_path / "token"
    if has_token:
        token.write_text("t")
    config = tmp_path / "kubeconfig" if explicit_kubeconfig else None
    assert not leader_election_default(env, token, kubeconfig=config)


@pytest.mark.parametrize(
    ("argv", "in_pod", "expected"),
    [
        ([], True, True),
        ([], False, False),
        (["--no-leader-elect"], True, False),
        (["--leader-elect"], False, True),
        (["--leader-elect"], True, True),
        (["--kubeconfig", "/k.yaml"], True, False),
        (["--kubeconfig", "/k.yaml", "--leader-elect"], True, True),
    ],
)
def test_flags_override_the_default(token: Path, argv: list[str], in_pod: bool, expected: bool):
    args = build_parser().parse_args(["operator", *argv])
    env = IN_POD if in_pod else {}
    assert leader_election_enabled(args, env, token) is expected


def _run_operator(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> Any:
    """``phalanx operator ARGV`` up to the point where it would start kopf."""
    import phalanx.operator.app as app

    seen: list[Any] = []
    monkeypatch.setattr(app, "run", lambda config, sidecars=(): seen.append(config) or 0)
    assert main(["operator", *argv]) == 0
    (config,) = seen
    return config


def test_the_command_elects_in_a_pod_with_the_pods_namespace(
    monkeypatch: pytest.MonkeyPatch, token: Path
):
    for name, value in IN_POD.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("POD_NAMESPACE", "phalanx-system")
    monkeypatch.setattr(operator_cmd, "SERVICE_ACCOUNT_TOKEN", token)
    config = _run_operator(monkeypatch, ["--no-webhooks", "--leader-elect-identity=pod-a"])
    assert config.leader_election is not None
    assert config.leader_election.namespace == "phalanx-system"
    assert config.leader_election.identity == "pod-a"
    assert config.leader_election.lease_name == "phalanx-scheduler"

    off = _run_operator(monkeypatch, ["--no-webhooks", "--no-leader-elect"])
    assert off.leader_election is None


def test_the_command_does_not_elect_on_a_workstation(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(operator_cmd, "SERVICE_ACCOUNT_TOKEN", tmp_path / "absent")
    assert _run_operator(monkeypatch, ["--no-webhooks"]).leader_election is None
