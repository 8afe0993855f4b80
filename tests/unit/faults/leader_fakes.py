"""Virtual time and an in-memory Lease endpoint for the leader election unit tests.

``VirtualClock`` is a discrete-event clock: ``sleep`` parks the caller until the driver
advances time to its wake-up, so a test runs minutes of protocol in milliseconds and every
timing is exact. ``LeaseServer`` answers GET/POST/PUT on one Lease with resourceVersion
checks (409 on a stale version), as the API server does; each replica talks to it through a
``ReplicaApi`` that a test can cut off (errors) or freeze (requests never return).
"""

from __future__ import annotations

import asyncio
import copy
import heapq
import itertools
from typing import Any

import aiohttp

from phalanx.operator.kube import ApiError


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0
        self._waiters: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (self.now + max(0.0, seconds), next(self._seq), future))
        await future

    async def settle(self) -> None:
        """Let every runnable task run until all are parked."""
        for _ in range(60):
            await asyncio.sleep(0)

    async def advance_to(self, until: float) -> None:
        while True:
            await self.settle()
            while self._waiters and self._waiters[0][2].done():
                heapq.heappop(self._waiters)  # cancelled sleeper
            if not self._waiters or self._waiters[0][0] > until:
                self.now = max(self.now, until)
                await self.settle()
                return
            wake_at, _, future = heapq.heappop(self._waiters)
            self.now = max(self.now, wake_at)
            future.set_result(None)

    async def advance(self, seconds: float) -> None:
        await self.advance_to(self.now + seconds)


class LeaseServer:
    """One namespace's Leases, with optimistic concurrency like the API server."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.leases: dict[str, dict[str, Any]] = {}
        self._rv = itertools.count(100)
        self.writes: list[tuple[float, str, str]] = []  # (time, replica, holder)

    def handle(self, replica: str, method: str, path: str, body: Any) -> dict[str, Any]:
        parts = path.rstrip("/").split("/")
        if method == "POST":
            name = body["metadata"]["name"]
            if name in self.leases:
                raise ApiError(409, {"reason": "AlreadyExists"}, method=method, path=path)
            return self._store(replica, name, body)
        name = parts[-1]
        current = self.leases.get(name)
        if method == "GET":
            if current is None:
                raise ApiError(404, {"reason": "NotFound"}, method=method, path=path)
            return copy.deepcopy(current)
        if method == "PUT":
            if current is None:
                raise ApiError(404, {"reason": "NotFound"}, method=method, path=path)
            sent_rv = body["metadata"].get("resourceVersion")
            if sent_rv != current["metadata"]["resourceVersion"]:
                raise ApiError(409, {"reason": "Conflict"}, method=method, path=path)
            return self._store(replica, name, body)
        raise AssertionError(f"unexpected {method} {path}")

    def _store(self, replica: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        self.leases[name] = obj
        self.writes.append((self.clock.now, replica, obj["spec"].get("holderIdentity") or ""))
        return copy.deepcopy(obj)

    def force_holder(self, name: str, holder: str) -> None:
        """An out-of-band edit (an admin, or a replica this test does not model)."""
        obj = self.leases[name]
        obj["spec"]["holderIdentity"] = holder
        obj["metadata"]["resourceVersion"] = str(next(self._rv))


class ReplicaApi:
    """What one replica's ``KubeApi`` would do, with switchable faults: "error" refuses at
    once, "hang" answers nothing until the request's timeout."""

    def __init__(self, server: LeaseServer, name: str, *, latency: float = 0.0) -> None:
        self.server = server
        self.name = name
        self.latency = latency
        self.mode = "ok"  # "ok" | "error" | "hang"
        self.requests: list[tuple[float, str]] = []

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
        self.requests.append((self.server.clock.now, method))
        if self.mode == "hang":
            # Never answered: the client's own timeout ends it, as aiohttp's would.
            await self.server.clock.sleep(timeout)
            raise TimeoutError(f"{method} {path}: no answer in {timeout}s")
        if self.mode == "error":
            raise aiohttp.ClientConnectionError("connection refused")
        if self.latency:
            await self.server.clock.sleep(self.latency)
        return self.server.handle(self.name, method, path, body)
