"""``bench e2e`` on a TAS scenario, without a cluster: the nodes, Topology, flavor and
Workloads it creates (as Kueue's generator does), and the topologyAssignment check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bench_tas import RACK_LABEL, write_tiny_tas

from phalanx.bench.objects import CLEANUP_LABEL, flavor_object, plan, workload_object
from phalanx.bench.tas import (
    AssignmentChecker,
    Demand,
    TopologyLevel,
    TopologySpec,
    node_object,
    plan_nodes,
    topology_object,
)
from phalanx.cli.bench_scenario import ScenarioError, load_scenario, load_topology_file
from phalanx.cli.main import main
from phalanx.placement import HOSTNAME_LABEL, TopologyRequest, encode_topology_assignment

GI = 1024**3


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_tiny_tas(tmp_path)


def test_nodes_are_named_labelled_and_sized_as_kueues_generator(tiny: Path) -> None:
    spec = load_topology_file(tiny)
    assert spec is not None
    nodes = plan_nodes(spec)
    assert [n.name for n in nodes] == [f"node-b0-r{r}-n{n}" for r in range(2) for n in range(4)]
    assert nodes[5].labels == {
        "cloud.provider.com/topology-block": "block-0",
        RACK_LABEL: "rack-1",
        HOSTNAME_LABEL: "node-b0-r1-n1",  # the node's own name (Kueue's: "node-1")
        "tas-node-group": "tas",
    }
    assert nodes[0].allocatable == {"cpu": 4000, "memory": 16 * GI, "pods": 110}

    obj = node_object(nodes[5], extra_labels={CLEANUP_LABEL: "true"})
    assert obj["metadata"]["name"] == "node-b0-r1-n1"
    assert obj["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert obj["metadata"]["labels"][CLEANUP_LABEL] == "true"
    assert obj["metadata"]["labels"][RACK_LABEL] == "rack-1"
    assert obj["status"]["allocatable"] == {"cpu": "4", "memory": "16Gi", "pods": "110"}
    assert obj["status"]["capacity"] == obj["status"]["allocatable"]


def test_the_full_shape_has_640_distinct_nodes_with_kueues_default_capacity() -> None:
    spec = TopologySpec(
        name="default-topology",
        levels=(
            TopologyLevel("block", 1, "cloud.provider.com/topology-block"),
            TopologyLevel("rack", 10, RACK_LABEL),
            TopologyLevel("node", 64, HOSTNAME_LABEL),
        ),
        flavor="tas-flavor",
        flavor_node_label="tas-node-group",
    )
    nodes = plan_nodes(spec)
    assert spec.node_count == len({n.name for n in nodes}) == 640
    assert nodes[-1].name == "node-b0-r9-n63"
    assert nodes[-1].labels[RACK_LABEL] == "rack-9"
    assert nodes[0].allocatable == {"cpu": 96_000, "memory": 256 * GI, "pods": 110}


def test_topology_flavor_and_workloads_carry_the_tas_fields(tiny: Path) -> None:
    spec = load_topology_file(tiny)
    assert spec is not None
    topology = topology_object(spec, labels={CLEANUP_LABEL: "true"})
    assert topology["metadata"]["name"] == "tiny-topology"
    assert topology["spec"]["levels"] == [
        {"nodeLabel": "cloud.provider.com/topology-block"},
        {"nodeLabel": RACK_LABEL},
        {"nodeLabel": HOSTNAME_LABEL},
    ]
    scenario = load_scenario(tiny)
    assert flavor_object(scenario)["spec"] == {
        "nodeLabels": {"tas-node-group": "tas"},
        "topologyName": "tiny-topology",
    }
    queues, workloads = plan(scenario)
    assert [q.name for q in queues] == ["cq-0-0-cohort-0", "cq-0-1-cohort-0"]
    assert len(workloads) == 2 * 3 * 8
    by_class = {w.class_name: workload_object(w)["spec"]["podSets"][0] for w in workloads}
    assert by_class["required-rack"]["count"] == 4
    assert by_class["required-rack"]["topologyRequest"] == {"required": RACK_LABEL}
    assert by_class["preferred-rack"]["topologyRequest"] == {"preferred": RACK_LABEL}
    # Kueue's generator: balanced is the slice fields alone
    assert by_class["balanced-rack"]["topologyRequest"] == {
        "podSetSliceRequiredTopology": RACK_LABEL,
        "podSetSliceSize": 2,
    }


def test_a_quota_scenario_keeps_a_plain_flavor_and_pod_set(tmp_path: Path) -> None:
    text = write_tiny_tas(tmp_path).read_text()
    plain = text.split("cohorts:", 1)[1]
    for key in ("podCount", "tasConstraint", "tasLevel", "sliceSize"):
        plain = "\n".join(line for line in plain.splitlines() if key not in line)
    path = tmp_path / "plain" / "generator.yaml"
    path.parent.mkdir()
    path.write_text("cohorts:" + plain)
    scenario = load_scenario(path)
    assert load_topology_file(path) is None
    assert flavor_object(scenario)["spec"] == {}
    _, workloads = plan(scenario)
    assert "topologyRequest" not in workload_object(workloads[0])["spec"]["podSets"][0]


def test_a_topology_needs_two_levels(tmp_path: Path) -> None:
    path = tmp_path / "one" / "generator.yaml"
    path.parent.mkdir()
    path.write_text("topology: {name: t, levels: [{name: node, count: 2, nodeLabel: x}]}\n")
    with pytest.raises(ScenarioError, match=r"topology.levels must list at least 2 levels"):
        load_topology_file(path)


def test_bench_e2e_refuses_balanced_without_slice_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_tiny_tas(tmp_path)
    path.write_text(path.read_text().replace("          sliceSize: 2\n", ""))
    assert main(["bench", "e2e", "--config", str(path), "--kubeconfig", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert "balanced-rack: tasConstraint balanced needs sliceSize" in err


# -- the assignment check ---------------------------------------------------------------------


def _checker(tiny: Path) -> AssignmentChecker:
    spec = load_topology_file(tiny)
    assert spec is not None
    return AssignmentChecker(
        plan_nodes(spec),
        {
            "ns/req": Demand(pods=4, cpu=2000, request=TopologyRequest.required(RACK_LABEL)),
            "ns/big": Demand(pods=3, cpu=2000, request=TopologyRequest.preferred(RACK_LABEL)),
            "ns/bal": Demand(
                pods=4,
                cpu=1000,
                request=TopologyRequest.unconstrained(slice_level=RACK_LABEL, slice_size=2),
            ),
        },
    )


def _workload(
    name: str, hosts: list[tuple[str, int]] | None, *, finished: bool = False
) -> dict[str, Any]:
    psa: dict[str, Any] = {"name": "main", "count": sum(c for _, c in hosts or [])}
    if hosts is not None:
        psa["topologyAssignment"] = encode_topology_assignment(
            [HOSTNAME_LABEL], [((h,), c) for h, c in hosts]
        )
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "status": {
            "admission": {"clusterQueue": "cq", "podSetAssignments": [psa]},
            "conditions": [
                {"type": "QuotaReserved", "status": "True"},
                {"type": "Finished", "status": "True" if finished else "False"},
            ],
        },
    }


def test_a_required_placement_in_one_rack_passes(tiny: Path) -> None:
    checker = _checker(tiny)
    checker.on_workload("MODIFIED", _workload("req", [("node-b0-r0-n0", 2), ("node-b0-r0-n3", 2)]))
    assert checker.snapshot() == (1, [])


def test_a_required_placement_across_racks_is_reported(tiny: Path) -> None:
    checker = _checker(tiny)
    checker.on_workload("MODIFIED", _workload("req", [("node-b0-r0-n0", 2), ("node-b0-r1-n0", 2)]))
    _, problems = checker.snapshot()
    assert problems == [f"tas ns/req: required {RACK_LABEL} but placed in ['rack-0', 'rack-1']"]


def test_a_slice_split_across_racks_is_reported(tiny: Path) -> None:
    checker = _checker(tiny)
    # pods 0-1 in rack 0, pods 2-3 split: the second slice breaks the constraint
    checker.on_workload("MODIFIED", _workload("bal", [("node-b0-r0-n0", 3), ("node-b0-r1-n0", 1)]))
    _, problems = checker.snapshot()
    assert len(problems) == 1 and "slice of pods 2-3" in problems[0]


def test_missing_or_partial_assignments_are_reported(tiny: Path) -> None:
    checker = _checker(tiny)
    checker.on_workload("MODIFIED", _workload("req", None))
    checker.on_workload("MODIFIED", _workload("bal", [("node-b0-r0-n0", 2)]))
    checker.on_workload("MODIFIED", _workload("big", [("gpu-b0-r0-h0", 3)]))
    _, problems = checker.snapshot()
    assert problems == [
        "tas ns/req: admitted without a topologyAssignment",
        "tas ns/bal: topologyAssignment places 2 pods of 4",
        "tas ns/big: assigned to 'gpu-b0-r0-h0', not a scenario node",
    ]


def test_node_capacity_counts_until_the_workload_finishes(tiny: Path) -> None:
    checker = _checker(tiny)
    # req holds 4 CPU on n0 (all of it); big would put 2 more there
    checker.on_workload("MODIFIED", _workload("req", [("node-b0-r0-n0", 2), ("node-b0-r0-n1", 2)]))
    checker.on_workload("MODIFIED", _workload("big", [("node-b0-r0-n0", 1), ("node-b0-r0-n2", 2)]))
    _, problems = checker.snapshot()
    assert problems == ["tas ns/big: node node-b0-r0-n0 holds cpu 6000 > allocatable 4000"]

    fresh = _checker(tiny)
    fresh.on_workload("MODIFIED", _workload("req", [("node-b0-r0-n0", 2), ("node-b0-r0-n1", 2)]))
    fresh.on_workload(
        "MODIFIED",
        _workload("req", [("node-b0-r0-n0", 2), ("node-b0-r0-n1", 2)], finished=True),
    )
    fresh.on_workload("MODIFIED", _workload("big", [("node-b0-r0-n0", 1), ("node-b0-r0-n2", 2)]))
    assert fresh.snapshot() == (2, [])


def test_a_relist_replaces_what_holds_the_nodes(tiny: Path) -> None:
    checker = _checker(tiny)
    checker.on_workload("MODIFIED", _workload("req", [("node-b0-r0-n0", 2), ("node-b0-r0-n1", 2)]))
    # req finished in a watch gap; big took node n0 meanwhile
    checker.on_workload_list(
        [
            _workload("req", [("node-b0-r0-n0", 2), ("node-b0-r0-n1", 2)], finished=True),
            _workload("big", [("node-b0-r0-n0", 2), ("node-b0-r0-n2", 1)]),
        ]
    )
    assert checker.snapshot() == (2, [])
