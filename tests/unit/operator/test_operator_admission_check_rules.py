"""Admission checks as Kueue's workload controller applies them: which checks apply to a
workload (strategy by flavor), the states it carries, two-phase admission, and what an
eviction does to the checks."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.admission.decisions import Admit
from phalanx.admission.model import Admission, PodSetAssignment
from phalanx.operator import admission_checks as ac
from phalanx.operator import conditions as cond
from phalanx.operator.decision_status import Eviction, admission_status, eviction_done_status

T0 = 1_700_000_000_000


def cluster_queue(
    *rules: dict[str, Any], flavors: tuple[str, ...] = ("on-demand", "spot")
) -> dict[str, Any]:
    return {
        "metadata": {"name": "cq"},
        "spec": {
            "resourceGroups": [
                {
                    "coveredResources": ["cpu"],
                    "flavors": [
                        {"name": f, "resources": [{"name": "cpu", "nominalQuota": 4}]}
                        for f in flavors
                    ],
                }
            ],
            "admissionChecksStrategy": {"admissionChecks": list(rules)},
        },
    }


def admission(*flavors: str) -> dict[str, Any]:
    return {
        "clusterQueue": "cq",
        "podSetAssignments": [
            {"name": f"ps{i}", "flavors": {"cpu": f}, "count": 1} for i, f in enumerate(flavors)
        ],
    }


@pytest.mark.parametrize(
    ("rules", "assigned", "expected"),
    [
        # No onFlavors: the check applies to every workload of the queue.
        ([{"name": "prov"}], ("spot",), ["prov"]),
        # onFlavors: only when one of the assigned flavors is listed.
        ([{"name": "prov", "onFlavors": ["spot"]}], ("spot",), ["prov"]),
        ([{"name": "prov", "onFlavors": ["spot"]}], ("on-demand",), []),
        ([{"name": "prov", "onFlavors": ["spot"]}], ("on-demand", "spot"), ["prov"]),
        # Sorted by name, as Kueue keeps them.
        ([{"name": "z"}, {"name": "a", "onFlavors": ["on-demand"]}], ("on-demand",), ["a", "z"]),
        # Before quota is reserved only checks covering every flavor of the queue are listed.
        ([{"name": "all"}, {"name": "some", "onFlavors": ["spot"]}], None, ["all"]),
        (
            [{"name": "both", "onFlavors": ["spot", "on-demand"]}],
            None,
            ["both"],
        ),
    ],
)
def test_applicable_checks_follow_the_strategy_by_flavor(
    rules: list[dict[str, Any]], assigned: tuple[str, ...] | None, expected: list[str]
) -> None:
    adm = admission(*assigned) if assigned is not None else None
    assert ac.applicable_checks(cluster_queue(*rules), adm) == expected


def test_a_queue_without_strategy_or_missing_has_no_checks() -> None:
    assert ac.applicable_checks(None, admission("spot")) == []
    bare = {"metadata": {"name": "cq"}, "spec": {}}
    assert ac.applicable_checks(bare, admission("spot")) == []


def test_sync_states_adds_pending_and_drops_the_unrequired() -> None:
    ready = {"name": "a", "state": "Ready", "message": "", "lastTransitionTime": "x"}
    synced = ac.sync_states([ready, {"name": "gone", "state": "Retry"}], ["b", "a"], now_ms=T0)
    assert synced == [
        ready,
        {"name": "b", "state": "Pending", "message": "", "lastTransitionTime": cond.rfc3339(T0)},
    ]
    assert ac.sync_states(synced, ["a", "b"], now_ms=T0) is None


def test_with_state_moves_the_transition_time_only_on_a_change() -> None:
    states = [{"name": "a", "state": "Pending", "message": "", "lastTransitionTime": "old"}]
    same = ac.with_state(states, {"name": "a", "state": "Pending", "message": "m"}, now_ms=T0)
    assert same[0]["lastTransitionTime"] == "old" and same[0]["message"] == "m"
    moved = ac.with_state(states, {"name": "a", "state": "Ready", "message": ""}, now_ms=T0)
    assert moved[0]["lastTransitionTime"] == cond.rfc3339(T0)


def test_checks_message_is_kueues() -> None:
    one = [{"name": "prov", "message": "no capacity"}]
    assert ac.checks_message(one, "Retry") == 'AdmissionCheck in Retry state: "prov" (no capacity)'
    two = [{"name": "b"}, {"name": "a", "message": "x"}]
    assert ac.checks_message(two, "Rejected") == ('AdmissionChecks in Rejected state: "a" (x); "b"')


def _admit() -> Admit:
    return Admit(
        workload="ns/w",
        admission=Admission(
            cluster_queue="cq",
            pod_sets=(
                PodSetAssignment(
                    name="main", count=1, flavors={"cpu": "spot"}, resource_usage={"cpu": 1000}
                ),
            ),
        ),
        time=T0,
    )


def _workload(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "w", "namespace": "ns"}, "status": status}


def test_quota_reserved_is_not_admitted_until_every_check_is_ready() -> None:
    build = admission_status(_admit(), checks=lambda adm: ["prov"])
    out = build(_workload())
    assert out is not None
    conditions = out["conditions"]
    assert cond.is_true(conditions, cond.QUOTA_RESERVED)
    admitted = cond.condition(conditions, cond.ADMITTED)
    assert admitted is not None and admitted["status"] == "False"
    assert admitted["reason"] == "UnsatisfiedAdmissionChecks"
    assert [(c["name"], c["state"]) for c in out["admissionChecks"]] == [("prov", "Pending")]
    # A check already Ready when quota is reserved: admitted at once.
    ready = [{"name": "prov", "state": "Ready", "message": "", "lastTransitionTime": "t"}]
    out = build(_workload(admissionChecks=ready))
    assert out is not None and cond.is_true(out["conditions"], cond.ADMITTED)


def test_without_checks_quota_reserved_and_admitted_go_together() -> None:
    out = admission_status(_admit(), checks=lambda adm: [])(_workload())
    assert out is not None and "admissionChecks" not in out
    assert cond.is_true(out["conditions"], cond.ADMITTED)


def test_eviction_resets_checks_to_pending_and_counts_retries() -> None:
    states = [
        {
            "name": "a",
            "state": "Retry",
            "message": "m",
            "lastTransitionTime": "t",
            "requeueAfterSeconds": 60,
        },
        {"name": "b", "state": "Ready", "message": "", "lastTransitionTime": "t", "retryCount": 2},
        {"name": "c", "state": "Pending", "message": "", "lastTransitionTime": "t"},
    ]
    reset = ac.reset_on_eviction(states, now_ms=T0)
    assert reset == [
        {
            "name": "a",
            "state": "Pending",
            "message": "Reset to Pending after eviction. Previously: Retry",
            "lastTransitionTime": cond.rfc3339(T0),
            "requeueAfterSeconds": 60,
            "retryCount": 1,
        },
        {
            "name": "b",
            "state": "Pending",
            "message": "Reset to Pending after eviction. Previously: Ready",
            "lastTransitionTime": cond.rfc3339(T0),
            "retryCount": 2,
        },
        states[2],
    ]
    assert ac.reset_on_eviction(states[2:], now_ms=T0) is None
    current = _workload(
        admission=admission("spot"),
        conditions=cond.admitted([], cluster_queue="cq", now_ms=T0),
        admissionChecks=states,
    )
    eviction = Eviction(reason="AdmissionCheck", message="Evicted", cluster_queue="cq")
    out = eviction_done_status(eviction, now_ms=T0, requeue=(0, T0 + 60_000))(current)
    assert out is not None and out["admissionChecks"] == reset
    requeued = cond.condition(out["conditions"], cond.REQUEUED)
    assert requeued is not None and (requeued["status"], requeued["reason"]) == (
        "False",
        "AdmissionCheck",
    )
    again = cond.requeued_again(out["conditions"], now_ms=T0 + 60_000)
    assert again is not None and cond.condition(again, cond.REQUEUED)["reason"] == "BackoffFinished"  # type: ignore[index]


def test_retry_time_is_the_latest_of_the_retry_checks() -> None:
    states = [
        {
            "name": "a",
            "state": "Retry",
            "lastTransitionTime": "2023-11-14T22:13:20Z",
            "requeueAfterSeconds": 60,
        },
        {
            "name": "b",
            "state": "Retry",
            "lastTransitionTime": "2023-11-14T22:13:20Z",
            "requeueAfterSeconds": 120,
        },
        {
            "name": "c",
            "state": "Pending",
            "lastTransitionTime": "2023-11-14T22:13:20Z",
            "requeueAfterSeconds": 900,
        },
    ]
    assert ac.retry_requeue_at(states) == T0 + 120_000
    assert ac.retry_requeue_at(states[2:]) is None


def test_pod_set_updates_of_ready_checks_are_merged_for_their_pod_set() -> None:
    states = [
        {
            "name": "a",
            "state": "Ready",
            "podSetUpdates": [
                {"name": "main", "nodeSelector": {"pool": "p1"}, "annotations": {"x": "1"}},
                {"name": "other", "labels": {"no": "no"}},
            ],
        },
        {
            "name": "b",
            "state": "Ready",
            "podSetUpdates": [
                {
                    "name": "main",
                    "labels": {"l": "v"},
                    "tolerations": [{"key": "k", "operator": "Exists"}],
                }
            ],
        },
    ]
    changes = ac.PodSetChanges.of(states, "main")
    assert changes.node_selector == {"pool": "p1"}
    assert changes.annotations == {"x": "1"}
    assert changes.labels == {"l": "v"}
    assert changes.tolerations == [{"key": "k", "operator": "Exists"}]
