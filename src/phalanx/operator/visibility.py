"""Kueue's visibility API (``visibility.kueue.x-k8s.io``, versions ``v1beta2`` and ``v1beta1``),
served as an aggregated API.

The API server proxies ``/apis/visibility.kueue.x-k8s.io/{v1beta2,v1beta1}/...`` here (the
APIServices ``v1beta2.visibility.kueue.x-k8s.io`` and ``v1beta1.visibility.kueue.x-k8s.io``),
as it does for Kueue's visibility server. Kueue serves both versions from one storage, with
v1beta2 preferred; their types are field for field the same, so the two versions give the same
answer but for its ``apiVersion``, and the same request is reviewed with its own version:

* ``GET clusterqueues/{cq}/pendingworkloads`` and
  ``GET namespaces/{ns}/localqueues/{lq}/pendingworkloads``, query ``limit`` (default 1000,
  at most 100,000) and ``offset``: a ``PendingWorkloadsSummary`` in Kueue's shape, each item
  with ``positionInClusterQueue`` and ``positionInLocalQueue`` (from 0), plus Phalanx's
  ``phalanxExplanation`` (``reason``, ``message``: why it is still pending).
* the discovery documents the API server reads from an aggregated server (``/apis``, the
  group, the version's resource list). ``/openapi/v2`` and ``/v3`` are 404, which the API
  server's aggregator skips silently; the APIService is Available without them.

Positions are the core's live queue order (``ClusterQueueQueue.entries()``, the order its
cycle takes heads in: priority, then FIFO, by LocalQueue usage with admission fair sharing),
read on the event loop between two cycles, never during one; workloads backing off after an
eviction follow, by requeue time. Only the replica that schedules has that order: a standby
answers 503 (Kueue's standbys keep their queues and answer; see docs/operator.md).

Authentication and authorization are delegated to the API server, as aggregated servers do:
the caller must present a client certificate signed by the request-header CA of the
ConfigMap ``kube-system/extension-apiserver-authentication`` (the API server's front-proxy
certificate) whose common name is one of ``requestheader-allowed-names``; only then are the
user, groups and extras of the ``X-Remote-*`` headers believed, and a SubjectAccessReview asks
whether that user may ``get`` ``clusterqueues/pendingworkloads`` (or ``localqueues/...`` in
the namespace) in the group. Anything else is 403.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import ssl
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp.web

from phalanx.admission import insight
from phalanx.admission.records import Phase
from phalanx.admission.scheduler import Scheduler
from phalanx.operator import insight_api
from phalanx.operator.certs import ReloadingCert
from phalanx.operator.kube import KubeApi
from phalanx.operator.serving import _Site

__all__ = [
    "GROUP",
    "VERSION",
    "VERSIONS",
    "FrontProxy",
    "NotServing",
    "PendingReasons",
    "RequestUser",
    "VisibilityServer",
    "api_group",
    "api_group_list",
    "api_resource_list",
    "pending_in_cluster_queue",
    "pending_in_local_queue",
    "queue_order",
]

logger = logging.getLogger(__name__)

GROUP = "visibility.kueue.x-k8s.io"
VERSION = "v1beta2"
"""The preferred version (Kueue's ``PrioritizedVersions`` lists it first)."""
VERSIONS = (VERSION, "v1beta1")
"""Every version served, preferred first, as Kueue's API group lists them."""
DEFAULT_LIMIT = 1000
MAX_LIMIT = 100_000
"""Kueue's ``DefaultPendingWorkloadsLimit`` and ``MaxPendingWorkloadsLimit``."""
AUTH_CONFIGMAP = "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"
SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


# -- discovery ------------------------------------------------------------------------------------


def _version_entry(version: str) -> dict[str, str]:
    return {"groupVersion": f"{GROUP}/{version}", "version": version}


def _group_body() -> dict[str, Any]:
    return {
        "name": GROUP,
        "versions": [_version_entry(version) for version in VERSIONS],
        "preferredVersion": _version_entry(VERSION),
    }


def api_group_list() -> dict[str, Any]:
    """Both groups this server answers: Kueue's and Phalanx's (``insight_api``)."""
    groups = [_group_body(), insight_api.group_entry()]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group() -> dict[str, Any]:
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_body()}


def api_resource_list(version: str = VERSION) -> dict[str, Any]:
    """What Kueue's generic API server lists for ``version`` (one storage map for both)."""
    resources = []
    for plural, singular, namespaced in (
        ("clusterqueues", "clusterqueue", False),
        ("localqueues", "localqueue", True),
    ):
        common = {"namespaced": namespaced, "kind": "PendingWorkloadsSummary"}
        resources.append({"name": plural, "singularName": singular, **common, "verbs": []})
        resources.append(
            {"name": f"{plural}/pendingworkloads", "singularName": "", **common, "verbs": ["get"]}
        )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{GROUP}/{version}",
        "resources": resources,
    }


# -- the pending workloads ------------------------------------------------------------------------


def queue_order(scheduler: Scheduler, cluster_queue: str) -> list[Any] | None:
    """The pending workloads (core entries) of ``cluster_queue`` in the order the scheduler
    takes them (``insight.pending_order``). None: no such ClusterQueue. Call only between
    cycles."""
    return insight.pending_order(scheduler, cluster_queue)


def _item(
    scheduler: Scheduler,
    objects: Mapping[str, Mapping[str, Any]],
    entry: Any,
    *,
    position_in_cq: int,
    position_in_lq: int,
) -> dict[str, Any]:
    workload = entry.workload
    obj = objects.get(entry.key) or {}
    meta = obj.get("metadata") or {}
    metadata: dict[str, Any] = {
        "name": workload.name,
        "namespace": workload.namespace,
        "creationTimestamp": meta.get("creationTimestamp"),
    }
    owners = [
        {key: ref.get(key) for key in ("apiVersion", "kind", "name", "uid")}
        for ref in meta.get("ownerReferences") or ()
    ]
    if owners:
        metadata["ownerReferences"] = owners
    item: dict[str, Any] = {
        "metadata": metadata,
        "priority": entry.priority,
        "localQueueName": workload.queue_name,
        "positionInClusterQueue": position_in_cq,
        "positionInLocalQueue": position_in_lq,
    }
    explanation = scheduler.explain(entry.key)
    if explanation is not None:
        item["phalanxExplanation"] = {
            "reason": explanation.reason.value,
            "message": explanation.message,
        }
    return item


def _summary(items: list[dict[str, Any]], version: str) -> dict[str, Any]:
    return {
        "kind": "PendingWorkloadsSummary",
        "apiVersion": f"{GROUP}/{version}",
        "metadata": {"creationTimestamp": None},
        "items": items,
    }


def bounded(limit: int, offset: int) -> tuple[int, int]:
    """Kueue's defaults (limit 0 -> 1000) and bounds (0..100,000; offset >= 0)."""
    if limit == 0:
        limit = DEFAULT_LIMIT
    return min(max(limit, 0), MAX_LIMIT), max(offset, 0)


def pending_in_cluster_queue(
    scheduler: Scheduler,
    objects: Mapping[str, Mapping[str, Any]],
    cluster_queue: str,
    *,
    limit: int = DEFAULT_LIMIT,
    offset: int = 0,
    version: str = VERSION,
) -> dict[str, Any] | None:
    """Kueue's ``pendingWorkloadsInCqREST.Get``; None when the ClusterQueue is unknown."""
    limit, offset = bounded(limit, offset)
    order = queue_order(scheduler, cluster_queue)
    if order is None:
        return None
    items = []
    in_lq: dict[str, int] = {}
    for index, entry in enumerate(order[: offset + limit]):
        position = in_lq.get(entry.local_queue, 0)
        in_lq[entry.local_queue] = position + 1
        if index >= offset:
            items.append(
                _item(scheduler, objects, entry, position_in_cq=index, position_in_lq=position)
            )
    return _summary(items, version)


def pending_in_local_queue(
    scheduler: Scheduler,
    objects: Mapping[str, Mapping[str, Any]],
    namespace: str,
    local_queue: str,
    *,
    limit: int = DEFAULT_LIMIT,
    offset: int = 0,
    version: str = VERSION,
) -> dict[str, Any] | None:
    """Kueue's ``pendingWorkloadsInLqREST.Get``; None when the LocalQueue is unknown."""
    limit, offset = bounded(limit, offset)
    key = f"{namespace}/{local_queue}"
    lq = scheduler.local_queues.get(key)
    if lq is None:
        return None
    items: list[dict[str, Any]] = []
    skipped = 0
    for index, entry in enumerate(queue_order(scheduler, lq.cluster_queue) or ()):
        if len(items) >= limit:
            break
        if entry.local_queue != key:
            continue
        if skipped < offset:
            skipped += 1
            continue
        items.append(
            _item(
                scheduler,
                objects,
                entry,
                position_in_cq=index,
                position_in_lq=len(items) + offset,
            )
        )
    return _summary(items, version)


class PendingReasons:
    """``phalanx_pending_workloads{cluster_queue,reason}``: pending workloads by the reason of
    their explanation (kueue#11843), recounted after a cycle at most every ``interval``
    seconds; ``cluster_queue`` is empty for workloads that reach none (LocalQueue missing)."""

    def __init__(
        self, gauge: Any, *, interval: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.gauge = gauge
        self.interval = interval
        self._clock = clock
        self._last: float | None = None
        self._labels: set[tuple[str, str]] = set()

    def after_cycle(self, scheduler: Scheduler) -> None:
        now = self._clock()
        if self._last is not None and now - self._last < self.interval:
            return
        self._last = now
        self.update(scheduler)

    def update(self, scheduler: Scheduler) -> None:
        counts: dict[tuple[str, str], int] = {}
        for key, entry in scheduler.entries.items():
            if entry.phase != Phase.PENDING:
                continue
            explanation = scheduler.explain(key)
            reason = explanation.reason.value if explanation is not None else "Unknown"
            labels = (entry.cluster_queue or "", reason)
            counts[labels] = counts.get(labels, 0) + 1
        for labels in self._labels - counts.keys():
            self.gauge.remove(*labels)
        for labels, count in counts.items():
            self.gauge.labels(*labels).set(count)
        self._labels = set(counts)


# -- authentication and authorization -------------------------------------------------------------


@dataclass(frozen=True)
class RequestUser:
    name: str
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class FrontProxy:
    """The API server's request-header authentication settings, as published in the
    ConfigMap ``kube-system/extension-apiserver-authentication``."""

    client_ca: str
    allowed_names: tuple[str, ...] = ()
    username_headers: tuple[str, ...] = ("X-Remote-User",)
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)

    @classmethod
    def from_configmap(cls, data: Mapping[str, str]) -> FrontProxy:
        ca = data.get("requestheader-client-ca-file") or ""
        if "BEGIN CERTIFICATE" not in ca:
            raise ValueError(
                "extension-apiserver-authentication has no requestheader-client-ca-file: the "
                "API server runs without the aggregation layer (--requestheader-client-ca-file)"
            )

        def listed(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
            raw = data.get(key)
            return tuple(json.loads(raw)) if raw else default

        return cls(
            client_ca=ca,
            allowed_names=listed("requestheader-allowed-names", ()),
            username_headers=listed("requestheader-username-headers", ("X-Remote-User",)),
            group_headers=listed("requestheader-group-headers", ("X-Remote-Group",)),
            extra_prefixes=listed("requestheader-extra-headers-prefix", ("X-Remote-Extra-",)),
        )

    def common_name_allowed(self, peercert: Mapping[str, Any] | None) -> bool:
        """``peercert`` (Python's ``getpeercert()``, present only for a certificate the TLS
        layer verified against the client CA) names an allowed front proxy."""
        if not peercert:
            return False
        if not self.allowed_names:
            return True  # Kubernetes: an empty list allows any name the CA signed
        for rdn in peercert.get("subject") or ():
            for key, value in rdn:
                if key == "commonName" and value in self.allowed_names:
                    return True
        return False

    def user(self, headers: Any) -> RequestUser | None:
        """The user the front proxy names (None: no user header)."""
        name = next((headers.get(h) for h in self.username_headers if headers.get(h)), None)
        if not name:
            return None
        groups: list[str] = []
        for header in self.group_headers:
            groups.extend(headers.getall(header, ()))
        extra: dict[str, list[str]] = {}
        for header, value in headers.items():
            for prefix in self.extra_prefixes:
                if header.lower().startswith(prefix.lower()):
                    key = urllib.parse.unquote(header[len(prefix) :]).lower()
                    extra.setdefault(key, []).append(value)
        return RequestUser(
            name=name, groups=tuple(groups), extra={k: tuple(v) for k, v in extra.items()}
        )


@dataclass(frozen=True)
class Access:
    """What a request asks to do, as a SubjectAccessReview's resource attributes."""

    group: str
    version: str
    verb: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def resource_path(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


class NotServing(Exception):
    """This replica has no live queues to answer from (a standby, or not synced yet)."""


QueueReader = Callable[[Callable[[Scheduler, Mapping[str, Mapping[str, Any]]], Any]], Any]
"""``await reader(fn)``: ``fn(scheduler, workload objects)`` run between two cycles."""


class _ClientVerifyingCert(ReloadingCert):
    """The serving certificate (re-read when it changes) and client certificates verified
    against the request-header CA only, never the system's trust store."""

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        super().__init__(cert_file, key_file)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(cert_file), str(key_file))
        context.verify_mode = ssl.CERT_OPTIONAL
        self.context = context
        self._cas: set[str] = set()

    def trust(self, ca_pem: str) -> None:
        """Add a request-header CA (kept until restart: a rotated CA adds to the store)."""
        if ca_pem not in self._cas:
            self.context.load_verify_locations(cadata=ca_pem)
            self._cas.add(ca_pem)


class VisibilityServer(_Site):
    """The aggregated API server of ``visibility.kueue.x-k8s.io`` (both versions) and of
    ``insight_api``'s group (HTTPS)."""

    def __init__(
        self,
        *,
        api: KubeApi,
        reader: QueueReader,
        listen: str,
        port: int,
        cert_folder: Path,
        refresh_seconds: float = 60.0,
        auth_ttl: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        objects: Callable[[str], Mapping[str, Mapping[str, Any]]] | None = None,
    ) -> None:
        self.cert = _ClientVerifyingCert(cert_folder / "tls.crt", cert_folder / "tls.key")
        super().__init__(listen=listen, port=port, ssl_context=self.cert.context)
        self.api = api
        self.reader = reader
        self.front_proxy: FrontProxy | None = None
        self.refresh_seconds = refresh_seconds
        self.auth_ttl = auth_ttl
        self._clock = clock
        self._decisions: dict[tuple[Any, ...], tuple[float, bool, str]] = {}
        self.objects = objects or (lambda kind: {})
        """The informers' objects of a kind (priority classes, for a what-if on a Job)."""

    def routes(self) -> list[aiohttp.web.RouteDef]:
        ours = f"/apis/{insight_api.GROUP}/{insight_api.VERSION}"
        kueue = []
        for version in VERSIONS:
            base = f"/apis/{GROUP}/{version}"
            kueue += [
                aiohttp.web.get(
                    base, self._discovery(functools.partial(api_resource_list, version))
                ),
                aiohttp.web.get(
                    f"{base}/clusterqueues/{{name}}/pendingworkloads",
                    self._cluster_queue(version),
                ),
                aiohttp.web.get(
                    f"{base}/namespaces/{{namespace}}/localqueues/{{name}}/pendingworkloads",
                    self._local_queue(version),
                ),
            ]
        return [
            aiohttp.web.get("/apis", self._discovery(api_group_list)),
            aiohttp.web.get(f"/apis/{GROUP}", self._discovery(api_group)),
            *kueue,
            aiohttp.web.get(f"/apis/{insight_api.GROUP}", self._discovery(insight_api.api_group)),
            aiohttp.web.get(ours, self._discovery(insight_api.api_resource_list)),
            aiohttp.web.get(
                f"{ours}/namespaces/{{namespace}}/workloads/{{name}}/explanation",
                self._explanation,
            ),
            aiohttp.web.post(f"{ours}/namespaces/{{namespace}}/whatifs", self._what_if),
        ]

    # -- the request-header settings ----------------------------------------------------------

    def use(self, front_proxy: FrontProxy) -> None:
        self.cert.trust(front_proxy.client_ca)
        if front_proxy != self.front_proxy:
            logger.info(
                "event=visibility_front_proxy allowed_names=%s",
                ",".join(front_proxy.allowed_names) or "*",
            )
        self.front_proxy = front_proxy

    async def load_front_proxy(self) -> None:
        cm = await self.api.request("GET", AUTH_CONFIGMAP, timeout=10.0)
        self.use(FrontProxy.from_configmap(cm.get("data") or {}))

    async def keep_front_proxy(self) -> None:
        """Read the ConfigMap now and every ``refresh_seconds`` (the API server rewrites it
        when its CA or settings change); failures are logged and retried."""
        while True:
            try:
                await self.load_front_proxy()
            except Exception as error:
                logger.error("event=visibility_front_proxy_unreadable error=%r", error)
            await asyncio.sleep(self.refresh_seconds if self.front_proxy else 5.0)

    # -- handlers -----------------------------------------------------------------------------

    def _discovery(
        self, body: Callable[[], dict[str, Any]]
    ) -> Callable[[aiohttp.web.Request], Any]:
        async def handler(request: aiohttp.web.Request) -> aiohttp.web.Response:
            if not self._from_front_proxy(request):
                return status(
                    403, "Forbidden", "a verified front-proxy client certificate is required"
                )
            return _json(200, body())

        return handler

    def _from_front_proxy(self, request: aiohttp.web.Request) -> bool:
        front_proxy = self.front_proxy
        if front_proxy is None or request.transport is None:
            return False
        return front_proxy.common_name_allowed(request.transport.get_extra_info("peercert"))

    def _cluster_queue(self, version: str) -> Callable[[aiohttp.web.Request], Any]:
        async def handler(request: aiohttp.web.Request) -> aiohttp.web.Response:
            name = request.match_info["name"]
            return await self._serve(
                request, version=version, resource="clusterqueues", namespace="", name=name
            )

        return handler

    def _local_queue(self, version: str) -> Callable[[aiohttp.web.Request], Any]:
        async def handler(request: aiohttp.web.Request) -> aiohttp.web.Response:
            namespace, name = request.match_info["namespace"], request.match_info["name"]
            return await self._serve(
                request, version=version, resource="localqueues", namespace=namespace, name=name
            )

        return handler

    async def _admit(
        self, request: aiohttp.web.Request, ask: Access
    ) -> aiohttp.web.Response | None:
        """None when the front proxy's user may do ``ask``; else the answer (403, 503)."""
        user = (
            self.front_proxy.user(request.headers)
            if self.front_proxy is not None and self._from_front_proxy(request)
            else None
        )
        if user is None:
            logger.info("event=visibility_refused status=403 user=- reason=no_front_proxy_user")
            return _forbidden("system:anonymous", ask)
        try:
            allowed, reason = await self._authorize(user, ask)
        except Exception as error:
            logger.warning("event=visibility_review_failed error=%r", error)
            return status(503, "ServiceUnavailable", "cannot review the request now")
        if not allowed:
            logger.info(
                "event=visibility_refused status=403 user=%s verb=%s group=%s resource=%s "
                "namespace=%s name=%s reason=%r",
                user.name,
                ask.verb,
                ask.group,
                ask.resource_path,
                ask.namespace or "-",
                ask.name or "-",
                reason,
            )
            return _forbidden(user.name, ask)
        return None

    async def _serve(
        self,
        request: aiohttp.web.Request,
        *,
        version: str,
        resource: str,
        namespace: str,
        name: str,
    ) -> aiohttp.web.Response:
        refused = await self._admit(
            request,
            Access(GROUP, version, "get", resource, "pendingworkloads", namespace, name),
        )
        if refused is not None:
            return refused
        try:
            limit = int(request.query.get("limit", "0") or 0)
            offset = int(request.query.get("offset", "0") or 0)
        except ValueError:
            return status(400, "BadRequest", "limit and offset must be integers")

        def read(scheduler: Scheduler, objects: Mapping[str, Mapping[str, Any]]) -> Any:
            if resource == "clusterqueues":
                return pending_in_cluster_queue(
                    scheduler, objects, name, limit=limit, offset=offset, version=version
                )
            return pending_in_local_queue(
                scheduler, objects, namespace, name, limit=limit, offset=offset, version=version
            )

        try:
            summary = await self.reader(read)
        except NotServing as error:
            return status(503, "ServiceUnavailable", str(error), retry_after=1)
        if summary is None:
            kind = resource[:-1]
            return status(
                404,
                "NotFound",
                f'{kind}.{GROUP} "{name}" not found',
                details={"name": name, "group": GROUP, "kind": kind},
            )
        return _json(200, summary)

    async def _explanation(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        ask = Access(
            insight_api.GROUP,
            insight_api.VERSION,
            "get",
            "workloads",
            "explanation",
            namespace,
            name,
        )
        refused = await self._admit(request, ask)
        if refused is not None:
            return refused
        try:
            body = await self.reader(
                lambda scheduler, _: insight_api.explanation_body(scheduler, namespace, name)
            )
        except NotServing as error:
            return status(503, "ServiceUnavailable", str(error), retry_after=1)
        if body is None:
            return status(
                404,
                "NotFound",
                f'workloads.kueue.x-k8s.io "{name}" not found in namespace "{namespace}"'
                " (or not queued by Phalanx)",
                details={"name": name, "group": "kueue.x-k8s.io", "kind": "workloads"},
            )
        return _json(200, body)

    async def _what_if(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        namespace = request.match_info["namespace"]
        ask = Access(insight_api.GROUP, insight_api.VERSION, "create", "whatifs", "", namespace)
        refused = await self._admit(request, ask)
        if refused is not None:
            return refused
        try:
            manifest = insight_api.workload_for_request(
                insight_api.decode(await request.read()), namespace, objects=self.objects
            )
        except insight_api.BadRequest as error:
            return status(400, "BadRequest", str(error))

        def decide(scheduler: Scheduler, _: Any) -> Any:
            return insight_api.whatif_body(insight_api.what_if(scheduler, manifest))

        try:
            body = await self.reader(decide)
        except NotServing as error:
            return status(503, "ServiceUnavailable", str(error), retry_after=1)
        except insight_api.BadRequest as error:
            return status(400, "BadRequest", str(error))
        # Created, as a SubjectAccessReview is: nothing is stored.
        return _json(201, body)

    async def _authorize(self, user: RequestUser, ask: Access) -> tuple[bool, str]:
        key = (user.name, user.groups, tuple(sorted(user.extra.items())), ask)
        now = self._clock()
        cached = self._decisions.get(key)
        if cached is not None and cached[0] > now:
            return cached[1], cached[2]
        attributes: dict[str, Any] = {
            "verb": ask.verb,
            "group": ask.group,
            "version": ask.version,
            "resource": ask.resource,
        }
        for field_name, value in (
            ("subresource", ask.subresource),
            ("name", ask.name),
            ("namespace", ask.namespace),
        ):
            if value:
                attributes[field_name] = value
        spec: dict[str, Any] = {
            "user": user.name,
            "groups": list(user.groups),
            "resourceAttributes": attributes,
        }
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra.items()}
        review = await self.api.request(
            "POST",
            SUBJECT_ACCESS_REVIEWS,
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": spec,
            },
            timeout=10.0,
        )
        result = review.get("status") or {}
        allowed = result.get("allowed") is True
        reason = str(result.get("reason") or "")
        if len(self._decisions) > 4096:
            self._decisions.clear()
        self._decisions[key] = (now + self.auth_ttl, allowed, reason)
        return allowed, reason


def status(
    code: int,
    reason: str,
    message: str,
    *,
    details: Mapping[str, Any] | None = None,
    retry_after: int | None = None,
) -> aiohttp.web.Response:
    """A Kubernetes ``Status`` answer."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = dict(details)
    response = _json(code, body)
    if retry_after is not None:
        response.headers["Retry-After"] = str(retry_after)
    return response


def _forbidden(user: str, ask: Access) -> aiohttp.web.Response:
    """The API server's wording for a refused request."""
    where = f'in the namespace "{ask.namespace}"' if ask.namespace else "at the cluster scope"
    named = f' "{ask.name}"' if ask.name else ""
    return status(
        403,
        "Forbidden",
        f'{ask.resource}.{ask.group}{named} is forbidden: User "{user}" cannot {ask.verb}'
        f' resource "{ask.resource_path}" in API group "{ask.group}" {where}',
        details={"name": ask.name, "group": ask.group, "kind": ask.resource},
    )


def _json(code: int, body: Mapping[str, Any]) -> aiohttp.web.Response:
    return aiohttp.web.Response(status=code, text=json.dumps(body), content_type="application/json")
