"""The operator's one in-memory view of the cluster, fed by both ingestion lanes.

kopf handlers (admin kinds, Namespaces, PriorityClasses) and the lean informers (Workloads,
Jobs, Pods, Nodes) call ``apply(kind, event_type, obj)``. The state keeps the latest object of
each kind by key and records *which* keys changed since the scheduling loop last looked, as
a set per kind: a burst of 50,000 events for 15,000 Workloads leaves 15,000 dirty keys, and
converting each to the core's types happens once per cycle, not once per event.

Everything runs on the operator's event loop thread; nothing here blocks or awaits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["KINDS", "ClusterState", "Delta", "key_of", "slim"]

# Every kind the operator tracks, by the name used for its store.
KINDS = (
    "ClusterQueue",
    "LocalQueue",
    "Cohort",
    "ResourceFlavor",
    "Topology",
    "WorkloadPriorityClass",
    "AdmissionCheck",
    "ProvisioningRequestConfig",
    "ProvisioningRequest",
    "PriorityClass",
    "Namespace",
    "Workload",
    "Job",
    "JobSet",
    "JobSetJob",
    "LeaderWorkerSet",
    "PyTorchJob",
    "RayJob",
    "RayJobCluster",
    "RayCluster",
    "TrainJob",
    "TrainJobSet",
    "Pod",
    "Node",
)
_NAMESPACED = frozenset(
    {"LocalQueue", "Workload", "Job", "JobSet", "JobSetJob", "Pod", "ProvisioningRequest"}
    | {"LeaderWorkerSet", "PyTorchJob", "RayJob", "RayJobCluster", "RayCluster"}
    | {"TrainJob", "TrainJobSet"}
)


def key_of(kind: str, obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    if kind in _NAMESPACED:
        return f"{metadata.get('namespace')}/{metadata.get('name')}"
    return str(metadata.get("name"))


_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def slim(obj: dict[str, Any]) -> dict[str, Any]:
    """Drop what no reader of the state needs and what costs the most memory per object:
    server-side apply's ``managedFields`` (often larger than the spec) and kubectl's
    last-applied copy of the whole object. At 50,000 Workloads this is most of the state.
    Mutates ``obj`` (freshly decoded from the API, owned by the caller) and returns it."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)
        annotations = metadata.get("annotations")
        if isinstance(annotations, dict) and _LAST_APPLIED in annotations:
            metadata["annotations"] = {k: v for k, v in annotations.items() if k != _LAST_APPLIED}
    return obj


@dataclass
class Delta:
    """Keys of one kind changed since the last drain; a deleted key is absent from the store."""

    kind: str
    keys: set[str] = field(default_factory=set)


class ClusterState:
    """Latest objects by kind and key, plus the set of keys changed since the last drain."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in KINDS}
        self._dirty: dict[str, set[str]] = {kind: set() for kind in KINDS}
        self._changed = asyncio.Event()
        self.events_applied = 0
        self._listeners: list[Callable[[str, str, dict[str, Any] | None], None]] = []

    # -- ingestion ---------------------------------------------------------------------------

    def apply(self, kind: str, event_type: str | None, obj: dict[str, Any]) -> None:
        """Record one watch event (``event_type`` None means "seen in the initial list")."""
        self.events_applied += 1
        key = key_of(kind, obj)
        store = self.objects[kind]
        if event_type == "DELETED":
            old = store.pop(key, None)
            if old is None:
                return
            current: dict[str, Any] | None = None
        else:
            old = store.get(key)
            if old is not None and not _newer(old, obj):
                # A relist, a duplicate, or the watch echo of a write whose response the
                # operator already recorded: nothing new.
                return
            obj = slim(obj)
            store[key] = obj
            current = obj
        self._dirty[kind].add(key)
        self._changed.set()
        for listener in self._listeners:
            listener(kind, key, current)

    def subscribe(self, listener: Callable[[str, str, dict[str, Any] | None], None]) -> None:
        """Call ``listener(kind, key, obj_or_None)`` on every change (for controllers that react
        per object, e.g. Job -> Workload)."""
        self._listeners.append(listener)

    def handler(self, kind: str) -> Callable[[str, dict[str, Any]], None]:
        """An informer callback feeding this kind."""

        def on_event(event_type: str, obj: dict[str, Any]) -> None:
            self.apply(kind, event_type, obj)

        return on_event

    # -- consumption by the scheduling loop --------------------------------------------------

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def has_changes(self) -> bool:
        return any(self._dirty.values())

    def drain(self) -> dict[str, set[str]]:
        """Take the dirty keys of every kind (and clear them)."""
        taken = {kind: keys for kind, keys in self._dirty.items() if keys}
        self._dirty = {kind: set() for kind in KINDS}
        self._changed.clear()
        return taken

    def mark_changed(self) -> None:
        """Wake the scheduling loop without a new object (e.g. a timer or a failed write)."""
        self._changed.set()

    # -- lookups -----------------------------------------------------------------------------

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        return self.objects[kind].get(key)

    def all(self, kind: str) -> Iterator[dict[str, Any]]:
        return iter(self.objects[kind].values())

    def count(self, kind: str) -> int:
        return len(self.objects[kind])


def _newer(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether ``new`` is a later version than ``old``.

    resourceVersions are opaque by contract, but every Kubernetes release backs them with
    etcd's integer revision; comparing them as integers lets the operator record its own
    write responses immediately without a late watch event rolling the object back. A
    non-integer version is compared for equality only.
    """
    old_rv = (old.get("metadata") or {}).get("resourceVersion")
    new_rv = (new.get("metadata") or {}).get("resourceVersion")
    if old_rv is None or new_rv is None:
        return True
    if old_rv.isdigit() and new_rv.isdigit():
        return int(new_rv) > int(old_rv)
    return bool(old_rv != new_rv)
