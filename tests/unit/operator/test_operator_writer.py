"""The pending-explanation queue: coalesced per Workload, only on change, rate-limited."""

from __future__ import annotations

import asyncio
from typing import Any

from phalanx.operator.metrics import Metrics
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import StatusWriter, WriteOutcome


def _run(interval: float, script: Any) -> list[tuple[str, str]]:
    written: list[tuple[str, str]] = []

    async def main() -> None:
        state = ClusterState()
        writer = StatusWriter(None, state, Metrics(), concurrency=4, pending_min_interval=interval)  # type: ignore[arg-type]

        async def fake_apply(key: str, build: Any, *, verb: str) -> WriteOutcome:
            status = build({"metadata": {"name": key}, "status": {}})
            written.append((key, status["conditions"][0]["message"]))
            return WriteOutcome(ok=True)

        writer.apply_status = fake_apply  # type: ignore[method-assign]
        writer.start()
        await script(writer, written)
        await writer.stop()

    asyncio.run(main())
    return written


def test_latest_message_wins_and_repeats_are_not_written() -> None:
    async def script(writer: StatusWriter, written: list[tuple[str, str]]) -> None:
        writer.explain("ns/a", message="first", inadmissible=False)
        writer.explain("ns/a", message="second", inadmissible=False)
        await asyncio.sleep(0.05)
        writer.explain("ns/a", message="second", inadmissible=False)
        await asyncio.sleep(0.05)

    assert _run(0.5, script) == [("ns/a", "second")]


def test_a_new_message_waits_for_the_interval_then_is_written() -> None:
    async def script(writer: StatusWriter, written: list[tuple[str, str]]) -> None:
        writer.explain("ns/a", message="one", inadmissible=False)
        await asyncio.sleep(0.05)
        writer.explain("ns/a", message="two", inadmissible=False)
        writer.explain("ns/b", message="other", inadmissible=True)
        await asyncio.sleep(0.1)
        assert ("ns/b", "other") in written, "another Workload is not held up"
        assert ("ns/a", "two") not in written, "written again before the interval"
        await asyncio.sleep(0.4)

    written = _run(0.3, script)
    assert written[0] == ("ns/a", "one")
    assert ("ns/b", "other") in written and written[-1] == ("ns/a", "two")


def test_forgotten_workloads_are_not_written() -> None:
    async def script(writer: StatusWriter, written: list[tuple[str, str]]) -> None:
        writer.explain("ns/a", message="one", inadmissible=False)
        writer.forget("ns/a")
        await asyncio.sleep(0.1)

    assert _run(0.3, script) == []
