"""API writes for Workloads: status by server-side apply, Events, with priorities and limits.

Decisions (admit, evict, finish) go first and are never dropped; pending explanations are
background work: coalesced per Workload (only the latest matters), written only when the
message changed, and at most once per ``pending_min_interval`` per Workload (once per
``pending_numbers_interval`` when only the message's numbers changed), and across the
operator at most at ``pending_rate`` (a never-explained Workload first), on slots of their
own that yield to queued decisions. A burst of 15,000 pending Workloads therefore costs a
bounded trickle of writes, not a storm, and never delays an admission.

Every successful write's response is fed back into :class:`ClusterState`, so the next
decision is computed from what the API server holds, without waiting for the watch echo.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from phalanx.operator import conditions as cond
from phalanx.operator.kube import (
    API_ERRORS,
    EVENTS,
    TRANSIENT_ERRORS,
    WORKLOADS,
    ApiError,
    KubeApi,
    outcome_unknown,
)
from phalanx.operator.metrics import Metrics
from phalanx.operator.ratelimit import TokenBucket
from phalanx.operator.retry import Backoff
from phalanx.operator.state import ClusterState

__all__ = ["FIELD_MANAGER", "ROUTINE_EVENTS", "StatusWriter", "WriteOutcome"]

ROUTINE_EVENTS = frozenset({"Admitted", "CreatedWorkload", "QuotaReserved"})
"""Events whose news the object itself keeps (its conditions, ``status.admission``, the
Workload's existence): rate-limited, where preemptions and evictions, which a later status
no longer shows, never are."""

logger = logging.getLogger(__name__)

FIELD_MANAGER = "phalanx"
APPLY_PATCH = "application/apply-patch+yaml"  # JSON is valid YAML


StatusFn = Callable[[dict[str, Any]], dict[str, Any] | None]
"""Given the current Workload, the status fields Phalanx should own (``conditions``, and
``admission`` when admitted); None to skip the write (nothing to change)."""


@dataclass(frozen=True)
class WriteOutcome:
    ok: bool
    status: int = 0
    """HTTP status of the failure (404: the Workload is gone)."""
    error: str = ""
    unknown: bool = False
    """The write may have landed and no read-back could tell (the API is unreachable): the
    caller must neither forget the decision nor give its quota away; ask again later."""


class StatusWriter:
    def __init__(
        self,
        api: KubeApi,
        state: ClusterState,
        metrics: Metrics,
        *,
        concurrency: int = 16,
        pending_concurrency: int = 4,
        pending_yield_seconds: float = 1.0,
        pending_min_interval: float = 5.0,
        pending_numbers_interval: float = 30.0,
        routine_events: TokenBucket | None = None,
        pending_rate: TokenBucket | None = None,
    ) -> None:
        self.api = api
        self.routine_events = routine_events or TokenBucket(rate=0, burst=1)
        self.state = state
        self.metrics = metrics
        self.pending_min_interval = pending_min_interval
        self.pending_numbers_interval = max(pending_numbers_interval, pending_min_interval)
        self._decision_slots = asyncio.Semaphore(concurrency)
        self._decisions_waiting = 0
        self._decisions_clear = asyncio.Event()
        self._decisions_clear.set()
        self._background_slots = asyncio.Semaphore(pending_concurrency)
        self.pending_yield_seconds = pending_yield_seconds
        self._first: OrderedDict[str, str] = OrderedDict()  # never explained yet: first
        self._background: OrderedDict[str, str] = OrderedDict()  # key -> message to write
        self.pending_rate = pending_rate or TokenBucket(rate=0, burst=1)
        """Explanations written across the operator (the API server's share for background
        work); a Workload never explained goes before one whose explanation changed."""
        self._background_ready = asyncio.Event()
        self._last_pending: dict[str, tuple[str, float]] = {}
        self._deferred: dict[str, tuple[str, float]] = {}  # key -> (message, when due)
        self._due: list[tuple[float, str]] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._workers = max(1, pending_concurrency)
        self._locks: dict[str, list[Any]] = {}
        self.attempts = 4
        self.backoff = Backoff(initial=0.2, factor=2.0, maximum=5.0)
        self.pending_allowed: Callable[[str], bool] = lambda key: True
        """Set by the scheduling loop: whether ``key`` is still pending in the core (an
        explanation for a workload admitted meanwhile is stale)."""

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for i in range(self._workers):
            self._tasks.append(
                loop.create_task(self._pending_worker(), name=f"phalanx-pending-{i}")
            )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- decisions ------------------------------------------------------------------------------

    async def apply_status(
        self, key: str, build: StatusFn, *, verb: str, background: bool = False
    ) -> WriteOutcome:
        """Server-side apply of the Workload status computed by ``build`` from its current
        version. Retried briefly on conflicts and transient errors.

        Writes to one Workload are serialized, so each is computed from the response of the
        previous one: a pending message in flight can never land after, and undo, an
        admission.

        A decision takes one of ``concurrency`` slots. A ``background`` write (a pending
        explanation) takes one of its own ``pending_concurrency`` slots instead, and first
        yields while decisions wait for theirs (up to ``pending_yield_seconds``): at the
        API server's pace, explanations must not slow the admissions that end the waits.

        A failure whose outcome is unknown (reset, timeout, 5xx, unreadable answer) is
        resolved by reading the Workload back: ``build`` sees the fresh object and returns
        None when the write is already there. If the API cannot be read either, the outcome
        is ``unknown``, never a failure.
        """
        if background:
            async with self._background_slots:
                await self._yield_to_decisions()
                async with self._lock(key):
                    return await self._write(key, build, verb)
        async with self._lock(key), self._decision_slot():
            return await self._write(key, build, verb)

    @contextlib.asynccontextmanager
    async def _decision_slot(self) -> AsyncIterator[None]:
        self._decisions_waiting += 1
        self._decisions_clear.clear()
        try:
            await self._decision_slots.acquire()
        finally:
            self._decisions_waiting -= 1
            if not self._decisions_waiting:
                self._decisions_clear.set()
        try:
            yield
        finally:
            self._decision_slots.release()

    async def _yield_to_decisions(self) -> None:
        """Wait while decisions queue for a slot, but no longer than
        ``pending_yield_seconds``: explanations trickle on under a steady backlog."""
        if self._decisions_waiting:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.pending_yield_seconds):
                    await self._decisions_clear.wait()

    async def _write(self, key: str, build: StatusFn, verb: str) -> WriteOutcome:
        last = WriteOutcome(ok=False, error="no attempt")
        doubt = False  # some write may have landed without our knowing
        unsettled: str | None = None  # the precondition of the latest such write
        for attempt in range(self.attempts):
            if attempt:
                await asyncio.sleep(self.backoff.delay(attempt - 1))
            current = self.state.get("Workload", key)
            if current is None:
                return WriteOutcome(ok=False, status=404, error="workload not found")
            status = build(current)
            if status is None:
                return WriteOutcome(ok=True)
            status = carry_over(current, status)
            try:
                await self._apply(current, status)
                self.metrics.api_write("Workload", verb, ok=True)
                return WriteOutcome(ok=True)
            except API_ERRORS as error:
                self.metrics.api_write("Workload", verb, ok=False)
                code = error.status if isinstance(error, ApiError) else 0
                if code in (404, 422):
                    last = WriteOutcome(ok=False, status=code, error=str(error))
                    break
                if outcome_unknown(error):
                    doubt, unsettled = True, resource_version(current)
                    last = WriteOutcome(ok=False, status=code, error=repr(error), unknown=True)
                    logger.warning(
                        "event=status_write_unknown workload=%s verb=%s error=%r",
                        key,
                        verb,
                        str(error) or repr(error),
                    )
                else:
                    last = WriteOutcome(ok=False, status=code, error=str(error))
                # After an unknown outcome or a conflict, read the Workload back, so the
                # next attempt's ``build`` sees it (None if the write is there) and its
                # precondition is current.
                if (outcome_unknown(error) or code == 409) and await self._read_back(key) == 404:
                    return WriteOutcome(ok=False, status=404, error="workload not found")
        if doubt:
            last = await self._settle(key, build, unsettled, last)
        logger.warning(
            "event=status_write_failed workload=%s verb=%s unknown=%s error=%r",
            key,
            verb,
            last.unknown,
            last.error,
        )
        return last

    async def _settle(
        self, key: str, build: StatusFn, unsettled: str | None, last: WriteOutcome
    ) -> WriteOutcome:
        """Out of attempts after a write whose outcome is unknown: read the Workload once
        more. Every write carries its resourceVersion as a precondition, so a Workload that
        moved past ``unsettled`` without the change can no longer receive it."""
        read = await self._read_back(key)
        if read == 404:
            return WriteOutcome(ok=False, status=404, error="workload not found")
        current = self.state.get("Workload", key)
        if read != 200 or current is None:
            return WriteOutcome(ok=False, status=last.status, error=last.error, unknown=True)
        if build(current) is None:
            return WriteOutcome(ok=True)
        if resource_version(current) != unsettled:
            return WriteOutcome(ok=False, status=last.status, error=last.error)
        return WriteOutcome(ok=False, status=last.status, error=last.error, unknown=True)

    async def _read_back(self, key: str) -> int:
        """GET the Workload into the state (the watch may be behind, or cut); the HTTP
        status of the read (0 when the API could not be reached)."""
        namespace, _, name = key.partition("/")
        try:
            fresh = await self.api.get(WORKLOADS, name, namespace=namespace)
        except ApiError as error:
            if error.not_found:
                self.state.apply("Workload", "DELETED", self.state.get("Workload", key) or {})
            return error.status
        except TRANSIENT_ERRORS:
            return 0
        if fresh.get("metadata"):
            self.state.apply("Workload", "MODIFIED", fresh)
        return 200

    @contextlib.asynccontextmanager
    async def _lock(self, key: str) -> AsyncIterator[None]:
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = [asyncio.Lock(), 0]
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self._locks[key]

    async def _apply(self, current: dict[str, Any], status: dict[str, Any]) -> None:
        metadata = current["metadata"]
        body: dict[str, Any] = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": metadata["name"], "namespace": metadata["namespace"]},
            "status": status,
        }
        if metadata.get("resourceVersion"):
            # A precondition: a write computed from this version lands on it or not at all,
            # so a retry after an unknown outcome can never apply twice or over a change.
            body["metadata"]["resourceVersion"] = metadata["resourceVersion"]
        path = WORKLOADS.path(namespace=metadata["namespace"], name=metadata["name"]) + "/status"
        response = await self.api.request(
            "PATCH",
            path,
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            body=body,
            content_type=APPLY_PATCH,
        )
        if response.get("metadata"):
            self.state.apply("Workload", "MODIFIED", response)

    # -- pending explanations -------------------------------------------------------------------

    def explain(self, key: str, *, message: str, inadmissible: bool) -> None:
        """Queue a pending explanation; written later if it differs from what the Workload
        shows, and not sooner than ``pending_min_interval`` after the previous one, or
        ``pending_numbers_interval`` when only its numbers changed."""
        encoded = ("I" if inadmissible else "P") + cond.truncate(message)
        last = self._last_pending.get(key)
        if last is not None and last[0] == encoded:
            self._background.pop(key, None)
            self._deferred.pop(key, None)
            return
        if last is None:
            self._first[key] = encoded  # the latest wins; it keeps its place in line
            self._background_ready.set()
            return
        elif _shape(last[0]) == _shape(encoded):
            # Only its figures moved ("3 more needed" -> "2 more needed"): the live numbers
            # are in the visibility API and `kubectl phalanx explain`; the status catches up
            # at the slower pace.
            due = last[1] + self.pending_numbers_interval
        else:
            due = last[1] + self.pending_min_interval
        if due > time.monotonic():
            # Too soon after the previous write: park it until it is due (latest wins).
            parked = self._deferred.get(key)
            if parked is None or parked[1] != due:
                heapq.heappush(self._due, (due, key))  # an entry due at another time is dropped
            self._deferred[key] = (encoded, due)
            self._background.pop(key, None)
        else:
            self._deferred.pop(key, None)
            self._background[key] = encoded
            self._background.move_to_end(key)
        self._background_ready.set()

    def forget(self, key: str) -> None:
        self._first.pop(key, None)
        self._background.pop(key, None)
        self._deferred.pop(key, None)
        self._last_pending.pop(key, None)

    def _promote_due(self) -> float | None:
        """Move parked explanations that are due into the ready queue; seconds until the
        next one is due (None when none is parked)."""
        now = time.monotonic()
        while self._due:
            due, key = self._due[0]
            parked = self._deferred.get(key)
            if parked is None or parked[1] != due:
                heapq.heappop(self._due)  # forgotten, superseded or moved
                continue
            if due > now:
                return due - now
            heapq.heappop(self._due)
            self._background[key] = self._deferred.pop(key)[0]
        return None

    async def _pending_worker(self) -> None:
        while True:
            wait = self._promote_due()
            if not self._first and not self._background:
                self._background_ready.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._background_ready.wait()
                continue
            await self.pending_rate.acquire()
            queue = self._first or self._background
            if not queue:
                continue  # written or forgotten while this worker waited for its turn
            key, encoded = queue.popitem(last=False)
            now = time.monotonic()
            inadmissible, message = encoded[0] == "I", encoded[1:]
            self._last_pending[key] = (encoded, now)

            def build(
                current: dict[str, Any],
                message: str = message,
                inadmissible: bool = inadmissible,
                key: str = key,
            ) -> dict[str, Any] | None:
                if not self.pending_allowed(key):
                    return None
                status = current.get("status") or {}
                existing = cond.condition(status.get("conditions"), cond.QUOTA_RESERVED)
                if cond.is_true(status.get("conditions"), cond.FINISHED) or (
                    existing is not None and existing.get("status") == "True"
                ):
                    return None  # admitted or finished meanwhile: the explanation is stale
                if existing is not None and existing.get("message") == message:
                    return None
                now_ms = int(time.time() * 1000)
                updated = cond.pending(
                    owned_conditions(current),
                    inadmissible=inadmissible,
                    message=message,
                    now_ms=now_ms,
                )
                if not inadmissible and not _backing_off(status, now_ms=now_ms):
                    # Back in its queue and considered: Kueue's Requeued=True after an
                    # eviction that left it False (reactivated, backoff over, restarted).
                    updated = cond.requeued_again(updated, now_ms=now_ms) or updated
                return {"conditions": updated}

            await self.apply_status(key, build, verb="pending", background=True)

    # -- the integrations' writes -----------------------------------------------------------------

    async def finish(self, key: str, *, succeeded: bool, message: str) -> WriteOutcome:
        """``Finished=True`` on the Workload as its job ended, its admission kept; a Workload
        already finished is left as it is."""
        now = int(time.time() * 1000)

        def build(current: dict[str, Any]) -> dict[str, Any] | None:
            if cond.is_true((current.get("status") or {}).get("conditions"), cond.FINISHED):
                return None
            status: dict[str, Any] = {
                "conditions": cond.finished(
                    owned_conditions(current), succeeded=succeeded, message=message, now_ms=now
                )
            }
            admission = (current.get("status") or {}).get("admission")
            if admission:
                status["admission"] = admission
            return status

        return await self.apply_status(key, build, verb="finish")

    async def pods_ready(self, key: str, workload: dict[str, Any], *, ready: bool) -> None:
        """``PodsReady`` as ``ready`` says, written only when that changes the condition and
        while the Workload is admitted."""
        conditions = (workload.get("status") or {}).get("conditions")
        now = int(time.time() * 1000)
        if cond.condition(
            cond.pods_ready(conditions, ready=ready, now_ms=now), cond.PODS_READY
        ) == cond.condition(conditions, cond.PODS_READY):
            return

        def build(wl: dict[str, Any]) -> dict[str, Any] | None:
            wl_status = wl.get("status") or {}
            if not wl_status.get("admission"):
                return None
            return {
                "conditions": cond.pods_ready(owned_conditions(wl), ready=ready, now_ms=now),
                "admission": wl_status["admission"],
            }

        await self.apply_status(key, build, verb="podsready")

    # -- events ---------------------------------------------------------------------------------

    async def event(
        self, obj: dict[str, Any], *, reason: str, message: str, warning: bool = False
    ) -> None:
        """A core/v1 Event on ``obj`` (best effort: a lost Event is not retried). A routine
        one (``ROUTINE_EVENTS``: the object's status shows the same) is skipped, and counted,
        when the routine Events' rate limit is spent."""
        if reason in ROUTINE_EVENTS and not warning and not self.routine_events.take():
            self.metrics.events_skipped_total.labels(reason).inc()
            return
        metadata = obj["metadata"]
        namespace = metadata.get("namespace") or "default"
        now = cond.rfc3339(int(time.time() * 1000))
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{metadata['name']}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", "kueue.x-k8s.io/v1beta2"),
                "kind": obj.get("kind", "Workload"),
                "name": metadata["name"],
                "namespace": metadata.get("namespace"),
                "uid": metadata.get("uid"),
            },
            "reason": reason,
            "message": cond.truncate(message),
            "type": "Warning" if warning else "Normal",
            "source": {"component": "phalanx"},
            "reportingComponent": "phalanx",
            "reportingInstance": "phalanx",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.api.create(EVENTS, body, namespace=namespace)
            self.metrics.api_write("Event", "create", ok=True)
        except API_ERRORS as error:
            self.metrics.api_write("Event", "create", ok=False)
            logger.debug("event=event_post_failed reason=%s error=%r", reason, error)


# Status fields besides conditions that Phalanx may own. Server-side apply removes an owned
# field that an apply omits, so every apply carries them over unless the builder drops one
# explicitly by setting it to None (e.g. ``admission`` when an eviction completes).
_CARRIED = (
    "admission",
    "requeueState",
    "accumulatedPastExecutionTimeSeconds",
    "schedulingStats",
    "admissionChecks",
)


def _backing_off(status: dict[str, Any], *, now_ms: int) -> bool:
    requeue_at = (status.get("requeueState") or {}).get("requeueAt")
    return isinstance(requeue_at, str) and requeue_at > cond.rfc3339(now_ms)


def resource_version(obj: dict[str, Any]) -> str | None:
    value = (obj.get("metadata") or {}).get("resourceVersion")
    return str(value) if value else None


def carry_over(current: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    existing = current.get("status") or {}
    out = dict(status)
    for name in _CARRIED:
        if name not in out and existing.get(name) is not None:
            out[name] = existing[name]
    return {name: value for name, value in out.items() if value is not None}


def owned_conditions(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """The Workload's conditions of the types Phalanx manages (what its apply must carry)."""
    return [
        dict(c)
        for c in (workload.get("status") or {}).get("conditions") or ()
        if c.get("type") in cond.MANAGED_TYPES
    ]


async def gather_logged(*coros: Awaitable[Any]) -> None:
    for result in await asyncio.gather(*coros, return_exceptions=True):
        if isinstance(result, Exception):
            logger.error("event=write_task_failed error=%r", result)


# A quantity standing alone ("4", "412.0", "32Gi", "500m"), not the digits of a name
# ("team-2", "a100", "job-17").
_NUMBER = re.compile(r"(?<![\w.-])\d+(?:\.\d+)?(?:[KMGTPE]i?|m)?(?![\w-])")


def _shape(encoded: str) -> str:
    """An encoded explanation with its numbers blanked: two explanations of one shape say the
    same thing with other figures."""
    return encoded[:1] + _NUMBER.sub("#", encoded[1:])
