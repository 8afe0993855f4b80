"""The topology gate remover against a scripted fake of ``api.patch``: transient failures are
retried with backoff (never dropped), one bad workload does not stop the others, and a pod's
removal from the index does not scan every workload.

No sleeps as synchronisation: each test waits on an Event the fake sets, with a timeout that
only bounds a failure."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from phalanx.operator.jobs import PODSET_LABEL, TOPOLOGY_GATE, WORKLOAD_ANNOTATION
from phalanx.operator.kube import ApiError, Resource
from phalanx.operator.metrics import Metrics
from phalanx.operator.state import ClusterState
from phalanx.operator.ungate import INDEX_LABEL, GateRemover
from phalanx.placement import encode_topology_assignment

RACK = "cloud.provider.com/topology-rack"
WAIT = 5.0  # bounds a failing test only; a passing one never waits this long

Outcome = BaseException | None  # raise it, or (None) answer with the patched pod


def _workload(name: str, *, racks: tuple[str, ...] = ("r0",)) -> dict[str, Any]:
    assignment = encode_topology_assignment([RACK], [((rack,), 1) for rack in racks])
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
        "status": {
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [
                    {"name": "main", "count": 1, "topologyAssignment": assignment}
                ],
            }
        },
    }


def _pod(name: str, *, workload: str | None, index: int = 0, rv: int = 1) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "resourceVersion": str(rv),
        "labels": {PODSET_LABEL: "main", INDEX_LABEL: str(index)},
    }
    if workload is not None:
        metadata["annotations"] = {WORKLOAD_ANNOTATION: workload}
    return {"metadata": metadata, "spec": {"schedulingGates": [{"name": TOPOLOGY_GATE}]}}


class ScriptedPods:
    """``api.patch`` for pods: each call takes the next outcome of its pod's script (an
    exception to raise, or None to apply the JSON patch and answer with the pod); a pod
    without a script (or past its end) succeeds. ``released[name]`` is set on success."""

    def __init__(self, state: ClusterState, scripts: dict[str, list[Outcome]]) -> None:
        self.state = state
        self.scripts = {name: list(script) for name, script in scripts.items()}
        self.calls: list[tuple[str, float]] = []  # (pod name, loop time)
        self.released: dict[str, asyncio.Event] = {}

    def event(self, name: str) -> asyncio.Event:
        return self.released.setdefault(name, asyncio.Event())

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: list[dict[str, Any]],
        *,
        namespace: str | None = None,
        content_type: str = "",
    ) -> dict[str, Any]:
        self.calls.append((name, asyncio.get_running_loop().time()))
        script = self.scripts.get(name) or []
        outcome = script.pop(0) if script else None
        if outcome is not None:
            raise outcome
        pod = copy.deepcopy(self.state.get("Pod", f"{namespace}/{name}"))
        assert pod is not None
        for op in patch:
            if op["op"] == "add" and op["path"] == "/spec/nodeSelector":
                pod["spec"]["nodeSelector"] = op["value"]
            elif op["op"] == "remove":
                index = int(op["path"].rsplit("/", 1)[1])
                del pod["spec"]["schedulingGates"][index]
        pod["metadata"]["resourceVersion"] = str(int(pod["metadata"]["resourceVersion"]) + 1)
        self.event(name).set()
        return pod


def _run(
    scripts: dict[str, list[Outcome]],
    body: Callable[[GateRemover, ScriptedPods, ClusterState], Awaitable[None]],
    *,
    retry_base: float = 0.01,
    retry_max: float = 0.05,
) -> None:
    async def main() -> None:
        state = ClusterState()
        api = ScriptedPods(state, scripts)
        remover = GateRemover(
            api,  # type: ignore[arg-type]
            state,
            Metrics(),
            retry_base=retry_base,
            retry_max=retry_max,
        )
        remover.start()
        try:
            await body(remover, api, state)
        finally:
            await remover.stop()

    asyncio.run(main())


def _gated(state: ClusterState, name: str) -> bool:
    pod = state.get("Pod", f"ns/{name}")
    assert pod is not None
    return bool(pod["spec"].get("schedulingGates"))


@pytest.mark.parametrize(
    "error",
    [
        aiohttp.ClientConnectionError("connection reset"),
        ConnectionRefusedError(111, "refused"),
        TimeoutError(),
        ApiError(503, {"reason": "ServiceUnavailable"}, method="PATCH", path="/p"),
    ],
    ids=["client-error", "os-error", "timeout", "http-503"],
)
def test_a_transient_failure_is_retried_and_the_pod_released(error: BaseException) -> None:
    # Before the fix a network error escaped _release and ended the remover's task: the pod
    # (and every later one) stayed gated. A 5xx was logged and dropped.
    async def body(remover: GateRemover, api: ScriptedPods, state: ClusterState) -> None:
        state.apply("Workload", "ADDED", _workload("wl"))
        state.apply("Pod", "ADDED", _pod("p0", workload="wl"))
        await asyncio.wait_for(api.event("p0").wait(), WAIT)
        assert [name for name, _ in api.calls] == ["p0", "p0"]
        assert not _gated(state, "p0")
        pod = state.get("Pod", "ns/p0")
        assert pod is not None and pod["spec"]["nodeSelector"] == {RACK: "r0"}
        assert remover._task is not None and not remover._task.done()

    _run({"p0": [error]}, body)


@pytest.mark.parametrize("status", [409, 422])
def test_a_pod_changed_under_the_patch_is_looked_at_again(status: int) -> None:
    # The JSON patch's ``test`` op failed: the pod changed. It used to be dropped (left gated
    # until some later event); it is retried from the state.
    failed = ApiError(status, {"reason": "Invalid"}, method="PATCH", path="/p")

    async def body(remover: GateRemover, api: ScriptedPods, state: ClusterState) -> None:
        state.apply("Workload", "ADDED", _workload("wl"))
        state.apply("Pod", "ADDED", _pod("p0", workload="wl"))
        await asyncio.wait_for(api.event("p0").wait(), WAIT)
        assert len(api.calls) == 2
        assert not _gated(state, "p0")

    _run({"p0": [failed]}, body)


def test_a_deleted_pod_is_not_retried() -> None:
    gone = ApiError(404, {"reason": "NotFound"}, method="PATCH", path="/p")

    async def body(remover: GateRemover, api: ScriptedPods, state: ClusterState) -> None:
        state.apply("Workload", "ADDED", _workload("wl", racks=("r0", "r1")))
        state.apply("Pod", "ADDED", _pod("p0", workload="wl"))
        state.apply("Pod", "ADDED", _pod("p1", workload="wl", index=1))
        await asyncio.wait_for(api.event("p1").wait(), WAIT)
        # Passes run one batch after the other: once a later workload's pod is released,
        # the pass over "wl" has ended.
        state.apply("Workload", "ADDED", _workload("other"))
        state.apply("Pod", "ADDED", _pod("o0", workload="other"))
        await asyncio.wait_for(api.event("o0").wait(), WAIT)
        assert [name for name, _ in api.calls] == ["p0", "p1", "o0"]
        assert "ns/wl" not in remover._retries and "ns/wl" not in remover._failures

    _run({"p0": [gone]}, body)


def test_retries_back_off_exponentially_up_to_the_cap() -> None:
    down = aiohttp.ClientConnectionError("down")

    async def body(remover: GateRemover, api: ScriptedPods, state: ClusterState) -> None:
        state.apply("Workload", "ADDED", _workload("wl"))
        state.apply("Pod", "ADDED", _pod("p0", workload="wl"))
        await asyncio.wait_for(api.event("p0").wait(), WAIT)
        times = [t for _, t in api.calls]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert len(gaps) == 5
        # Lower bounds only (a busy machine makes gaps longer, never shorter): 0.04, 0.08,
        # 0.16, then the cap 0.2 and 0.2. Without backoff the gaps would be ~0.
        for gap, expected in zip(gaps, [0.04, 0.08, 0.16, 0.2, 0.2], strict=True):
            assert gap >= expected * 0.8, (gaps, expected)
        assert "ns/wl" not in remover._failures, "a released workload starts over"

    _run({"p0": [down] * 5}, body, retry_base=0.04, retry_max=0.2)


def test_retry_delay_doubles_and_is_capped() -> None:
    remover = GateRemover(None, ClusterState(), Metrics(), retry_base=0.5, retry_max=30.0)  # type: ignore[arg-type]
    assert [remover.retry_delay(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]


def test_a_malformed_workload_does_not_stop_the_others() -> None:
    # A bad topologyAssignment raises ValueError inside the pass; it used to end the task.
    async def body(remover: GateRemover, api: ScriptedPods, state: ClusterState) -> None:
        bad = _workload("bad")
        bad["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"] = {"levels": []}
        state.apply("Workload", "ADDED", bad)
        state.apply("Workload", "ADDED", _workload("good"))
        state.apply("Pod", "ADDED", _pod("b0", workload="bad"))
        state.apply("Pod", "ADDED", _pod("g0", workload="good"))
        await asyncio.wait_for(api.event("g0").wait(), WAIT)
        # The task lives on: a pod arriving later is released too.
        state.apply("Workload", "ADDED", _workload("later"))
        state.apply("Pod", "ADDED", _pod("l0", workload="later"))
        await asyncio.wait_for(api.event("l0").wait(), WAIT)
        assert remover._task is not None and not remover._task.done()
        assert _gated(state, "b0")

    _run({}, body)


class _NoScan(dict[str, set[str]]):
    """The workload -> pods index, failing if anything walks over every workload."""

    def values(self) -> Any:
        raise AssertionError("scanned every workload to remove one pod")

    def items(self) -> Any:
        raise AssertionError("scanned every workload to remove one pod")

    def __iter__(self) -> Any:
        raise AssertionError("scanned every workload to remove one pod")


def test_pod_removal_uses_the_reverse_index() -> None:
    state = ClusterState()
    remover = GateRemover(None, state, Metrics())  # type: ignore[arg-type]
    remover._mark = lambda wl_key: None  # type: ignore[method-assign]  # no task here
    remover._pods_of = _NoScan()
    for w in range(50):
        state.apply("Pod", "ADDED", _pod(f"p{w}", workload=f"wl{w}"))
    state.apply("Pod", "ADDED", _pod("q", workload="wl7"))
    assert remover._pods_of["ns/wl7"] == {"ns/p7", "ns/q"}

    state.apply("Pod", "DELETED", _pod("p7", workload="wl7"))
    assert remover._pods_of["ns/wl7"] == {"ns/q"}
    # The annotation removed (the pod no longer belongs to the workload).
    state.apply("Pod", "MODIFIED", _pod("q", workload=None, rv=2))
    assert "ns/wl7" not in remover._pods_of and "ns/q" not in remover._workload_of
    # A deleted Workload drops its pods from both directions.
    state.apply("Workload", "ADDED", _workload("wl3"))
    state.apply("Workload", "DELETED", _workload("wl3"))
    assert "ns/wl3" not in remover._pods_of and "ns/p3" not in remover._workload_of
    assert len(remover._pods_of) == 48 and len(remover._workload_of) == 48
