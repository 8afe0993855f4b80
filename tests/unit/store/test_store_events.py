"""Deriving lifecycle events from a Workload object: each transition once, at the time the
Workload's status gives it."""

from __future__ import annotations

import datetime as dt

from store_builders import condition, workload

from phalanx.store import events as ev

T0 = dt.datetime(2026, 1, 1)


def test_a_pending_workload_was_only_created() -> None:
    events = ev.events_of(workload())
    assert [(e.transition, e.at, e.local_queue) for e in events] == [("created", T0, "lq-a")]


def test_a_reservation_carries_the_admission() -> None:
    obj = workload(
        cluster_queue="cq",
        topology={"levels": ["rack"], "domains": [{"values": ["r1"], "count": 4}]},
        conditions=[condition("QuotaReserved", "2026-01-01T00:01:00Z")],
    )
    (_, reserved) = ev.events_of(obj)
    assert reserved.transition == ev.QUOTA_RESERVED
    assert reserved.at == T0 + dt.timedelta(minutes=1)
    assert reserved.cluster_queue == "cq"
    assert reserved.flavors == {"main": {"nvidia.com/gpu": "h100", "cpu": "default"}}
    assert reserved.topology == (
        {"podSet": "main", "levels": ["rack"], "domains": [{"values": ["r1"], "count": 4}]},
    )
    assert sorted(reserved.usage, key=lambda u: u.resource) == [
        ev.Usage("main", "cpu", "default", 2000),
        ev.Usage("main", "nvidia.com/gpu", "h100", 4),
    ]


def test_eviction_preemption_and_release_name_their_cause() -> None:
    message = "Preempted to accommodate a workload (UID: other) due to reclamation"
    obj = workload(
        conditions=[
            condition("QuotaReserved", "2026-01-01T00:05:00Z", status="False", reason="Preempted"),
            condition("Evicted", "2026-01-01T00:04:00Z", reason="Preempted", message=message),
            condition("Preempted", "2026-01-01T00:04:00Z", reason="InCohortReclamation"),
        ]
    )
    by_kind = {e.transition: e for e in ev.events_of(obj)}
    assert by_kind[ev.EVICTED].message == message
    assert by_kind[ev.PREEMPTED].reason == "InCohortReclamation"
    assert by_kind[ev.QUOTA_RELEASED].at == T0 + dt.timedelta(minutes=5)


def test_finished_records_the_outcome_and_false_conditions_are_not_transitions() -> None:
    obj = workload(
        cluster_queue="cq",
        conditions=[
            condition("QuotaReserved", "2026-01-01T00:01:00Z"),
            condition("Admitted", "2026-01-01T00:01:00Z"),
            condition("Evicted", "2026-01-01T00:02:00Z", status="False"),
            condition("Finished", "2026-01-01T01:01:00.250000Z", reason="Succeeded"),
        ],
    )
    kinds = [(e.transition, e.reason) for e in ev.events_of(obj)]
    assert kinds == [
        ("created", None),
        ("quota_reserved", "QuotaReserved"),
        ("admitted", "Admitted"),
        ("finished", "Succeeded"),
    ]


def test_deriving_twice_gives_the_same_keys() -> None:
    obj = workload(
        cluster_queue="cq", conditions=[condition("QuotaReserved", "2026-01-01T00:01:00Z")]
    )
    assert [e.key for e in ev.events_of(obj)] == [e.key for e in ev.events_of(dict(obj))]


def test_a_workload_without_uid_yields_nothing() -> None:
    obj = workload()
    del obj["metadata"]["uid"]
    assert ev.events_of(obj) == []
