"""The pending-explanation queue: coalesced per Workload, only on change, rate-limited."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from phalanx.operator.metrics import Metrics
from phalanx.operator.ratelimit import TokenBucket
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import StatusWriter, WriteOutcome


def _run(interval: float, script: Any) -> list[tuple[str, str]]:
    written: list[tuple[str, str]] = []

    async def main() -> None:
        state = ClusterState()
        writer = StatusWriter(None, state, Metrics(), concurrency=4, pending_min_interval=interval)  # type: ignore[arg-type]

        async def fake_apply(key: str, build: Any, **_: Any) -> WriteOutcome:
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


Write = tuple[float, str, str]  # seconds from the start, key, message


def _run_paced(
    minimum: float, numbers: float, script: Any, *, rate: TokenBucket | None = None
) -> list[Write]:
    """Like ``_run`` with both intervals, and the explanations' token bucket when ``rate`` is
    given; each write with its time from the start."""
    written: list[Write] = []

    async def main() -> None:
        writer = StatusWriter(
            None,  # type: ignore[arg-type]
            ClusterState(),
            Metrics(),
            concurrency=4,
            pending_min_interval=minimum,
            pending_numbers_interval=numbers,
            pending_rate=rate,
        )
        start = asyncio.get_running_loop().time()

        async def fake_apply(key: str, build: Any, **_: Any) -> WriteOutcome:
            status = build({"metadata": {"name": key}, "status": {}})
            now = asyncio.get_running_loop().time() - start
            written.append((now, key, status["conditions"][0]["message"]))
            return WriteOutcome(ok=True)

        writer.apply_status = fake_apply  # type: ignore[method-assign]
        writer.start()
        await script(writer)
        await writer.stop()

    asyncio.run(main())
    return written


NEEDED = "insufficient unused quota for nvidia.com/gpu in flavor a100, {} more needed"


def test_a_change_of_numbers_only_waits_for_the_slower_interval() -> None:
    # Catches a writer that rewrites every change at the fast pace (no coalescing).
    async def script(writer: StatusWriter) -> None:
        writer.explain("ns/a", message=NEEDED.format(4), inadmissible=False)
        await asyncio.sleep(0.05)
        writer.explain("ns/a", message=NEEDED.format(3), inadmissible=False)
        await asyncio.sleep(0.3)  # past the fast interval, not the slow one
        writer.explain("ns/a", message=NEEDED.format(2), inadmissible=False)
        await asyncio.sleep(0.6)

    written = _run_paced(0.1, 0.6, script)
    assert [message for _, _, message in written] == [NEEDED.format(4), NEEDED.format(2)]
    assert written[1][0] >= 0.6, "the latest figures, once the slow interval is over"


def test_a_new_kind_of_message_after_a_numbers_change_is_not_held_back() -> None:
    # Catches a parked numbers-only change keeping a real change waiting for its slow slot.
    async def script(writer: StatusWriter) -> None:
        writer.explain("ns/a", message=NEEDED.format(4), inadmissible=False)
        await asyncio.sleep(0.02)
        writer.explain("ns/a", message=NEEDED.format(3), inadmissible=False)
        writer.explain("ns/a", message="topology: no rack has 4 free nodes", inadmissible=True)
        await asyncio.sleep(0.4)

    written = _run_paced(0.1, 2.0, script)
    assert [message for _, _, message in written] == [
        NEEDED.format(4),
        "topology: no rack has 4 free nodes",
    ]
    assert written[1][0] < 0.3


def test_digits_in_names_and_the_inadmissible_flag_are_part_of_the_message() -> None:
    # Catches a shape that blanks every digit: team-1 -> team-2 is a different message.
    async def script(writer: StatusWriter) -> None:
        writer.explain("ns/a", message="waiting behind ClusterQueue team-1", inadmissible=False)
        await asyncio.sleep(0.02)
        writer.explain("ns/a", message="waiting behind ClusterQueue team-2", inadmissible=False)
        await asyncio.sleep(0.25)
        writer.explain("ns/a", message="waiting behind ClusterQueue team-2", inadmissible=True)
        await asyncio.sleep(0.25)

    written = _run_paced(0.1, 5.0, script)
    assert [message for _, _, message in written] == [
        "waiting behind ClusterQueue team-1",
        "waiting behind ClusterQueue team-2",
        "waiting behind ClusterQueue team-2",
    ]


def test_explanations_are_written_no_faster_than_their_rate() -> None:
    """10 a second with a burst of 2: the first two at once, then one every 0.1 s."""

    async def script(writer: StatusWriter) -> None:
        for i in range(6):
            writer.explain(f"ns/w{i}", message="waiting", inadmissible=False)
        await asyncio.sleep(0.55)

    written = _run_paced(0.0, 0.0, script, rate=TokenBucket(rate=10.0, burst=2))
    times = [t for t, _, _ in written]
    assert len(written) == 6, written
    assert times[1] < 0.05, "the burst goes out at once"
    for earlier, later in itertools.pairwise(times[1:]):
        assert later - earlier >= 0.08, times


def test_a_workload_never_explained_goes_before_a_changed_explanation() -> None:
    """Under the limit, the first explanation of b is written before a's new message, which
    was queued earlier: somebody with no answer at all waits least."""

    async def script(writer: StatusWriter) -> None:
        writer.explain("ns/a", message="first", inadmissible=False)
        await asyncio.sleep(0.05)  # a's first explanation written, the burst spent
        writer.explain("ns/a", message="second reason", inadmissible=False)
        writer.explain("ns/b", message="first", inadmissible=False)
        await asyncio.sleep(0.5)

    written = _run_paced(0.0, 0.0, script, rate=TokenBucket(rate=5.0, burst=1))
    messages = [f"{key}:{message}" for _, key, message in written]
    assert messages == ["ns/a:first", "ns/b:first", "ns/a:second reason"]
