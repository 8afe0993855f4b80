"""Leader election timing, in virtual time against an in-memory Lease endpoint.

The property under test: a leader that cannot renew stops (callback fired, ``still_leading``
False) no later than ``renew_deadline`` after it sent its last successful renew, and no other
replica acquires before ``lease_duration`` after it saw that renew, so tenures never overlap.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from leader_fakes import LeaseServer, ReplicaApi, VirtualClock

from phalanx.operator.kube import KubeApi
from phalanx.operator.kubeconfig import ClusterAuth
from phalanx.operator.leader import (
    FencedApi,
    LeaderElectionConfig,
    LeaderElectionError,
    LeaderElector,
    LeaseObservation,
    LeaseRecord,
    NotLeaderError,
    Tenure,
)

LD, RD, RP = 15.0, 10.0, 2.0


# -- pure parts -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"lease_duration": 10.0, "renew_deadline": 10.0}, "renew_deadline (10.0) must be less"),
        ({"lease_duration": 15.0, "renew_deadline": 20.0}, "must be less than lease_duration"),
        ({"renew_deadline": 2.0, "retry_period": 2.0}, "must exceed 1.2 x retry_period"),
        ({"retry_period": 0.0}, "retry_period must be positive"),
        ({"lease_duration": 0.5, "renew_deadline": 0.2, "retry_period": 0.1}, "at least 1 s"),
        ({"lease_name": ""}, "lease_name must not be empty"),
    ],
)
def test_unsafe_settings_are_rejected_naming_the_setting(kwargs: dict[str, Any], needle: str):
    with pytest.raises(LeaderElectionError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        LeaderElectionConfig(namespace="ns", identity="a", **kwargs)


def test_lease_duration_is_stored_rounded_up():
    config = LeaderElectionConfig(
        namespace="ns", identity="a", lease_duration=4.2, renew_deadline=3, retry_period=1
    )
    assert config.lease_duration_seconds == 5


def test_tenure_runs_from_the_send_time_of_the_last_successful_renew():
    tenure = Tenure(renew_deadline=10.0)
    assert not tenure.valid(0.0)
    tenure.renewed(100.0)
    assert tenure.valid(109.999)
    assert not tenure.valid(110.0)
    tenure.renewed(95.0)  # a slow, older attempt answered late: must not extend or shorten
    assert tenure.deadline == 110.0
    tenure.renewed(104.0)
    assert tenure.deadline == 114.0
    tenure.end()
    assert not tenure.valid(104.0)


def _record(holder: str, renew: str, duration: int = 15) -> LeaseRecord:
    return LeaseRecord(
        holder=holder,
        lease_duration_seconds=duration,
        acquire_time="2024-01-01T00:00:00.000000Z",
        renew_time=renew,
        transitions=1,
        resource_version="7",
    )


def test_candidate_counts_expiry_from_its_own_observation_not_the_record_timestamps():
    seen = LeaseObservation()
    ancient = _record("b", "2000-01-01T00:00:00.000000Z")
    assert seen.observe(ancient, now=500.0)
    assert seen.expires_at() == 515.0  # the renewTime in 2000 is not trusted
    assert seen.held_by_other("a", 514.9)
    assert not seen.held_by_other("a", 515.0)
    # The same record again (e.g. from the next poll) does not restart the clock...
    assert not seen.observe(ancient, now=510.0)
    assert seen.expires_at() == 515.0
    # ...a renewal does.
    assert seen.observe(_record("b", "2000-01-01T00:00:02.000000Z"), now=512.0)
    assert seen.expires_at() == 527.0


def test_a_released_lease_has_no_expiry_and_is_free():
    seen = LeaseObservation()
    seen.observe(_record("", "2024-01-01T00:00:00.000000Z", duration=1), now=3.0)
    assert seen.expires_at() is None
    assert not seen.held_by_other("a", 3.0)


def test_own_holder_is_never_held_by_other():
    seen = LeaseObservation()
    seen.observe(_record("a", "2024-01-01T00:00:00.000000Z"), now=3.0)
    assert not seen.held_by_other("a", 4.0)


# -- the protocol in virtual time -----------------------------------------------------------------


@dataclass
class Replica:
    name: str
    api: ReplicaApi
    elector: LeaderElector
    started: list[float] = field(default_factory=list)
    stopped: list[float] = field(default_factory=list)

    def intervals(self, end: float) -> list[tuple[float, float]]:
        stops = [*self.stopped, end][: len(self.started)]
        return list(zip(self.started, stops, strict=True))


def _replica(
    clock: VirtualClock,
    server: LeaseServer,
    name: str,
    *,
    seed: int,
    lease_duration: float = LD,
    renew_deadline: float = RD,
    retry_period: float = RP,
    latency: float = 0.0,
) -> Replica:
    api = ReplicaApi(server, name, latency=latency)
    config = LeaderElectionConfig(
        lease_name="sched",
        namespace="ns",
        identity=name,
        lease_duration=lease_duration,
        renew_deadline=renew_deadline,
        retry_period=retry_period,
        watch=False,  # the unit tests exercise the polling path; the watch is integration
    )
    replica = Replica(name=name, api=api, elector=cast(Any, None))
    _LIVE.append(replica)
    replica.elector = LeaderElector(
        cast(KubeApi, api),
        config,
        on_started_leading=lambda: replica.started.append(clock.now),
        on_stopped_leading=lambda: replica.stopped.append(clock.now),
        clock=clock,
        wall_clock=lambda: 1_700_000_000.0 + clock.now,
        sleep=clock.sleep,
        rng=random.Random(seed),
    )
    return replica


_LIVE: list[Replica] = []


def _run(scenario: Callable[[VirtualClock, LeaseServer], Awaitable[None]]) -> None:
    async def main() -> None:
        clock = VirtualClock()
        server = LeaseServer(clock)
        _LIVE.clear()
        try:
            await scenario(clock, server)
        finally:
            # A failed assertion must fail the test, not hang it on a frozen replica.
            for r in _LIVE:
                r.api.mode = "error"
            await _stop(clock, *_LIVE)

    asyncio.run(main())


async def _stop(clock: VirtualClock, *replicas: Replica) -> None:
    """Stop electors while virtual time runs (a release to a frozen API times out)."""
    tasks = [asyncio.ensure_future(r.elector.stop()) for r in replicas]
    await clock.advance(10.0)
    await asyncio.gather(*tasks)


def _no_overlap(replicas: list[Replica], end: float) -> None:
    spans = sorted(span for r in replicas for span in r.intervals(end))
    for (_, first_end), (second_start, _) in itertools.pairwise(spans):
        assert first_end < second_start, f"tenures overlap: {spans}"


def _last_renew_sent(replica: Replica, before: float) -> float:
    return max(t for t, method in replica.api.requests if method in ("PUT", "POST") and t < before)


def test_a_single_replica_creates_the_lease_and_renews_every_retry_period():
    async def scenario(clock: VirtualClock, server: LeaseServer) -> None:
        a = _replica(clock, server, "a", seed=1)
        a.elector.start()
        await clock.advance(0.0)
        assert a.started == [0.0] and a.elector.is_leader.is_set()
        assert a.elector.still_leading()
        await clock.advance(30.0)
        renew_times = [t for t, _, holder in server.writes if holder == "a"]
        gaps = [b - c for c, b in itertools.pairwise(renew_times)]
        assert gaps and all(abs(g - RP) < 1e-9 for g in gaps), gaps
        assert a.stopped == []
        spec = server.leases["sched"]["spec"]
        assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 15
        await _stop(clock, a)

    _run(scenario)


def test_two_replicas_one_leader_and_the_other_never_leads_while_it_renews():
    async def scenario(clock: VirtualClock, server: LeaseServer) -> None:
        a = _replica(clock, server, "a", seed=1)
        b = _replica(clock, server, "b", seed=2)
        a.elector.start()
        await clock.advance(0.5)
        b.elector.start()
        await clock.advance(200.0)
        assert a.started == [0.0] and a.stopped == []
        assert b.started == []
        assert not b.elector.still_leading()
        assert b.elector.leader == "a"
        await _stop(clock, a, b)

    _run(scenario)


@pytest.mark.parametrize("fault", ["hang", "error"])
@pytest.mark.parametrize("cut_at", [7.0, 7.9, 8.1, 31.3])
def test_leader_that_cannot_renew_stops_at_its_deadline_before_anyone_takes_over(
    fault: str, cut_at: float
):
    async def scenario(clock: VirtualClock, server: LeaseServer) -> None:
        a = _replica(clock, server, "a", seed=3, latency=0.05)
        b = _replica(clock, server, "b", seed=4, latency=0.05)
        a.elector.start()
        await clock.advance(1.0)
        b.elector.start()
        await clock.advance_to(cut_at)
        a.api.mode = fault  # the leader is cut off from the API server
        last_sent = _last_renew_sent(a, before=cut_at + 1e-6)
        await clock.advance_to(cut_at + 60.0)

        # The leader stopped exactly at its deadline, not at the hung request's timeout.
        assert len(a.stopped) == 1
        assert a.stopped[0] == pytest.approx(last_sent + RD)
        assert not a.elector.still_leading()
        # The other replica took over, strictly after, with the full safety margin, and
        # within one lease duration (plus one request) of the last renew.
        assert len(b.started) == 1
        assert b.started[0] - a.stopped[0] >= LD - RD - 1e-9
        assert b.started[0] <= last_sent + LD + 0.05 + 1e-9 + RP * 1.2
        _no_overlap([a, b], clock.now)
        await _stop(clock, a, b)

    _run(scenario)


def test_still_leading_turns_false_at_the_deadline_even_if_the_loop_has_not_run():
    async def scenario(clock: VirtualClock, server: LeaseServer) -> None:
        a = _replica(clock, server, "a", seed=5)
        a.elector.start()
        await clock.advance(4.0)
        a.api.mode = "hang"
        last_sent = _last_renew_sent(a, before=4.0 + 1e-6)
        # Move the clock without letting the elector's tasks run (a stalled event loop).
        clock.now = last_sent + RD - 0.001
        assert a.elector.still_leading()
        clock.now = last_sent + RD
        assert not a.elector.still_leading()
        assert a.elector.is_leader.is_set()  # the loop has not noticed yet; the check has
        await clock.advance(0.0)
        assert a.stopped == [pytest.approx(last_sent + RD)]
        await _stop(clock, a)

    _run(scenario)


def test_a_slow_successful_renew_counts_from_when_it_was_sent():
    async def scenario(clock: VirtualClock, server: LeaseServer) -> None:
        a = _replica(clock, server, "a", seed=6)
        a.elector.start()
        await clock.advance(0.0)
        # Answered 3.5 s after sending. The next renew goes out RP after that answer and must
        # itself be answered within RD of the previous send: 2 x 3.5 + RP = 9 s < RD.
        a.api.latency = 3.5
        await clock.advance(60.0)
        assert a.stopped == []
        sends = [t for t, m in a.api.requests if m == "PUT"]
        answered = [s for s in sends if s + 3.5 <= clock.now]
        assert a.elector.tenure.renewed_at == answered[-1]  # the send time, not the answer
        await _stop(clock, a)

    _run(scenario)


def test_a_renew_slower_than_the_deadline_loses_leadership_safely():
    async def scenario(clock: VirtualClock, server: LeaseServer) -> None:
        a = _replica(clock, server, "a", seed=7)
        b = _replica(clock, server, "b", seed=8)
        a.elector.start()
        await clock.advance(0.0)
        b.elector.start()
        await clock.advance(3.0)
        a.api.latency = 11.0  # answers arrive after the deadline
        await clock.advance(60.0)
        assert a.stopped and a.stopped[0] <= 3.0 + RD
        assert b.started
        _no_overlap([a, b], clock.now)
        await _stop(clock, a, b)

    _run(scenario)


def test_clean_shutdown_releases_the_lease_and_the_candidate_takes_over_at_once():
    async def scenario(clock: VirtualClock, server: LeaseServer) -> None:
        a = _replica(clock, server, "a", seed=9)
        b = _replica(clock, server, "b", seed=10)
        a.elector.start()
        await clock.advance(0.0)
        b.elector.start()
        await clock.advance(10.0)
        await _stop(clock, a)
        released_at = 10.0
        assert a.stopped == [released_at]
        release = [(t, holder) for t, replica, holder in server.writes if replica == "a"][-1]
        assert release == (released_at, "")
        # Polling: b sees the release at its next attempt, well before a lease duration.
        assert b.started and b.started[0] - released_at <= RP * 1.2 + 1e-9
        assert server.leases["sched"]["spec"]["holderIdentity"] == "b"
        assert server.leases["sched"]["spec"]["leaseTransitions"] == 1
        await _stop(clock, b)

    _run(scenario)


def test_a_conflicting_write_between_read_and_claim_is_not_leadership():
    async def scenario(clock: VirtualClock, server: LeaseServer) -> None:
        a = _replica(clock, server, "a", seed=11)
        a.elector.start()
        await clock.advance(0.0)
        await _stop(clock, a)  # released
        b = _replica(clock, server, "b", seed=12, latency=1.0)
        original = b.api.request

        async def racing(method: str, path: str, **kwargs: Any) -> dict[str, Any]:
            result = await original(method, path, **kwargs)
            if method == "GET" and not b.started:
                # Between b's read and its claim, another replica takes the lease.
                server.force_holder("sched", "c")
            return result

        b.api.request = racing  # type: ignore[method-assign]
        b.elector.start()
        await clock.advance(5.0)
        assert b.started == []
        assert b.elector.leader == "c"
        await _stop(clock, b)

    _run(scenario)


def test_leader_stops_when_another_replica_holds_the_lease():
    async def scenario(clock: VirtualClock, server: LeaseServer) -> None:
        a = _replica(clock, server, "a", seed=13)
        a.elector.start()
        await clock.advance(1.0)
        server.force_holder("sched", "intruder")
        await clock.advance(RP * 2)
        assert a.stopped and a.stopped[0] <= 1.0 + RP * 2
        assert not a.elector.still_leading()
        await _stop(clock, a)

    _run(scenario)


def test_random_faults_never_produce_overlapping_tenures():
    """Three replicas, each cut off and restored at seeded random moments for 20 minutes."""

    async def scenario(clock: VirtualClock, server: LeaseServer) -> None:
        rng = random.Random(2024)
        replicas = [_replica(clock, server, n, seed=i, latency=0.02) for i, n in enumerate("abc")]
        for r in replicas:
            r.elector.start()
        for _ in range(200):
            await clock.advance(rng.uniform(0.5, 12.0))
            victim = rng.choice(replicas)
            victim.api.mode = rng.choice(["ok", "ok", "error", "hang"])
            assert sum(r.elector.still_leading() for r in replicas) <= 1
        for r in replicas:
            r.api.mode = "ok"
        await clock.advance(60.0)
        _no_overlap(replicas, clock.now)
        assert sum(len(r.started) for r in replicas) >= 3  # leadership did move around
        assert sum(r.elector.still_leading() for r in replicas) == 1
        await _stop(clock, *replicas)

    _run(scenario)


def test_watch_event_of_another_holder_wakes_the_leader_to_stop():
    async def scenario(clock: VirtualClock, server: LeaseServer) -> None:
        a = _replica(clock, server, "a", seed=14)
        a.elector.start()
        await clock.advance(0.5)
        server.force_holder("sched", "intruder")
        a.elector._on_lease_event("MODIFIED", server.leases["sched"])
        await clock.advance(0.0)
        assert a.stopped == [0.5]
        await _stop(clock, a)

    _run(scenario)


def test_fenced_api_refuses_writes_when_not_leading():
    async def scenario() -> None:
        inner = KubeApi(ClusterAuth(server="https://127.0.0.1:9"))
        leading = False
        fenced = FencedApi(inner, allowed=lambda: leading)
        try:
            with pytest.raises(NotLeaderError) as info:
                await fenced.request("PATCH", "/apis/x/v1/namespaces/a/things/b", body={})
            assert info.value.status == 503 and info.value.reason == "NotLeader"
            assert fenced.session is inner.session
        finally:
            await inner.close()

    asyncio.run(scenario())
