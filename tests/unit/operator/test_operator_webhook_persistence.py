"""Behind a Service the webhooks outlive a replica's clean exit; on a loopback URL they don't.

Checked with kopf's own ``build_webhooks(persistent_only=True)``: what kopf leaves in the
webhook configuration when the process stops cleanly (the last step of every rolling update).
"""

from __future__ import annotations

import kopf
from kopf._cogs.structs import references
from kopf._core.engines.admission import build_webhooks
from kopf._core.intents.causes import WebhookType

from phalanx.operator.webhooks import register_webhooks

JOBS = references.Resource(group="batch", version="v1", plural="jobs", namespaced=True)


def kept_on_exit(*, persistent: bool) -> list[str]:
    registry = kopf.OperatorRegistry()
    register_webhooks(registry, validator=lambda obj: [], persistent=persistent)
    handlers = [
        h for h in registry._webhooks.get_all_handlers() if h.reason == WebhookType.MUTATING
    ]
    assert handlers, "the Job webhook is registered"
    webhooks = build_webhooks(
        handlers,
        resources=[JOBS],
        name_suffix="phalanx.kueue.x-k8s.io",
        client_config={"url": "https://phalanx-webhook.phalanx-system.svc:443"},
        persistent_only=True,
    )
    return [w["name"] for w in webhooks]


def test_behind_a_service_the_job_webhook_survives_a_clean_exit() -> None:
    assert kept_on_exit(persistent=True) == ["suspend-queued-jobs.phalanx.kueue.x-k8s.io"]


def test_on_a_loopback_url_nothing_is_left_pointing_at_a_stopped_process() -> None:
    assert kept_on_exit(persistent=False) == []
