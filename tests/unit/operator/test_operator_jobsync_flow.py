"""The Job controller's whole life of a queued Job, driven by a scripted API.

The scripted API keeps Jobs and Workloads, applies JSON patches as the API server does
(``jsonpatch``, including ``test`` operations) and can fail a call in the ways a connection
does. Each test reconciles step by step and looks at what the API holds; no sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from typing import Any

import aiohttp
import jsonpatch

from phalanx.operator.jobsync import JobController, RetryLater
from phalanx.operator.kube import ApiError, Resource
from phalanx.operator.metrics import Metrics
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import StatusWriter

NS = "ns"


class ScriptedApi:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0
        self.fail_next: list[BaseException] = []
        self.creates = 0

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(obj)

    def _fault(self) -> None:
        if self.fail_next:
            raise self.fail_next.pop(0)

    async def create(
        self, resource: Resource, body: dict[str, Any], *, namespace: str | None = None
    ) -> dict[str, Any]:
        self._fault()
        if "generateName" in body["metadata"]:
            body = copy.deepcopy(body)
            body["metadata"]["name"] = f"{body['metadata']['generateName']}{self.version}"
        key = (resource.plural, f"{namespace}/{body['metadata']['name']}")
        if key in self.objects:
            raise ApiError(409, {"reason": "AlreadyExists"}, method="POST", path=key[1])
        if resource.plural == "workloads":
            self.creates += 1
        obj = copy.deepcopy(body)
        obj["metadata"].setdefault("uid", f"uid-{body['metadata']['name']}")
        obj["metadata"]["namespace"] = namespace
        self.objects[key] = obj
        return self._bump(obj)

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        content_type: str = "",
    ) -> dict[str, Any]:
        self._fault()
        key = (resource.plural, f"{namespace}/{name}")
        current = self.objects[key]
        if isinstance(patch, list):
            try:
                updated = jsonpatch.apply_patch(current, patch)
            except (jsonpatch.JsonPatchTestFailed, jsonpatch.JsonPatchConflict) as error:
                raise ApiError(422, {"message": str(error)}, method="PATCH", path=name) from None
        else:
            precondition = (patch.get("metadata") or {}).get("resourceVersion")
            if precondition and precondition != current["metadata"].get("resourceVersion"):
                raise ApiError(409, {"reason": "Conflict"}, method="PATCH", path=name)
            updated = copy.deepcopy(current)
            for field, value in patch.items():
                for k, v in value.items():
                    if v is None:
                        updated.setdefault(field, {}).pop(k, None)
                    else:
                        updated.setdefault(field, {})[k] = v
        self.objects[key] = updated
        return self._bump(updated)

    def job(self) -> dict[str, Any]:
        return self.objects[("jobs", f"{NS}/train")]

    def workload(self) -> dict[str, Any]:
        (found,) = [o for (kind, _), o in self.objects.items() if kind == "workloads"]
        return found


def a_job() -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "namespace": NS,
            "uid": "job-uid-1",
            "labels": {"kueue.x-k8s.io/queue-name": "lq"},
        },
        "spec": {
            "suspend": True,
            "parallelism": 2,
            "completions": 2,
            "template": {
                "spec": {
                    "containers": [
                        {"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}
                    ]
                }
            },
        },
    }


class Harness:
    def __init__(self) -> None:
        self.api = ScriptedApi()
        self.state = ClusterState()
        writer = StatusWriter(self.api, self.state, Metrics())  # type: ignore[arg-type]
        self.jobs = JobController(self.api, self.state, writer, Metrics())  # type: ignore[arg-type]
        job = a_job()
        self.api.objects[("jobs", f"{NS}/train")] = job
        self.state.apply("Job", "ADDED", self.api._bump(job))
        self.state.apply(
            "ResourceFlavor",
            None,
            {"metadata": {"name": "h100"}, "spec": {"nodeLabels": {"gpu": "h100"}}},
        )

    async def reconcile(self) -> None:
        await self.jobs.reconcile(f"{NS}/train")

    def admit(self) -> None:
        """What the scheduling loop's admission write leaves in the API and the state."""
        wl = self.api.workload()
        wl["status"] = {
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                {"type": "Admitted", "status": "True", "reason": "Admitted"},
            ],
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [
                    {"name": "main", "count": 2, "flavors": {"nvidia.com/gpu": "h100"}}
                ],
            },
        }
        self.state.apply("Workload", "MODIFIED", self.api._bump(wl))

    def job_controller_writes(self, **status: Any) -> dict[str, Any]:
        """The Job controller's status write: in the API and, unless told otherwise by the
        caller keeping the returned old version, in the state."""
        job = self.api.job()
        old = copy.deepcopy(job)
        job["status"] = {**(job.get("status") or {}), **status}
        self.state.apply("Job", "MODIFIED", self.api._bump(job))
        return old

    def evict(self) -> None:
        wl = self.api.workload()
        wl["status"]["conditions"].append(
            {"type": "Evicted", "status": "True", "reason": "Preempted"}
        )
        self.state.apply("Workload", "MODIFIED", self.api._bump(wl))


def test_a_queued_job_gets_a_workload_starts_on_admission_and_stops_on_eviction() -> None:
    async def main() -> None:
        h = Harness()
        await h.reconcile()
        wl = h.api.workload()
        assert wl["spec"]["queueName"] == "lq"
        assert h.api.job()["spec"]["suspend"] is True
        await h.reconcile()  # nothing to do until admitted
        assert h.api.creates == 1
        h.admit()
        await h.reconcile()
        job = h.api.job()
        assert job["spec"]["suspend"] is False
        assert job["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": "h100"}
        h.evict()
        await h.reconcile()
        assert h.api.job()["spec"]["suspend"] is True
        await h.reconcile()
        restored = h.api.job()["spec"]["template"]["spec"]
        assert not restored.get("nodeSelector"), "the admission's node labels stayed on the Job"

    asyncio.run(main())


def test_a_workload_create_whose_answer_was_lost_is_not_created_twice() -> None:
    async def main() -> None:
        h = Harness()

        async def create_then_reset(*args: Any, **kwargs: Any) -> dict[str, Any]:
            await ScriptedApi.create(h.api, *args, **kwargs)
            raise aiohttp.ServerDisconnectedError()

        h.api.create = create_then_reset  # type: ignore[method-assign]
        with contextlib.suppress(aiohttp.ClientError):  # the worker retries the Job later
            await h.reconcile()
        del h.api.create  # the normal scripted create again
        await h.reconcile()  # the retry meets AlreadyExists: waits for the watch event
        assert h.api.creates == 1

    asyncio.run(main())


def test_a_failed_job_patch_is_retried_later_not_lost() -> None:
    async def main() -> None:
        h = Harness()
        await h.reconcile()
        h.admit()
        h.api.fail_next.append(ApiError(500, {"reason": "InternalError"}, method="P", path="/"))
        raised = False
        try:
            await h.reconcile()
        except RetryLater:
            raised = True
        assert raised and h.api.job()["spec"]["suspend"] is True
        await h.reconcile()
        assert h.api.job()["spec"]["suspend"] is False

    asyncio.run(main())


SUSPENDED = {"type": "Suspended", "status": "True", "reason": "JobSuspended"}
START = "2026-12-03T10:00:00Z"


def test_a_preempted_job_whose_pods_succeeded_keeps_its_start_time_and_finishes() -> None:
    async def main() -> None:
        h = Harness()
        await h.reconcile()
        h.admit()
        await h.reconcile()
        h.job_controller_writes(startTime=START, active=2)
        h.evict()
        await h.reconcile()
        assert h.api.job()["spec"]["suspend"] is True
        # Both pods had succeeded: the Job controller decides success, not suspension.
        h.job_controller_writes(
            active=0,
            succeeded=2,
            conditions=[{"type": "SuccessCriteriaMet", "status": "True"}],
        )
        await h.reconcile()
        assert h.api.job()["status"]["startTime"] == START, "cleared: Complete would be refused"
        assert "nodeSelector" in h.api.job()["spec"]["template"]["spec"]  # left as it ran
        h.job_controller_writes(
            conditions=[
                {"type": "SuccessCriteriaMet", "status": "True"},
                {"type": "Complete", "status": "True"},
            ]
        )
        finishing: list[str] = []

        async def apply_status(key: str, build: Any, *, verb: str) -> Any:
            finishing.append(verb)
            return type("Outcome", (), {"ok": True, "status": 200, "error": ""})()

        h.jobs.writer.apply_status = apply_status  # type: ignore[method-assign]
        await h.reconcile()
        assert finishing == ["finish"]

    asyncio.run(main())


def test_a_start_time_clear_is_refused_when_the_job_changed_since_it_was_read() -> None:
    async def main() -> None:
        h = Harness()
        await h.reconcile()
        h.admit()
        await h.reconcile()
        h.job_controller_writes(startTime=START, active=2)
        h.evict()
        await h.reconcile()  # suspended
        h.job_controller_writes(active=0, conditions=[SUSPENDED])
        # The Job controller counts a success the operator has not seen yet.
        seen = copy.deepcopy(h.state.get("Job", f"{NS}/train"))
        h.job_controller_writes(succeeded=2)
        h.state.apply("Job", "MODIFIED", seen)
        await h.reconcile()
        assert h.api.job()["status"]["startTime"] == START

    asyncio.run(main())


def test_a_preempted_job_is_restored_once_the_job_controller_suspended_it() -> None:
    async def main() -> None:
        h = Harness()
        await h.reconcile()
        h.admit()
        await h.reconcile()
        h.job_controller_writes(startTime=START, active=2)
        h.evict()
        await h.reconcile()
        await h.reconcile()  # pods still active: nothing to do yet
        assert h.api.job()["status"]["startTime"] == START
        h.job_controller_writes(active=0, conditions=[SUSPENDED])
        await h.reconcile()
        assert "startTime" not in h.api.job()["status"]
        await h.reconcile()
        assert not h.api.job()["spec"]["template"]["spec"].get("nodeSelector")

    asyncio.run(main())


def test_a_job_kueue_started_is_restored_when_phalanx_preempts_it() -> None:
    # Kueue marks a started template with the kueue.x-k8s.io/podset label, and adds the
    # kueue.x-k8s.io/workload annotation only with TAS: after a move from Kueue, a Job it
    # started carries the label alone, and its admission must still be taken back.
    async def main() -> None:
        h = Harness()
        await h.reconcile()
        h.admit()
        await h.reconcile()
        job = h.api.job()
        del job["spec"]["template"]["metadata"]["annotations"]["kueue.x-k8s.io/workload"]
        assert job["spec"]["template"]["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "main"
        h.state.apply("Job", "MODIFIED", h.api._bump(job))
        h.job_controller_writes(startTime=START, active=2)
        h.evict()
        await h.reconcile()
        h.job_controller_writes(active=0, conditions=[SUSPENDED])
        await h.reconcile()  # startTime cleared
        await h.reconcile()
        restored = h.api.job()["spec"]["template"]
        assert not restored["spec"].get("nodeSelector")
        assert "kueue.x-k8s.io/podset" not in (restored["metadata"].get("labels") or {})

    asyncio.run(main())


def test_a_job_that_ran_before_it_was_queued_starts_on_admission() -> None:
    async def main() -> None:
        h = Harness()
        # Created while no webhook suspended it: the Job controller started it.
        job = h.api.job()
        job["spec"]["suspend"] = False
        h.state.apply("Job", "MODIFIED", h.api._bump(job))
        h.job_controller_writes(startTime=START, active=2)
        await h.reconcile()  # suspends it, creates the Workload
        assert h.api.job()["spec"]["suspend"] is True and h.api.creates == 1
        h.admit()
        await h.reconcile()  # the Job controller has not stopped it yet: wait
        assert h.api.job()["spec"]["suspend"] is True
        h.job_controller_writes(active=0, conditions=[SUSPENDED])
        await h.reconcile()  # startTime cleared: the template is mutable again
        await h.reconcile()
        started = h.api.job()
        assert started["spec"]["suspend"] is False
        assert started["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": "h100"}

    asyncio.run(main())


def _events(h: Harness) -> list[dict[str, Any]]:
    return [o for (kind, _), o in h.api.objects.items() if kind == "events"]


def test_a_missing_workload_priority_class_holds_the_job_until_it_exists() -> None:
    async def main() -> None:
        h = Harness()
        job = h.api.job()
        job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "urgent"
        h.state.apply("Job", "MODIFIED", h.api._bump(job))
        await h.reconcile()
        await h.reconcile()  # told once per Job version, not once per pass
        assert h.api.creates == 0
        assert [e["reason"] for e in _events(h)] == ["WorkloadPriorityClassNotFound"]
        assert "urgent" in _events(h)[0]["message"]
        urgent = {"metadata": {"name": "urgent"}, "value": 7}
        h.state.apply("WorkloadPriorityClass", "ADDED", urgent)
        assert f"{NS}/train" in h.jobs.work.queued  # its creation brings the Job back
        await h.reconcile()
        assert h.api.workload()["spec"]["priority"] == 7

    asyncio.run(main())


def test_an_invalid_min_parallelism_is_told_on_the_job_without_a_traceback() -> None:
    async def main() -> None:
        h = Harness()
        job = h.api.job()
        job["metadata"]["annotations"] = {"kueue.x-k8s.io/job-min-parallelism": "many"}
        h.state.apply("Job", "MODIFIED", h.api._bump(job))
        await h.reconcile()  # returns: nothing to retry until the Job changes
        assert h.api.creates == 0
        (event,) = _events(h)
        assert event["reason"] == "InvalidJob"
        assert "kueue.x-k8s.io/job-min-parallelism" in event["message"]

    asyncio.run(main())


def test_an_ending_job_whose_start_time_was_cleared_gets_it_back() -> None:
    async def main() -> None:
        h = Harness()
        job = h.api.job()
        job["metadata"]["creationTimestamp"] = "2026-12-03T09:59:00Z"
        h.state.apply("Job", "MODIFIED", h.api._bump(job))
        await h.reconcile()
        h.admit()
        await h.reconcile()
        h.job_controller_writes(startTime=START, active=2)
        h.evict()
        await h.reconcile()
        h.job_controller_writes(active=0, conditions=[SUSPENDED])
        await h.reconcile()  # nothing in the status says a pod succeeded: cleared
        assert "startTime" not in h.api.job()["status"]
        # The Job controller counts a success it had not seen: the end is decided, and
        # Complete would be refused without a startTime.
        h.job_controller_writes(
            succeeded=2, conditions=[SUSPENDED, {"type": "SuccessCriteriaMet", "status": "True"}]
        )
        await h.reconcile()
        assert h.api.job()["status"]["startTime"] == "2026-12-03T09:59:00Z"
        await h.reconcile()  # nothing more to do until Complete
        assert h.api.job()["spec"]["suspend"] is True

    asyncio.run(main())
