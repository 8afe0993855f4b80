"""The Job controller's bookkeeping is bounded by the live Jobs: the Workload -> Job map
forgets deleted Jobs (in either deletion order), a Job created again under the same name
replaces its old entry, and retry timers die with their Job and with the controller."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from phalanx.operator import jobs
from phalanx.operator.jobsync import JobController
from phalanx.operator.state import ClusterState


def job(name: str, uid: str, namespace: str = "ns") -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "labels": {"kueue.x-k8s.io/queue-name": "lq"},
        },
        "spec": {"suspend": True},
    }


def workload_of(job_obj: dict[str, Any]) -> dict[str, Any]:
    metadata = job_obj["metadata"]
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": jobs.workload_name(metadata["name"], metadata["uid"]),
            "namespace": metadata["namespace"],
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": metadata["name"]}
            ],
        },
    }


def controller() -> tuple[ClusterState, JobController]:
    state = ClusterState()
    return state, JobController(None, state, None, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("jobs_first", [True, False])
def test_the_owner_map_is_empty_once_jobs_and_workloads_are_deleted(jobs_first: bool) -> None:
    state, ctl = controller()
    made = [job(f"j{i}", f"uid-{i}") for i in range(50)]
    for obj in made:
        state.apply("Job", "ADDED", obj)
        state.apply("Workload", "ADDED", workload_of(obj))
    assert len(ctl._owner_of) == 50
    kinds = [("Job", made), ("Workload", [workload_of(o) for o in made])]
    for kind, objs in kinds if jobs_first else reversed(kinds):
        for obj in objs:
            state.apply(kind, "DELETED", obj)
    assert ctl._owner_of == {}
    assert ctl._workload_of == {}


def test_a_deleted_workload_of_a_live_job_still_wakes_the_job() -> None:
    state, ctl = controller()
    obj = job("j", "uid-1")
    state.apply("Job", "ADDED", obj)
    state.apply("Workload", "ADDED", workload_of(obj))
    ctl.work.queued.clear()
    state.apply("Workload", "DELETED", workload_of(obj))
    assert ctl.work.queued == {"ns/j"}  # the Job creates its Workload again
    assert ctl._owner_of == {f"ns/{workload_of(obj)['metadata']['name']}": "ns/j"}


def test_a_job_created_again_under_its_name_replaces_its_entry() -> None:
    state, ctl = controller()
    state.apply("Job", "ADDED", job("j", "uid-1"))
    state.apply("Job", "DELETED", job("j", "uid-1"))
    state.apply("Job", "ADDED", job("j", "uid-2"))
    new_key = f"ns/{workload_of(job('j', 'uid-2'))['metadata']['name']}"
    assert ctl._owner_of == {new_key: "ns/j"}
    # Without a deletion in between (a missed event): the old entry still goes.
    state.apply("Job", "MODIFIED", job("j", "uid-3"))
    assert list(ctl._owner_of.values()) == ["ns/j"]
    assert len(ctl._owner_of) == 1


def capture_timers(monkeypatch: pytest.MonkeyPatch) -> list[asyncio.TimerHandle]:
    loop = asyncio.get_running_loop()
    handles: list[asyncio.TimerHandle] = []
    real = loop.call_later

    def call_later(delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        handle = real(delay, callback, *args)
        handles.append(handle)
        return handle

    monkeypatch.setattr(loop, "call_later", call_later)
    return handles


def test_stop_cancels_pending_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> list[asyncio.TimerHandle]:
        _, ctl = controller()
        handles = capture_timers(monkeypatch)
        for key in ("ns/a", "ns/b", "ns/c"):
            ctl.work.retry_later(key)
        await ctl.stop()
        return handles

    handles = asyncio.run(main())
    assert len(handles) == 3
    assert all(h.cancelled() for h in handles)


def test_a_deleted_job_drops_its_retry_and_a_job_has_one_pending_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def main() -> tuple[list[asyncio.TimerHandle], JobController]:
        state, ctl = controller()
        handles = capture_timers(monkeypatch)
        state.apply("Job", "ADDED", job("j", "uid-1"))
        ctl.work.retry_later("ns/j")
        ctl.work.retry_later("ns/j")  # a later retry while an earlier one is due: one timer
        assert len(handles) == 1 and len(ctl.work.retries) == 1
        state.apply("Job", "DELETED", job("j", "uid-1"))
        return handles, ctl

    handles, ctl = asyncio.run(main())
    assert handles[0].cancelled()
    assert ctl.work.retries == {} and ctl.work.failures == {}


def test_a_fired_retry_requeues_the_job_and_leaves_no_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def main() -> JobController:
        _, ctl = controller()
        loop = asyncio.get_running_loop()
        scheduled: list[tuple[Any, tuple[Any, ...]]] = []
        real = loop.call_later

        def call_later(delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
            scheduled.append((callback, args))
            return real(delay, callback, *args)

        monkeypatch.setattr(loop, "call_later", call_later)
        ctl.work.retry_later("ns/j")
        ctl.work.retries["ns/j"].cancel()
        callback, args = scheduled[0]
        callback(*args)  # what the timer runs when it fires: no waiting on the clock
        return ctl

    ctl = asyncio.run(main())
    assert ctl.work.retries == {}
    assert ctl.work.queued == {"ns/j"}
