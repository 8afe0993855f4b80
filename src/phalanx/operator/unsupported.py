"""Queued objects of the kinds Kueue integrates and Phalanx does not (MPIJob, TFJob, AppWrapper,
Deployment, ...): left alone, as Phalanx leaves every kind it does not manage, and told so by
an ``IntegrationNotSupported`` Event, once per object, so that a team moving from Kueue learns
why its labelled object runs unqueued instead of finding out from the bill.

Watched only where the kind is served (its API group and resource are discovered at start) and
this operator may list and watch it: the default install grants nothing on these kinds, so
there nothing is watched and nothing is refused. An object another object controls (its
``ownerReferences`` name a controller, as a Deployment's ReplicaSet) is its owner's business
and is not told. The Events are written by the scheduling replica only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from phalanx.operator.integration import QUEUE_LABEL, disabled_message
from phalanx.operator.keyed import KeyedQueue
from phalanx.operator.writer import StatusWriter

__all__ = [
    "LEADER_WORKER_SET",
    "UNSUPPORTED",
    "UnsupportedKind",
    "UnsupportedKinds",
    "unsupported_message",
]

logger = logging.getLogger(__name__)

REASON = "IntegrationNotSupported"


@dataclass(frozen=True)
class UnsupportedKind:
    framework: str
    """Kueue's ``integrations.frameworks`` name."""
    group: str
    plural: str
    kind: str


UNSUPPORTED: tuple[UnsupportedKind, ...] = (
    UnsupportedKind("kubeflow.org/mpijob", "kubeflow.org", "mpijobs", "MPIJob"),
    UnsupportedKind("kubeflow.org/tfjob", "kubeflow.org", "tfjobs", "TFJob"),
    UnsupportedKind("kubeflow.org/paddlejob", "kubeflow.org", "paddlejobs", "PaddleJob"),
    UnsupportedKind("kubeflow.org/xgboostjob", "kubeflow.org", "xgboostjobs", "XGBoostJob"),
    UnsupportedKind("kubeflow.org/jaxjob", "kubeflow.org", "jaxjobs", "JAXJob"),
    UnsupportedKind(
        "workload.codeflare.dev/appwrapper", "workload.codeflare.dev", "appwrappers", "AppWrapper"
    ),
    UnsupportedKind("deployment", "apps", "deployments", "Deployment"),
    UnsupportedKind("statefulset", "apps", "statefulsets", "StatefulSet"),
)
"""Every kind of Kueue's ``integrations.frameworks`` Phalanx has no integration for."""

LEADER_WORKER_SET = UnsupportedKind(
    "leaderworkerset.x-k8s.io/leaderworkerset",
    "leaderworkerset.x-k8s.io",
    "leaderworkersets",
    "LeaderWorkerSet",
)
"""Integrated, but when disabled nothing else watches it (admitted through its pods)."""


def unsupported_message(kind: UnsupportedKind, *, supported: tuple[str, ...]) -> str:
    return (
        f"{kind.kind} has label {QUEUE_LABEL} but Phalanx has no integration for"
        f" {kind.framework!r} (it integrates {', '.join(supported)}): it is not queued or"
        " suspended and runs as if unlabelled; submit the work as one of those kinds, or"
        " remove the label"
    )


def told_about(obj: dict[str, Any]) -> bool:
    """Whether a queued object of an unsupported kind gets the Event: labelled, and not
    controlled by another object."""
    metadata = obj.get("metadata") or {}
    if not (metadata.get("labels") or {}).get(QUEUE_LABEL):
        return False
    return not any(ref.get("controller") for ref in metadata.get("ownerReferences") or ())


class UnsupportedKinds:
    """The Events on queued objects of :data:`UNSUPPORTED` kinds, once per object (by uid).

    Also the kinds integrated but not enabled that no controller of their own watches (a
    LeaderWorkerSet): those get ``IntegrationNotEnabled`` (Normal), as a disabled Job does."""

    def __init__(self, writer: StatusWriter, *, supported: tuple[str, ...]) -> None:
        self.writer = writer
        self.supported = supported
        self._objects: dict[str, tuple[UnsupportedKind, dict[str, Any]]] = {}
        self._told: set[str] = set()  # uids
        self._ready = asyncio.Event()  # set once this replica schedules
        self.work = KeyedQueue(
            "unsupported-kinds",
            self._tell,
            log_as="unsupported_kind",
            ready=self._ready,
        )

    def handler(self, kind: UnsupportedKind) -> Callable[[str, dict[str, Any]], None]:
        """The informer callback for ``kind``'s queued objects."""

        def on_event(event_type: str, obj: dict[str, Any]) -> None:
            metadata = obj.get("metadata") or {}
            uid = str(metadata.get("uid") or "")
            if event_type == "DELETED":
                self._objects.pop(uid, None)
                self._told.discard(uid)
                return
            if uid in self._told or not told_about(obj):
                return
            self._objects[uid] = (kind, obj)
            self.work.add(uid)

        return on_event

    def start(self) -> None:
        self.work.start()
        self._ready.set()

    async def stop(self) -> None:
        await self.work.stop()

    async def _tell(self, uid: str) -> None:
        entry = self._objects.pop(uid, None)
        if entry is None or uid in self._told:
            return
        kind, obj = entry
        if kind.framework in self.supported:  # integrated, not enabled
            reason = "IntegrationNotEnabled"
            message = disabled_message(framework=kind.framework, kind=kind.kind)
        else:
            reason, message = REASON, unsupported_message(kind, supported=self.supported)
        logger.info(
            "event=workload_refused kind=%s key=%s/%s reason=%s",
            kind.kind,
            (obj.get("metadata") or {}).get("namespace"),
            (obj.get("metadata") or {}).get("name"),
            reason,
        )
        await self.writer.event(obj, reason=reason, message=message, warning=reason == REASON)
        self._told.add(uid)
