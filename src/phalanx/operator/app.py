"""The kopf application: registry, settings and the embedded run.

kopf runs the process (startup/shutdown, login, webhooks, logging). Every kind the scheduler
reads, admin kinds included, is ingested by Phalanx's own list/watch informers
(:mod:`phalanx.operator.informer`, started in ``on.startup``): kopf's watch sends no DELETED
for an object removed while it was disconnected, an informer's relist does. kopf handles no
object, so it writes nothing (no finalizers, no annotations) onto users' objects.

The probes (``/healthz``, ``/readyz``) and ``/metrics`` are Phalanx's own servers
(:mod:`phalanx.operator.serving`): ``/healthz`` answers 500 when the scheduling loop completed
no cycle for ``liveness_stall_seconds``. A crashed long-running task stops the operator, and
:func:`run` returns 1.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import Sequence
from typing import Any

import kopf

from phalanx.operator import webhook_policy
from phalanx.operator.config import OperatorConfig
from phalanx.operator.conversion import ConversionWebhook
from phalanx.operator.runtime import TEST_HOOKS_ENV, PhalanxOperator, Sidecar
from phalanx.operator.validation import validate_object
from phalanx.operator.webhooks import direct_validations, register_webhooks, webhook_server

__all__ = ["build_registry", "build_settings", "run", "tune_gc"]

logger = logging.getLogger(__name__)

# After a fatal error kopf stops the operator cleanly (cleanup handlers, the Lease handed
# back); if that has not ended the process this long after, it exits hard.
_HARD_EXIT_AFTER = 60.0


def build_settings(
    config: OperatorConfig, *, conversion: ConversionWebhook | None = None
) -> kopf.OperatorSettings:
    """kopf's settings; ``conversion``: the CRDs' conversion webhook, served on the admission
    webhooks' server."""
    settings = kopf.OperatorSettings()
    # Per-object log lines and k8s Events from kopf cost CPU and API writes at scale; the
    # operator logs its own decisions. Warnings still become Events.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.error_backoffs = (1, 2, 5, 10, 20)
    settings.execution.max_workers = 4
    # kopf handles no objects (only activities and webhooks); these are belt and braces so
    # that nothing kopf-specific is ever written onto users' objects.
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="phalanx.kueue.x-k8s.io", key="last-handled"
    )
    if config.webhook.enabled:
        # kopf manages the configurations; every webhook in them gets the manifests' settings.
        webhook_policy.install(
            config.webhook.configuration_name,
            webhook_policy.WebhookPolicy(
                timeout_seconds=config.webhook.timeout_seconds,
                namespace_selector=(
                    config.webhook.namespace_selector
                    or webhook_policy.default_namespace_selector(None)
                ),
            ),
        )
        server = webhook_server(config.webhook, direct=direct_validations(validate_object))
        settings.admission.server = conversion.serving(server) if conversion else server
        settings.admission.managed = config.webhook.configuration_name
    return settings


def build_registry(op: PhalanxOperator) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    issued: list[str | None] = []

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        # kopf and Phalanx's own client must use the same credentials: resolve them once.
        # kopf logs in again when what it has expires or is refused (401), and never takes a
        # refused token back: drop the one it has, so an exec plugin runs again and a token
        # file is re-read. (A sync handler: kopf runs it in a thread, so a plugin may block.)
        auth = op.auth
        if issued:
            auth.invalidate(issued[-1])
        token = auth.bearer_token()
        issued[:] = [token]
        cert = auth.client_certificate()
        return kopf.ConnectionInfo(
            server=auth.server,
            ca_data=auth.ca_data,
            insecure=auth.insecure_skip_tls_verify,
            certificate_data=cert[0] if cert else None,
            private_key_data=cert[1] if cert else None,
            scheme="Bearer" if token else None,
            token=token,
            default_namespace=auth.default_namespace,
            expiration=auth.expiration,
        )

    @kopf.on.startup(registry=registry)
    async def startup(**_: Any) -> None:
        await op.startup()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await op.cleanup()

    if op.config.webhook.enabled:
        register_webhooks(
            registry,
            validator=op.validate_object,
            persistent=op.config.webhook.service is not None,
            frameworks=op.config.frameworks,
        )
    return registry


def run(config: OperatorConfig, *, sidecars: Sequence[Sidecar] = ()) -> int:
    """Run the operator until SIGINT/SIGTERM (exit code 0) or a fatal error (1);
    ``sidecars`` start with it (the dashboard, which the CLI wires in)."""
    tune_gc()
    _quiet_kopf()
    op = PhalanxOperator(
        config,
        test_hooks=os.environ.get(TEST_HOOKS_ENV) == "1",
        hard_exit_after=_HARD_EXIT_AFTER,
        sidecars=sidecars,
    )
    registry = build_registry(op)
    settings = build_settings(config, conversion=op.conversion)
    # kopf installs its own SIGINT/SIGTERM handlers (main thread) and shuts down cleanly.
    # A threading.Event stop flag would leave an executor thread blocked in wait(), which
    # asyncio.run then joins forever.
    try:
        asyncio.run(
            kopf.operator(
                registry=registry,
                settings=settings,
                standalone=True,
                clusterwide=not config.namespaces,
                namespaces=list(config.namespaces),
                stop_flag=op.stop_flag,
            )
        )
    except kopf.PermanentError as error:
        logger.error("event=operator_failed error=%r", error)
        return 1
    if op.fatal is not None:
        logger.error("event=operator_exit exit_code=1 reason=%r", op.fatal)
        return 1
    return 0


def tune_gc() -> None:
    """Raise the cyclic collector's thresholds for a process holding many watched objects.

    Every decoded watch event allocates dozens of containers; at the default threshold (700)
    the young generation is collected every few events and older generations, which hold the
    tens of thousands of cached objects, are rescanned over and over: measured on 20,000
    Workload events, 0.8 CPU s per 10,000 events with the defaults, 0.3 with these.
    """
    gc.set_threshold(50_000, 50, 100)


def _quiet_kopf() -> None:
    """kopf logs a line per handled object at INFO; keep its warnings, drop the chatter."""
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    logging.getLogger("kopf._core.reactor.observation").setLevel(logging.WARNING)
    logging.getLogger("kopf._core.engines.peering").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
