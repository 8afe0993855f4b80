"""A fault-injecting HTTP proxy between the operator and the API server.

The operator talks plain HTTP to the proxy on ``127.0.0.1:<free port>`` (a second kubeconfig,
:meth:`FaultProxy.write_kubeconfig`, points it there); the proxy forwards each request to the
real API server with the real credentials (client certificate or token from the cluster's
kubeconfig, :class:`~phalanx.operator.kubeconfig.ClusterAuth`). A TCP pass-through would
keep TLS end to end and so could not see which request is which; terminating HTTP here is
what lets the faults target one kind of request.

Faults are chosen per request by a seeded :class:`FaultPolicy`, on Workload status writes
(``PATCH``/``PUT .../workloads/<name>/status``) and, at their own rates, on a few other
writes (:data:`DEFAULT_WRITE_PATHS`). Reads and watches pass through untouched, except an
occasional watch cut when asked for. The kinds (:class:`FaultKind`):

- ``reset_before``: the connection is reset before forwarding; the write did not land.
- ``drop_after``: forwarded, then the connection is reset without an answer; it landed.
- ``gateway_timeout``: forwarded, then a 504 with a ``Status`` body; it landed.
- ``server_error``: forwarded, then a 500 with a non-JSON body; it landed.
- ``stall_before``: held ``stall_seconds`` (past the client's timeout) before forwarding. A
  client that gave up meanwhile closes the connection and the write is never forwarded: a
  write landing long after its client died, possibly after that process was killed and
  replaced, is a ghost no client can fence, and not what an API server does.
- ``stall_after``: forwarded at once, the answer held ``stall_seconds``; it landed.
- ``watch_cut``: a watch stream reset after a random time (the informer must resume).

Every injected fault is counted per kind (:meth:`FaultProxy.counts`) and recorded
(:meth:`FaultProxy.records`: when, what, on which path), so a violation found downstream can
be laid beside the faults its Workload went through.

The proxy runs in the caller's event loop (:meth:`FaultProxy.start`) or in a thread with its
own loop (:func:`running_proxy`, for synchronous tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from yarl import URL

from phalanx.operator.kubeconfig import ClusterAuth

__all__ = [
    "DEFAULT_WRITE_PATHS",
    "LANDED",
    "FaultKind",
    "FaultPolicy",
    "FaultProxy",
    "FaultRecord",
    "RequestClass",
    "classify",
    "running_proxy",
]


class FaultKind(StrEnum):
    RESET_BEFORE = "reset_before"
    DROP_AFTER = "drop_after"
    GATEWAY_TIMEOUT = "gateway_timeout"
    SERVER_ERROR = "server_error"
    STALL_BEFORE = "stall_before"
    STALL_AFTER = "stall_after"
    WATCH_CUT = "watch_cut"


LANDED = frozenset(
    {
        FaultKind.DROP_AFTER,
        FaultKind.GATEWAY_TIMEOUT,
        FaultKind.SERVER_ERROR,
        FaultKind.STALL_AFTER,
    }
)
"""Faults after which the write is on the API server although the client cannot know it."""

WRITE_FAULTS = (
    FaultKind.RESET_BEFORE,
    FaultKind.DROP_AFTER,
    FaultKind.GATEWAY_TIMEOUT,
    FaultKind.SERVER_ERROR,
    FaultKind.STALL_BEFORE,
    FaultKind.STALL_AFTER,
)


class RequestClass(StrEnum):
    STATUS_WRITE = "status_write"
    """A write to a Workload's status subresource: what the faults are for."""
    WRITE = "write"
    """Any other write."""
    WATCH = "watch"
    READ = "read"


_STATUS_WRITE = re.compile(
    r"^/apis/kueue\.x-k8s\.io/[^/]+/namespaces/[^/]+/workloads/[^/]+/status$"
)
_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

DEFAULT_WRITE_PATHS: tuple[re.Pattern[str], ...] = (
    # Workload creation for a Job, and the Job patches (suspend, start, restore).
    re.compile(r"^/apis/kueue\.x-k8s\.io/[^/]+/namespaces/[^/]+/workloads$"),
    re.compile(r"^/apis/batch/v1/namespaces/[^/]+/jobs/[^/]+$"),
)
"""Other writes that may be faulted (at ``write_rates``); the rest (Events, ClusterQueue
status, kopf's webhook configuration, ...) always pass."""


def classify(method: str, path: str, query: Mapping[str, str]) -> RequestClass:
    method = method.upper()
    if method in _WRITE_METHODS:
        if method in ("PATCH", "PUT") and _STATUS_WRITE.match(path):
            return RequestClass.STATUS_WRITE
        return RequestClass.WRITE
    if query.get("watch", "").lower() in ("1", "true") or "/watch/" in path:
        return RequestClass.WATCH
    return RequestClass.READ


@dataclass(frozen=True)
class FaultRecord:
    at: float
    """Wall-clock time (``time.time()``) the fault was chosen."""
    kind: FaultKind
    method: str
    path: str
    upstream_status: int | None = None
    """The API server's answer to the forwarded request (None: not forwarded)."""


@dataclass
class FaultPolicy:
    """Which fault, if any, each request gets; seeded, so a run's choices can be replayed
    given the same order of requests.

    One random draw per candidate request: the kinds are tried in :data:`WRITE_FAULTS` order
    with their rates stacked; a kind whose ``budgets`` entry is used up injects nothing (the
    draw is not moved to another kind, so budgets do not skew the other rates)."""

    seed: int = 7
    status_rates: Mapping[FaultKind, float] = field(default_factory=dict)
    write_rates: Mapping[FaultKind, float] = field(default_factory=dict)
    budgets: Mapping[FaultKind, int] = field(default_factory=dict)
    stall_seconds: float = 35.0
    watch_cut_rate: float = 0.0
    watch_cut_after: tuple[float, float] = (5.0, 60.0)
    write_paths: tuple[re.Pattern[str], ...] = DEFAULT_WRITE_PATHS

    def __post_init__(self) -> None:
        for rates in (self.status_rates, self.write_rates):
            unknown = set(rates) - set(WRITE_FAULTS)
            assert not unknown, f"not a write fault: {unknown}"
            assert sum(rates.values()) <= 1.0, f"rates add up past 1: {dict(rates)}"
        self._rng = random.Random(self.seed)
        self.used: Counter[FaultKind] = Counter()

    def _within_budget(self, kind: FaultKind) -> bool:
        budget = self.budgets.get(kind)
        return budget is None or self.used[kind] < budget

    def decide(self, request_class: RequestClass, path: str = "") -> FaultKind | None:
        if request_class is RequestClass.STATUS_WRITE:
            rates = self.status_rates
        elif request_class is RequestClass.WRITE:
            if not any(p.match(path) for p in self.write_paths):
                return None
            rates = self.write_rates
        elif request_class is RequestClass.WATCH:
            if self.watch_cut_rate <= 0:
                return None
            if self._rng.random() < self.watch_cut_rate and self._within_budget(
                FaultKind.WATCH_CUT
            ):
                self.used[FaultKind.WATCH_CUT] += 1
                return FaultKind.WATCH_CUT
            return None
        else:
            return None
        if not rates:
            return None
        draw = self._rng.random()
        edge = 0.0
        for kind in WRITE_FAULTS:
            edge += rates.get(kind, 0.0)
            if draw < edge:
                if not self._within_budget(kind):
                    return None
                self.used[kind] += 1
                return kind
        return None

    def watch_cut_delay(self) -> float:
        return self._rng.uniform(*self.watch_cut_after)


_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
    )
)
_REQUEST_DROP = _HOP_BY_HOP | {"host", "content-length", "authorization", "accept-encoding"}
_RESPONSE_DROP = _HOP_BY_HOP | {"content-length", "content-encoding", "server", "date"}


def _gateway_timeout_status(path: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"Timeout: request did not complete within the allotted timeout ({path})",
        "reason": "Timeout",
        "details": {"causes": [{"message": "injected by faultproxy"}]},
        "code": 504,
    }


class FaultProxy:
    """The proxy. ``auth`` holds the real API server's address and credentials."""

    def __init__(
        self,
        auth: ClusterAuth,
        policy: FaultPolicy | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.auth = auth
        self.policy = policy or FaultPolicy()
        self.host = host
        self.port = port
        self.enabled = True
        """Faults on (True) or every request passed through (False); may be flipped from
        any thread."""
        self._lock = threading.Lock()
        self._counts: Counter[FaultKind] = Counter()
        self._by_class: Counter[tuple[RequestClass, FaultKind]] = Counter()
        self._seen: Counter[RequestClass] = Counter()
        self._records: list[FaultRecord] = []
        self._upstream_errors = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._base = URL(auth.server)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread_error: BaseException | None = None

    # -- reading ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def counts(self) -> dict[str, int]:
        """Injected faults per kind (every kind present, zeros included)."""
        with self._lock:
            return {kind.value: self._counts[kind] for kind in FaultKind}

    def counts_by_class(self) -> dict[str, dict[str, int]]:
        with self._lock:
            out: dict[str, dict[str, int]] = {}
            for (request_class, kind), n in sorted(self._by_class.items()):
                out.setdefault(request_class.value, {})[kind.value] = n
            return out

    def seen(self) -> dict[str, int]:
        """Requests proxied per class."""
        with self._lock:
            return {c.value: self._seen[c] for c in RequestClass}

    def records(self) -> list[FaultRecord]:
        with self._lock:
            return list(self._records)

    @property
    def upstream_errors(self) -> int:
        """Requests the API server could not be reached for (answered by a reset)."""
        with self._lock:
            return self._upstream_errors

    def write_kubeconfig(self, path: Path, *, namespace: str = "default") -> Path:
        """A kubeconfig that points a client at this proxy (plain HTTP, no credentials: the
        proxy adds the real ones)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "faultproxy", "cluster": {"server": self.url}}],
            "users": [{"name": "faultproxy", "user": {}}],
            "contexts": [
                {
                    "name": "faultproxy",
                    "context": {
                        "cluster": "faultproxy",
                        "user": "faultproxy",
                        "namespace": namespace,
                    },
                }
            ],
            "current-context": "faultproxy",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        return path

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ssl=self.auth.ssl_context()),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=True,
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # A client that hangs up cancels its handler: a stalled write is then never forwarded,
        # and a watch whose client died closes its upstream stream at once.
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        addresses = self._runner.addresses
        self.port = int(addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def start_thread(self, *, timeout: float = 30.0) -> None:
        def main() -> None:
            async def run() -> None:
                self._loop = asyncio.get_running_loop()
                self._stop = asyncio.Event()
                try:
                    await self.start()
                except BaseException as error:
                    self._thread_error = error
                    self._ready.set()
                    raise
                self._ready.set()
                await self._stop.wait()
                await self.stop()

            with contextlib.suppress(Exception):
                asyncio.run(run())

        self._thread = threading.Thread(target=main, name="fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the fault proxy did not start within {timeout}s")
        if self._thread_error is not None:
            raise RuntimeError(f"the fault proxy did not start: {self._thread_error!r}")

    def stop_thread(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=30)

    # -- the proxy --------------------------------------------------------------------------

    def _count(self, request_class: RequestClass, kind: FaultKind, request: web.Request) -> int:
        """Count a fault and record it; the record's index."""
        with self._lock:
            self._counts[kind] += 1
            self._by_class[(request_class, kind)] += 1
            self._records.append(
                FaultRecord(at=time.time(), kind=kind, method=request.method, path=request.path)
            )
            return len(self._records) - 1

    def _landed(self, index: int, status: int) -> None:
        """Note the API server's answer to a faulted request on its record."""
        with self._lock:
            record = self._records[index]
            self._records[index] = FaultRecord(
                at=record.at,
                kind=record.kind,
                method=record.method,
                path=record.path,
                upstream_status=status,
            )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        request_class = classify(request.method, request.path, request.query)
        with self._lock:
            self._seen[request_class] += 1
            fault = self.policy.decide(request_class, request.path) if self.enabled else None
        body = await request.read() if request.can_read_body else None
        record = self._count(request_class, fault, request) if fault is not None else -1
        if fault is FaultKind.RESET_BEFORE:
            return _reset(request)
        if fault is FaultKind.STALL_BEFORE:
            # Cancelled here if the client gives up first (it does: the stall outlasts its
            # timeout), so the write is never forwarded.
            await asyncio.sleep(self.policy.stall_seconds)
        if request_class is RequestClass.WATCH:
            return await self._stream(request, cut=fault is FaultKind.WATCH_CUT)

        assert self._session is not None
        try:
            async with self._session.request(
                request.method,
                self._upstream_url(request),
                headers=self._upstream_headers(request),
                data=body,
            ) as upstream:
                payload = await upstream.read()
                status = upstream.status
                headers = _response_headers(upstream)
        except (aiohttp.ClientError, OSError):
            with self._lock:
                self._upstream_errors += 1
            return _reset(request)
        if fault is not None:
            self._landed(record, status)
        if fault is FaultKind.DROP_AFTER:
            return _reset(request)
        if fault is FaultKind.GATEWAY_TIMEOUT:
            return web.json_response(_gateway_timeout_status(request.path), status=504)
        if fault is FaultKind.SERVER_ERROR:
            return web.Response(
                status=500,
                text="<html><body><h1>500 Internal Server Error</h1>injected</body></html>",
                content_type="text/html",
            )
        if fault is FaultKind.STALL_AFTER:
            await asyncio.sleep(self.policy.stall_seconds)
        return web.Response(status=status, body=payload, headers=headers)

    async def _stream(self, request: web.Request, *, cut: bool) -> web.StreamResponse:
        """A watch, passed on chunk by chunk as the API server sends it."""
        assert self._session is not None
        cut_after = self.policy.watch_cut_delay() if cut else None
        response: web.StreamResponse | None = None
        try:
            async with self._session.request(
                request.method,
                self._upstream_url(request),
                headers=self._upstream_headers(request),
            ) as upstream:
                response = web.StreamResponse(
                    status=upstream.status, headers=_response_headers(upstream)
                )
                await response.prepare(request)
                try:
                    async with asyncio.timeout(cut_after):
                        async for chunk in upstream.content.iter_any():
                            await response.write(chunk)
                except TimeoutError:
                    return _reset(request)
        except (aiohttp.ClientError, OSError):
            if response is None:
                with self._lock:
                    self._upstream_errors += 1
            return _reset(request)
        await response.write_eof()
        return response

    def _upstream_url(self, request: web.Request) -> URL:
        return URL(str(self._base) + request.raw_path, encoded=True)

    def _upstream_headers(self, request: web.Request) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _REQUEST_DROP}
        headers.update(self.auth.headers())
        return headers


def _response_headers(upstream: aiohttp.ClientResponse) -> dict[str, str]:
    return {k: v for k, v in upstream.headers.items() if k.lower() not in _RESPONSE_DROP}


def _reset(request: web.Request) -> web.StreamResponse:
    """Reset the client's connection (RST, no answer). The returned response is never sent."""
    transport = request.transport
    if transport is not None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    return web.Response(status=502)


@contextlib.contextmanager
def running_proxy(auth: ClusterAuth, policy: FaultPolicy | None = None) -> Iterator[FaultProxy]:
    """A :class:`FaultProxy` serving from its own thread for the duration of the block."""
    proxy = FaultProxy(auth, policy)
    proxy.start_thread()
    try:
        yield proxy
    finally:
        proxy.stop_thread()
