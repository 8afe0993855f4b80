"""The operator's own HTTP endpoints: ``/metrics`` (HTTPS, authenticated) and the probes.

As Kueue runs them: metrics on their own port over TLS, each scrape's token checked by
:class:`~phalanx.operator.metrics_auth.MetricsAuthorizer`; ``/healthz`` and ``/readyz`` on
another, plain-HTTP port that says nothing secret (whether the informers have synced, whether
the scheduling loop keeps completing cycles). For local runs ``--metrics-secure=false`` serves
``/metrics`` over plain HTTP without authentication, on loopback only.

Both run on the operator's event loop: a scrape needs the API client for its reviews, and a
probe that cannot be answered because the loop is stuck is a failed probe, as it should be.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import ssl
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp.web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from phalanx.operator.certs import ReloadingCert, ensure_webhook_certs, renew_if_due
from phalanx.operator.config import OperatorConfig
from phalanx.operator.kube import KubeApi
from phalanx.operator.metrics_auth import MetricsAuthorizer, ReviewFailed, Verdict

__all__ = ["Endpoints", "HealthServer", "MetricsServer", "is_loopback", "metrics_cert_folder"]

logger = logging.getLogger(__name__)


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class _Site:
    """One aiohttp application on one address and port."""

    def __init__(self, *, listen: str, port: int, ssl_context: ssl.SSLContext | None) -> None:
        self.listen = listen
        self.port = port
        self.ssl_context = ssl_context
        self._runner: aiohttp.web.AppRunner | None = None

    def routes(self) -> list[aiohttp.web.RouteDef]:
        raise NotImplementedError

    async def start(self) -> None:
        app = aiohttp.web.Application()
        app.add_routes(self.routes())
        self._runner = aiohttp.web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = aiohttp.web.TCPSite(
            self._runner, self.listen, self.port, ssl_context=self.ssl_context
        )
        await site.start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class MetricsServer(_Site):
    """``GET /metrics``: with an ``authorizer``, over TLS and only for callers allowed to
    ``get`` the non-resource URL ``/metrics``; without, plain and open (loopback only)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        listen: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        authorizer: MetricsAuthorizer | None,
    ) -> None:
        if authorizer is None and not is_loopback(listen):
            raise ValueError(
                f"metrics on {listen}: plain HTTP without authentication is served on loopback "
                "only; listen on 127.0.0.1 or keep --metrics-secure"
            )
        if authorizer is not None and ssl_context is None:
            raise ValueError("authenticated metrics need TLS: a bearer token must not travel plain")
        super().__init__(listen=listen, port=port, ssl_context=ssl_context)
        self.registry = registry
        self.authorizer = authorizer

    def routes(self) -> list[aiohttp.web.RouteDef]:
        return [aiohttp.web.get("/metrics", self._metrics)]

    async def _metrics(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        if self.authorizer is not None:
            try:
                decision = await self.authorizer.check(request.headers.get("Authorization"))
            except ReviewFailed as error:
                logger.warning("event=metrics_review_failed error=%r", str(error))
                return aiohttp.web.Response(status=503, text="cannot review the token now\n")
            if decision.verdict is not Verdict.ALLOWED:
                logger.info(
                    "event=metrics_refused status=%d user=%s reason=%r",
                    decision.verdict.value,
                    decision.user or "-",
                    decision.reason,
                )
                text = (
                    "Unauthorized\n"
                    if decision.verdict is Verdict.UNAUTHENTICATED
                    else (f"Forbidden: {decision.user} may not get /metrics\n")
                )
                return aiohttp.web.Response(status=decision.verdict.value, text=text)
        body = await asyncio.to_thread(generate_latest, self.registry)
        return aiohttp.web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


class HealthServer(_Site):
    """``/healthz`` (liveness) and ``/readyz`` (readiness), plain HTTP.

    ``liveness()`` returns details for the answer and raises to fail it (500 with the
    message); ``ready()`` says whether this replica can do its work (503 until then)."""

    def __init__(
        self,
        *,
        listen: str,
        port: int,
        liveness: Callable[[], dict[str, Any]],
        ready: Callable[[], bool],
    ) -> None:
        super().__init__(listen=listen, port=port, ssl_context=None)
        self.liveness = liveness
        self.ready = ready

    def routes(self) -> list[aiohttp.web.RouteDef]:
        return [
            aiohttp.web.get("/healthz", self._healthz),
            aiohttp.web.get("/readyz", self._readyz),
        ]

    async def _healthz(self, _: aiohttp.web.Request) -> aiohttp.web.Response:
        try:
            details = self.liveness()
        except Exception as error:
            return _json(500, {"ok": False, "error": str(error)})
        return _json(200, {"ok": True, **details})

    async def _readyz(self, _: aiohttp.web.Request) -> aiohttp.web.Response:
        ready = self.ready()
        return _json(200 if ready else 503, {"ok": ready})


def _json(status: int, payload: dict[str, Any]) -> aiohttp.web.Response:
    return aiohttp.web.Response(
        status=status, text=json.dumps(payload) + "\n", content_type="application/json"
    )


def metrics_cert_folder(config: OperatorConfig) -> Path:
    """``--metrics-cert-dir``; else the webhook's certificate (its server has made or checked
    it by now); else, without webhooks, a self-managed one for localhost beside it."""
    if config.metrics_cert_dir is not None:
        return config.metrics_cert_dir
    if config.webhook.enabled:
        return config.webhook.cert_dir
    return config.webhook.cert_dir.parent / "metrics"


class Endpoints:
    """The metrics and health servers and the upkeep of certificates, for one operator."""

    def __init__(
        self,
        config: OperatorConfig,
        *,
        registry: CollectorRegistry,
        api: KubeApi,
        liveness: Callable[[], dict[str, Any]],
        ready: Callable[[], bool],
    ) -> None:
        self.config = config
        self.registry = registry
        self.api = api
        self.liveness = liveness
        self.ready = ready
        self.metrics: MetricsServer | None = None
        self.health: HealthServer | None = None
        self.metrics_cert: ReloadingCert | None = None
        self.authorizer: MetricsAuthorizer | None = None
        self._self_managed: list[Path] = []

    async def start(self) -> list[tuple[str, Coroutine[Any, Any, None]]]:
        """Start listening; returns the long-running upkeep tasks to run (name, coroutine)."""
        config = self.config
        if config.webhook.enabled:
            self._self_managed.append(config.webhook.cert_dir)
        if config.metrics_port:
            ssl_context = None
            if config.metrics_secure:
                folder = metrics_cert_folder(config)
                if not (folder / "tls.crt").exists() or not (folder / "tls.key").exists():
                    ensure_webhook_certs(folder, hosts=["localhost", "127.0.0.1"])
                if folder not in self._self_managed:
                    self._self_managed.append(folder)
                self.metrics_cert = ReloadingCert(folder / "tls.crt", folder / "tls.key")
                ssl_context = self.metrics_cert.context
                ttl = config.metrics_auth_ttl
                self.authorizer = MetricsAuthorizer(self.api, ttl=ttl, deny_ttl=min(10.0, ttl / 3))
            self.metrics = MetricsServer(
                self.registry,
                listen=config.metrics_addr,
                port=config.metrics_port,
                ssl_context=ssl_context,
                authorizer=self.authorizer,
            )
            await self.metrics.start()
            logger.info(
                "event=metrics_serving address=%s://%s:%d/metrics authentication=%s",
                "https" if ssl_context else "http",
                config.metrics_addr,
                config.metrics_port,
                "tokenreview" if self.authorizer else "none",
            )
        if config.liveness_port:
            self.health = HealthServer(
                listen=config.health_addr,
                port=config.liveness_port,
                liveness=self.liveness,
                ready=self.ready,
            )
            await self.health.start()
        tasks: list[tuple[str, Coroutine[Any, Any, None]]] = []
        if self._self_managed:
            tasks.append(("phalanx-cert-renewal", self._renew_forever()))
        if self.metrics_cert is not None:
            interval = config.cert_check_seconds
            tasks.append(
                ("phalanx-metrics-cert-reload", self.metrics_cert.watch(interval=interval))
            )
        return tasks

    async def _renew_forever(self) -> None:
        """Renew self-managed certificates before they expire; the servers then reload them
        (kopf's webhook server checks its files once a minute)."""
        while True:
            await asyncio.sleep(self.config.cert_check_seconds)
            for folder in self._self_managed:
                if os.access(folder, os.W_OK):
                    try:
                        await asyncio.to_thread(renew_if_due, folder)
                    except OSError as error:
                        logger.error(
                            "event=certificate_renewal_failed folder=%s error=%r", folder, error
                        )

    async def stop(self) -> None:
        for server in (self.metrics, self.health):
            if server is not None:
                await server.stop()
