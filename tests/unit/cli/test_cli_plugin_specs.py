"""The plugin's flags into objects: each case is what kueuectl builds (or refuses) for the same
flags, read from its create/stop commands."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from phalanx.cli import completion_cmd, list_pods, plugin_cmd, plugin_specs
from phalanx.cli.main import build_parser
from phalanx.cli.plugin_client import name_line
from phalanx.cli.plugin_specs import FlagError


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_a_bare_cluster_queue_is_kueuectls_defaults() -> None:
    assert plugin_specs.cluster_queue("cq") == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "cq"},
        "spec": {
            "namespaceSelector": {},
            "preemption": {"reclaimWithinCohort": "Never", "withinClusterQueue": "Never"},
            "queueingStrategy": "BestEffortFIFO",
        },
    }


def test_cluster_queue_flags_as_kueuectls_example() -> None:
    args = _parse(
        "create", "clusterqueue", "my-cluster-queue",
        "--cohort", "cohortname",
        "--queuing-strategy", "StrictFIFO",
        "--namespace-selector", "fooX=barX,fooY=barY",
        "--reclaim-within-cohort", "Any",
        "--preemption-within-cluster-queue", "LowerPriority",
        "--nominal-quota",
        "alpha:cpu=9;memory=36Gi;nvidia.com/gpu=10,beta:cpu=18;memory=72Gi;nvidia.com/gpu=20",
        "--borrowing-limit",
        "alpha:cpu=1;memory=1Gi;nvidia.com/gpu=1,beta:cpu=2;memory=2Gi;nvidia.com/gpu=2",
        "--lending-limit", "alpha:cpu=1;memory=1Gi;nvidia.com/gpu=1",
    )  # fmt: skip
    spec = plugin_cmd.build(args, "")["spec"]
    assert spec["cohortName"] == "cohortname"
    assert spec["queueingStrategy"] == "StrictFIFO"
    assert spec["namespaceSelector"] == {"matchLabels": {"fooX": "barX", "fooY": "barY"}}
    assert spec["preemption"] == {
        "reclaimWithinCohort": "Any",
        "withinClusterQueue": "LowerPriority",
    }
    [group] = spec["resourceGroups"]
    assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu"]
    alpha, beta = group["flavors"]
    assert alpha["name"] == "alpha"
    assert alpha["resources"][0] == {
        "name": "cpu",
        "nominalQuota": "9",
        "borrowingLimit": "1",
        "lendingLimit": "1",
    }
    assert beta["resources"][2] == {
        "name": "nvidia.com/gpu",
        "nominalQuota": "20",
        "borrowingLimit": "2",
    }


def test_flavors_with_other_resources_make_another_group() -> None:
    groups = plugin_specs.resource_groups(
        ["alpha:cpu=1;memory=1Gi", "gpu-a:nvidia.com/gpu=8", "beta:memory=2Gi;cpu=2"], [], []
    )
    assert [g["coveredResources"] for g in groups] == [["cpu", "memory"], ["nvidia.com/gpu"]]
    assert [f["name"] for f in groups[0]["flavors"]] == ["alpha", "beta"]


def test_a_limit_alone_has_a_zero_nominal_quota() -> None:
    # kueuectl's ResourceQuota always serialises nominalQuota (a Quantity, not a pointer).
    [group] = plugin_specs.resource_groups([], ["alpha:cpu=2"], [])
    assert group["flavors"][0]["resources"] == [
        {"name": "cpu", "nominalQuota": "0", "borrowingLimit": "2"}
    ]


@pytest.mark.parametrize(
    ("nominal", "borrowing", "flag", "words"),
    [
        (["alpha"], [], "nominal-quota", "is not FLAVOR:RESOURCE=QUANTITY"),
        (["alpha:cpu"], [], "nominal-quota", "is not RESOURCE=QUANTITY"),
        (["alpha:cpu=abc"], [], "nominal-quota", "'abc' is not a quantity"),
        (["Alpha:cpu=1"], [], "nominal-quota", "is not a ResourceFlavor name"),
        (["alpha:cpu=1;cpu=2"], [], "nominal-quota", "cpu is given twice"),
        (["alpha:cpu=1"], ["alpha:memory=1Gi"], "borrowing-limit", "same resources"),
        (["a:cpu=1;memory=1", "b:cpu=1"], [], "nominal-quota", "shares cpu with flavor a"),
        (["a:cpu=1", "a:cpu=2"], [], "nominal-quota", "flavor a is given twice"),
    ],
)
def test_bad_quotas_name_the_flag(
    nominal: list[str], borrowing: list[str], flag: str, words: str
) -> None:
    with pytest.raises(FlagError) as caught:
        plugin_specs.resource_groups(nominal, borrowing, [])
    assert caught.value.flag == flag
    assert str(caught.value).startswith(f"--{flag}: ")
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--queuing-strategy", "FIFO"], "queuing-strategy"),
        (["--reclaim-within-cohort", "Sometimes"], "reclaim-within-cohort"),
        (["--preemption-within-cluster-queue", "Any"], "preemption-within-cluster-queue"),
        (["--namespace-selector", "team"], "namespace-selector"),
        (["--namespace-selector", "team=a b"], "namespace-selector"),
        (["--lending-limit", "x:cpu=-"], "lending-limit"),
    ],
)
def test_bad_cluster_queue_flags_name_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(FlagError, match=f"^--{flag}: "):
        plugin_cmd.build(_parse("create", "cq", "q", *argv), "")


def test_local_queue_needs_its_cluster_queue() -> None:
    assert plugin_cmd.build(_parse("create", "lq", "q", "-c", "cq"), "team-a") == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": "q", "namespace": "team-a"},
        "spec": {"clusterQueue": "cq"},
    }
    with pytest.raises(FlagError, match=r"^--clusterqueue: required"):
        plugin_cmd.build(_parse("create", "lq", "q"), "team-a")


def test_resource_flavor_as_kueuectls_examples() -> None:
    args = _parse(
        "create", "rf", "my-resource-flavor",
        "--node-labels", "kubernetes.io/arch=arm64,kubernetes.io/os=linux",
        "--node-taints", "key1=value:NoSchedule,key2:NoExecute",
        "--tolerations", "key1=value:NoSchedule,key2:NoExecute,key3=value,key4,:PreferNoSchedule",
    )  # fmt: skip
    spec = plugin_cmd.build(args, "")["spec"]
    assert spec["nodeLabels"] == {"kubernetes.io/arch": "arm64", "kubernetes.io/os": "linux"}
    assert spec["nodeTaints"] == [
        {"key": "key1", "value": "value", "effect": "NoSchedule"},
        {"key": "key2", "effect": "NoExecute"},
    ]
    assert spec["tolerations"] == [
        {"key": "key1", "operator": "Equal", "value": "value", "effect": "NoSchedule"},
        {"key": "key2", "operator": "Exists", "effect": "NoExecute"},
        {"key": "key3", "operator": "Equal", "value": "value"},
        {"key": "key4", "operator": "Exists"},
        {"operator": "Exists", "effect": "PreferNoSchedule"},
    ]


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("node-taints", "key1=value", "is not KEY[=VALUE]:EFFECT"),
        ("node-taints", "k:Sometimes", "effect 'Sometimes' is not one of"),
        ("node-taints", "k:NoSchedule,k=v:NoSchedule", "given twice"),
        ("node-taints", "a=b=c:NoSchedule", "is not KEY[=VALUE][:EFFECT]"),
        ("tolerations", "=v", "has a value but no key"),
        ("tolerations", "k:NoSchedule:x", "is not KEY[=VALUE][:EFFECT]"),
        ("node-labels", "bad key=v", "is not a label key"),
    ],
)
def test_bad_flavor_flags_name_the_flag(flag: str, value: str, words: str) -> None:
    with pytest.raises(FlagError) as caught:
        plugin_cmd.build(_parse("create", "rf", "f", f"--{flag}", value), "")
    assert str(caught.value).startswith(f"--{flag}: ")
    assert words in str(caught.value)


def test_stop_policies_as_kueuectl() -> None:
    assert plugin_specs.stop_policy(stop=True) == "HoldAndDrain"
    assert plugin_specs.stop_policy(stop=True, keep_already_running=True) == "Hold"
    assert plugin_specs.stop_policy(stop=False) == "None"


def test_kubectls_name_lines() -> None:
    cq: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "cq"},
    }
    assert name_line(cq, operation="created", dry_run="none") == (
        "clusterqueue.kueue.x-k8s.io/cq created"
    )
    assert name_line(cq, operation="created", dry_run="server") == (
        "clusterqueue.kueue.x-k8s.io/cq created (server dry run)"
    )
    assert name_line(cq, operation="", dry_run="none") == "clusterqueue.kueue.x-k8s.io/cq"


def test_list_pods_for_names_a_job_or_workload() -> None:
    assert list_pods.parse_for("job/train") == ("Job", "train")
    assert list_pods.parse_for("workload/job-train-1a2b3") == ("Workload", "job-train-1a2b3")
    with pytest.raises(list_pods.ForError, match=r"^--for: 'train' is not job/NAME"):
        list_pods.parse_for("train")
    with pytest.raises(list_pods.ForError, match=r"^--for: 'deployment/x'"):
        list_pods.parse_for("deployment/x")


def test_pod_rows_as_kubectl() -> None:
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {"ready": True, "restartCount": 1, "state": {"running": {}}},
                {
                    "ready": False,
                    "restartCount": 2,
                    "state": {"waiting": {"reason": "ErrImagePull"}},
                },
            ],
        },
    }
    assert list_pods.pod_row(pod) == ["p", "1/2", "ErrImagePull", "3"]


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ([""], {"list", "create", "stop", "resume", "delete", "version", "completion"}),
        (["li"], {"list"}),
        (["list", ""], {"workload", "clusterqueue", "localqueue", "resourceflavor", "pods"}),
        (["create", ""], {"clusterqueue", "localqueue", "resourceflavor"}),
        (["stop", "c"], {"clusterqueue", "cq"}),
        (["completion", ""], {"bash", "zsh", "fish"}),
        (["stop", "cq", "--k"], {"--keep-already-running", "--kubeconfig"}),
        (["list", "-o", "json", "--st"], {"--status"}),
        (["create", "cq", "x", "--nominal-quota", "a:cpu=1", "--coh"], {"--cohort"}),
    ],
)
def test_completion_from_the_parser(words: list[str], expected: set[str]) -> None:
    assert expected <= set(completion_cmd.complete(build_parser(), words))
    assert "__complete" not in completion_cmd.complete(build_parser(), [""])
