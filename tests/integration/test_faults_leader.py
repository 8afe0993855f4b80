"""Two leader electors against the real API server: one leader, failover, no overlap.

Short timings (lease 4 s, renew deadline 2.5 s, retry 0.5 s) keep the test quick; the code
path is the production one (Lease objects, resourceVersion conflicts, the Lease watch).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from phalanx.devcluster.handle import ClusterHandle
from phalanx.operator import kubeconfig
from phalanx.operator.kube import KubeApi
from phalanx.operator.leader import LeaderElectionConfig, LeaderElector

pytestmark = [pytest.mark.integration, pytest.mark.faults]

LD, RD, RP = 4.0, 2.5, 0.5
SLACK = 0.35  # event-loop scheduling and one request on a busy 2-core machine


class CuttableApi(KubeApi):
    """A replica's client that a test can partition from the API server (writes and reads
    fail at once), logging when each successful Lease write was *sent*."""

    cut = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ok_writes: list[float] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        if self.cut:
            raise aiohttp.ClientConnectionError("partitioned by the test")
        sent = time.monotonic()
        result = await super().request(method, path, **kwargs)
        if method in ("PUT", "POST") and "/leases" in path and not self.cut:
            self.ok_writes.append(sent)
        return result


@dataclass
class Replica:
    name: str
    api: CuttableApi
    elector: LeaderElector
    started: list[float] = field(default_factory=list)
    stopped: list[float] = field(default_factory=list)


def _replica(cluster: ClusterHandle, namespace: str, name: str, lease: str) -> Replica:
    api = CuttableApi(kubeconfig.load(cluster.kubeconfig))
    config = LeaderElectionConfig(
        lease_name=lease,
        namespace=namespace,
        identity=name,
        lease_duration=LD,
        renew_deadline=RD,
        retry_period=RP,
    )
    replica = Replica(name=name, api=api, elector=None)  # type: ignore[arg-type]
    replica.elector = LeaderElector(
        api,
        config,
        on_started_leading=lambda: replica.started.append(time.monotonic()),
        on_stopped_leading=lambda: replica.stopped.append(time.monotonic()),
    )
    return replica


class OverlapMonitor:
    """Samples every 20 ms that at most one replica believes it leads."""

    def __init__(self, replicas: list[Replica]) -> None:
        self.replicas = replicas
        self.violations: list[str] = []
        self.samples = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            leaders = [r.name for r in self.replicas if r.elector.still_leading()]
            self.samples += 1
            if len(leaders) > 1:
                self.violations.append(f"{time.monotonic():.3f}: {leaders}")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def _wait(predicate: Any, timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _spans(replicas: list[Replica], end: float) -> list[tuple[float, float, str]]:
    spans = []
    for r in replicas:
        stops = [*r.stopped, end]
        spans += [(s, stops[i], r.name) for i, s in enumerate(r.started)]
    return sorted(spans)


def _assert_no_overlap(replicas: list[Replica]) -> None:
    spans = _spans(replicas, time.monotonic())
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        assert end < start, f"{a} led until {end:.3f} but {b} started at {start:.3f}: {spans}"


def test_two_electors_failover_within_the_lease_duration_without_overlap(
    cluster: ClusterHandle, namespace: str
) -> None:
    async def scenario() -> None:
        a = _replica(cluster, namespace, "replica-a", "phalanx-test")
        b = _replica(cluster, namespace, "replica-b", "phalanx-test")
        monitor = OverlapMonitor([a, b])
        monitor.start()
        try:
            a.elector.start()
            b.elector.start()
            await _wait(lambda: a.started or b.started, LD + 2, "a first leader")
            await asyncio.sleep(3 * RP + LD)  # both running: exactly one leads, stably
            assert len(a.started) + len(b.started) == 1, (a.started, b.started)
            leader, follower = (a, b) if a.started else (b, a)
            assert follower.elector.leader == leader.name

            # The leader is partitioned: it can no longer renew.
            cut_at = time.monotonic()
            leader.api.cut = True
            await _wait(lambda: follower.started, LD + 3, "failover")
            took = follower.started[0] - cut_at
            last_renew_sent = max(leader.api.ok_writes)
            assert leader.stopped, "the partitioned leader never stopped leading"
            stop = leader.stopped[0]
            # Safety: it stopped by its renew deadline, strictly before the takeover.
            assert stop <= last_renew_sent + RD + SLACK, (stop - last_renew_sent, RD)
            assert stop < follower.started[0]
            # Liveness: the takeover came within one lease duration of the cut.
            assert took <= LD + SLACK, f"failover took {took:.2f}s > lease duration {LD}s"
            assert follower.started[0] - last_renew_sent >= LD - SLACK  # not early either

            # Healed, the old leader stays a follower while the new one renews.
            leader.api.cut = False
            await asyncio.sleep(LD + 2 * RP)
            assert len(leader.started) == 1 and follower.elector.still_leading()

            # A clean shutdown releases the lease: the other takes over at once.
            released_at = time.monotonic()
            await follower.elector.stop()
            took = await _wait(lambda: len(leader.started) == 2, LD, "takeover after release")
            assert took < 1.5, f"takeover after a release took {took:.2f}s"
            assert follower.stopped[-1] <= released_at + SLACK
            _assert_no_overlap([a, b])
            assert not monitor.violations, monitor.violations
            assert monitor.samples > 100
        finally:
            await monitor.stop()
            for r in (a, b):
                r.api.cut = False
                await r.elector.stop()
                await r.api.close()

    asyncio.run(scenario())


def test_lease_record_names_the_holder_and_counts_transitions(
    cluster: ClusterHandle, namespace: str
) -> None:
    async def scenario() -> dict[str, Any]:
        a = _replica(cluster, namespace, "replica-a", "phalanx-record")
        try:
            a.elector.start()
            await _wait(lambda: a.started, LD, "leadership")
            lease = await a.api.request(
                "GET",
                f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/phalanx-record",
            )
            await a.elector.stop()
            released = await a.api.request(
                "GET",
                f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/phalanx-record",
            )
            return {"held": lease, "released": released}
        finally:
            await a.elector.stop()
            await a.api.close()

    got = asyncio.run(scenario())
    spec = got["held"]["spec"]
    assert spec["holderIdentity"] == "replica-a"
    assert spec["leaseDurationSeconds"] == 4
    assert spec["renewTime"].endswith("Z") and "." in spec["renewTime"]
    released = got["released"]["spec"]
    assert not released.get("holderIdentity")
    assert released["leaseDurationSeconds"] == 1
