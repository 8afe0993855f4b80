"""The integration controllers' work queue: one reconcile per key at a time, changes that
arrive meanwhile not lost, failures retried with backoff, nothing before ``ready``."""

from __future__ import annotations

import asyncio

from phalanx.operator.keyed import KeyedQueue
from phalanx.operator.retry import Backoff

FAST = Backoff(initial=0.001, factor=2.0, maximum=0.01)


async def _settle(queue: KeyedQueue, *, timeout: float = 5.0) -> None:
    """Until nothing is queued, running or due for a retry."""
    async with asyncio.timeout(timeout):
        while queue.queued or queue.retries or queue._running:
            await asyncio.sleep(0.001)


def test_a_key_added_many_times_before_it_is_taken_is_reconciled_once() -> None:
    async def main() -> list[str]:
        seen: list[str] = []

        async def reconcile(key: str) -> None:
            seen.append(key)

        ready = asyncio.Event()
        queue = KeyedQueue("t", reconcile, log_as="t", ready=ready, workers=4)
        queue.start()
        for _ in range(5):
            queue.add("ns/a")
        queue.add("ns/b")
        ready.set()
        await _settle(queue)
        await queue.stop()
        return seen

    assert sorted(asyncio.run(main())) == ["ns/a", "ns/b"]


def test_a_key_is_never_reconciled_twice_at_once_and_a_change_meanwhile_is_seen() -> None:
    """With several workers, a key added while its reconcile awaits a write must wait for it
    and then run again (client-go's workqueue does the same). The Job controller's eight
    workers used to take such a key at once: two reconciles of one Job side by side."""

    async def main() -> tuple[int, int]:
        running = 0
        most = 0
        calls = 0
        release = asyncio.Event()

        async def reconcile(key: str) -> None:
            nonlocal running, most, calls
            calls += 1
            running += 1
            most = max(most, running)
            if calls == 1:
                await release.wait()  # a write in flight
            running -= 1

        ready = asyncio.Event()
        ready.set()
        queue = KeyedQueue("t", reconcile, log_as="t", ready=ready, workers=8)
        queue.start()
        queue.add("ns/j")
        async with asyncio.timeout(5):
            while calls == 0:
                await asyncio.sleep(0)
        queue.add("ns/j")  # the Job changed while its first reconcile runs
        for _ in range(20):
            await asyncio.sleep(0)  # every idle worker gets a chance to take it
        assert calls == 1, "taken while its first reconcile still runs"
        release.set()
        await _settle(queue)
        await queue.stop()
        return most, calls

    most, calls = asyncio.run(main())
    assert most == 1
    assert calls == 2  # the change that arrived meanwhile was reconciled


def test_a_failed_reconcile_is_retried_with_backoff_and_a_success_resets_the_count() -> None:
    async def main() -> tuple[int, dict[str, int]]:
        calls = 0

        async def reconcile(key: str) -> None:
            nonlocal calls
            calls += 1
            if calls < 4:
                raise ConnectionResetError("the API server went away")

        ready = asyncio.Event()
        ready.set()
        queue = KeyedQueue(
            "t", reconcile, log_as="t", ready=ready, expected=(OSError,), backoff=FAST
        )
        queue.start()
        queue.add("ns/j")
        await _settle(queue)
        await queue.stop()
        return calls, queue.failures

    calls, failures = asyncio.run(main())
    assert calls == 4  # three failures, each tried again without a new change
    assert failures == {}


def test_an_unexpected_error_is_retried_too_and_does_not_kill_the_worker() -> None:
    async def main() -> list[str]:
        seen: list[str] = []

        async def reconcile(key: str) -> None:
            seen.append(key)
            if key == "ns/bad" and seen.count(key) == 1:
                raise KeyError("a bug")

        ready = asyncio.Event()
        ready.set()
        queue = KeyedQueue("t", reconcile, log_as="t", ready=ready, backoff=FAST)
        queue.start()
        queue.add("ns/bad")
        queue.add("ns/good")
        await _settle(queue)
        assert all(not t.done() for t in queue.tasks)
        await queue.stop()
        return seen

    assert sorted(asyncio.run(main())) == ["ns/bad", "ns/bad", "ns/good"]


def test_forget_and_stop_cancel_pending_retries() -> None:
    async def main() -> None:
        async def reconcile(key: str) -> None:
            pass

        ready = asyncio.Event()
        queue = KeyedQueue("t", reconcile, log_as="t", ready=ready)
        queue.retry_later("ns/a")
        queue.retry_later("ns/a")  # a later retry while an earlier one is due: one timer
        queue.retry_later("ns/b")
        handles = dict(queue.retries)
        assert set(handles) == {"ns/a", "ns/b"} and queue.failures == {"ns/a": 2, "ns/b": 1}
        queue.forget("ns/a")
        assert handles["ns/a"].cancelled() and "ns/a" not in queue.failures
        await queue.stop()
        assert handles["ns/b"].cancelled() and queue.retries == {}

    asyncio.run(main())


def test_nothing_is_taken_before_ready() -> None:
    async def main() -> list[str]:
        seen: list[str] = []

        async def reconcile(key: str) -> None:
            seen.append(key)

        ready = asyncio.Event()
        queue = KeyedQueue("t", reconcile, log_as="t", ready=ready, workers=2)
        queue.start()
        queue.add("ns/a")
        for _ in range(20):
            await asyncio.sleep(0)
        assert seen == []
        ready.set()
        await _settle(queue)
        await queue.stop()
        return seen

    assert asyncio.run(main()) == ["ns/a"]
