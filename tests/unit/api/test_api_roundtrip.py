"""YAML -> model -> YAML for every kind, and the defaults Kueue applies."""

from __future__ import annotations

import pytest
import yaml
from api_cases import load_raw, manifest_files, minimal_cq, minimal_workload

from phalanx.api import (
    ClusterQueue,
    Cohort,
    LocalQueue,
    ResourceFlavor,
    Topology,
    Workload,
    WorkloadPriorityClass,
    load_manifests,
    parse_object,
    to_manifest,
)
from phalanx.api.clusterqueue import (
    FlavorFungibilityPolicy,
    PreemptionPolicy,
    QueueingStrategy,
    StopPolicy,
)


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.stem)
def test_api_manifest_round_trips_unchanged(path):
    text = path.read_text()
    objects = load_manifests(text)
    raw = [d for d in yaml.safe_load_all(text) if d]
    assert len(objects) == len(raw)
    for obj, original in zip(objects, raw, strict=True):
        dumped = to_manifest(obj)
        assert dumped == original
        # And the dump itself reads back to an equal model, through YAML text.
        again = load_manifests(yaml.safe_dump(dumped))
        assert again == [obj]


def test_api_every_kind_has_an_example_manifest():
    kinds = {type(obj) for path in manifest_files() for obj in load_manifests(path.read_text())}
    assert kinds == {
        ClusterQueue,
        Cohort,
        LocalQueue,
        ResourceFlavor,
        Topology,
        Workload,
        WorkloadPriorityClass,
    }


def test_api_cluster_queue_defaults_follow_kueue():
    cq = parse_object(minimal_cq())
    assert isinstance(cq, ClusterQueue)
    spec = cq.spec
    assert spec.queueing_strategy is QueueingStrategy.BEST_EFFORT_FIFO
    assert spec.stop_policy is StopPolicy.NONE
    assert spec.preemption.within_cluster_queue == PreemptionPolicy.NEVER
    assert spec.preemption.reclaim_within_cohort == PreemptionPolicy.NEVER
    assert spec.preemption.borrow_within_cohort.policy == "Never"
    assert spec.flavor_fungibility.when_can_borrow is FlavorFungibilityPolicy.MAY_STOP_SEARCH
    assert spec.flavor_fungibility.when_can_preempt is FlavorFungibilityPolicy.TRY_NEXT_FLAVOR
    assert spec.cohort_name is None
    assert spec.namespace_selector is None


def test_api_with_defaults_dump_fills_what_the_api_server_would():
    full = to_manifest(parse_object(minimal_cq()), with_defaults=True)
    assert full["spec"]["queueingStrategy"] == "BestEffortFIFO"
    assert full["spec"]["stopPolicy"] == "None"
    assert full["spec"]["preemption"] == {
        "reclaimWithinCohort": "Never",
        "borrowWithinCohort": {"policy": "Never"},
        "withinClusterQueue": "Never",
    }
    assert full["spec"]["flavorFungibility"] == {
        "whenCanBorrow": "MayStopSearch",
        "whenCanPreempt": "TryNextFlavor",
    }
    # Written as given: no defaults invented.
    assert "queueingStrategy" not in to_manifest(parse_object(minimal_cq()))["spec"]


def test_api_workload_and_queue_defaults():
    wl = parse_object(minimal_workload({"template": {}}))
    assert isinstance(wl, Workload)
    assert wl.spec.active is True
    assert wl.spec.pod_sets[0].name == "main"
    assert wl.spec.pod_sets[0].count == 1
    assert wl.spec.pod_sets[0].min_count is None
    lq = parse_object(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "q", "namespace": "ns"},
            "spec": {"clusterQueue": "cq", "fairSharing": {}},
        }
    )
    assert isinstance(lq, LocalQueue)
    assert lq.spec.stop_policy is StopPolicy.NONE
    assert lq.spec.fair_sharing is not None and lq.spec.fair_sharing.weight == 1


def test_api_snake_case_attributes_carry_the_camel_case_fields():
    cq = load_manifests((manifest_files()[0].parent / "clusterqueue.yaml").read_text())[0]
    assert isinstance(cq, ClusterQueue)
    gpu = cq.spec.resource_groups[1].flavors[0].resources[0]  # type: ignore[index]
    assert (gpu.name, gpu.nominal_quota, gpu.borrowing_limit, gpu.lending_limit) == (
        "nvidia.com/gpu",
        16,
        8,
        4,
    )
    assert cq.spec.cohort_name == "research"
    assert cq.status is not None and cq.status.pending_workloads == 3


def test_api_quantities_keep_their_written_form():
    raw = minimal_cq()
    quotas = raw["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    quotas[0]["nominalQuota"] = "1500m"
    quotas[1]["nominalQuota"] = "8"
    cq = parse_object(raw)
    quota = cq.spec.resource_groups[0].flavors[0].resources  # type: ignore[union-attr]
    assert [q.nominal_quota for q in quota] == ["1500m", "8"]
    assert to_manifest(cq)["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0] == {
        "name": "cpu",
        "nominalQuota": "1500m",
    }


def test_api_models_are_frozen():
    wpc = load_raw("workloadpriorityclass")
    obj = parse_object(wpc)
    with pytest.raises(ValueError):
        obj.value = 1  # type: ignore[misc,union-attr]


def test_api_list_documents_are_expanded():
    items = [load_raw("topology"), load_raw("workloadpriorityclass")]
    text = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items})
    assert [type(o) for o in load_manifests(text)] == [Topology, WorkloadPriorityClass]
