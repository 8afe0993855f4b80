"""Conditions as Kueue writes them where Phalanx used to differ: ``PodsReady`` (Kueue's Job
reconciler: WaitForStart, Started, WaitForRecovery, Recovered; pods that succeeded count, and
the condition goes back to WaitForStart when the admission ends), ``Requeued`` after an
eviction (True only after a preemption; False with the eviction's reason otherwise, True
again with Kueue's reason once the workload is back in its queue), and ClusterQueue and
LocalQueue status written as soon as the queue is created."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from phalanx.admission.model import ClusterQueue, FlavorQuotas, LocalQueue, ResourceFlavor
from phalanx.admission.model import ResourceGroup as CoreResourceGroup
from phalanx.admission.scheduler import Scheduler
from phalanx.operator import conditions as cond
from phalanx.operator import jobs
from phalanx.operator.decision_status import Eviction, eviction_done_status
from phalanx.operator.metrics import Metrics
from phalanx.operator.queuestatus import QueueStatus
from phalanx.operator.state import ClusterState
from phalanx.quotas.resources import ResourceQuota

T0, T1 = 1_767_225_600_000, 1_767_225_660_000  # 2026-01-01T00:00:00Z and a minute later


def reason(conditions: list[dict[str, Any]] | None, kind: str) -> tuple[str, str] | None:
    c = cond.condition(conditions, kind)
    return None if c is None else (c["status"], c["reason"])


# -- PodsReady ------------------------------------------------------------------------------------


def job(*, parallelism: int = 2, completions: int | None = None, **status: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"parallelism": parallelism}
    if completions is not None:
        spec["completions"] = completions
    return {"spec": spec, "status": status}


@pytest.mark.parametrize(
    ("obj", "ready"),
    [
        pytest.param(job(ready=2), True, id="all-ready"),
        pytest.param(job(ready=1), False, id="one-short"),
        pytest.param(job(ready=1, succeeded=1), True, id="ready-or-succeeded"),
        pytest.param(
            job(succeeded=1, uncountedTerminatedPods={"succeeded": ["uid-2"]}),
            True,
            id="succeeded-not-yet-counted",
        ),
        pytest.param(job(parallelism=4, completions=2, ready=2), True, id="completions-below"),
    ],
)
def test_a_jobs_pods_are_ready_as_kueue_counts_them(obj: dict[str, Any], ready: bool) -> None:
    assert jobs.pods_ready(obj) is ready


def test_pods_ready_goes_through_kueues_reasons() -> None:
    waiting = cond.pods_ready(None, ready=False, now_ms=T0)
    assert reason(waiting, cond.PODS_READY) == ("False", "WaitForStart")
    started = cond.pods_ready(waiting, ready=True, now_ms=T0)
    assert reason(started, cond.PODS_READY) == ("True", "Started")
    lost = cond.pods_ready(started, ready=False, now_ms=T1)
    assert reason(lost, cond.PODS_READY) == ("False", "WaitForRecovery")
    assert cond.condition(lost, cond.PODS_READY)["message"] == (  # type: ignore[index]
        "At least one pod has failed, waiting for recovery"
    )
    still = cond.pods_ready(lost, ready=False, now_ms=T1)
    assert reason(still, cond.PODS_READY) == ("False", "WaitForRecovery")
    recovered = cond.pods_ready(still, ready=True, now_ms=T1)
    assert reason(recovered, cond.PODS_READY) == ("True", "Recovered")
    unadmitted = cond.pods_ready(recovered, admitted=False, ready=False, now_ms=T1)
    assert reason(unadmitted, cond.PODS_READY) == ("False", "WaitForStart")


# -- Requeued and PodsReady when an eviction completes -------------------------------------------


def running() -> list[dict[str, Any]]:
    out = cond.admitted(None, cluster_queue="cq", now_ms=T0)
    return cond.pods_ready(out, ready=True, now_ms=T0)


@pytest.mark.parametrize(
    ("evicted_by", "requeued"),
    [
        ("Preempted", ("True", "Preempted")),
        ("Deactivated", ("False", "Deactivated")),
        ("PodsReadyTimeout", ("False", "PodsReadyTimeout")),
        ("ClusterQueueStopped", ("False", "ClusterQueueStopped")),
        ("LocalQueueStopped", ("False", "LocalQueueStopped")),
    ],
)
def test_an_eviction_completes_as_kueue_writes_it(
    evicted_by: str, requeued: tuple[str, str]
) -> None:
    message = f"evicted: {evicted_by}"
    evicted = cond.evicted(running(), reason=evicted_by, message=message, now_ms=T1)
    done = cond.eviction_done(evicted, reason=evicted_by, message=message, now_ms=T1)
    assert reason(done, cond.REQUEUED) == requeued
    assert cond.condition(done, cond.REQUEUED)["message"] == message  # type: ignore[index]
    assert reason(done, cond.QUOTA_RESERVED) == ("False", "Pending")
    assert cond.condition(done, cond.QUOTA_RESERVED)["message"] == message  # type: ignore[index]
    assert reason(done, cond.ADMITTED) == ("False", "NoReservation")
    assert reason(done, cond.PODS_READY) == ("False", "WaitForStart"), (
        "PodsReady stayed True after the eviction"
    )


def test_a_workload_without_pods_ready_gets_none_on_eviction() -> None:
    admitted = cond.admitted(None, cluster_queue="cq", now_ms=T0)
    done = cond.eviction_done(admitted, reason="Preempted", message="m", now_ms=T1)
    assert cond.condition(done, cond.PODS_READY) is None


@pytest.mark.parametrize(
    ("evicted_by", "again"),
    [
        ("Deactivated", ("Reactivated", "The workload was reactivated")),
        ("PodsReadyTimeout", ("BackoffFinished", "The workload backoff was finished")),
        (
            "ClusterQueueStopped",
            ("ClusterQueueRestarted", "The ClusterQueue was restarted after being stopped"),
        ),
        (
            "LocalQueueStopped",
            ("LocalQueueRestarted", "The LocalQueue was restarted after being stopped"),
        ),
    ],
)
def test_requeued_turns_true_again_with_kueues_reason(
    evicted_by: str, again: tuple[str, str]
) -> None:
    done = cond.eviction_done(running(), reason=evicted_by, message="m", now_ms=T0)
    back = cond.requeued_again(done, now_ms=T1)
    assert back is not None
    c = cond.condition(back, cond.REQUEUED)
    assert c is not None and (c["status"], c["reason"], c["message"]) == ("True", *again)
    assert cond.requeued_again(back, now_ms=T1) is None


def test_requeued_after_a_preemption_needs_nothing_more() -> None:
    done = cond.eviction_done(running(), reason="Preempted", message="m", now_ms=T0)
    assert cond.requeued_again(done, now_ms=T1) is None


def test_the_eviction_done_status_builder_writes_the_deactivation_as_kueue() -> None:
    workload = {
        "metadata": {"name": "w", "namespace": "ns"},
        "status": {
            "conditions": cond.evicted(
                running(), reason="Deactivated", message="The workload is deactivated", now_ms=T1
            ),
            "admission": {"clusterQueue": "cq", "podSetAssignments": []},
        },
    }
    eviction = Eviction(
        reason="Deactivated", message="The workload is deactivated", cluster_queue="cq"
    )
    status = eviction_done_status(eviction, now_ms=T1, requeue=None)(workload)
    assert status is not None
    assert reason(status["conditions"], cond.REQUEUED) == ("False", "Deactivated")
    assert reason(status["conditions"], cond.PODS_READY) == ("False", "WaitForStart")


# -- queue status on creation --------------------------------------------------------------------


def test_a_new_queues_status_is_written_at_once_not_after_the_batching_interval() -> None:
    """The first snapshot after a queue appears is taken and written straight away, even
    within the batching interval of the previous one (kubectl showed blank columns for
    about 3 s after creation)."""
    state = ClusterState()
    scheduler = Scheduler()
    scheduler.apply_resource_flavor(ResourceFlavor("default"))
    scheduler.set_namespace("default", {})
    writes: list[tuple[str, str]] = []

    class Api:
        async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
            body = kwargs["body"]
            writes.append((body["kind"], body["metadata"]["name"]))
            return {}

    status = QueueStatus(Api(), state, Metrics(), interval=30.0)  # type: ignore[arg-type]

    async def run() -> None:
        status.start()
        status.snapshot(scheduler, {})  # an earlier snapshot: the interval starts now
        await asyncio.sleep(0)
        scheduler.apply_cluster_queue(
            ClusterQueue(
                "cq",
                (
                    CoreResourceGroup(
                        ("cpu",), (FlavorQuotas("default", {"cpu": ResourceQuota(1)}),)
                    ),
                ),
            )
        )
        scheduler.apply_local_queue(LocalQueue("default", "lq", "cq"))
        state.apply("ClusterQueue", "ADDED", {"metadata": {"name": "cq"}, "spec": {}})
        state.apply(
            "LocalQueue",
            "ADDED",
            {"metadata": {"name": "lq", "namespace": "default"}, "spec": {"clusterQueue": "cq"}},
        )
        status.snapshot(scheduler, {})
        for _ in range(20):
            await asyncio.sleep(0.01)
            if len(writes) == 2:
                break
        await status.stop()

    asyncio.run(run())
    assert sorted(writes) == [("ClusterQueue", "cq"), ("LocalQueue", "lq")]
