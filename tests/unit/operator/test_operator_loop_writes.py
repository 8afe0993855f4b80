"""The scheduling loop's handling of write outcomes, driven by a scripted status writer.

An admission whose write outcome is unknown stays decided (in flight, quota counted) until
the writer can tell; only a definite failure makes the core forget it. An eviction write that
fails is retried, not marked written (its victim would run on and its preemptor wait).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from phalanx.admission.decisions import Admit
from phalanx.admission.model import Admission, PodSetAssignment
from phalanx.operator.config import OperatorConfig
from phalanx.operator.decision_status import Eviction
from phalanx.operator.loop import SchedulingLoop
from phalanx.operator.metrics import Metrics
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import StatusFn, StatusWriter, WriteOutcome

KEY = "ns/w"


class ScriptedWriter(StatusWriter):
    """Answers ``apply_status`` from a script; every call waits for the test's go-ahead,
    so the test can look at the loop between two attempts."""

    def __init__(self, outcomes: list[WriteOutcome]) -> None:
        super().__init__(None, ClusterState(), Metrics())  # type: ignore[arg-type]
        self.outcomes: Iterator[WriteOutcome] = iter(outcomes)
        self.calls: list[str] = []
        self.called = asyncio.Event()
        self.go = asyncio.Event()

    async def apply_status(self, key: str, build: StatusFn, *, verb: str) -> WriteOutcome:
        self.calls.append(verb)
        self.called.set()
        await self.go.wait()
        self.go.clear()
        return next(self.outcomes)

    async def event(self, obj: dict[str, Any], **_: Any) -> None:
        return None


def make_loop(writer: ScriptedWriter) -> SchedulingLoop:
    state = ClusterState()
    state.apply(
        "Workload",
        None,
        {"metadata": {"name": "w", "namespace": "ns", "resourceVersion": "1"}, "status": {}},
    )
    loop = SchedulingLoop(
        api=None,  # type: ignore[arg-type]
        state=state,
        writer=writer,
        jobs=None,
        metrics=Metrics(),
        config=OperatorConfig(),
    )
    loop.write_backoff = type(loop.write_backoff)(initial=0.0, maximum=0.0)
    return loop


ADMIT = Admit(
    KEY,
    Admission(
        "cq",
        (PodSetAssignment(name="main", count=1, flavors={"cpu": "f"}, resource_usage={"cpu": 1}),),
    ),
    0,
)


async def step(writer: ScriptedWriter) -> None:
    """Let the pending ``apply_status`` call answer, and wait for the next one (if any)."""
    writer.called.clear()
    writer.go.set()
    for _ in range(50):
        await asyncio.sleep(0)
        if writer.called.is_set():
            return


def test_an_unknown_admission_outcome_keeps_the_admission_until_it_is_known() -> None:
    async def main() -> None:
        writer = ScriptedWriter(
            [
                WriteOutcome(ok=False, error="reset", unknown=True),
                WriteOutcome(ok=False, error="reset", unknown=True),
                WriteOutcome(ok=True),
            ]
        )
        loop = make_loop(writer)
        loop.bridge.in_flight_admissions.add(KEY)
        task = asyncio.ensure_future(loop._write_admission(ADMIT))
        await asyncio.wait_for(writer.called.wait(), 5)
        for _ in range(2):
            await step(writer)
            # Still in flight: not forgotten (no entry in _failed), not given away.
            assert KEY in loop.bridge.in_flight_admissions
            assert loop._failed == []
        await step(writer)
        await asyncio.wait_for(task, 5)
        assert writer.calls == ["admit", "admit", "admit"]
        assert KEY not in loop.bridge.in_flight_admissions
        assert loop._failed == []

    asyncio.run(main())


def test_a_definite_failure_makes_the_core_forget_the_admission() -> None:
    async def main() -> None:
        writer = ScriptedWriter([WriteOutcome(ok=False, status=422, error="invalid")])
        loop = make_loop(writer)
        loop.bridge.in_flight_admissions.add(KEY)
        task = asyncio.ensure_future(loop._write_admission(ADMIT))
        await asyncio.wait_for(writer.called.wait(), 5)
        await step(writer)
        await asyncio.wait_for(task, 5)
        assert loop._failed == [(KEY, 422)]
        assert KEY not in loop.bridge.in_flight_admissions

    asyncio.run(main())


def test_a_failed_eviction_write_is_retried_not_marked_written() -> None:
    async def main() -> None:
        writer = ScriptedWriter(
            [
                WriteOutcome(ok=False, status=500, error="etcd"),
                WriteOutcome(ok=False, status=0, error="reset"),
                WriteOutcome(ok=True),
            ]
        )
        loop = make_loop(writer)
        eviction = Eviction(reason="Preempted", message="m", cluster_queue="cq")
        loop.evicting[KEY] = eviction
        task = asyncio.ensure_future(loop._write_eviction(KEY, eviction))
        await asyncio.wait_for(writer.called.wait(), 5)
        for _ in range(2):
            await step(writer)
            assert not eviction.written, "marked written after a failed write"
        await step(writer)
        await asyncio.wait_for(task, 5)
        assert eviction.written and writer.calls == ["evict"] * 3

    asyncio.run(main())


def _evict_with(loop: SchedulingLoop, workload_metadata: dict[str, Any]) -> Eviction:
    loop.state.apply(
        "Workload",
        None,
        {"metadata": {"name": "w", "namespace": "ns", "resourceVersion": "2", **workload_metadata}},
    )
    eviction = Eviction(reason="Preempted", message="m", cluster_queue="cq", preemption_reason="X")
    loop._start_eviction(KEY, eviction)
    return eviction


def test_a_workload_nothing_owns_is_evicted_in_one_write_released_only_after_it() -> None:
    async def main() -> None:
        writer = ScriptedWriter(
            [WriteOutcome(ok=False, status=500, error="etcd"), WriteOutcome(ok=True)]
        )
        loop = make_loop(writer)
        eviction = _evict_with(loop, {})
        await asyncio.wait_for(writer.called.wait(), 5)
        # In flight: the core must not release the quota before the API shows it released.
        assert KEY in loop.bridge.in_flight_releases and loop._released == []
        await step(writer)
        assert loop._released == [] and KEY in loop.evicting, "released after a failed write"
        await step(writer)
        for _ in range(50):
            await asyncio.sleep(0)
        assert writer.calls == ["evict", "evict"], "one write per attempt, no requeue write"
        assert loop._released == [(KEY, eviction)] and KEY not in loop.evicting

    asyncio.run(main())


def test_a_jobs_workload_is_evicted_first_and_released_when_the_job_stopped() -> None:
    async def main() -> None:
        writer = ScriptedWriter([WriteOutcome(ok=True)])
        loop = make_loop(writer)
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "j",
            "uid": "u",
            "controller": True,
        }
        eviction = _evict_with(loop, {"ownerReferences": [owner]})
        await asyncio.wait_for(writer.called.wait(), 5)
        await step(writer)
        for _ in range(50):
            await asyncio.sleep(0)
        assert writer.calls == ["evict"]
        assert eviction.written and KEY in loop.evicting and loop._released == []
        assert KEY not in loop.bridge.in_flight_releases, "quota released with its Job running"

    asyncio.run(main())


def test_a_victim_finished_before_its_eviction_gets_no_eviction_event() -> None:
    class Recording(ScriptedWriter):
        def __init__(self, outcomes: list[WriteOutcome]) -> None:
            super().__init__(outcomes)
            self.events: list[str] = []

        async def event(self, obj: dict[str, Any], **kwargs: Any) -> None:
            self.events.append(kwargs["reason"])

    async def main() -> None:
        writer = Recording([WriteOutcome(ok=True), WriteOutcome(ok=True)])
        loop = make_loop(writer)
        _evict_with(loop, {})
        await asyncio.wait_for(writer.called.wait(), 5)
        await step(writer)
        for _ in range(50):
            await asyncio.sleep(0)
        assert writer.events == ["Preempted"]
        loop.state.apply(
            "Workload",
            None,
            {
                "metadata": {"name": "w", "namespace": "ns", "resourceVersion": "3"},
                "status": {"conditions": [{"type": "Finished", "status": "True"}]},
            },
        )
        loop.evicting.clear()
        loop.bridge.in_flight_releases.clear()
        loop._start_eviction(
            KEY,
            Eviction(reason="Preempted", message="m", cluster_queue="cq", preemption_reason="X"),
        )
        await asyncio.wait_for(writer.called.wait(), 5)
        await step(writer)
        for _ in range(50):
            await asyncio.sleep(0)
        assert writer.events == ["Preempted"], "an Event for an eviction that did not happen"

    asyncio.run(main())
