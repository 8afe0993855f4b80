"""The dashboard's HTTP server: one page, a JSON view, a server-sent-event stream, read-only.

Who sees what: each request carries a bearer token (``Authorization: Bearer``, or a cookie
set once from ``?token=`` so a browser can open the page); the API server authenticates it
(TokenReview) and authorizes each view (SubjectAccessReview): the Workloads and LocalQueues
of a namespace need ``list workloads.kueue.x-k8s.io`` there, the cluster-wide views (cohorts,
ClusterQueues, the topology map) need ``list clusterqueues.kueue.x-k8s.io``. Verdicts are
cached briefly (:class:`~phalanx.operator.metrics_auth.AccessReviewer`). There is no write
action anywhere. ``insecure_local`` serves everything without a token, on loopback only.

Updates: ``/events`` pushes the sections that changed (:func:`~phalanx.dashboard.model.diff`)
at most once per second whatever the rate of changes (the source coalesces them).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import importlib.resources
import logging
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp.web

from phalanx.dashboard.model import Filter, build_view, diff, namespaces_of, workload_detail
from phalanx.dashboard.source import Source
from phalanx.dashboard.usage import GPU, NO_STORE, UsageReader, fair_share, usage_view
from phalanx.operator.kube import KubeApi, dumps
from phalanx.operator.metrics_auth import AccessReviewer, Identity, ReviewFailed
from phalanx.operator.serving import is_loopback
from phalanx.store.db import StoreError

__all__ = ["COOKIE", "DashboardServer", "Viewer", "start_dashboard"]

logger = logging.getLogger(__name__)

COOKIE = "phalanx_dashboard_token"
KUEUE = "kueue.x-k8s.io"
KEEPALIVE_SECONDS = 15.0


@dataclass(frozen=True)
class Viewer:
    """What one caller may see: ``namespaces`` None means every namespace."""

    name: str
    namespaces: frozenset[str] | None
    cluster_scoped: bool

    def can_read(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces


class Unauthorized(Exception):
    pass


class DashboardServer:
    def __init__(
        self,
        api: KubeApi,
        *,
        listen: str,
        port: int,
        insecure_local: bool = False,
        ssl_context: ssl.SSLContext | None = None,
        review_ttl: float = 30.0,
        interval: float = 1.0,
        store_url: str | None = None,
    ) -> None:
        if insecure_local and not is_loopback(listen):
            raise ValueError(
                f"--dashboard-listen {listen}: without authentication the dashboard is served "
                "on loopback only; listen on 127.0.0.1 or drop the insecure-local flag"
            )
        if not insecure_local and ssl_context is None and not is_loopback(listen):
            raise ValueError(
                f"--dashboard-listen {listen}: bearer tokens must not travel plain; serve on "
                "127.0.0.1 (reach it with kubectl port-forward) or give a TLS certificate"
            )
        self.api = api
        self.listen = listen
        self.port = port
        self.ssl_context = ssl_context
        self.source = Source(api, interval=interval)
        self.reviewer = None if insecure_local else AccessReviewer(api, ttl=review_ttl)
        self.usage = UsageReader(store_url)
        self._runner: aiohttp.web.AppRunner | None = None
        self._cache: dict[Any, dict[str, Any]] = {}
        self._cache_version = -1

    # -- lifecycle ----------------------------------------------------------------------------

    def app(self) -> aiohttp.web.Application:
        app = aiohttp.web.Application()
        app.add_routes(
            [
                aiohttp.web.get("/", self._page),
                aiohttp.web.get("/api/view", self._view),
                aiohttp.web.get("/api/workloads/{namespace}/{name}", self._workload),
                aiohttp.web.get("/api/usage", self._usage),
                aiohttp.web.get("/events", self._events),
                aiohttp.web.get("/static/{file}", self._static),
            ]
        )
        return app

    async def start(self) -> None:
        await self.source.start()
        self._runner = aiohttp.web.AppRunner(self.app(), handle_signals=False, access_log=None)
        await self._runner.setup()
        site = aiohttp.web.TCPSite(
            self._runner, self.listen, self.port, ssl_context=self.ssl_context
        )
        await site.start()
        logger.info(
            "event=dashboard_serving address=%s://%s:%d/ authentication=%s",
            "https" if self.ssl_context else "http",
            self.listen,
            self.port,
            "tokenreview" if self.reviewer else "none (insecure local)",
        )

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.source.stop()
        await asyncio.to_thread(self.usage.close)

    # -- who is asking ------------------------------------------------------------------------

    def _token(self, request: aiohttp.web.Request) -> str | None:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
        return request.query.get("token") or request.cookies.get(COOKIE) or None

    async def viewer(
        self, request: aiohttp.web.Request, *, namespaces: Iterable[str] = ()
    ) -> Viewer:
        """The caller's rights now, reviewed for the namespaces of the watched objects and
        ``namespaces``; raises Unauthorized (401) or ReviewFailed (503)."""
        if self.reviewer is None:
            return Viewer("local", None, True)
        token = self._token(request)
        if token is None:
            raise Unauthorized("no bearer token")
        identity = await self.reviewer.identify(token)
        if identity is None:
            raise Unauthorized("the API server did not accept the token")
        return await self._rights(identity, namespaces)

    async def _rights(self, identity: Identity, extra: Iterable[str] = ()) -> Viewer:
        assert self.reviewer is not None
        reviewer = self.reviewer
        cluster = await reviewer.allowed(
            identity, verb="list", group=KUEUE, resource="clusterqueues"
        )
        every = await reviewer.allowed(identity, verb="list", group=KUEUE, resource="workloads")
        if every:
            return Viewer(identity.username, None, cluster)
        namespaces = sorted(namespaces_of(self.source.objects) | set(extra))
        verdicts = await asyncio.gather(
            *(
                reviewer.allowed(
                    identity, verb="list", group=KUEUE, resource="workloads", namespace=ns
                )
                for ns in namespaces
            )
        )
        readable = frozenset(ns for ns, ok in zip(namespaces, verdicts, strict=True) if ok)
        return Viewer(identity.username, readable, cluster)

    async def _guarded(
        self,
        request: aiohttp.web.Request,
        answer: Callable[[Viewer], Any],
    ) -> aiohttp.web.StreamResponse:
        try:
            viewer = await self.viewer(request)
        except Unauthorized as error:
            return aiohttp.web.Response(
                status=401,
                text=(
                    f"Unauthorized ({error}): send 'Authorization: Bearer <token>' or open "
                    "/?token=<token> once (it sets an HttpOnly cookie)\n"
                ),
            )
        except ReviewFailed as error:
            logger.warning("event=dashboard_review_failed error=%r", str(error))
            return aiohttp.web.Response(status=503, text="cannot review the token now\n")
        response: aiohttp.web.StreamResponse = await answer(viewer)
        return response

    # -- views --------------------------------------------------------------------------------

    def view_for(self, viewer: Viewer, where: Filter) -> dict[str, Any]:
        """The live sections for ``viewer``, built once per published version and rights."""
        version = self.source.version
        if version != self._cache_version:
            self._cache.clear()
            self._cache_version = version
        key = (viewer.namespaces, viewer.cluster_scoped, where)
        view = self._cache.get(key)
        if view is None:
            view = build_view(
                self.source.objects,
                positions=self.source.positions,
                can_read=viewer.can_read,
                cluster_scoped=viewer.cluster_scoped,
                where=where,
            )
            view["notice"] = self.source.positions_problem
            view["fairShare"] = fair_share(
                self.source.objects.cluster_queues,
                self.source.objects.local_queues,
                can_read=viewer.can_read,
                cluster_scoped=viewer.cluster_scoped,
            )
            self._cache[key] = view
        return view

    @staticmethod
    def _filter(request: aiohttp.web.Request) -> Filter:
        return Filter(
            text=request.query.get("q", "")[:200],
            cluster_queue=request.query.get("cq", "")[:253],
            namespace=request.query.get("ns", "")[:63],
        )

    async def _page(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        if "token" in request.query and self.reviewer is not None:
            return await self._set_cookie(request)

        async def answer(viewer: Viewer) -> aiohttp.web.StreamResponse:
            view = self.view_for(viewer, Filter())
            return aiohttp.web.Response(
                text=page(viewer, dumps(view).decode()),
                content_type="text/html",
                headers=_NO_STORE,
            )

        return await self._guarded(request, answer)

    async def _set_cookie(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        """``/?token=``: checked, then kept in an HttpOnly cookie; the token leaves the URL."""
        token = request.query["token"]
        assert self.reviewer is not None
        try:
            identity = await self.reviewer.identify(token)
        except ReviewFailed:
            return aiohttp.web.Response(status=503, text="cannot review the token now\n")
        if identity is None:
            return aiohttp.web.Response(status=401, text="Unauthorized: token not accepted\n")
        response = aiohttp.web.HTTPFound("/")
        response.set_cookie(
            COOKIE,
            token,
            httponly=True,
            samesite="Strict",
            secure=self.ssl_context is not None,
            path="/",
        )
        return response

    async def _view(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        async def answer(viewer: Viewer) -> aiohttp.web.StreamResponse:
            view = {"viewer": viewer.name, **self.view_for(viewer, self._filter(request))}
            return aiohttp.web.Response(
                body=dumps(view), content_type="application/json", headers=_NO_STORE
            )

        return await self._guarded(request, answer)

    async def _usage(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        """Usage over time from the store: ``?window=24h|7d|30d&by=localqueue|namespace|
        clusterqueue&resource=...``; what the caller may read of it."""
        window = request.query.get("window", "24h")
        by = request.query.get("by", "localqueue")
        resource = request.query.get("resource", "")[:253] or GPU

        async def answer(viewer: Viewer) -> aiohttp.web.StreamResponse:
            if self.usage.url is None:
                return await _json({"problem": NO_STORE, "store": False})
            try:
                data = await self.usage.read(window=window, by=by)
            except ValueError as error:
                return await _json({"error": str(error)}, status=400)
            except StoreError as error:
                logger.warning("event=dashboard_store_failed error=%r", str(error))
                return await _json({"problem": str(error), "store": True})
            if viewer.namespaces is not None and by != "clusterqueue":
                # Namespaces with history but no objects left are reviewed too (cached).
                held = {group.split("/", 1)[0] for group in data.held}
                if held - viewer.namespaces:
                    # On failure the first review's rights stand: fewer namespaces, never more.
                    with contextlib.suppress(Unauthorized, ReviewFailed):
                        viewer = await self.viewer(request, namespaces=held)
            view = usage_view(
                data,
                resource=resource,
                can_read=viewer.can_read,
                cluster_scoped=viewer.cluster_scoped,
            )
            return await _json({**view, "store": True})

        return await self._guarded(request, answer)

    async def _workload(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        namespace = request.match_info["namespace"]
        name = request.match_info["name"]

        async def answer(viewer: Viewer) -> aiohttp.web.StreamResponse:
            key = f"{namespace}/{name}"
            workload = self.source.objects.workloads.get(key)
            # A namespace the viewer may not read looks like one without the Workload.
            if workload is None or not viewer.can_read(namespace):
                return aiohttp.web.json_response(
                    {"error": f"no Workload {key} you may read"}, status=404
                )
            detail = workload_detail(
                workload,
                position=self.source.positions.get(key),
                local_queues=self.source.objects.local_queues,
            )
            return aiohttp.web.Response(
                body=dumps(detail), content_type="application/json", headers=_NO_STORE
            )

        return await self._guarded(request, answer)

    async def _events(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        """Server-sent events: ``view`` with the changed sections, first all of them."""

        async def answer(viewer: Viewer) -> aiohttp.web.StreamResponse:
            response = aiohttp.web.StreamResponse(
                headers={
                    "Content-Type": "text/event-stream",
                    "Cache-Control": "no-store",
                    "X-Accel-Buffering": "no",
                }
            )
            await response.prepare(request)
            where = self._filter(request)
            sent: dict[str, Any] | None = None
            version = -1
            try:
                while True:
                    if version >= 0:
                        # Rights are reviewed again (cached): a revoked binding stops showing.
                        viewer = await self.viewer(request)
                    view = self.view_for(viewer, where)
                    changed = diff(sent, view)
                    if changed:
                        changed["version"] = self.source.version
                        await response.write(b"event: view\ndata: " + dumps(changed) + b"\n\n")
                        sent = view
                    before = self.source.version
                    version = await self.source.wait_changed(before, KEEPALIVE_SECONDS)
                    if version == before:
                        await response.write(b": keepalive\n\n")
            except (ConnectionResetError, asyncio.CancelledError, Unauthorized, ReviewFailed):
                pass
            return response

        return await self._guarded(request, answer)

    async def _static(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        name = request.match_info["file"]
        if name not in _STATIC:
            raise aiohttp.web.HTTPNotFound()
        data = importlib.resources.files("phalanx.dashboard").joinpath("static", name).read_bytes()
        return aiohttp.web.Response(
            body=data, content_type=_STATIC[name], headers={"Cache-Control": "no-cache"}
        )


async def _json(body: Any, *, status: int = 200) -> aiohttp.web.StreamResponse:
    return aiohttp.web.Response(
        body=dumps(body), status=status, content_type="application/json", headers=_NO_STORE
    )


_STATIC = {"app.js": "application/javascript", "app.css": "text/css"}
_NO_STORE = {"Cache-Control": "no-store"}


def page(viewer: Viewer, initial_json: str) -> str:
    """The page: the shell and the first view inline, so the first paint needs no round trip."""
    data = initial_json.replace("</", "<\\/")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Phalanx</title>
<link rel="stylesheet" href="/static/app.css">
</head><body>
<header><h1>Phalanx</h1>
<nav><a href="#overview">Overview</a> <a href="#pending">Pending</a>
<a href="#topology">Topology</a> <a href="#usage">Usage</a></nav>
<span id="status">connecting</span>
<span class="who">signed in as {html.escape(viewer.name)} - read-only</span></header>
<main id="app"></main>
<script id="initial" type="application/json">{data}</script>
<script src="/static/app.js"></script>
</body></html>
"""


async def start_dashboard(
    api: KubeApi,
    *,
    listen: str,
    port: int,
    insecure_local: bool = False,
    ssl_context: ssl.SSLContext | None = None,
    store_url: str | None = None,
) -> Callable[[], Any]:
    """Start a dashboard on ``api``; returns the coroutine function that stops it (for the
    operator's ``--dashboard-port``; ``store_url`` is the operator's own ``--store``)."""
    server = DashboardServer(
        api,
        listen=listen,
        port=port,
        insecure_local=insecure_local,
        ssl_context=ssl_context,
        store_url=store_url,
    )
    await server.start()

    async def stop() -> None:
        with contextlib.suppress(Exception):
            await server.stop()

    return stop
