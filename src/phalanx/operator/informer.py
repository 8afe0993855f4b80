"""A lean list/watch informer for the high-volume kinds (Workloads, Jobs, Pods, Nodes).

kopf's per-object machinery costs about 1 ms of CPU per watch event; a burst of 15,000
Workloads brings ~50,000 events, i.e. most of a minute of one saturated core. This informer
does only what the scheduler needs: a paginated list, then a streaming watch from the list's
resourceVersion with bookmarks; every line is decoded once (orjson) and handed as
``(type, object)`` to a synchronous callback. It never writes to the objects it watches (no
annotations, no finalizers).

Recovery follows client-go's reflector: a stream that ends or drops resumes from the last
resourceVersion seen (bookmarks keep it fresh); ``410 Gone`` means that version was compacted
away, so the informer relists and reports objects that vanished meanwhile as ``DELETED``;
errors, 429 and 5xx back off exponentially (honouring ``Retry-After``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from phalanx.operator.kube import ApiError, KubeApi, Resource, loads
from phalanx.operator.retry import Backoff

__all__ = [
    "Backoff",
    "EventHandler",
    "Informer",
    "InformerStats",
    "LineSplitter",
    "WatchGone",
    "object_key",
    "typed",
]

logger = logging.getLogger(__name__)

EventHandler = Callable[[str, dict[str, Any]], None]
"""Called as ``handler(event_type, obj)``; event_type is ADDED, MODIFIED or DELETED."""

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"


class WatchGone(Exception):
    """The resourceVersion is too old (410 Gone): only a relist can recover."""


class WatchStreamError(Exception):
    """The server reported an error inside the watch stream (other than 410)."""


@dataclass
class InformerStats:
    lists: int = 0
    watches: int = 0
    events: int = 0
    bookmarks: int = 0
    relists_on_gone: int = 0
    errors: int = 0
    handler_errors: int = 0


class LineSplitter:
    """Splits a byte stream into lines; a watch line can be larger than any one chunk."""

    __slots__ = ("_partial",)

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._partial:
            chunk = self._partial + chunk
        lines = chunk.split(b"\n")
        self._partial = lines.pop()
        return [line for line in lines if line]

    @property
    def pending(self) -> bytes:
        return self._partial


def object_key(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    name = metadata.get("name", "")
    return f"{namespace}/{name}" if namespace else str(name)


def retry_after_seconds(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date; rare from the API server, the computed backoff will do


class Informer:
    """List then watch one resource and deliver its events to ``handler``.

    ``synced`` is set once the first full list has been delivered: the scheduler must not run
    a cycle before it (a restart must see every admitted Workload before admitting anything).
    """

    def __init__(
        self,
        api: KubeApi,
        resource: Resource,
        handler: EventHandler,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        watch_timeout: int = 300,
        backoff: Backoff | None = None,
        on_synced: Callable[[], None] | None = None,
    ) -> None:
        self.api = api
        self.resource = resource
        self.handler = handler
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.backoff = backoff or Backoff()
        self.on_synced = on_synced
        self.resource_version: str | None = None
        self.synced = asyncio.Event()
        self.stats = InformerStats()
        # Keys (and uids) of the objects delivered and not deleted: a relist must report the
        # ones that vanished while the watch was down.
        self._known: dict[str, str] = {}
        self._response: aiohttp.ClientResponse | None = None
        self._interrupted = False
        self._task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.resource.plural

    def __len__(self) -> int:
        return len(self._known)

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.get_running_loop().create_task(
            self.run(), name=f"phalanx-informer-{self.name}"
        )
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def interrupt(self) -> None:
        """Drop the current watch connection; the informer resumes from its resourceVersion."""
        if self._response is not None:
            self._interrupted = True
            self._response.close()

    async def run(self) -> None:
        attempt = 0
        while True:
            try:
                if self.resource_version is None:
                    await self._relist()
                await self._watch()
                attempt = 0
            except asyncio.CancelledError:
                raise
            except WatchGone:
                self.stats.relists_on_gone += 1
                logger.info("event=watch_gone resource=%s action=relist", self.name)
                self.resource_version = None
            except Exception as error:  # every failure of the network or server backs off
                self.stats.errors += 1
                retry_after = None
                if isinstance(error, ApiError):
                    if error.status == 410:
                        self.stats.relists_on_gone += 1
                        self.resource_version = None
                        continue
                    retry_after = retry_after_seconds(error.body.get("_retry_after"))
                    if retry_after is not None:
                        # The server is up and says when to come back (a restarted API
                        # server answers 429 while its storage initializes): the backoff
                        # grown while it was unreachable no longer applies.
                        attempt = 0
                delay = self.backoff.delay(attempt, retry_after=retry_after)
                attempt += 1
                logger.warning(
                    "event=watch_error resource=%s error=%r retry_in=%.2f",
                    self.name,
                    error,
                    delay,
                )
                await asyncio.sleep(delay)

    def _params(self) -> dict[str, str]:
        params: dict[str, str] = {}
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        if self.field_selector:
            params["fieldSelector"] = self.field_selector
        return params

    async def _get_json(self, params: dict[str, str]) -> dict[str, Any]:
        path = self.resource.path(namespace=self.namespace)
        await self.api.fresh_credentials()
        headers = self.api.headers()
        async with self.api.session.get(
            path,
            params=params,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=120),
        ) as response:
            raw = await response.read()
            if response.status >= 400:
                if response.status == 401:
                    self.api.unauthorized(headers)  # the retry gets a fresh credential
                raise _api_error(response, raw, path)
            body: dict[str, Any] = loads(raw)
            return body

    async def _relist(self) -> None:
        """A paginated list; every item is delivered, vanished ones as DELETED."""
        started = time.monotonic()
        self.stats.lists += 1
        params = {**self._params(), "limit": str(self.page_size)}
        seen: dict[str, str] = {}
        first_page = True
        while True:
            try:
                page = await self._get_json(params)
            except ApiError as error:
                if error.status == 410 and not first_page:
                    # The continue token expired mid-list: start the list over.
                    params.pop("continue", None)
                    seen.clear()
                    first_page = True
                    continue
                raise
            first_page = False
            for item in page.get("items") or ():
                typed(item, page)
                key = object_key(item)
                seen[key] = (item.get("metadata") or {}).get("uid", "")
                self._deliver(MODIFIED if key in self._known else ADDED, item)
            metadata = page.get("metadata") or {}
            token = metadata.get("continue")
            if not token:
                self.resource_version = metadata.get("resourceVersion")
                break
            params["continue"] = token
        for key in self._known.keys() - seen.keys():
            self._deliver(DELETED, _stub(key, self._known[key]))
        self._known = seen
        logger.info(
            "event=listed resource=%s objects=%d resource_version=%s seconds=%.3f",
            self.name,
            len(seen),
            self.resource_version,
            time.monotonic() - started,
        )
        if not self.synced.is_set():
            self.synced.set()
            if self.on_synced is not None:
                self.on_synced()

    async def _watch(self) -> None:
        params = {
            **self._params(),
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.watch_timeout),
        }
        if self.resource_version:
            params["resourceVersion"] = self.resource_version
        path = self.resource.path(namespace=self.namespace)
        self.stats.watches += 1
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=15, sock_read=self.watch_timeout + 60
        )
        await self.api.fresh_credentials()
        headers = self.api.headers()
        async with self.api.session.get(
            path, params=params, headers=headers, timeout=timeout
        ) as response:
            if response.status >= 400:
                if response.status == 401:
                    self.api.unauthorized(headers)  # the retry gets a fresh credential
                raise _api_error(response, await response.read(), path)
            self._response = response
            self._interrupted = False
            splitter = LineSplitter()
            try:
                async for chunk in response.content.iter_any():
                    for line in splitter.feed(chunk):
                        self.feed_line(line)
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
                if not self._interrupted:
                    raise
            finally:
                self._response = None

    def feed_line(self, line: bytes) -> None:
        """Decode one watch line and dispatch it; public so tests can replay recorded streams."""
        event = loads(line)
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "BOOKMARK":
            self.stats.bookmarks += 1
            self.resource_version = obj["metadata"]["resourceVersion"]
            return
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise WatchGone(obj.get("message", ""))
            raise WatchStreamError(f"{code} {obj.get('reason')}: {obj.get('message')}")
        metadata = obj["metadata"]
        self.resource_version = metadata.get("resourceVersion", self.resource_version)
        key = object_key(obj)
        if kind == DELETED:
            self._known.pop(key, None)
        else:
            self._known[key] = metadata.get("uid", "")
        self._deliver(kind, obj)

    def feed_lines(self, lines: Iterator[bytes] | list[bytes]) -> None:
        for line in lines:
            self.feed_line(line)

    def _deliver(self, kind: str, obj: dict[str, Any]) -> None:
        self.stats.events += 1
        try:
            self.handler(kind, obj)
        except Exception:
            # One bad object must not stop the stream for all the others.
            self.stats.handler_errors += 1
            logger.exception("event=handler_error resource=%s key=%s", self.name, object_key(obj))


def typed(item: dict[str, Any], page: Mapping[str, Any]) -> dict[str, Any]:
    """Give a list item the ``kind`` and ``apiVersion`` the API server leaves out of list
    items (a watch event's object has them): from the list's own (``JobList`` -> ``Job``).
    Whatever names the object from it (an Event's involvedObject) must not fall back to a
    default kind."""
    list_kind = str(page.get("kind") or "")
    if "kind" not in item and list_kind.endswith("List"):
        item["kind"] = list_kind[: -len("List")]
    if "apiVersion" not in item and page.get("apiVersion"):
        item["apiVersion"] = page["apiVersion"]
    return item


def _stub(key: str, uid: str) -> dict[str, Any]:
    namespace, _, name = key.rpartition("/")
    metadata: dict[str, Any] = {"name": name, "uid": uid}
    if namespace:
        metadata["namespace"] = namespace
    return {"metadata": metadata}


def _api_error(response: aiohttp.ClientResponse, raw: bytes, path: str) -> ApiError:
    try:
        body = loads(raw) if raw else {}
    except ValueError:
        body = {"message": raw[:200].decode(errors="replace")}
    if not isinstance(body, dict):
        body = {}
    retry_after = response.headers.get("Retry-After")
    if retry_after:
        body["_retry_after"] = retry_after
    return ApiError(response.status, body, method="GET", path=path)
