"""The visibility label on the operator's own Pod (``phalanx.operator.podlabel``) and the
manifests that route the visibility Service by it: cleared at start, set once the replica
schedules, cleared when it stops or loses the Lease; nothing without ``POD_NAME``; failures
retried and logged, an unknown outcome read back; the Service selects the label and the
Deployment names the Pod through the downward API."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from phalanx.operator.kube import ApiError, KubeApi
from phalanx.operator.podlabel import SERVING_LABEL, SERVING_VALUE, ServingLabel
from phalanx.operator.retry import Backoff

REPO = Path(__file__).resolve().parents[3]
POD_PATH = "/api/v1/namespaces/phalanx-system/pods/phalanx-0"
FAST = Backoff(initial=0.01, maximum=0.02)


class FakePods:
    """A KubeApi stand-in holding one Pod's labels; ``failures`` are raised by the next
    patches in order (an exception instance, or ``"lost"``: applied, then a reset)."""

    def __init__(self, *, labels: dict[str, str] | None = None, exists: bool = True) -> None:
        self.labels: dict[str, str] = dict(labels or {})
        self.exists = exists
        self.failures: list[Any] = []
        self.calls: list[tuple[str, str, Any]] = []

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        self.calls.append((method, path, body if body is not None else params))
        if method == "GET":
            assert path == "/api/v1/namespaces/phalanx-system/pods"
            assert params == {"fieldSelector": "metadata.name=phalanx-0"}
            items = [{"metadata": {"name": "phalanx-0", "labels": dict(self.labels)}}]
            return {"items": items if self.exists else []}
        assert (method, path, content_type) == ("PATCH", POD_PATH, "application/merge-patch+json")
        failure = self.failures.pop(0) if self.failures else None
        if isinstance(failure, Exception):
            raise failure
        if not self.exists:
            raise ApiError(404, {"reason": "NotFound"}, method=method, path=path)
        for key, value in body["metadata"]["labels"].items():
            if value is None:
                self.labels.pop(key, None)
            else:
                self.labels[key] = value
        if failure == "lost":
            raise aiohttp_reset()
        return {"metadata": {"labels": dict(self.labels)}}

    @property
    def patches(self) -> list[Any]:
        return [c[2]["metadata"]["labels"][SERVING_LABEL] for c in self.calls if c[0] == "PATCH"]


def aiohttp_reset() -> Exception:
    import aiohttp

    return aiohttp.ServerDisconnectedError()


def _label(api: FakePods) -> ServingLabel:
    return ServingLabel(
        cast(KubeApi, api),
        namespace="phalanx-system",
        name="phalanx-0",
        backoff=FAST,
    )


async def _running(label: ServingLabel) -> asyncio.Task[None]:
    task = label.start()
    await asyncio.sleep(0)
    return task


def test_outside_a_pod_there_is_no_label():
    api = FakePods()
    assert ServingLabel.from_env(api, {}) is None  # type: ignore[arg-type]
    assert ServingLabel.from_env(api, {"POD_NAMESPACE": "x"}) is None  # type: ignore[arg-type]
    label = ServingLabel.from_env(
        api,  # type: ignore[arg-type]
        {"POD_NAME": "phalanx-0", "POD_NAMESPACE": "phalanx-system"},
    )
    assert label is not None and label.pod == "phalanx-system/phalanx-0"


def test_a_replica_clears_a_stale_label_at_start_then_sets_it_when_it_schedules_and_clears_it():
    async def scenario() -> None:
        # A container restarted after its pod led: the label of its last run is still there.
        api = FakePods(labels={SERVING_LABEL: SERVING_VALUE, "app.kubernetes.io/name": "phalanx"})
        label = _label(api)
        label.want(False)
        task = await _running(label)
        assert await label.settle(1.0)
        assert api.labels == {"app.kubernetes.io/name": "phalanx"}
        label.want(True)  # gained the Lease and synced
        assert await label.settle(1.0)
        assert api.labels[SERVING_LABEL] == SERVING_VALUE
        label.want(False)  # lost it, or stopping
        assert await label.settle(1.0)
        assert SERVING_LABEL not in api.labels
        assert api.patches == [None, SERVING_VALUE, None]
        await label.stop()
        assert task.done()

    asyncio.run(scenario())


def test_the_last_wanted_state_wins_when_it_changes_during_a_write():
    async def scenario() -> None:
        api = FakePods()
        label = _label(api)
        task = await _running(label)
        label.want(True)
        label.want(False)
        label.want(True)
        assert await label.settle(1.0)
        assert api.labels.get(SERVING_LABEL) == SERVING_VALUE
        await label.stop()
        assert task.done()

    asyncio.run(scenario())


def test_failures_are_logged_and_retried_and_never_raise(caplog: pytest.LogCaptureFixture):
    async def scenario() -> None:
        api = FakePods()
        api.failures = [
            ApiError(403, {"reason": "Forbidden"}, method="PATCH", path=POD_PATH),
            ApiError(429, {"reason": "TooManyRequests"}, method="PATCH", path=POD_PATH),
        ]
        label = _label(api)
        task = await _running(label)
        label.want(True)
        assert await label.settle(2.0)
        assert api.labels.get(SERVING_LABEL) == SERVING_VALUE
        assert label.failures == 2 and len(api.patches) == 3
        assert not task.done()
        await label.stop()

    with caplog.at_level(logging.WARNING, logger="phalanx.operator.podlabel"):
        asyncio.run(scenario())
    failed = [r.getMessage() for r in caplog.records if "serving_label_failed" in r.getMessage()]
    assert len(failed) == 2 and "403" in failed[0], failed


def test_an_unknown_outcome_is_read_back_not_blindly_repeated():
    async def scenario() -> None:
        api = FakePods()
        api.failures = ["lost"]  # the patch landed, the answer was lost
        label = _label(api)
        label.want(True)
        task = await _running(label)
        assert await label.settle(1.0)
        assert [c[0] for c in api.calls] == ["PATCH", "GET"]
        assert label.failures == 0
        await label.stop()
        assert task.done()

    asyncio.run(scenario())


def test_an_unknown_outcome_that_did_not_land_is_retried():
    async def scenario() -> None:
        api = FakePods()
        api.failures = [TimeoutError()]  # raised before it was applied
        label = _label(api)
        label.want(True)
        task = await _running(label)
        assert await label.settle(1.0)
        assert [c[0] for c in api.calls] == ["PATCH", "GET", "PATCH"]
        assert api.labels.get(SERVING_LABEL) == SERVING_VALUE
        await label.stop()
        assert task.done()

    asyncio.run(scenario())


def test_a_missing_pod_holds_no_label_and_settle_is_bounded():
    async def scenario() -> None:
        api = FakePods(exists=False)
        label = _label(api)
        task = await _running(label)
        label.want(False)
        assert await label.settle(1.0)  # nothing to remove
        label.want(True)
        assert not await label.settle(0.1)  # cannot be set: retried, settle gives up
        assert label.failures >= 1 and not task.done()
        await label.stop()

    asyncio.run(scenario())


# -- the operator: start, leadership, stop ---------------------------------------------------


class _Loop:
    def __init__(self) -> None:
        self.ready = asyncio.Event()


def _operator(label: ServingLabel) -> Any:
    from phalanx.operator.runtime import Heartbeat, PhalanxOperator

    op = PhalanxOperator.__new__(PhalanxOperator)
    op.serving_label = label
    op.heartbeat = Heartbeat(stall_seconds=20)
    op.loop = _Loop()  # type: ignore[assignment]
    op._stopping = False
    op._components = []
    op._tasks = []
    op._hooks = None
    op.elector = None
    op.endpoints = None
    op.visibility = None
    op._sidecar_stops = []
    op.api = None
    op.fatal = None
    return op


def test_the_operator_labels_its_pod_once_it_schedules_and_unlabels_it_when_it_stops(
    monkeypatch: pytest.MonkeyPatch,
):
    import phalanx.operator.runtime as runtime

    kills: list[int] = []
    monkeypatch.setattr(runtime.os, "kill", lambda pid, sig: kills.append(sig))

    async def scenario() -> None:
        api = FakePods()
        label = _label(api)
        op = _operator(label)
        label.want(False)
        task = await _running(label)
        arm = asyncio.get_running_loop().create_task(op._arm_heartbeat())
        await asyncio.sleep(0.05)
        assert label.wanted is False  # leading, but not synced: it cannot answer yet
        op.loop.ready.set()
        await arm
        assert await label.settle(1.0) and api.labels.get(SERVING_LABEL) == SERVING_VALUE
        op._lost_leadership()
        assert kills  # it exits: SIGTERM, whose cleanup takes the label off
        await op.cleanup()
        assert SERVING_LABEL not in api.labels
        await label.stop()
        assert task.done()

    asyncio.run(scenario())


# -- the manifests ----------------------------------------------------------------------------


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_the_visibility_service_selects_only_the_labelled_pod():
    (service,) = [
        d
        for d in _docs(REPO / "manifests" / "controller" / "visibility.yaml")
        if d["kind"] == "Service"
    ]
    assert service["spec"]["selector"] == {
        "app.kubernetes.io/name": "phalanx",
        SERVING_LABEL: SERVING_VALUE,
    }
    chart = (REPO / "charts" / "phalanx" / "templates" / "visibility.yaml").read_text()
    assert f"{SERVING_LABEL}: {SERVING_VALUE}" in chart  # rendered equal: tests/unit/install
    # The webhook and metrics Services keep selecting every replica.
    for path in (REPO / "manifests" / "base" / "webhook.yaml", REPO / "manifests" / "controller"):
        files = [path] if path.is_file() else sorted(path.glob("*.yaml"))
        for doc in (d for f in files for d in _docs(f)):
            if doc["kind"] == "Service" and doc["metadata"]["name"] != "phalanx-visibility":
                assert SERVING_LABEL not in (doc["spec"].get("selector") or {}), doc


def test_the_deployment_names_the_pod_through_the_downward_api():
    (deployment,) = [
        d
        for d in _docs(REPO / "manifests" / "controller" / "deployment.yaml")
        if d["kind"] == "Deployment"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}) for e in container["env"]}
    assert env["POD_NAME"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["fieldPath"] == "metadata.namespace"
    assert "--visibility-port=8082" in container["args"]
    # The pods' own labels never include it: only the operator sets it, on one pod.
    assert SERVING_LABEL not in deployment["spec"]["template"]["metadata"]["labels"]
    assert SERVING_LABEL not in deployment["spec"]["selector"]["matchLabels"]
