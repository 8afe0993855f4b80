"""``phalanx operator --config``: the phalanx-config ConfigMap's Kueue Configuration is read,
every problem is named by its field, and flags given on the command line win over it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from phalanx.cli.main import main
from phalanx.cli.operator_cmd import register, wait_for_pods_ready
from phalanx.operator import configfile
from phalanx.operator.configfile import ConfigFile, ConfigFileError, parse, parse_duration

REPO = Path(__file__).resolve().parents[3]
KEY = "controller_manager_config.yaml"


def _shipped() -> dict[str, Any]:
    document = yaml.safe_load((REPO / "manifests" / "base" / "config.yaml").read_text())
    return dict(yaml.safe_load(document["data"][KEY]))


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["operator", *argv])


def test_the_shipped_configmap_is_a_valid_configuration_with_kueues_defaults():
    settings = parse(_shipped())
    assert settings.wait_for_pods_ready is False
    assert settings.pods_ready_timeout_seconds == 300
    assert (settings.backoff_base_seconds, settings.backoff_max_seconds) == (60, 3600)
    assert settings.fair_sharing == configfile.FairSharing(enabled=False)
    assert settings.managed_jobs_namespace_selector == {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", "phalanx-system"],
            }
        ]
    }


def test_kueues_process_sections_are_read_past_and_named():
    document = {
        **_shipped(),
        "health": {"healthProbeBindAddress": ":8081"},
        "leaderElection": {"leaderElect": True},
    }
    assert parse(document).ignored == ("health", "leaderElection")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"apiVersion": "v1"}, "apiVersion: must be one of config.kueue.x-k8s.io/v1beta1"),
        ({"waitForPodsReady": {"timeout": "5 minutes"}}, "waitForPodsReady.timeout: '5 minutes'"),
        ({"waitForPodsReady": {"enable": "yes"}}, "waitForPodsReady.enable: must be true or false"),
        ({"waitForPodsReady": {"blockAdmission": True}}, "waitForPodsReady.blockAdmission:"),
        (
            {"waitForPodsReady": {"requeuingStrategy": {"backoffBaseSeconds": -1}}},
            "waitForPodsReady.requeuingStrategy.backoffBaseSeconds: must be a whole number",
        ),
        (
            {"fairSharing": {"preemptionStrategies": ["Greedy"]}},
            "fairSharing.preemptionStrategies[0]: must be one of",
        ),
        ({"integrations": {"frameworks": ["batch/job", "kubeflow.org/mpijob"]}}, "frameworks[1]:"),
        ({"integrations": {"frameworks": ["batch/jobs"]}}, "not one of Kueue's framework names"),
        ({"manageJobsWithoutQueueName": True}, "manageJobsWithoutQueueName: Phalanx manages"),
        (
            {
                "managedJobsNamespaceSelector": {
                    "matchExpressions": [{"key": "a", "operator": "In"}]
                }
            },
            "managedJobsNamespaceSelector.matchExpressions[0].values: In needs",
        ),
        ({"fairSharng": {}}, "fairSharng: not a Configuration field"),
    ],
)
def test_each_problem_names_its_field(change: dict[str, Any], message: str):
    with pytest.raises(ConfigFileError) as raised:
        parse({**_shipped(), **change}, source="cfg.yaml")
    assert any(message in problem for problem in raised.value.problems), raised.value.problems
    assert str(raised.value).startswith("invalid configuration cfg.yaml:")


@pytest.mark.parametrize(
    ("text", "seconds"), [("5m", 300), ("300s", 300), ("1h30m", 5400), ("1.5h", 5400), ("0", 0)]
)
def test_durations_are_gos(text: str, seconds: float):
    assert parse_duration(text) == seconds


def test_the_file_sets_what_no_flag_sets_and_flags_win():
    settings = ConfigFile(
        wait_for_pods_ready=True,
        pods_ready_timeout_seconds=120,
        backoff_base_seconds=10,
        backoff_max_seconds=600,
        backoff_limit_count=3,
    )
    from_file = wait_for_pods_ready(_args(), settings)
    assert (from_file.enabled, from_file.timeout_seconds) == (True, 120)
    assert (from_file.backoff_base_seconds, from_file.backoff_max_seconds) == (10, 600)
    assert from_file.backoff_limit_count == 3
    flags = wait_for_pods_ready(
        _args("--wait-for-pods-ready=0", "--requeue-backoff-base=5"), settings
    )
    assert (flags.enabled, flags.backoff_base_seconds) == (False, 5)
    defaults = wait_for_pods_ready(_args(), ConfigFile())
    assert (defaults.enabled, defaults.timeout_seconds, defaults.backoff_base_seconds) == (
        False,
        300,
        60,
    )


def test_an_invalid_file_stops_the_operator_before_it_connects(tmp_path: Path, capsys):
    path = tmp_path / KEY
    path.write_text(yaml.safe_dump({**_shipped(), "fairSharing": {"enable": "on"}}))
    assert main(["operator", f"--config={path}", f"--kubeconfig={tmp_path / 'none'}"]) == 2
    err = capsys.readouterr().err
    assert f"error: --config: invalid configuration {path}:" in err
    assert "fairSharing.enable: must be true or false, got 'on'" in err


def test_feature_gate_tas_balanced_placement_is_honoured_and_other_gates_read_past():
    document = {
        **_shipped(),
        "featureGates": {"TASBalancedPlacement": True, "TopologyAwareScheduling": True},
    }
    settings = parse(document)
    assert settings.tas_balanced_placement is True
    assert settings.ignored == ("featureGates.TopologyAwareScheduling",)
    assert parse(_shipped()).tas_balanced_placement is None  # Kueue's default: off
    with pytest.raises(ConfigFileError, match=r"featureGates.TASBalancedPlacement: must be true"):
        parse({**_shipped(), "featureGates": {"TASBalancedPlacement": "yes"}})


def test_the_operators_placement_oracle_takes_the_gate():
    from phalanx.operator.oracle import TopologyOracle

    assert TopologyOracle(balanced_placement=True).balanced_placement is True
    assert TopologyOracle().balanced_placement is False
