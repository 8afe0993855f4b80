"""A lean asynchronous Kubernetes REST client on aiohttp.

Phalanx writes Workload status, patches Jobs and Pods, and posts Events from the operator's
event loop. The synchronous ``kubernetes`` client would block that loop (or need a thread per
call); this client is a thin layer over one pooled aiohttp session, with JSON bodies decoded by
orjson when it is installed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from phalanx.operator.kubeconfig import ClusterAuth

try:  # orjson is 3-5x faster than json on watch lines; json is the fallback.
    import orjson

    def loads(data: bytes | str) -> Any:
        return orjson.loads(data)

    def dumps(value: Any) -> bytes:
        return orjson.dumps(value)

except ImportError:  # pragma: no cover - exercised only without orjson

    def loads(data: bytes | str) -> Any:
        return json.loads(data)

    def dumps(value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode()


__all__ = [
    "API_ERRORS",
    "CLUSTER_QUEUES",
    "EVENTS",
    "JOBS",
    "JOBSETS",
    "LOCAL_QUEUES",
    "NODES",
    "PODS",
    "RAYCLUSTERS",
    "TRANSIENT_ERRORS",
    "WORKLOADS",
    "ApiError",
    "KubeApi",
    "MalformedResponse",
    "Resource",
    "dumps",
    "loads",
    "outcome_unknown",
]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


@dataclass(frozen=True)
class Resource:
    """One API resource, enough to build its URLs."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, *, namespace: str | None = None, name: str | None = None) -> str:
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [root]
        if self.namespaced and namespace is not None:
            parts.append(f"/namespaces/{quote(namespace, safe='')}")
        parts.append(f"/{self.plural}")
        if name is not None:
            parts.append(f"/{quote(name, safe='')}")
        return "".join(parts)


KUEUE = "kueue.x-k8s.io"
WORKLOADS = Resource(KUEUE, "v1beta2", "workloads")
CLUSTER_QUEUES = Resource(KUEUE, "v1beta2", "clusterqueues", namespaced=False)
LOCAL_QUEUES = Resource(KUEUE, "v1beta2", "localqueues")
JOBS = Resource("batch", "v1", "jobs")
JOBSETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets")
RAYCLUSTERS = Resource("ray.io", "v1", "rayclusters")
PODS = Resource("", "v1", "pods")
NODES = Resource("", "v1", "nodes", namespaced=False)
EVENTS = Resource("", "v1", "events")


class ApiError(Exception):
    """A non-2xx answer from the API server, with its Status body when there is one."""

    def __init__(self, status: int, body: Mapping[str, Any] | None, *, method: str, path: str):
        self.status = status
        self.body = dict(body or {})
        self.reason = str(self.body.get("reason", ""))
        message = self.body.get("message") or f"HTTP {status}"
        super().__init__(f"{method} {path}: {status} {self.reason}: {message}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


class MalformedResponse(Exception):
    """A 2xx answer whose body could not be decoded: the request may well have taken effect."""


TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    aiohttp.ClientError,
    OSError,
    TimeoutError,
    MalformedResponse,
)
"""Failures of the transport or of the answer, as opposed to an answer saying no."""

API_ERRORS: tuple[type[BaseException], ...] = (ApiError, *TRANSIENT_ERRORS)
"""Everything a request may raise that is about the API, not a bug: an answer saying no,
or a failure of the transport or of the answer."""


def outcome_unknown(error: BaseException) -> bool:
    """Whether a write that raised ``error`` may nonetheless have landed.

    A reset after the request was sent, a client timeout, an answer that could not be read,
    or a server error (a 504 is the API server giving up on etcd while the write goes on)
    say nothing about whether the write took effect; the object must be read back before
    the write is forgotten or repeated. A 4xx answer is a definite no."""
    if isinstance(error, ApiError):
        return error.status >= 500
    return isinstance(error, TRANSIENT_ERRORS)


class KubeApi:
    """One pooled aiohttp session to one API server.

    Create it inside the running event loop (aiohttp binds sessions to a loop) and ``close()``
    it on shutdown.
    """

    def __init__(self, auth: ClusterAuth, *, connection_limit: int = 64) -> None:
        self.auth = auth
        self._ssl = auth.ssl_context()
        self._session = aiohttp.ClientSession(
            base_url=auth.server,
            connector=aiohttp.TCPConnector(limit=connection_limit, ssl=self._ssl),
            json_serialize=lambda value: dumps(value).decode(),
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        return self._session

    async def close(self) -> None:
        await self._session.close()

    async def fresh_credentials(self) -> None:
        """Run an expired exec plugin in a worker thread, not on the event loop."""
        if self.auth.refresh_due():
            await asyncio.to_thread(self.auth.refresh)

    def unauthorized(self, sent_headers: Mapping[str, str]) -> bool:
        """The API server answered 401 to a request with ``sent_headers``: drop that
        credential so the next request gets a new one. Returns whether one may come."""
        sent = sent_headers.get("Authorization", "")
        token = sent.removeprefix("Bearer ") if sent else None
        return self.auth.invalidate(token)

    def headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", **self.auth.headers()}
        if extra:
            headers.update(extra)
        return headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        data = None if body is None else dumps(body)
        for attempt in (1, 2):
            await self.fresh_credentials()
            headers = self.headers({"Content-Type": content_type} if data is not None else None)
            async with self._session.request(
                method,
                path,
                params=params,
                data=data,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                raw = await response.read()
                status = response.status
            # A 401 was never processed: safe to repeat once with a fresh credential (an
            # expired exec token, a rotated token file), as client-go does.
            if status != 401 or attempt == 2 or not self.unauthorized(headers):
                break
        return self._decode(method, path, status, raw)

    def _decode(self, method: str, path: str, status: int, raw: bytes) -> dict[str, Any]:
        try:
            parsed: Any = loads(raw) if raw else {}
        except ValueError:
            if status >= 400:
                raise ApiError(
                    status,
                    {"message": f"HTTP {status} with a non-JSON body"},
                    method=method,
                    path=path,
                ) from None
            raise MalformedResponse(
                f"{method} {path}: HTTP {status} with a non-JSON body"
            ) from None
        if status >= 400:
            raise ApiError(
                status,
                parsed if isinstance(parsed, dict) else None,
                method=method,
                path=path,
            )
        return parsed if isinstance(parsed, dict) else {}

    async def get(
        self, resource: Resource, name: str, *, namespace: str | None = None
    ) -> dict[str, Any]:
        return await self.request("GET", resource.path(namespace=namespace, name=name))

    async def create(
        self, resource: Resource, body: Mapping[str, Any], *, namespace: str | None = None
    ) -> dict[str, Any]:
        return await self.request("POST", resource.path(namespace=namespace), body=body)

    async def delete(
        self, resource: Resource, name: str, *, namespace: str | None = None
    ) -> dict[str, Any]:
        return await self.request(
            "DELETE",
            resource.path(namespace=namespace, name=name),
            body={"propagationPolicy": "Background"},
        )

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        content_type: str = MERGE_PATCH,
    ) -> dict[str, Any]:
        path = resource.path(namespace=namespace, name=name)
        if subresource:
            path = f"{path}/{subresource}"
        return await self.request("PATCH", path, body=patch, content_type=content_type)

    async def list_all(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """Every object of a kind, paginated; for one-off reads (tests, CLI), not the informer.
        One object by name is ``field_selector="metadata.name=<name>"``: a list, which needs
        no ``get`` rule."""
        items: list[dict[str, Any]] = []
        params: dict[str, str] = {"limit": "500"}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        while True:
            page = await self.request("GET", resource.path(namespace=namespace), params=params)
            items.extend(page.get("items") or ())
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            params["continue"] = token


async def gather_limited(coros: list[Any], *, limit: int) -> list[Any]:
    """Run coroutines with at most ``limit`` in flight (bulk writes without a thundering herd)."""
    semaphore = asyncio.Semaphore(limit)

    async def one(coro: Any) -> Any:
        async with semaphore:
            return await coro

    return await asyncio.gather(*(one(c) for c in coros), return_exceptions=True)
