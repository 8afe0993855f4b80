"""A work queue of object keys, as the integration controllers reconcile them.

The shape of client-go's rate-limited workqueue, which controllers share:

* a key is queued at most once, however many changes arrive before it is taken;
* a key is never reconciled by two workers at once: a key queued again while it is being
  reconciled waits, and is taken once more after that reconcile ends (so the change that
  queued it is seen);
* a reconcile that raises is tried again after a per-key exponential backoff (0.5 s doubling
  to 30 s) without waiting for the object to change: a write that failed because the API
  server or a webhook was away must be tried again by itself; a success resets the count;
* nothing is taken before ``ready`` is set (every informer has listed), and ``stop`` cancels the
  workers and every pending retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from phalanx.operator.retry import Backoff

__all__ = ["KeyedQueue"]

logger = logging.getLogger(__name__)


class KeyedQueue:
    def __init__(
        self,
        name: str,
        reconcile: Callable[[str], Awaitable[None]],
        *,
        log_as: str,
        ready: asyncio.Event,
        expected: tuple[type[BaseException], ...] = (),
        workers: int = 1,
        backoff: Backoff | None = None,
    ) -> None:
        """``name`` names the worker tasks (``phalanx-<name>-<i>``), ``log_as`` the log line of
        a failure (``event=<log_as>_reconcile_failed <log_as>=<key>``). A failure of a type in
        ``expected`` is logged without a traceback (it was logged where it happened, or the
        API server is away); any other with one."""
        self.name = name
        self._log_as = log_as
        self._reconcile = reconcile
        self._ready = ready
        self._expected = expected
        self._workers = workers
        self._backoff = backoff or Backoff()
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self.queued: set[str] = set()
        """Keys waiting to be taken (or waiting for their running reconcile to end)."""
        self._running: set[str] = set()
        self.failures: dict[str, int] = {}
        """Consecutive failed reconciles per key."""
        self.retries: dict[str, asyncio.TimerHandle] = {}
        """Pending retries per key."""
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The running workers (the operator watches each: one that dies stops it)."""
        return list(self._tasks)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for i in range(self._workers):
            self._tasks.append(loop.create_task(self._work(), name=f"phalanx-{self.name}-{i}"))

    async def stop(self) -> None:
        for handle in self.retries.values():
            handle.cancel()
        self.retries.clear()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    def add(self, key: str) -> None:
        """Reconcile ``key`` (once, however often it is added before it is taken)."""
        if key in self.queued:
            return
        self.queued.add(key)
        if key not in self._running:
            self._queue.put_nowait(key)
        # else: put back when its running reconcile ends

    def forget(self, key: str) -> None:
        """The object is gone: drop its failure count and its pending retry."""
        self.failures.pop(key, None)
        handle = self.retries.pop(key, None)
        if handle is not None:
            handle.cancel()

    def retry_later(self, key: str) -> None:
        """Reconcile ``key`` again after its backoff; an earlier retry already due stands."""
        failures = self.failures[key] = self.failures.get(key, 0) + 1
        delay = self._backoff.delay(failures - 1)
        loop = asyncio.get_running_loop()
        pending = self.retries.get(key)
        if pending is not None:
            if pending.when() <= loop.time() + delay:
                return
            pending.cancel()
        self.retries[key] = loop.call_later(delay, self._retry_now, key)

    def _retry_now(self, key: str) -> None:
        self.retries.pop(key, None)
        self.add(key)

    async def _work(self) -> None:
        await self._ready.wait()
        while True:
            key = await self._queue.get()
            self.queued.discard(key)
            self._running.add(key)
            try:
                await self._reconcile(key)
            except asyncio.CancelledError:
                raise
            except self._expected as error:
                logger.warning(
                    "event=%s_reconcile_failed %s=%s error=%r",
                    self._log_as,
                    self._log_as,
                    key,
                    error,
                )
                self.retry_later(key)
            except Exception:
                logger.exception("event=%s_reconcile_failed %s=%s", self._log_as, self._log_as, key)
                self.retry_later(key)
            else:
                self.failures.pop(key, None)
            finally:
                self._running.discard(key)
                if key in self.queued:
                    self._queue.put_nowait(key)  # queued again while it ran
