"""The CRDs' conversion webhook: kueue.x-k8s.io v1beta1 <-> v1beta2, served by the operator.

The API server stores v1beta2 and asks this webhook (a ``ConversionReview``, apiextensions v1)
whenever a client reads or writes v1beta1 of a kind whose CRD converts through it (ClusterQueue,
LocalQueue, Cohort and Workload, as in Kueue). The conversions themselves are
:func:`phalanx.api.v1beta1.convert_object`; this module does the I/O around them:

- :meth:`ConversionWebhook.serving` puts the review on the admission webhooks' TLS server
  (kopf's, wrapped rather than changed): its route ``<path>/<id>`` hands ``POST /convert`` over
  with the id ``convert``, which no admission handler uses, and each client config it
  advertises is the one the CRDs need too.
- :meth:`ConversionWebhook.keep_crds` keeps each such CRD's ``spec.conversion.webhook.
  clientConfig`` pointing at this server, as kopf does for the webhook configurations: at every
  start of the server (a new certificate, a new address) and every ``interval`` seconds, so a
  re-applied CRD (back to the Service it names when generated) is repaired. It only touches
  CRDs that convert through the webhook; the CRDs, not the operator, decide that.

Without an operator, v1beta2 requests never call the webhook (v1beta2 is what is stored), so
only v1beta1 requests of those four kinds fail, with the API server's "conversion webhook ...
failed" error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final

import aiohttp
import aiohttp.web
import kopf

from phalanx.api import v1beta1
from phalanx.api.kinds import KINDS
from phalanx.operator.kube import ApiError, KubeApi, MalformedResponse, Resource

__all__ = ["CONVERSION_WEBHOOK_ID", "CRDS", "ConversionWebhook", "review"]

logger = logging.getLogger(__name__)

CONVERSION_WEBHOOK_ID: Final = v1beta1.CONVERSION_PATH.lstrip("/")

CRDS: Final = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)

CONVERTED_CRDS: Final = tuple(
    info.crd_name for info in KINDS if info.kind in v1beta1.WEBHOOK_CONVERTED_KINDS
)
"""The CRDs the operator keeps pointing at itself (RBAC grants patch on exactly these)."""

_REVIEW_API_VERSION: Final = "apiextensions.k8s.io/v1"


def review(request: Mapping[str, Any]) -> dict[str, Any]:
    """The ``ConversionReview`` answering ``request``: every object converted, or a Failure
    naming the first object that could not be (the API server shows that message)."""
    body = request.get("request")
    if request.get("kind") != "ConversionReview" or not isinstance(body, Mapping):
        raise aiohttp.web.HTTPBadRequest(reason="expected a ConversionReview with a request")
    desired = str(body.get("desiredAPIVersion", ""))
    result: dict[str, Any] = {"status": "Success"}
    converted: list[dict[str, Any]] = []
    try:
        converted = [v1beta1.convert_object(obj, to=desired) for obj in body.get("objects") or ()]
    except v1beta1.ConversionError as error:
        logger.warning("event=conversion_failed desired=%s error=%r", desired, str(error))
        result = {"status": "Failure", "message": str(error)}
        converted = []
    return {
        "apiVersion": request.get("apiVersion") or _REVIEW_API_VERSION,
        "kind": "ConversionReview",
        "response": {"uid": body.get("uid", ""), "convertedObjects": converted, "result": result},
    }


class ConversionWebhook:
    """Serves ConversionReviews beside the admission webhooks and points the CRDs at them.

    ``restore_on_exit``: on a clean exit, point the CRDs back at the Service they name when
    generated. Right for a process serving on its own loopback URL (the local control plane),
    which must not leave the CRDs pointing at an address nobody serves, and whose URL form would
    make re-applying the generated CRDs invalid (a client config has a url or a service, not
    both). Behind a Service the client config stays: every replica serves it.
    """

    def __init__(self, *, restore_on_exit: bool, crd_names: Sequence[str] = CONVERTED_CRDS):
        self.restore_on_exit = restore_on_exit
        self.crd_names = tuple(crd_names)
        self.client_config: dict[str, Any] | None = None
        self._changed = asyncio.Event()

    # -- serving ----------------------------------------------------------------------------------

    def serving(self, server: kopf.WebhookServerProtocol) -> kopf.WebhookServerProtocol:
        """``server`` (for ``settings.admission.server``) answering ConversionReviews too."""

        async def serve(fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
            async for config in server(self.wrap(fn)):
                self.advertise(config)
                yield config

        return serve

    def wrap(self, fn: kopf.WebhookFn) -> kopf.WebhookFn:
        """kopf's admission function, with ConversionReviews on ``/convert`` answered here."""

        async def serve(
            request: Any,
            *,
            webhook: str | None = None,
            headers: dict[str, str] | None = None,
            sslpeer: dict[str, Any] | None = None,
        ) -> Any:
            if webhook == CONVERSION_WEBHOOK_ID:
                return review(request)
            return await fn(request, webhook=webhook, headers=headers, sslpeer=sslpeer)

        return serve

    def advertise(self, config: Mapping[str, Any]) -> None:
        """The webhook server (re)started with this client config (kopf's, without a handler
        id): the CRDs' conversion must use it."""
        self.client_config = conversion_client_config(config)
        self._changed.set()

    # -- keeping the CRDs pointing here -----------------------------------------------------------

    async def keep_crds(self, api: KubeApi, *, interval: float = 30.0) -> None:
        """Forever: make each converted CRD's client config this server's."""
        try:
            while True:
                await self._changed.wait()
                self._changed.clear()
                config = self.client_config
                if config is not None:
                    await self.sync(api, config)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(interval):
                        await self._changed.wait()
                self._changed.set()  # the next round runs at once (changed or interval over)
        finally:
            if self.restore_on_exit and self.client_config is not None:
                # Shield: cleanup cancels this task, and the restore must still be sent.
                await asyncio.shield(self._restore(api))

    async def sync(self, api: KubeApi, config: Mapping[str, Any]) -> list[str]:
        """Patch every converted CRD whose client config differs; return the names patched."""
        patched = []
        for name in self.crd_names:
            try:
                if await _point_crd(api, name, config):
                    patched.append(name)
            except ApiError as error:
                if error.status == 404:
                    continue  # not installed (yet): the next round looks again
                logger.warning(
                    "event=conversion_crd_patch_failed crd=%s status=%s error=%r action=retry",
                    name,
                    error.status,
                    str(error),
                )
            except (aiohttp.ClientError, TimeoutError, MalformedResponse) as error:
                logger.warning(
                    "event=conversion_crd_patch_failed crd=%s error=%r action=retry", name, error
                )
        if patched:
            logger.info("event=conversion_webhook_configured crds=%s", ",".join(patched))
        return patched

    async def _restore(self, api: KubeApi) -> None:
        generated = {"service": {**v1beta1.CONVERSION_SERVICE, "path": v1beta1.CONVERSION_PATH}}
        for name in self.crd_names:
            try:
                crd = await api.get(CRDS, name)
                if _client_config(crd) == self.client_config:  # still ours: nobody took over
                    await _patch_client_config(api, crd, generated)
            except (ApiError, aiohttp.ClientError, TimeoutError, MalformedResponse) as error:
                logger.warning("event=conversion_crd_restore_failed crd=%s error=%r", name, error)


def conversion_client_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The CRD client config for the conversion path of the webhook server's ``config``."""
    out: dict[str, Any] = {}
    if config.get("caBundle"):
        out["caBundle"] = config["caBundle"]
    service = config.get("service")
    if service:
        path = str(service.get("path") or "").rstrip("/") + v1beta1.CONVERSION_PATH
        out["service"] = {**service, "path": path}
    else:
        out["url"] = str(config["url"]).rstrip("/") + v1beta1.CONVERSION_PATH
    return out


def _client_config(crd: Mapping[str, Any]) -> dict[str, Any] | None:
    conversion = (crd.get("spec") or {}).get("conversion") or {}
    webhook = conversion.get("webhook") or {}
    config = webhook.get("clientConfig")
    return dict(config) if isinstance(config, Mapping) else None


async def _point_crd(api: KubeApi, name: str, config: Mapping[str, Any]) -> bool:
    crd = await api.get(CRDS, name)
    conversion = (crd.get("spec") or {}).get("conversion") or {}
    if conversion.get("strategy") != "Webhook":
        return False  # the installed CRD converts without a webhook: not ours to change
    live = _client_config(crd) or {}
    wanted = dict(config)
    if "service" in wanted and "service" in live:
        # The API server defaults the port; compare what it keeps.
        wanted["service"] = {"port": 443, **wanted["service"]}
    if live == wanted:
        return False
    await _patch_client_config(api, crd, config)
    return True


async def _patch_client_config(
    api: KubeApi, crd: Mapping[str, Any], config: Mapping[str, Any]
) -> None:
    """A merge patch of the client config under the CRD's resourceVersion (a CRD applied
    meanwhile makes it fail with 409; the next round reads it again)."""
    client_config: dict[str, Any] = {"url": None, "service": None, "caBundle": None}
    client_config.update(config)
    patch = {
        "metadata": {"resourceVersion": crd["metadata"]["resourceVersion"]},
        "spec": {"conversion": {"webhook": {"clientConfig": client_config}}},
    }
    await api.patch(CRDS, crd["metadata"]["name"], patch)
