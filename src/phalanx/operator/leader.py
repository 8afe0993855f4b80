"""Leader election on a ``coordination.k8s.io/v1`` Lease, so that one replica schedules.

Only the leader may run scheduling cycles and write decisions; every replica serves the
webhooks. The protocol is client-go's ``leaderelection`` (the record lives in the Lease's
spec, writes carry the resourceVersion read, a conflict means someone else wrote first), on
Phalanx's own aiohttp client rather than the blocking ``kubernetes`` package.

The safety rule, and why it holds
---------------------------------
A leader measures its tenure with a **monotonic** clock from the moment it *sent* its last
successful renew. It stops leading (``on_stopped_leading`` fires, :meth:`LeaderElector.
still_leading` turns False) once ``renew_deadline`` has passed since then, whether or not the
renew request it has in flight ever returns. A candidate counts the lease as expired only
``lease_duration`` after it *received* a record it had not seen before. The record it
received was written after the leader sent it, so the candidate's expiry comes at least
``lease_duration - renew_deadline`` (5 s with the defaults) after the leader stopped: the
margin absorbs clock-rate differences and a stalled event loop. Wall-clock timestamps in
the record are informative only; no replica trusts another's clock.

Failover: a candidate watches the Lease, so it sees each renew within milliseconds, and tries
to acquire at the exact moment the record it saw expires (or at once when the holder released
it on a clean shutdown). A leader killed outright is replaced within ``lease_duration`` of its
last renew, plus one request.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from phalanx.operator.informer import Informer
from phalanx.operator.kube import ApiError, KubeApi, Resource

__all__ = [
    "LEASES",
    "FencedApi",
    "LeaderElectionConfig",
    "LeaderElectionError",
    "LeaderElector",
    "LeaseObservation",
    "LeaseRecord",
    "NotLeaderError",
    "Tenure",
    "default_identity",
    "default_namespace",
]

logger = logging.getLogger(__name__)

LEASES = Resource("coordination.k8s.io", "v1", "leases")
JITTER = 1.2
"""Candidates wait ``retry_period * uniform(1, JITTER)`` between attempts (client-go's factor),
so replicas started together do not hit the API server in lockstep."""

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
T = TypeVar("T")
Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]
Callback = Callable[[], None]


class LeaderElectionError(ValueError):
    """Leader election settings that cannot be safe; the message names the setting."""


class NotLeaderError(ApiError):
    """A write refused locally because this replica is not (or no longer) the leader."""

    def __init__(self, *, method: str, path: str) -> None:
        super().__init__(
            503,
            {"reason": "NotLeader", "message": "this replica does not hold the leader lease"},
            method=method,
            path=path,
        )


def default_identity() -> str:
    """``<hostname>_<8 hex>``: unique per process, readable in ``kubectl get lease``."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def default_namespace() -> str:
    """Where the Lease lives: ``$POD_NAMESPACE``, the service account's namespace in a pod,
    else ``kube-system`` (exists in every cluster; fine for an operator run by an admin)."""
    env = os.environ.get("POD_NAMESPACE")
    if env:
        return env
    try:
        return _SA_NAMESPACE.read_text().strip() or "kube-system"
    except OSError:
        return "kube-system"


@dataclass(frozen=True)
class LeaderElectionConfig:
    """Timings follow client-go's names and defaults (15 s / 10 s / 2 s).

    ``lease_duration``: how long candidates wait, from when they see a renew, before taking
    over. ``renew_deadline``: how long the leader keeps leading without a successful renew.
    ``retry_period``: how often the leader renews and candidates retry.
    """

    lease_name: str = "phalanx-scheduler"
    namespace: str = field(default_factory=default_namespace)
    identity: str = field(default_factory=default_identity)
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    release_on_shutdown: bool = True
    watch: bool = True
    """Watch the Lease (failover at the exact expiry) instead of only polling it."""

    def __post_init__(self) -> None:
        problems = []
        if not self.lease_name:
            problems.append("lease_name must not be empty")
        if not self.identity:
            problems.append("identity must not be empty")
        if self.retry_period <= 0:
            problems.append(f"retry_period must be positive, got {self.retry_period}")
        if self.lease_duration < 1:
            problems.append(
                f"lease_duration must be at least 1 s (the Lease stores whole seconds),"
                f" got {self.lease_duration}"
            )
        if self.renew_deadline >= self.lease_duration:
            problems.append(
                f"renew_deadline ({self.renew_deadline}) must be less than lease_duration"
                f" ({self.lease_duration}): a leader must stop before others may take over"
            )
        if self.renew_deadline <= JITTER * self.retry_period:
            problems.append(
                f"renew_deadline ({self.renew_deadline}) must exceed {JITTER} x retry_period"
                f" ({self.retry_period}) so that a leader gets more than one renew attempt"
            )
        if problems:
            raise LeaderElectionError("leader election: " + "; ".join(problems))

    @property
    def lease_duration_seconds(self) -> int:
        # Rounded up: the record must never promise less than this replica assumes.
        return max(1, -int(-self.lease_duration // 1))


@dataclass(frozen=True)
class LeaseRecord:
    """The leader election record as a Lease's spec holds it."""

    holder: str
    lease_duration_seconds: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int
    resource_version: str | None = None

    @classmethod
    def from_lease(cls, lease: dict[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=(lease.get("metadata") or {}).get("resourceVersion"),
        )

    def spec(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder or None,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.transitions,
        }

    def same_record(self, other: LeaseRecord | None) -> bool:
        """Equal as a record (the resourceVersion aside): a renew always changes renewTime."""
        return other is not None and self.spec() == other.spec()


class LeaseObservation:
    """A candidate's view of the lease: the last record seen and *when this replica first saw
    it* (monotonic). Expiry counts from that moment, never from the record's timestamps."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.observed_at: float = 0.0

    def observe(self, record: LeaseRecord, now: float) -> bool:
        """Record ``record`` seen at ``now``; True when it differs from the previous one."""
        if record.same_record(self.record):
            # A newer resourceVersion of the same record (e.g. a metadata change) still
            # identifies the object to update.
            self.record = record
            return False
        self.record = record
        self.observed_at = now
        return True

    def forget(self) -> None:
        self.record = None
        self.observed_at = 0.0

    def expires_at(self) -> float | None:
        """When the observed holder's claim lapses; None when nobody holds the lease."""
        if self.record is None or not self.record.holder:
            return None
        return self.observed_at + self.record.lease_duration_seconds

    def held_by_other(self, identity: str, now: float) -> bool:
        expiry = self.expires_at()
        return (
            self.record is not None
            and self.record.holder != identity
            and expiry is not None
            and now < expiry
        )


class Tenure:
    """The leader's side of the safety rule: valid until ``renew_deadline`` after the start of
    the last successful renew."""

    def __init__(self, renew_deadline: float) -> None:
        self.renew_deadline = renew_deadline
        self.renewed_at: float | None = None

    def renewed(self, sent_at: float) -> None:
        # Only moves forward: a slow earlier attempt finishing late must not shorten it.
        if self.renewed_at is None or sent_at > self.renewed_at:
            self.renewed_at = sent_at

    def end(self) -> None:
        self.renewed_at = None

    @property
    def deadline(self) -> float | None:
        return None if self.renewed_at is None else self.renewed_at + self.renew_deadline

    def valid(self, now: float) -> bool:
        deadline = self.deadline
        return deadline is not None and now < deadline


def micro_time(seconds: float) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaign for the Lease, lead while renewals succeed, and tell the operator.

    ``is_leader`` is set while leading. ``on_started_leading`` and ``on_stopped_leading``
    callbacks run synchronously on the event loop, in that order per tenure; the stop
    callback must stop all scheduling writes at once (cancel tasks) because the tenure is
    already over when it runs. :meth:`still_leading` is the check to make right before a
    write: it reads the clock, so it is exact even when the event loop was stalled.
    """

    def __init__(
        self,
        api: KubeApi,
        config: LeaderElectionConfig,
        *,
        on_started_leading: Callback | None = None,
        on_stopped_leading: Callback | None = None,
        on_new_leader: Callable[[str], None] | None = None,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.api = api
        self.config = config
        self.identity = config.identity
        self.is_leader = asyncio.Event()
        self.on_started_leading: list[Callback] = [on_started_leading] if on_started_leading else []
        self.on_stopped_leading: list[Callback] = [on_stopped_leading] if on_stopped_leading else []
        self.on_new_leader = on_new_leader
        self._clock = clock
        self._wall = wall_clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.tenure = Tenure(config.renew_deadline)
        self.observation = LeaseObservation()
        self._mine: LeaseRecord | None = None  # the record as this replica last wrote it
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._informer: Informer | None = None
        self._reported_leader: str | None = None
        self.transitions = 0
        """Tenures this elector started (for tests and logs)."""

    # -- public ---------------------------------------------------------------------------------

    @property
    def leader(self) -> str | None:
        """The holder this replica last saw ("" or None: nobody)."""
        record = self.observation.record
        return record.holder if record else None

    def still_leading(self) -> bool:
        """True while this replica leads and its renew deadline has not passed."""
        return self.is_leader.is_set() and self.tenure.valid(self._clock())

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.get_running_loop().create_task(
            self.run(), name="phalanx-leader-election"
        )
        return self._task

    async def stop(self) -> None:
        """Stop campaigning; a leader fires stop-leading, then releases the lease."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def run(self) -> None:
        if self.config.watch:
            self._informer = Informer(
                self.api,
                LEASES,
                self._on_lease_event,
                namespace=self.config.namespace,
                field_selector=f"metadata.name={self.config.lease_name}",
                watch_timeout=max(30, int(self.config.lease_duration * 4)),
            )
            self._informer.start()
        try:
            while True:
                await self._campaign()
                await self._lead()
        finally:
            was_leading = self.is_leader.is_set()
            if was_leading:
                self._stop_leading("shutdown")
            if self._informer is not None:
                await self._informer.stop()
            if was_leading and self.config.release_on_shutdown:
                await self._release()

    # -- candidate ------------------------------------------------------------------------------

    async def _campaign(self) -> None:
        while True:
            # With a live watch the observation is current: no read is needed while another
            # replica's claim runs. Polling (no watch) must read to see renewals at all.
            skip = self._watching() and self.observation.held_by_other(self.identity, self._clock())
            if not skip and await self._attempt_bounded() and self.tenure.valid(self._clock()):
                self._start_leading()
                return
            await self._wait_for_turn()

    async def _attempt_bounded(self) -> bool:
        # The client's timeout normally ends a hung request; this bound does not rely on it.
        try:
            return await self._bounded(
                self._try_acquire_or_renew(), 2 * self._request_timeout() + 1.0
            )
        except TimeoutError:
            return False

    def _watching(self) -> bool:
        return self._informer is not None and self._informer.synced.is_set()

    async def _wait_for_turn(self) -> None:
        delay = self.config.retry_period * self._rng.uniform(1.0, JITTER)
        expiry = self.observation.expires_at()
        now = self._clock()
        if expiry is not None and expiry > now:
            delay = min(delay, expiry - now)
        elif self.observation.record is not None and not self.observation.record.holder:
            delay = min(delay, 0.05)  # released: go now (after a breath for the writer)
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await self._bounded(self._wake.wait(), delay)

    def _on_lease_event(self, event_type: str, lease: dict[str, Any]) -> None:
        if event_type == "DELETED":
            self.observation.forget()
        else:
            record = LeaseRecord.from_lease(lease)
            self.observation.observe(record, self._clock())
            self._report_leader(record.holder)
            # Our own renew echoes back too; only a change of holder matters to a candidate.
            if record.holder == self.identity:
                return
        # A release or another holder: re-evaluate now rather than at the next retry.
        if not self.is_leader.is_set() or (
            self.observation.record is not None and self.observation.record.holder
        ):
            self._wake.set()

    # -- leader ---------------------------------------------------------------------------------

    async def _lead(self) -> None:
        period = self.config.retry_period
        while True:
            deadline = self.tenure.deadline
            assert deadline is not None
            now = self._clock()
            if now >= deadline:
                self._stop_leading("renew deadline passed")
                return
            with contextlib.suppress(TimeoutError):
                await self._bounded(self._wake_on_loss(), min(period, deadline - now))
            if self._lost_to_other():
                self._stop_leading(f"lease taken by {self.leader}")
                return
            deadline = self.tenure.deadline
            assert deadline is not None
            now = self._clock()
            if now >= deadline:
                self._stop_leading("renew deadline passed")
                return
            try:
                await self._bounded(self._try_acquire_or_renew(), deadline - now)
            except TimeoutError:
                logger.warning(
                    "event=lease_renew_timeout lease=%s identity=%s",
                    self.config.lease_name,
                    self.identity,
                )
            if self._lost_to_other():
                self._stop_leading(f"lease taken by {self.leader}")
                return

    async def _wake_on_loss(self) -> None:
        """Sleep until the watch shows another holder (never returns otherwise)."""
        while not self._lost_to_other():
            self._wake.clear()
            await self._wake.wait()

    def _lost_to_other(self) -> bool:
        record = self.observation.record
        return record is not None and bool(record.holder) and record.holder != self.identity

    def _start_leading(self) -> None:
        self.transitions += 1
        self.is_leader.set()
        logger.info(
            "event=leader_started lease=%s/%s identity=%s deadline_in=%.2f",
            self.config.namespace,
            self.config.lease_name,
            self.identity,
            (self.tenure.deadline or 0.0) - self._clock(),
        )
        _run_callbacks(self.on_started_leading, "started_leading")

    def _stop_leading(self, reason: str) -> None:
        if not self.is_leader.is_set():
            return
        self.is_leader.clear()
        self.tenure.end()
        self._mine = None
        logger.warning(
            "event=leader_stopped lease=%s/%s identity=%s reason=%r",
            self.config.namespace,
            self.config.lease_name,
            self.identity,
            reason,
        )
        _run_callbacks(self.on_stopped_leading, "stopped_leading")

    # -- one attempt (client-go's tryAcquireOrRenew) --------------------------------------------

    async def _try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the lease afterwards."""
        try:
            if self.is_leader.is_set() and self._mine is not None:
                # Fast path: renew what we last wrote; a conflict falls back to a fresh read.
                with contextlib.suppress(ApiError):
                    if await self._write(self._renewal(self._mine)):
                        return True
            return await self._read_and_claim()
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
            logger.info(
                "event=lease_attempt_failed lease=%s identity=%s error=%r",
                self.config.lease_name,
                self.identity,
                error,
            )
            return False

    async def _read_and_claim(self) -> bool:
        path = LEASES.path(namespace=self.config.namespace, name=self.config.lease_name)
        try:
            lease = await self.api.request("GET", path, timeout=self._request_timeout())
        except ApiError as error:
            if not error.not_found:
                raise
            return await self._create()
        record = LeaseRecord.from_lease(lease)
        now = self._clock()
        self.observation.observe(record, now)
        self._report_leader(record.holder)
        if self.observation.held_by_other(self.identity, now):
            return False
        if record.holder == self.identity:
            claim = self._renewal(record)
        else:
            wall = micro_time(self._wall())
            claim = LeaseRecord(
                holder=self.identity,
                lease_duration_seconds=self.config.lease_duration_seconds,
                acquire_time=wall,
                renew_time=wall,
                transitions=record.transitions + 1,  # as client-go: every change of hands
                resource_version=record.resource_version,
            )
        return await self._write(claim)

    def _renewal(self, record: LeaseRecord) -> LeaseRecord:
        return LeaseRecord(
            holder=self.identity,
            lease_duration_seconds=self.config.lease_duration_seconds,
            acquire_time=record.acquire_time or micro_time(self._wall()),
            renew_time=micro_time(self._wall()),
            transitions=record.transitions,
            resource_version=record.resource_version,
        )

    async def _write(self, claim: LeaseRecord) -> bool:
        """PUT ``claim`` guarded by its resourceVersion; a 409 means someone wrote first."""
        body = self._lease_body(claim)
        path = LEASES.path(namespace=self.config.namespace, name=self.config.lease_name)
        sent_at = self._clock()  # before the request: the tenure may only err short
        try:
            written = await self.api.request(
                "PUT", path, body=body, timeout=self._request_timeout()
            )
        except ApiError as error:
            if error.conflict:
                self._mine = None
                return False
            raise
        self._claimed(written, sent_at)
        return True

    async def _create(self) -> bool:
        wall = micro_time(self._wall())
        claim = LeaseRecord(
            holder=self.identity,
            lease_duration_seconds=self.config.lease_duration_seconds,
            acquire_time=wall,
            renew_time=wall,
            transitions=0,
        )
        sent_at = self._clock()
        try:
            written = await self.api.request(
                "POST",
                LEASES.path(namespace=self.config.namespace),
                body=self._lease_body(claim),
                timeout=self._request_timeout(),
            )
        except ApiError as error:
            if error.status == 409:  # created by another replica meanwhile
                return False
            raise
        self._claimed(written, sent_at)
        return True

    def _claimed(self, written: dict[str, Any], sent_at: float) -> None:
        record = LeaseRecord.from_lease(written)
        self._mine = record
        self.tenure.renewed(sent_at)
        self.observation.observe(record, self._clock())
        self._report_leader(record.holder)

    def _lease_body(self, claim: LeaseRecord) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            "name": self.config.lease_name,
            "namespace": self.config.namespace,
        }
        if claim.resource_version:
            metadata["resourceVersion"] = claim.resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {k: v for k, v in claim.spec().items() if v is not None},
        }

    def _request_timeout(self) -> float:
        # A request must not outlive a retry round by much; the deadline race bounds a
        # leader's renew separately.
        return max(1.0, min(self.config.renew_deadline, 2 * self.config.retry_period))

    async def _release(self) -> None:
        """Hand the lease back (empty holder) so a candidate takes over at once."""
        record = self._last_own_record()
        if record is None:
            return
        wall = micro_time(self._wall())
        released = LeaseRecord(
            holder="",
            lease_duration_seconds=1,
            acquire_time=wall,
            renew_time=wall,
            transitions=record.transitions,
            resource_version=record.resource_version,
        )
        path = LEASES.path(namespace=self.config.namespace, name=self.config.lease_name)
        try:
            # Bounded on our clock too: shutdown must not hang on an unreachable API server.
            await self._bounded(
                self.api.request(
                    "PUT", path, body=self._lease_body(released), timeout=self._request_timeout()
                ),
                self._request_timeout(),
            )
            logger.info("event=lease_released lease=%s identity=%s", path, self.identity)
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as error:
            # A conflict means someone else holds it already; otherwise it simply expires.
            logger.info("event=lease_release_failed lease=%s error=%r", path, error)

    def _last_own_record(self) -> LeaseRecord | None:
        if self._mine is not None:
            return self._mine
        record = self.observation.record
        return record if record is not None and record.holder == self.identity else None

    def _report_leader(self, holder: str) -> None:
        if holder and holder != self._reported_leader:
            self._reported_leader = holder
            logger.info("event=leader_observed lease=%s leader=%s", self.config.lease_name, holder)
            if self.on_new_leader is not None:
                try:
                    self.on_new_leader(holder)
                except Exception:
                    logger.exception("event=leader_callback_failed callback=new_leader")

    async def _bounded(self, awaitable: Coroutine[Any, Any, T], seconds: float) -> T:
        """``awaitable`` or TimeoutError after ``seconds`` of the injected clock's sleep."""
        task = asyncio.ensure_future(awaitable)
        timer = asyncio.ensure_future(self._sleep(max(0.0, seconds)))
        try:
            done, _ = await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            timer.cancel()
            raise
        if task in done:
            timer.cancel()
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise TimeoutError


class FencedApi(KubeApi):
    """The operator's client for scheduling writes: any non-GET request is refused with
    :class:`NotLeaderError` unless ``allowed()`` (``LeaderElector.still_leading``) says so at
    the moment of sending. Shares ``inner``'s pooled session; closing it is ``inner``'s job."""

    def __init__(self, inner: KubeApi, *, allowed: Callable[[], bool]) -> None:
        # No super().__init__(): a second session would double the connection pool.
        self.auth = inner.auth
        self._ssl = inner._ssl
        self._session = inner.session
        self._allowed = allowed

    async def close(self) -> None:
        return None

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
        if method != "GET" and not self._allowed():
            raise NotLeaderError(method=method, path=path)
        return await super().request(
            method, path, params=params, body=body, content_type=content_type, timeout=timeout
        )


def _run_callbacks(callbacks: list[Callback], name: str) -> None:
    for callback in callbacks:
        try:
            callback()
        except Exception:
            logger.exception("event=leader_callback_failed callback=%s", name)
