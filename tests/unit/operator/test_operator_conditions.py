"""Workload conditions as Kueue writes them, and the gate remover's domain assignment."""

from __future__ import annotations

from phalanx.operator import conditions as cond
from phalanx.operator.ungate import assign_domains

T0, T1 = 1_767_225_600_000, 1_767_225_660_000  # 2026-01-01T00:00:00Z and a minute later


def test_transition_time_moves_only_when_the_status_changes() -> None:
    first = cond.pending(None, inadmissible=False, message="waiting", now_ms=T0)
    again = cond.pending(first, inadmissible=False, message="still waiting", now_ms=T1)
    (c,) = again
    assert c["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert c["message"] == "still waiting" and c["reason"] == "Pending"
    admitted = cond.admitted(again, cluster_queue="cq", now_ms=T1)
    reserved = cond.condition(admitted, cond.QUOTA_RESERVED)
    assert reserved is not None
    assert reserved["status"] == "True" and reserved["lastTransitionTime"] == "2026-01-01T00:01:00Z"
    assert cond.is_true(admitted, cond.ADMITTED)


def test_inadmissible_reason_for_routing_problems() -> None:
    (c,) = cond.pending(None, inadmissible=True, message="LocalQueue lq doesn't exist", now_ms=T0)
    assert c["reason"] == "Inadmissible" and c["status"] == "False"


def test_eviction_by_preemption_then_requeue_then_readmission() -> None:
    admitted = cond.admitted(None, cluster_queue="cq", now_ms=T0)
    evicted = cond.evicted(
        admitted,
        reason="Preempted",
        message="Preempted to accommodate ns/hi",
        now_ms=T1,
        preemption_reason="InClusterQueue",
    )
    assert cond.condition(evicted, cond.EVICTED)["reason"] == "Preempted"  # type: ignore[index]
    assert cond.condition(evicted, cond.PREEMPTED)["reason"] == "InClusterQueue"  # type: ignore[index]
    assert cond.is_true(evicted, cond.QUOTA_RESERVED), "quota is held until the pods are gone"
    done = cond.eviction_done(
        evicted, reason="Preempted", message="Preempted to accommodate ns/hi", now_ms=T1
    )
    assert not cond.is_true(done, cond.QUOTA_RESERVED)
    assert not cond.is_true(done, cond.ADMITTED)
    assert cond.is_true(done, cond.REQUEUED)
    again = cond.admitted(done, cluster_queue="cq", now_ms=T1)
    evicted_after = cond.condition(again, cond.EVICTED)
    assert evicted_after is not None and evicted_after["status"] == "False"
    assert evicted_after["reason"] == "QuotaReserved"
    assert evicted_after["message"].startswith("Previously: ")


def test_long_messages_are_truncated() -> None:
    (c,) = cond.pending(None, inadmissible=False, message="x" * 5000, now_ms=T0)
    assert len(c["message"]) == 1024 and c["message"].endswith("...")


LEVELS = ("rack", "kubernetes.io/hostname")
DOMAINS = ((("r1", "h1"), 2), (("r1", "h2"), 1), (("r1", "h3"), 1))


def test_indexed_pods_keep_rank_order() -> None:
    got = assign_domains(LEVELS, DOMAINS, [], [("p3", 3), ("p0", 0), ("p2", 2), ("p1", 1)])
    assert got["p0"]["kubernetes.io/hostname"] == "h1"
    assert got["p1"]["kubernetes.io/hostname"] == "h1"
    assert got["p2"]["kubernetes.io/hostname"] == "h2"
    assert got["p3"] == {"rack": "r1", "kubernetes.io/hostname": "h3"}


def test_pods_without_index_fill_remaining_room_and_extra_pods_wait() -> None:
    placed = [{"rack": "r1", "kubernetes.io/hostname": "h1"}]
    got = assign_domains(
        LEVELS, DOMAINS, placed, [("a", None), ("b", None), ("c", None), ("d", None)]
    )
    hosts = sorted(sel["kubernetes.io/hostname"] for sel in got.values())
    assert hosts == ["h1", "h2", "h3"]
    assert len(got) == 3, "a fourth pod has no room left in the assignment"


def test_replacement_pod_goes_where_room_is_when_its_domain_is_full() -> None:
    placed = [{"rack": "r1", "kubernetes.io/hostname": "h1"}] * 2
    got = assign_domains(LEVELS, DOMAINS, placed, [("retry", 0)])
    assert got["retry"]["kubernetes.io/hostname"] == "h2"


def test_status_applies_carry_owned_fields_unless_dropped() -> None:
    from phalanx.operator.writer import carry_over

    current = {"status": {"admission": {"clusterQueue": "cq"}, "requeueState": {"count": 1}}}
    kept = carry_over(current, {"conditions": []})
    assert kept["admission"] == {"clusterQueue": "cq"} and kept["requeueState"] == {"count": 1}
    dropped = carry_over(current, {"conditions": [], "admission": None})
    assert "admission" not in dropped and dropped["requeueState"] == {"count": 1}
