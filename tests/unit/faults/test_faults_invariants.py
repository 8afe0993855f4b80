"""The invariant checker, fed with hand-made watch events and relists, and run on its own
informers against a scripted API server (a watch gap and the relist after it)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from phalanx.bench.invariants import InvariantChecker, InvariantWatch, admission_usage


def cq(
    name: str,
    *,
    gpus: int,
    cohort: str | None = None,
    borrowing: int | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    res: dict[str, Any] = {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}
    if borrowing is not None:
        res["borrowingLimit"] = str(borrowing)
    spec: dict[str, Any] = {
        "resourceGroups": [
            {
                "coveredResources": ["nvidia.com/gpu"],
                "flavors": [{"name": "h100", "resources": [res]}],
            }
        ]
    }
    if cohort:
        spec["cohortName"] = cohort
    return {"metadata": {"name": name}, "spec": spec, "status": status or {}}


def wl(
    name: str,
    *,
    uid: str | None = None,
    cq_name: str | None = None,
    gpus: int = 1,
    reserved: bool = False,
    finished: bool = False,
    evicted: bool = False,
    job: str | None = None,
    since: str = "2026-01-01T00:00:00Z",
    rv: int = 1,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": uid or f"uid-{name}",
        "resourceVersion": str(rv),
    }
    if job:
        metadata["ownerReferences"] = [{"kind": "Job", "name": job, "uid": f"job-{job}"}]
    conditions = []
    status: dict[str, Any] = {"conditions": conditions}
    if cq_name is not None:
        status["admission"] = {
            "clusterQueue": cq_name,
            "podSetAssignments": [
                {
                    "name": "main",
                    "flavors": {"nvidia.com/gpu": "h100"},
                    "resourceUsage": {"nvidia.com/gpu": str(gpus)},
                    "count": 1,
                }
            ],
        }
    conditions.append(
        {
            "type": "QuotaReserved",
            "status": "True" if reserved else "False",
            "lastTransitionTime": since,
        }
    )
    if finished:
        conditions.append({"type": "Finished", "status": "True"})
    if evicted:
        conditions.append({"type": "Evicted", "status": "True"})
    return {"metadata": metadata, "status": status}


def checker_with(*queues: dict[str, Any]) -> InvariantChecker:
    checker = InvariantChecker(clock=lambda: 0.0)
    for q in queues:
        checker.on_cluster_queue("ADDED", q)
    return checker


def kinds(checker: InvariantChecker) -> list[str]:
    return [v.kind for v in checker.snapshot()]


def test_admission_usage_sums_pod_sets_per_flavor_and_resource():
    admission = {
        "clusterQueue": "a",
        "podSetAssignments": [
            {
                "flavors": {"cpu": "x", "nvidia.com/gpu": "h100"},
                "resourceUsage": {"cpu": "1500m", "nvidia.com/gpu": "8"},
            },
            {
                "flavors": {"cpu": "x", "nvidia.com/gpu": "h100"},
                "resourceUsage": {"cpu": "2", "nvidia.com/gpu": "16"},
            },
        ],
    }
    assert admission_usage(admission) == {("x", "cpu"): 3500, ("h100", "nvidia.com/gpu"): 24}


def test_admit_then_finish_is_clean_and_leaves_nothing():
    c = checker_with(cq("a", gpus=4))
    c.on_workload("ADDED", wl("w"))
    c.on_workload("MODIFIED", wl("w", cq_name="a", gpus=4, reserved=True))
    assert c.reserved["a"] == {("h100", "nvidia.com/gpu"): 4}
    c.on_workload("MODIFIED", wl("w", cq_name="a", gpus=4, reserved=True, finished=True))
    assert kinds(c) == []
    assert c.final_problems() == []
    assert c.history_by_key()["ns/w"].admissions == 1


def test_admission_changed_while_reserved_is_a_double_admission():
    c = checker_with(cq("a", gpus=8), cq("b", gpus=8))
    c.on_workload("MODIFIED", wl("w", cq_name="a", reserved=True))
    c.on_workload("MODIFIED", wl("w", cq_name="b", reserved=True))
    assert kinds(c) == ["double_admission"]
    assert c.reserved["a"][("h100", "nvidia.com/gpu")] == 0
    assert c.reserved["b"][("h100", "nvidia.com/gpu")] == 1


def test_readmission_after_an_eviction_is_counted_not_flagged():
    c = checker_with(cq("a", gpus=8))
    c.on_workload("MODIFIED", wl("w", cq_name="a", reserved=True))
    c.on_workload("MODIFIED", wl("w", cq_name="a", reserved=True, evicted=True))
    c.on_workload("MODIFIED", wl("w", reserved=False, evicted=True))
    c.on_workload("MODIFIED", wl("w", cq_name="a", reserved=True))
    h = c.history_by_key()["ns/w"]
    assert (h.admissions, h.evictions) == (2, 1)
    assert kinds(c) == []


def test_the_same_admission_seen_twice_is_one_admission():
    c = checker_with(cq("a", gpus=8))
    c.on_workload("MODIFIED", wl("w", cq_name="a", reserved=True))
    c.on_workload("MODIFIED", wl("w", cq_name="a", reserved=True))  # e.g. a relist
    assert c.history_by_key()["ns/w"].admissions == 1
    assert c.reserved["a"][("h100", "nvidia.com/gpu")] == 1


def test_queue_overshoot_without_cohort_is_above_nominal():
    c = checker_with(cq("a", gpus=2))
    c.on_workload("MODIFIED", wl("w1", cq_name="a", reserved=True))
    c.on_workload("MODIFIED", wl("w2", cq_name="a", reserved=True))
    assert kinds(c) == []
    c.on_workload("MODIFIED", wl("w3", cq_name="a", reserved=True))
    assert kinds(c) == ["overshoot"]
    assert "reserved 3 > 2" in c.snapshot()[0].detail


def test_borrowing_within_limit_is_fine_beyond_it_is_an_overshoot():
    c = checker_with(cq("a", gpus=2, cohort="co", borrowing=1), cq("b", gpus=4, cohort="co"))
    c.on_workload("MODIFIED", wl("w1", cq_name="a", gpus=3, reserved=True))
    assert kinds(c) == []
    c.on_workload("MODIFIED", wl("w2", cq_name="a", gpus=1, reserved=True))
    assert kinds(c) == ["overshoot"]
    assert "nominal + borrowingLimit" in c.snapshot()[0].detail


def test_cohort_total_above_the_sum_of_nominal_quotas_is_an_overshoot():
    c = checker_with(cq("a", gpus=2, cohort="co"), cq("b", gpus=2, cohort="co"))
    c.on_workload("MODIFIED", wl("w1", cq_name="a", gpus=3, reserved=True))
    assert kinds(c) == []
    c.on_workload("MODIFIED", wl("w2", cq_name="b", gpus=2, reserved=True))
    assert kinds(c) == ["overshoot"]
    assert "cohort co" in c.snapshot()[0].detail


def test_cohort_object_quota_adds_to_the_pool():
    c = checker_with(cq("a", gpus=2, cohort="co"))
    c.on_cohort(
        "ADDED",
        {
            "metadata": {"name": "co"},
            "spec": {
                "resourceGroups": [
                    {
                        "flavors": [
                            {
                                "name": "h100",
                                "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "2"}],
                            }
                        ]
                    }
                ]
            },
        },
    )
    c.on_workload("MODIFIED", wl("w1", cq_name="a", gpus=4, reserved=True))
    assert kinds(c) == []


def test_lowering_quota_under_running_usage_is_not_an_overshoot():
    c = checker_with(cq("a", gpus=4))
    c.on_workload("MODIFIED", wl("w1", cq_name="a", gpus=4, reserved=True))
    c.on_cluster_queue("MODIFIED", cq("a", gpus=1))
    assert kinds(c) == []


def test_status_reporting_more_than_allowed_is_flagged():
    status = {
        "flavorsReservation": [
            {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "5"}]}
        ]
    }
    c = checker_with(cq("a", gpus=4, status=status))
    assert kinds(c) == ["status_overshoot"]


def test_two_workloads_for_one_job_are_flagged():
    c = checker_with(cq("a", gpus=4))
    c.on_workload("ADDED", wl("job-x-1", job="x"))
    c.on_workload("ADDED", wl("job-x-2", job="x"))
    assert kinds(c) == ["duplicate_workload"]


def test_leaks_in_workloads_and_in_queue_status_are_reported_at_the_end():
    status = {
        "flavorsUsage": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "1"}]}],
        "reservingWorkloads": 1,
    }
    c = checker_with(cq("a", gpus=4, status=status))
    c.on_workload("MODIFIED", wl("w1", cq_name="a", reserved=True))
    problems = c.final_problems()
    assert any("still reserved" in p for p in problems)
    assert any("reserved usage left" in p for p in problems)
    assert any("status.flavorsUsage" in p for p in problems)
    assert any("status.reservingWorkloads" in p for p in problems)


def test_deleting_a_reserved_workload_releases_its_usage():
    c = checker_with(cq("a", gpus=4))
    c.on_workload("MODIFIED", wl("w1", cq_name="a", gpus=4, reserved=True))
    c.on_workload("DELETED", wl("w1", cq_name="a", gpus=4, reserved=True))
    assert c.reserved["a"][("h100", "nvidia.com/gpu")] == 0
    c.on_workload("MODIFIED", wl("w2", cq_name="a", gpus=4, reserved=True))
    assert kinds(c) == []


def test_a_workload_first_seen_finished_with_an_admission_counts_as_admitted_once():
    # The watch was cut (API-server restart) while it was reserved; a relist shows the end.
    c = checker_with(cq("a", gpus=8))
    c.on_workload("ADDED", wl("gap", cq_name="a", reserved=True, finished=True))
    h = c.history_by_key()["ns/gap"]
    assert (h.admissions, h.inferred, h.finished) == (1, True, True)
    assert c.final_problems() == []
    # A Workload that finished without ever holding an admission is not counted.
    c.on_workload("ADDED", wl("never", finished=True))
    assert c.history_by_key()["ns/never"].admissions == 0


# -- watch gaps: a relist is one snapshot --------------------------------------------------------

GPU = ("h100", "nvidia.com/gpu")


def cohort_of_two() -> InvariantChecker:
    """Two queues of 2 GPUs in one cohort: 4 GPUs in all."""
    return checker_with(cq("a", gpus=2, cohort="co"), cq("b", gpus=2, cohort="co"))


def test_a_relist_is_judged_as_one_state_not_item_by_item():
    # Before the gap: w1 (a) and w9 (b) hold the whole cohort. In the gap w9 finished and w5
    # was admitted in its place. The relist comes in name order: w1, w5, w9. Applied one
    # item at a time, w5 would be counted beside the stale w9: 6 > 4, a state the API never
    # had.
    c = cohort_of_two()
    c.on_workload("ADDED", wl("w1", cq_name="a", gpus=2, reserved=True, rv=10))
    c.on_workload("ADDED", wl("w9", cq_name="b", gpus=2, reserved=True, rv=11))
    c.on_workload_list(
        [
            wl("w1", cq_name="a", gpus=2, reserved=True, rv=10),
            wl("w5", cq_name="b", gpus=2, reserved=True, rv=20),
            wl("w9", cq_name="b", gpus=2, reserved=True, finished=True, rv=19),
        ],
        resource_version="21",
    )
    assert kinds(c) == []
    assert c.reserved["a"][GPU] == 2 and c.reserved["b"][GPU] == 2
    assert c.max_usage["b"][GPU] == 2
    h = c.history_by_key()
    assert (h["ns/w5"].admissions, h["ns/w9"].finished, h["ns/w9"].held) == (1, True, None)


def test_a_workload_deleted_in_the_gap_frees_its_quota_before_the_relist_is_judged():
    # The informer reports vanished objects as DELETED after the whole list: too late for the
    # Workloads listed before. Its absence from the snapshot is the release.
    c = cohort_of_two()
    c.on_workload("ADDED", wl("w1", cq_name="a", gpus=2, reserved=True))
    c.on_workload("ADDED", wl("w9", cq_name="b", gpus=2, reserved=True))
    c.on_workload_list(
        [
            wl("w1", cq_name="a", gpus=2, reserved=True),
            wl("w5", cq_name="b", gpus=2, reserved=True),
        ],
        resource_version="30",
    )
    assert kinds(c) == []
    assert c.reserved["b"][GPU] == 2
    assert c.history_by_key()["ns/w9"].held is None


def test_a_workload_recreated_under_its_name_in_the_gap_is_a_new_workload():
    # Same key, new uid: the informer calls it MODIFIED; the old uid's quota is free.
    c = checker_with(cq("a", gpus=2))
    c.on_workload("ADDED", wl("w", uid="old", cq_name="a", gpus=2, reserved=True))
    c.on_workload_list([wl("w", uid="new", cq_name="a", gpus=2, reserved=True)])
    assert kinds(c) == []
    assert c.reserved["a"][GPU] == 2
    assert c.workloads["old"].held is None


def test_an_overshoot_in_the_listed_state_itself_is_still_reported():
    c = cohort_of_two()
    c.on_workload("ADDED", wl("w1", cq_name="a", gpus=2, reserved=True))
    c.on_workload_list(
        [
            wl("w1", cq_name="a", gpus=2, reserved=True),
            wl("w2", cq_name="b", gpus=2, reserved=True, rv=7),
            wl("w3", cq_name="b", gpus=1, reserved=True, rv=8),
        ],
        resource_version="9",
    )
    assert kinds(c) == ["overshoot"]  # judged once, on the listed state
    detail = c.snapshot()[0].detail
    assert "cohort co" in detail and "reserved 5 > 4" in detail
    assert "relist at resourceVersion 9" in detail and "w3@8=1" in detail


def test_a_reservation_released_and_taken_again_in_the_gap_is_an_eviction_and_a_readmission():
    c = checker_with(cq("a", gpus=2), cq("b", gpus=2))
    c.on_workload("ADDED", wl("w", cq_name="a", gpus=2, reserved=True, since="T1"))
    c.on_workload_list([wl("w", cq_name="b", gpus=2, reserved=True, since="T2")])
    h = c.history_by_key()["ns/w"]
    assert (h.admissions, h.evictions) == (2, 1)
    assert kinds(c) == []
    assert (c.reserved["a"][GPU], c.reserved["b"][GPU]) == (0, 2)


def test_an_admission_changed_in_the_gap_without_a_new_reservation_is_a_double_admission():
    c = checker_with(cq("a", gpus=2), cq("b", gpus=2))
    c.on_workload("ADDED", wl("w", cq_name="a", gpus=2, reserved=True, since="T1"))
    c.on_workload_list([wl("w", cq_name="b", gpus=2, reserved=True, since="T1")])
    assert kinds(c) == ["double_admission"]


def test_cluster_queues_and_cohorts_missing_from_a_relist_are_gone():
    c = checker_with(cq("a", gpus=2), cq("b", gpus=2))
    c.on_cohort("ADDED", {"metadata": {"name": "co"}, "spec": {}})
    c.on_cluster_queue_list([cq("a", gpus=3)])
    c.on_cohort_list([])
    assert set(c.queues) == {"a"} and c.queues["a"].nominal[GPU] == 3
    assert c.cohort_quota == {}


# -- the same, end to end: the checker's own informers across an API-server restart ----------


def _cq_obj(name: str) -> dict[str, Any]:
    obj = cq(name, gpus=2, cohort="co")
    obj["metadata"]["resourceVersion"] = "1"
    return obj


class _Response:
    def __init__(self, status: int, body: bytes, lines: list[bytes] | None, hang: bool) -> None:
        self.status = status
        self.headers: dict[str, str] = {}
        self._body = body
        self._lines = lines
        self._hang = hang
        self.content = self

    async def read(self) -> bytes:
        return self._body

    async def iter_any(self) -> Any:
        for line in self._lines or ():
            yield line + b"\n"
        if self._hang:
            await asyncio.Event().wait()

    def close(self) -> None:
        pass

    async def __aenter__(self) -> _Response:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class ScriptedApiServer:
    """Answers the informers' GETs from a script per resource: ``("list", items, rv)``,
    ``("watch", events)`` (a stream that then ends, as when the API server goes away) or
    ``("watch_gone",)`` (the restarted server no longer has that resourceVersion). When a
    resource's script is exhausted, its watch stays open with nothing to say."""

    def __init__(self, scripts: dict[str, list[tuple[Any, ...]]]) -> None:
        self.scripts = scripts
        self.requests: list[tuple[str, str]] = []
        self.session = self

    def headers(self) -> dict[str, str]:
        return {}

    async def fresh_credentials(self) -> None:
        pass

    def unauthorized(self, sent_headers: dict[str, str]) -> bool:
        return False

    async def close(self) -> None:
        pass

    def get(self, path: str, *, params: dict[str, str], **_: Any) -> _Response:
        plural = path.rsplit("/", 1)[-1]
        watching = params.get("watch") == "true"
        self.requests.append((plural, "watch" if watching else "list"))
        script = self.scripts.get(plural) or []
        if not script:
            if watching:
                return _Response(200, b"", [], hang=True)
            return _Response(200, json.dumps({"items": [], "metadata": {}}).encode(), None, False)
        step = script.pop(0)
        if step[0] == "list":
            assert not watching, f"{plural}: expected a list, got a watch"
            page = {"items": step[1], "metadata": {"resourceVersion": step[2]}}
            return _Response(200, json.dumps(page).encode(), None, hang=False)
        assert watching, f"{plural}: expected a watch, got a list"
        if step[0] == "watch":
            lines = [json.dumps({"type": t, "object": o}).encode() for t, o in step[1]]
            return _Response(200, b"", lines, hang=False)
        gone = {"kind": "Status", "code": 410, "message": "too old resource version"}
        return _Response(200, b"", [json.dumps({"type": "ERROR", "object": gone}).encode()], False)


def test_the_watch_gap_of_an_api_server_restart_does_not_leave_a_stale_view():
    """What the fault suite's API-server restart does to the checker: its watch ends, the
    restarted server answers 410, the informer lists again. Workloads admitted in the gap
    come earlier in the list than ones that finished (w9) or were deleted (w8) in the gap; the
    API never had more than 4 GPUs reserved in the cohort."""
    server = ScriptedApiServer(
        {
            "clusterqueues": [("list", [_cq_obj("a"), _cq_obj("b")], "5")],
            "workloads": [
                ("list", [], "5"),
                (
                    "watch",
                    [
                        ("ADDED", wl("w1", cq_name="a", gpus=2, rv=6)),
                        ("MODIFIED", wl("w1", cq_name="a", gpus=2, reserved=True, rv=7)),
                        ("ADDED", wl("w8", cq_name="b", gpus=1, reserved=True, rv=8)),
                        ("ADDED", wl("w9", cq_name="b", gpus=1, reserved=True, rv=9)),
                    ],
                ),
                ("watch_gone",),
                (
                    "list",
                    [
                        wl("w1", cq_name="a", gpus=2, reserved=True, rv=7),
                        wl("w2", cq_name="b", gpus=1, reserved=True, rv=12),
                        wl("w3", cq_name="b", gpus=1, reserved=True, rv=13),
                        wl("w9", cq_name="b", gpus=1, reserved=True, finished=True, rv=11),
                    ],
                    "14",
                ),
            ],
        }
    )
    checker = InvariantChecker(clock=lambda: 0.0)
    watch = InvariantWatch(lambda: server, checker=checker)  # type: ignore[arg-type,return-value]

    async def run() -> None:
        await watch.start()
        # Until the watch after the relist is open: the relist has been delivered.
        for _ in range(500):
            if sum(1 for r in server.requests if r[0] == "workloads") >= 5:
                break
            await asyncio.sleep(0.01)
        await watch.stop()

    asyncio.run(run())
    assert [r for r in server.requests if r[0] == "workloads"] == [
        ("workloads", "list"),
        ("workloads", "watch"),
        ("workloads", "watch"),
        ("workloads", "list"),
        ("workloads", "watch"),
    ]
    assert [str(v) for v in checker.snapshot()] == []
    assert checker.reserved["a"][GPU] == 2 and checker.reserved["b"][GPU] == 2
    h = checker.history_by_key()
    assert h["ns/w8"].held is None and h["ns/w9"].finished
