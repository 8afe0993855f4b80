"""The operator runtime without a server: crashed tasks stop the process loudly, the liveness
probe tells a stuck scheduling loop, and the admin kinds are fed by relisting informers.

The kubeconfig points at a closed port: informers started here fail to connect and back off,
which is all these tests need of them."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import yaml

import phalanx.operator.runtime as runtime_module
from phalanx.operator.access import AccessProbe
from phalanx.operator.app import build_registry
from phalanx.operator.config import OperatorConfig, WebhookConfig
from phalanx.operator.informer import Informer
from phalanx.operator.keyed import KeyedQueue
from phalanx.operator.kube import ApiError
from phalanx.operator.leader import LeaderElectionConfig, LeaderElector
from phalanx.operator.loop import SchedulingLoop
from phalanx.operator.queuestatus import QueueStatus
from phalanx.operator.runtime import (
    ADMIN_KINDS,
    Heartbeat,
    OptionalInformer,
    PhalanxOperator,
    SchedulerStalled,
)
from phalanx.operator.ungate import GateRemover
from phalanx.operator.writer import StatusWriter

WAIT = 5.0  # bounds a failing test only


@pytest.fixture
def config(tmp_path: Path) -> OperatorConfig:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        )
    )
    return OperatorConfig(
        kubeconfig=kubeconfig, metrics_port=None, webhook=WebhookConfig(enabled=False)
    )


@pytest.fixture(autouse=True)
def _questions_asked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The API server here (127.0.0.1:1) never answers: a start-up question is asked once,
    not with the 3.5 s of backoff a real start gives an API server that is away."""
    monkeypatch.setattr(runtime_module, "AccessProbe", functools.partial(AccessProbe, attempts=1))


def _with_operator(
    config: OperatorConfig,
    body: Callable[[PhalanxOperator], Awaitable[None]],
    *,
    start: bool = True,
) -> PhalanxOperator:
    op = PhalanxOperator(config)

    async def main() -> None:
        try:
            if start:
                await op.startup()
            await body(op)
        finally:
            await op.cleanup()

    asyncio.run(main())
    return op


# -- keep scheduling or die loudly ------------------------------------------------------------


def test_a_crashed_task_stops_the_operator_with_its_traceback(
    config: OperatorConfig, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: the crash was logged as one line (no traceback) and the process kept running
    # without the task.
    async def crash() -> None:
        raise RuntimeError("boom")

    async def body(op: PhalanxOperator) -> None:
        op.spawn(crash(), name="phalanx-test-task")
        await asyncio.wait_for(op.stop_flag.wait(), WAIT)

    with caplog.at_level(logging.ERROR, logger="phalanx.operator.runtime"):
        op = _with_operator(config, body, start=False)
    assert op.fatal is not None and "phalanx-test-task" in op.fatal and "boom" in op.fatal
    crashed = [r for r in caplog.records if "event=task_crashed" in r.getMessage()]
    assert len(crashed) == 1 and "task=phalanx-test-task" in crashed[0].getMessage()
    assert crashed[0].exc_info is not None and crashed[0].exc_info[0] is RuntimeError
    assert "Traceback" in caplog.text and 'raise RuntimeError("boom")' in caplog.text


def test_only_an_unexpected_end_is_fatal(config: OperatorConfig) -> None:
    async def body(op: PhalanxOperator) -> None:
        parked = op.spawn(asyncio.Event().wait(), name="parked")
        once = op.spawn(asyncio.sleep(0), name="one-shot", forever=False)
        await once
        parked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await parked
        await asyncio.sleep(0)  # done callbacks run on the next loop iteration
        assert op.fatal is None, "a cancelled task or a one-shot task that returned"
        forever = op.spawn(asyncio.sleep(0), name="returns")
        await forever
        await asyncio.wait_for(op.stop_flag.wait(), WAIT)
        assert op.fatal == "task returns exited"

    _with_operator(config, body, start=False)


def test_a_task_returning_during_shutdown_is_not_fatal(config: OperatorConfig) -> None:
    async def body(op: PhalanxOperator) -> None:
        op._stopping = True
        await op.spawn(asyncio.sleep(0), name="returns")
        await asyncio.sleep(0)
        assert op.fatal is None

    _with_operator(config, body, start=False)


def _crash(*_: Any, **__: Any) -> Any:
    async def crash() -> None:
        raise RuntimeError("injected crash")

    return crash()


@pytest.mark.parametrize(
    ("cls", "method", "task_name"),
    [
        (SchedulingLoop, "run", "phalanx-scheduler"),
        (StatusWriter, "_pending_worker", "phalanx-pending-"),
        (KeyedQueue, "_work", "phalanx-jobs-"),
        (GateRemover, "_run", "phalanx-ungate"),
        (QueueStatus, "_run", "phalanx-qstatus"),
        (Informer, "run", "phalanx-informer-"),
    ],
)
def test_every_long_running_task_is_watched(
    config: OperatorConfig,
    monkeypatch: pytest.MonkeyPatch,
    cls: type,
    method: str,
    task_name: str,
) -> None:
    # Each component's task crashing must stop the operator: a component whose task the
    # runtime does not watch (a renamed attribute, a new component) fails here.
    monkeypatch.setattr(cls, method, _crash)

    async def body(op: PhalanxOperator) -> None:
        await asyncio.wait_for(op.stop_flag.wait(), WAIT)

    op = _with_operator(config, body)
    assert op.fatal is not None and task_name in op.fatal and "injected crash" in op.fatal


def test_the_leader_election_task_is_watched(
    config: OperatorConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(LeaderElector, "run", _crash)
    elected = OperatorConfig(
        kubeconfig=config.kubeconfig,
        metrics_port=None,
        webhook=config.webhook,
        leader_election=LeaderElectionConfig(namespace="ns", identity="me"),
    )

    async def body(op: PhalanxOperator) -> None:
        await asyncio.wait_for(op.stop_flag.wait(), WAIT)

    op = _with_operator(elected, body)
    assert op.fatal is not None and "phalanx-leader-election" in op.fatal


# -- liveness -----------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_heartbeat_fails_only_when_armed_and_stale() -> None:
    clock = Clock()
    beat = Heartbeat(stall_seconds=20, clock=clock)
    clock.now += 3600
    assert beat.stalled_for() is None, "a standby (or a loop still syncing) is alive"
    beat.beat()
    assert beat.stalled_for() is None, "a beat does not arm it"
    beat.arm()
    clock.now += 20
    assert beat.stalled_for() is None
    clock.now += 0.5
    assert beat.stalled_for() == 20.5
    beat.beat()
    assert beat.stalled_for() is None
    beat.disarm()
    clock.now += 100
    assert beat.stalled_for() is None


def test_the_loop_heartbeat_arms_when_the_loop_is_ready_and_beats_per_cycle(
    config: OperatorConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The loop's real run() waits for the informers (which cannot connect here); a stand-in
    # sets ready and completes cycles the way it does, through the on_cycle callbacks.
    cycles_done = asyncio.Event()

    async def fake_run(loop: SchedulingLoop) -> None:
        loop.ready.set()
        for _ in range(3):
            await asyncio.sleep(0)
            loop.cycles += 1
            for callback in loop.on_cycle:
                callback(None)  # type: ignore[arg-type]
        cycles_done.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(SchedulingLoop, "run", fake_run)
    monkeypatch.setattr(QueueStatus, "snapshot", lambda *a, **k: None)

    async def body(op: PhalanxOperator) -> None:
        clock = Clock()
        op.heartbeat = Heartbeat(stall_seconds=20, clock=clock)
        await asyncio.wait_for(cycles_done.wait(), WAIT)
        assert op.heartbeat.armed
        assert op.liveness()["cycles"] == 3
        clock.now += 21
        with pytest.raises(SchedulerStalled, match=r"no scheduling cycle completed for 21\.0s"):
            op.liveness()
        op.loop.on_cycle[-1](None)  # type: ignore[arg-type]
        assert op.liveness()["seconds_since_cycle"] == 0.0

    _with_operator(config, body)


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=WAIT) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, {}


def test_healthz_answers_500_when_the_scheduler_stalls_and_readyz_waits_for_sync(
    config: OperatorConfig, unused_port: int
) -> None:
    # The probes' own server (not kopf's): a stall reaches the HTTP status, and readiness
    # means the informers have listed.
    clock = Clock()
    config = dataclasses.replace(config, liveness_port=unused_port, health_addr="127.0.0.1")

    async def body(op: PhalanxOperator) -> None:
        op.heartbeat = Heartbeat(stall_seconds=20, clock=clock)
        op.heartbeat.arm()
        base = f"http://127.0.0.1:{unused_port}"
        status, payload = await asyncio.to_thread(_get, f"{base}/healthz")
        assert status == 200 and payload["scheduler"]["scheduling"] is True
        assert payload["informers_synced"] is False
        clock.now += 25
        status, _ = await asyncio.to_thread(_get, f"{base}/healthz")
        assert status == 500
        op.heartbeat.beat()  # a failure is not cached: the next request probes again
        status, _ = await asyncio.to_thread(_get, f"{base}/healthz")
        assert status == 200
        status, _ = await asyncio.to_thread(_get, f"{base}/readyz")
        assert status == 503, "not ready before the informers have listed"
        await _stop_informers(op)
        for informer in op.informers:
            informer.synced.set()
        status, _ = await asyncio.to_thread(_get, f"{base}/readyz")
        assert status == 200

    _with_operator(config, body)


@pytest.fixture
def unused_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- admin kinds through relisting informers ------------------------------------------------------


async def _stop_informers(op: PhalanxOperator) -> None:
    for informer in op.informers:
        await informer.stop()


def _pages(
    *pages: dict[str, Any] | ApiError,
) -> Callable[[dict[str, str]], Coroutine[Any, Any, dict[str, Any]]]:
    remaining = list(pages)

    async def get_json(params: dict[str, str]) -> dict[str, Any]:
        page = remaining.pop(0)
        if isinstance(page, ApiError):
            raise page
        return page

    return get_json


def _cq(name: str, rv: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": str(rv)}}


def test_admin_kinds_are_fed_by_informers_not_kopf(config: OperatorConfig) -> None:
    async def body(op: PhalanxOperator) -> None:
        await _stop_informers(op)
        plurals = {i.resource.plural: i for i in op.informers}
        for resource, _kind in ADMIN_KINDS:
            assert isinstance(plurals[resource.plural], OptionalInformer), resource.plural
        assert not build_registry(op)._watching.get_all_handlers(), "kopf ingests nothing"

    _with_operator(config, body)


def test_a_relist_after_a_lost_watch_deletes_a_vanished_cluster_queue(
    config: OperatorConfig,
) -> None:
    # kopf's watch sends nothing for an object deleted while it was disconnected; the
    # informer's relist (after 410 Gone) does, and the state forgets the ClusterQueue.
    async def body(op: PhalanxOperator) -> None:
        await _stop_informers(op)
        informer = next(i for i in op.informers if i.resource.plural == "clusterqueues")
        informer._get_json = _pages(  # type: ignore[method-assign,assignment]
            {"items": [_cq("kept", 1), _cq("gone", 2)], "metadata": {"resourceVersion": "2"}},
            {"items": [_cq("kept", 1)], "metadata": {"resourceVersion": "9"}},
        )
        await informer._relist()
        assert set(op.state.objects["ClusterQueue"]) == {"kept", "gone"}
        await informer._relist()  # the watch was lost meanwhile, "gone" deleted then
        assert set(op.state.objects["ClusterQueue"]) == {"kept"}

    _with_operator(config, body)


def test_wait_synced_waits_for_the_admin_informers(config: OperatorConfig) -> None:
    admin = {resource.plural for resource, _ in ADMIN_KINDS}

    async def body(op: PhalanxOperator) -> None:
        await _stop_informers(op)
        for informer in op.informers:
            if informer.resource.plural not in admin:
                informer.synced.set()
        waiter = asyncio.create_task(op.wait_synced())
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(waiter), 0.05)
        assert not op.synced
        for informer in op.informers:
            informer.synced.set()
        await asyncio.wait_for(waiter, WAIT)
        assert op.synced_event.is_set() and op.synced

    _with_operator(config, body)


def test_a_missing_admin_kind_counts_as_empty_and_does_not_block_sync() -> None:
    # E.g. the Topology CRD not installed: the list answers 404. The informer must still
    # report synced (or the scheduler would never start) and keep retrying.
    events: list[tuple[str, str]] = []
    informer = OptionalInformer(
        None,  # type: ignore[arg-type]
        ADMIN_KINDS[1][0],
        lambda kind, obj: events.append((kind, obj["metadata"]["name"])),
    )
    missing = ApiError(404, {"reason": "NotFound"}, method="GET", path="/x")
    informer._get_json = _pages(  # type: ignore[method-assign,assignment]
        {"items": [_cq("t1", 1)], "metadata": {"resourceVersion": "1"}}, missing, missing
    )

    async def main() -> None:
        await informer._relist()
        informer.synced.clear()  # as on a first list that met the 404
        with pytest.raises(ApiError):
            await informer._relist()  # raised on, for the run loop to back off and retry
        assert informer.synced.is_set()
        assert events == [("ADDED", "t1"), ("DELETED", "t1")], "known objects are gone"
        with pytest.raises(ApiError):
            await informer._relist()
        assert events[-1] == ("DELETED", "t1"), "nothing reported twice"

    asyncio.run(main())


def test_other_list_errors_of_an_admin_kind_do_not_count_as_synced() -> None:
    informer = OptionalInformer(None, ADMIN_KINDS[0][0], lambda kind, obj: None)  # type: ignore[arg-type]
    informer._get_json = _pages(  # type: ignore[method-assign,assignment]
        ApiError(403, {"reason": "Forbidden"}, method="GET", path="/x")
    )

    async def main() -> None:
        with pytest.raises(ApiError):
            await informer._relist()
        assert not informer.synced.is_set()

    asyncio.run(main())
