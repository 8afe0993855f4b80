"""The label that routes Kueue's visibility API to the replica that schedules.

Only the replica that schedules has the queues (a standby answers 503), so the Service
``phalanx-visibility`` selects the pods carrying :data:`SERVING_LABEL` besides the app label,
and each replica keeps that label on its own Pod: set once its scheduling loop has synced
(it can answer), removed at start (a container restarted after a crash must not keep an old
leader's label) and when it stops scheduling (leadership lost, shutdown). A deleted pod takes
its label with it. The standby's 503 stays the fallback for the moments around a hand-over.

The Pod is named by the downward API (``POD_NAME``, ``POD_NAMESPACE``, which the Deployment
passes); outside a pod (no ``POD_NAME``) nothing is written. Writes are best effort, on the
unfenced client (removing the label is the first thing a replica whose tenure ended does): a
JSON merge patch of the one label (idempotent), retried with the operator's backoff until it
lands or the wanted state changes; every failure is logged and none stops scheduling. After
an unknown outcome the Pod is read back (a list by name: the ClusterRole has no pods ``get``),
as the status writer reads its Workloads back. RBAC: the existing ``pods`` ``patch`` and
``list`` (the gate remover's and the informer's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from phalanx.operator.kube import PODS, ApiError, KubeApi, outcome_unknown
from phalanx.operator.leader import default_namespace
from phalanx.operator.retry import Backoff

__all__ = ["SERVING_LABEL", "SERVING_VALUE", "ServingLabel"]

logger = logging.getLogger(__name__)

SERVING_LABEL = "phalanx.kueue.x-k8s.io/visibility"
SERVING_VALUE = "serving"

Sleep = Callable[[float], Awaitable[None]]


class ServingLabel:
    """Keeps :data:`SERVING_LABEL` on this replica's own Pod as :meth:`want` last said.

    One task converges the Pod to the wanted state (level-triggered: a change while a write is
    in flight is written next). ``confirmed`` is what the API server is known to hold (None:
    not known yet; the first wanted state is False, so every replica clears it at start)."""

    def __init__(
        self,
        api: KubeApi,
        *,
        namespace: str,
        name: str,
        backoff: Backoff | None = None,
        request_timeout: float = 10.0,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.backoff = backoff or Backoff()
        self.request_timeout = request_timeout
        self._sleep = sleep
        self.wanted = False
        self.confirmed: bool | None = None
        self.failures = 0
        """Failed attempts so far (for tests and logs)."""
        self._wake = asyncio.Event()
        self._settled = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def from_env(
        cls, api: KubeApi, environ: Mapping[str, str] | None = None, **kwargs: Any
    ) -> ServingLabel | None:
        """The label of the Pod the downward API names; None outside a pod (no ``POD_NAME``).
        The namespace is ``POD_NAMESPACE``, else the service account's (as the Lease's)."""
        env = os.environ if environ is None else environ
        name = env.get("POD_NAME", "").strip()
        if not name:
            return None
        namespace = env.get("POD_NAMESPACE", "").strip() or default_namespace()
        return cls(api, namespace=namespace, name=name, **kwargs)

    @property
    def pod(self) -> str:
        return f"{self.namespace}/{self.name}"

    def want(self, serving: bool) -> None:
        """Ask for the label (True) or its absence (False); returns at once."""
        if serving != self.wanted:
            logger.info("event=serving_label_wanted pod=%s serving=%s", self.pod, serving)
        self.wanted = serving
        if self.confirmed is not serving:
            self._settled.clear()
        self._wake.set()

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.get_running_loop().create_task(
            self.run(), name="phalanx-serving-label"
        )
        return self._task

    async def settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the Pod to hold the wanted state; True when it does."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self.confirmed is not self.wanted:
                    self._settled.clear()
                    await self._settled.wait()
        return self.confirmed is self.wanted

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def run(self) -> None:
        attempt = 0
        while True:
            if self.confirmed is self.wanted:
                self._settled.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            target = self.wanted
            if await self._write(target):
                self.confirmed = target
                attempt = 0
                logger.info(
                    "event=serving_label_written pod=%s label=%s serving=%s",
                    self.pod,
                    SERVING_LABEL,
                    target,
                )
                continue
            self.failures += 1
            delay = self.backoff.delay(attempt)
            attempt += 1
            self._settled.set()  # a waiter sees the failure (settle() checks again)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    # A new wanted state is tried at once; the same one after the delay.
                    while self.wanted is target:
                        self._wake.clear()
                        await self._wake.wait()

    async def _write(self, serving: bool) -> bool:
        """One merge patch of the label; True when the Pod holds ``serving`` afterwards."""
        patch = {"metadata": {"labels": {SERVING_LABEL: SERVING_VALUE if serving else None}}}
        path = PODS.path(namespace=self.namespace, name=self.name)
        try:
            await self.api.request(
                "PATCH",
                path,
                body=patch,
                content_type="application/merge-patch+json",
                timeout=self.request_timeout,
            )
            return True
        except asyncio.CancelledError:
            raise
        except Exception as error:
            if isinstance(error, ApiError) and error.not_found and not serving:
                return True  # no such Pod: it holds no label
            unknown = outcome_unknown(error)
            if unknown:
                held = await self._read_back()
                if held is serving:
                    logger.info(
                        "event=serving_label_read_back pod=%s serving=%s error=%r",
                        self.pod,
                        serving,
                        error,
                    )
                    return True
            logger.warning(
                "event=serving_label_failed pod=%s serving=%s outcome_unknown=%s error=%r"
                " action=retry",
                self.pod,
                serving,
                unknown,
                error,
            )
            return False

    async def _read_back(self) -> bool | None:
        """Whether the Pod carries the label now (None: could not tell). A list by name, which
        the operator's ``pods`` ``list`` allows (it has no ``get``)."""
        try:
            page = await self.api.request(
                "GET",
                PODS.path(namespace=self.namespace),
                params={"fieldSelector": f"metadata.name={self.name}"},
                timeout=self.request_timeout,
            )
        except asyncio.CancelledError:
            raise
        except Exception as error:
            logger.info("event=serving_label_read_back_failed pod=%s error=%r", self.pod, error)
            return None
        items = page.get("items") or []
        if not items:
            return False
        labels = (items[0].get("metadata") or {}).get("labels") or {}
        return bool(labels.get(SERVING_LABEL) == SERVING_VALUE)
