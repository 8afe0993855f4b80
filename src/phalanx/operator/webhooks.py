"""Admission webhooks: hold queued Jobs, Pods and integrated kinds at creation; validate.

Served by kopf's webhook server over TLS. kopf also keeps the Mutating- and
ValidatingWebhookConfiguration (``settings.admission.managed``) pointing at this process. The
webhooks are stateless, so every replica can serve them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp.web
import kopf

from phalanx.operator import jobs, lws, pods
from phalanx.operator.certs import ensure_webhook_certs
from phalanx.operator.config import WebhookConfig
from phalanx.operator.job_validation import validate_job
from phalanx.operator.kinds import OWNED_KINDS
from phalanx.operator.kindsync import KindSpec

__all__ = [
    "KUEUE_KINDS",
    "MAX_REVIEW_BYTES",
    "PhalanxWebhookServer",
    "Review",
    "direct_validations",
    "register_webhooks",
    "webhook_server",
]

logger = logging.getLogger(__name__)

# (plural, kind) of every Kueue kind Phalanx serves; validated by the webhook.
KUEUE_KINDS = (
    ("clusterqueues", "ClusterQueue"),
    ("localqueues", "LocalQueue"),
    ("cohorts", "Cohort"),
    ("resourceflavors", "ResourceFlavor"),
    ("topologies", "Topology"),
    ("workloadpriorityclasses", "WorkloadPriorityClass"),
    ("workloads", "Workload"),
    ("admissionchecks", "AdmissionCheck"),
    ("provisioningrequestconfigs", "ProvisioningRequestConfig"),
)

# The largest AdmissionReview the server reads. The API server takes a request body of up to
# 3 MiB, so an object can be that large; an UPDATE's review carries it twice (object and
# oldObject), and JSON re-encoding can grow it (``<``, ``>`` and ``&`` become six-byte
# escapes). 16 MiB covers two 3 MiB objects with that headroom. aiohttp's default, 1 MiB,
# answered 413 for a valid 1.2 MB Job, and the API server refused the Job.
MAX_REVIEW_BYTES = 16 * 1024 * 1024

Validator = Callable[[dict[str, Any]], list[str]]
"""Returns one message per problem, each naming its field path; empty when valid."""


Review = Callable[[Mapping[str, Any]], dict[str, Any]]
"""Answers one AdmissionReview request with its AdmissionReview response."""


class PhalanxWebhookServer(kopf.WebhookServer):
    """kopf's HTTPS server, whose advertised client config can be a fixed URL or a Service.

    ``direct``: webhook ids answered by a plain function instead of kopf's handler machinery
    (see :func:`direct_validations`); every other id goes to kopf.
    """

    def __init__(
        self,
        *,
        advertised_url: str | None = None,
        service: tuple[str, str, int] | None = None,
        direct: Mapping[str, Review] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.advertised_url = advertised_url
        self.service = service
        self.direct: dict[str, Review] = dict(direct or {})

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        async for config in super().__call__(self._dispatching(fn)):
            advertised = kopf.WebhookClientConfig(**config)
            if self.service is not None:
                namespace, name, port = self.service
                advertised.pop("url", None)
                advertised["service"] = kopf.WebhookClientConfigService(
                    namespace=namespace, name=name, port=port
                )
            elif self.advertised_url is not None:
                advertised["url"] = self.advertised_url.rstrip("/")
            yield advertised

    def _dispatching(self, fn: kopf.WebhookFn) -> kopf.WebhookFn:
        async def serve(
            request: Any,
            *,
            webhook: str | None = None,
            headers: dict[str, str] | None = None,
            sslpeer: dict[str, Any] | None = None,
        ) -> Any:
            answer = self.direct.get(webhook or "")
            if answer is not None:
                return answer(request)
            return await fn(request, webhook=webhook, headers=headers, sslpeer=sslpeer)

        return serve

    async def _serve(  # type: ignore[override]
        self, fn: kopf.WebhookFn, request: aiohttp.web.Request
    ) -> aiohttp.web.Response:
        # kopf builds the aiohttp application with the default body limit and no way to set
        # it; the limit is per request, so each request gets the larger one before it is read.
        return await super()._serve(fn, request.clone(client_max_size=MAX_REVIEW_BYTES))


def webhook_server(
    config: WebhookConfig, *, direct: Mapping[str, Review] | None = None
) -> PhalanxWebhookServer:
    """The server for ``settings.admission.server``, with certificates from ``cert_dir``
    (made there on first use); ``direct``: reviews answered without kopf's machinery."""
    hosts = [config.listen_addr if config.listen_addr not in ("0.0.0.0", "::") else "127.0.0.1"]
    if config.url:
        host = urlsplit(config.url).hostname
        if host and host not in hosts:
            hosts.insert(0, host)
    service = None
    if config.service:
        # Reached only through the Service: its DNS names are what the certificate must cover
        # (a mounted Secret is read-only, so no other name may be required of it).
        namespace, _, name = config.service.partition("/")
        hosts = [f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]
        service = (namespace, name, 443)
    certs = ensure_webhook_certs(config.cert_dir, hosts=hosts)
    return PhalanxWebhookServer(
        addr=config.listen_addr,
        port=config.port,
        host=hosts[0] if not config.service else None,
        certfile=str(certs.cert_file),
        pkeyfile=str(certs.key_file),
        cafile=str(certs.ca_file),
        advertised_url=config.url,
        service=service,
        direct=direct,
    )


def register_webhooks(
    registry: kopf.OperatorRegistry,
    *,
    validator: Validator,
    persistent: bool = False,
    frameworks: Collection[str] = ("batch/job",),
) -> None:
    """Add the mutating Job webhook and the validating webhooks to a kopf registry.

    The Job webhooks only while ``batch/job`` is among the enabled ``frameworks``: a Job of a
    disabled integration is left alone, so it must not be suspended either.

    ``persistent``: keep them in the webhook configuration when this process exits cleanly.
    Behind a Service (in a cluster) that is what must happen: kopf otherwise removes them on
    every clean exit, and after a rolling update (the last step is an old replica exiting) the
    cluster would run without them, creating queued Jobs unsuspended. A process serving on
    its own loopback URL (the local control plane) must not leave them pointing at itself.
    """

    if "batch/job" in frameworks:
        _register_job_webhooks(registry, persistent=persistent)
    if "pod" in frameworks:
        _register_pod_webhook(registry, persistent=persistent)
    for spec in OWNED_KINDS:
        if spec.rules.framework in frameworks:
            _register_kind_webhooks(registry, spec, persistent=persistent)
    if lws.FRAMEWORK in frameworks:
        _register_lws_webhooks(registry, persistent=persistent)
    for plural, kind in KUEUE_KINDS:
        _register_validation(
            registry, plural=plural, kind=kind, validator=validator, persistent=persistent
        )


def _register_pod_webhook(registry: kopf.OperatorRegistry, *, persistent: bool) -> None:
    @kopf.on.mutate(
        "",
        "v1",
        "pods",
        id="gate-queued-pods",
        operations=["CREATE"],
        labels={jobs.QUEUE_LABEL: kopf.PRESENT},
        persistent=persistent,
        registry=registry,
    )
    async def gate_pod(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        # Kueue's rule: a queued Pod is created gated; admission of its whole group ungates it.
        if pods.owned_by_controller(body):
            return  # a Job's (or another controller's) pod: its owner is what is queued
        defaults = pods.admission_defaults(body)
        patch.setdefault("metadata", {})["labels"] = defaults["labels"]
        patch["metadata"]["annotations"] = defaults["annotations"]
        patch.setdefault("spec", {})["schedulingGates"] = defaults["schedulingGates"]


def _register_job_webhooks(registry: kopf.OperatorRegistry, *, persistent: bool) -> None:
    @kopf.on.mutate(
        "batch",
        "v1",
        "jobs",
        id="suspend-queued-jobs",
        operations=["CREATE"],
        labels={jobs.QUEUE_LABEL: kopf.PRESENT},
        persistent=persistent,
        registry=registry,
    )
    async def suspend_job(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        # Kueue's rule: a queued Job is created suspended; admission unsuspends it. A
        # JobSet's Job is the JobSet's to hold (its template may carry the label).
        if jobs.owned_by_jobset(body):
            return
        patch.setdefault("spec", {})["suspend"] = True

    @kopf.on.validate(
        "batch",
        "v1",
        "jobs",
        id="validate-queued-jobs",
        operations=["CREATE", "UPDATE"],
        labels={jobs.QUEUE_LABEL: kopf.PRESENT},
        persistent=persistent,
        registry=registry,
    )
    async def validate_queued_job(body: kopf.Body, **kwargs: Any) -> None:
        # kopf passes the previous object as ``old`` on an UPDATE (None on a CREATE).
        if jobs.owned_by_jobset(body):
            return
        errors = validate_job(body, old=kwargs.get("old"))
        if errors:
            name = body.get("metadata", {}).get("name", "")
            raise kopf.AdmissionError(f"Job {name!r} is invalid: " + "; ".join(errors), code=422)


def _register_kind_webhooks(
    registry: kopf.OperatorRegistry, spec: KindSpec, *, persistent: bool
) -> None:
    """A kind's webhooks for queued objects: hold at creation (Kueue's rule: a queued object
    is created suspended; admission starts it) and validate."""
    group, _, version = spec.rules.api_version.rpartition("/")
    plural, kind = spec.rules.plural, spec.rules.kind
    hold = spec.hold_at_creation
    if hold is not None:

        @kopf.on.mutate(
            group,
            version,
            plural,
            id=f"suspend-queued-{plural}",
            operations=["CREATE"],
            labels={jobs.QUEUE_LABEL: kopf.PRESENT},
            persistent=persistent,
            registry=registry,
        )
        async def hold_object(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
            # Only what the kind's rules queue (a RayJob on an existing cluster is not).
            if spec.rules.queue_name(body) is not None:
                _merge(patch, hold(body) if callable(hold) else hold)

    validate = spec.validate
    if validate is not None:

        @kopf.on.validate(
            group,
            version,
            plural,
            id=f"validate-queued-{plural}",
            operations=["CREATE", "UPDATE"],
            labels={jobs.QUEUE_LABEL: kopf.PRESENT},
            persistent=persistent,
            registry=registry,
        )
        async def validate_queued(body: kopf.Body, **kwargs: Any) -> None:
            errors = validate(body, kwargs.get("old"))
            if errors:
                name = body.get("metadata", {}).get("name", "")
                raise kopf.AdmissionError(
                    f"{kind} {name!r} is invalid: " + "; ".join(errors), code=422
                )


def _register_lws_webhooks(registry: kopf.OperatorRegistry, *, persistent: bool) -> None:
    """A queued LeaderWorkerSet cannot be suspended: its templates are marked so that each
    pod its StatefulSets make is created gated, and queued per group (Kueue's rule)."""

    @kopf.on.mutate(
        lws.GROUP,
        "v1",
        lws.PLURAL,
        id="mark-queued-leaderworkersets",
        operations=["CREATE", "UPDATE"],
        labels={jobs.QUEUE_LABEL: kopf.PRESENT},
        persistent=persistent,
        registry=registry,
    )
    async def mark_templates(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        _merge(patch, lws.template_defaults(body))

    @kopf.on.validate(
        lws.GROUP,
        "v1",
        lws.PLURAL,
        id="validate-queued-leaderworkersets",
        operations=["CREATE", "UPDATE"],
        labels={jobs.QUEUE_LABEL: kopf.PRESENT},
        persistent=persistent,
        registry=registry,
    )
    async def validate_queued(body: kopf.Body, **kwargs: Any) -> None:
        errors = lws.validate_lws(body, old=kwargs.get("old"))
        if errors:
            name = body.get("metadata", {}).get("name", "")
            raise kopf.AdmissionError(
                f"LeaderWorkerSet {name!r} is invalid: " + "; ".join(errors), code=422
            )

    @kopf.on.mutate(
        "",
        "v1",
        "pods",
        id="gate-leaderworkerset-pods",
        operations=["CREATE"],
        labels={jobs.QUEUE_LABEL: kopf.PRESENT},
        annotations={pods.SUSPENDING_PARENT_ANNOTATION: lws.FRAMEWORK},
        persistent=persistent,
        registry=registry,
    )
    async def gate_pod(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        defaults = pods.admission_defaults(body)
        patch.setdefault("metadata", {})["labels"] = defaults["labels"]
        patch["metadata"]["annotations"] = defaults["annotations"]
        patch.setdefault("spec", {})["schedulingGates"] = defaults["schedulingGates"]


def _merge(patch: dict[str, Any], fields: Mapping[str, Any]) -> None:
    for key, value in fields.items():
        if isinstance(value, Mapping):
            _merge(patch.setdefault(key, {}), value)
        else:
            patch[key] = value


def _refusal(kind: str, obj: Mapping[str, Any], errors: list[str]) -> str:
    name = (obj.get("metadata") or {}).get("name", "")
    return f"{kind} {name!r} is invalid: " + "; ".join(errors)


def direct_validations(validator: Validator) -> dict[str, Review]:
    """The Kueue kinds' validating webhooks, answered without kopf's handler machinery.

    Each Workload create passes through ``validate-workloads``; kopf builds a cause, a diff, a
    patch, a logger and a handler state around every review (most of the webhook's CPU in a
    profile of the operator at 1,000 ClusterQueues, while the check itself is a few percent).
    The answer is the one kopf's handler gives (:func:`_register_validation`): allowed, or
    refused with code 422 and the same message. The handlers stay registered, since kopf
    writes the webhook configuration from them.
    """

    def answerer(kind: str) -> Review:
        def answer(review: Mapping[str, Any]) -> dict[str, Any]:
            request = review.get("request")
            if not isinstance(request, Mapping):
                raise aiohttp.web.HTTPBadRequest(reason="expected an AdmissionReview request")
            obj = request.get("object")
            if not isinstance(obj, Mapping):
                obj = request.get("oldObject")
            if not isinstance(obj, Mapping):
                raise aiohttp.web.HTTPBadRequest(reason="the AdmissionReview carries no object")
            checked = dict(obj)
            checked.setdefault("kind", kind)
            response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": False}
            try:
                errors = validator(checked)
            except Exception as error:
                # As kopf answers a handler that crashed: refused, code 500, the error named.
                logger.exception("event=webhook_check_crashed kind=%s", kind)
                response["status"] = {"message": str(error) or repr(error), "code": 500}
            else:
                response["allowed"] = not errors
                if errors:
                    response["status"] = {"message": _refusal(kind, checked, errors), "code": 422}
            return {
                "apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
                "kind": review.get("kind", "AdmissionReview"),
                "response": response,
            }

        return answer

    return {f"validate-{plural}": answerer(kind) for plural, kind in KUEUE_KINDS}


def _register_validation(
    registry: kopf.OperatorRegistry,
    *,
    plural: str,
    kind: str,
    validator: Validator,
    persistent: bool,
) -> None:
    async def validate(body: kopf.Body, **_: Any) -> None:
        obj = dict(body)
        obj.setdefault("kind", kind)
        errors = validator(obj)
        if errors:
            raise kopf.AdmissionError(_refusal(kind, obj, errors), code=422)

    kopf.on.validate(
        "kueue.x-k8s.io",
        "v1beta2",
        plural,
        id=f"validate-{plural}",
        operations=["CREATE", "UPDATE"],
        persistent=persistent,
        registry=registry,
    )(validate)
