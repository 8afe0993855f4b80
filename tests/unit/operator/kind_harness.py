"""One integrated object (a JobSet, PyTorchJob, RayJob, TrainJob) and its KindController
against a scripted API: the shared part of the kinds' rule tests.

The StatusWriter's status apply is replaced by a plain merge into the scripted Workload (the
writer's own merge is tested apart); its Events are created through the scripted API, or
collected in ``events`` (``capture_events``).
"""

from __future__ import annotations

from typing import Any

from test_operator_jobsync_flow import ScriptedApi

from phalanx.operator.kinds import by_framework
from phalanx.operator.kindsync import KindController
from phalanx.operator.metrics import Metrics
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import StatusWriter, WriteOutcome

NS = "team-a"

# The flavors the harnesses' admissions name: nodeLabels that a start writes into pod templates.
FLAVORS = {"h100": {"gpu": "h100"}, "cpu": {"pool": "cpu"}}


class KindHarness:
    """``obj`` of ``framework`` stored as ``plural``/``state_kind`` in ``NS``; ``reconcile``
    runs the controller on it, ``admit`` (with ``assignments``) and ``evict`` play the
    scheduler's writes."""

    def __init__(
        self,
        *,
        framework: str,
        plural: str,
        state_kind: str,
        obj: dict[str, Any],
        assignments: list[tuple[str, int, dict[str, str]]],
        flavors: dict[str, dict[str, str]] | None = None,
        capture_events: bool = False,
        enabled: bool = True,
    ) -> None:
        self.api = ScriptedApi()
        self.state = ClusterState()
        self.plural, self.state_kind = plural, state_kind
        self.name = obj["metadata"]["name"]
        self.assignments = assignments
        self.events: list[str] = []
        writer = StatusWriter(self.api, self.state, Metrics())  # type: ignore[arg-type]
        writer.apply_status = self._apply_status  # type: ignore[method-assign]
        if capture_events:
            writer.event = self._event  # type: ignore[method-assign]
        self.ctl = KindController(
            by_framework()[framework],
            self.api,  # type: ignore[arg-type]
            self.state,
            writer,
            Metrics(),
            enabled=enabled,
        )
        self.api.objects[(plural, f"{NS}/{self.name}")] = obj
        self.state.apply(state_kind, "ADDED", self.api._bump(obj))
        for name, labels in (FLAVORS if flavors is None else flavors).items():
            self.state.apply(
                "ResourceFlavor", None, {"metadata": {"name": name}, "spec": {"nodeLabels": labels}}
            )

    async def _apply_status(self, key: str, build: Any, *, verb: str) -> WriteOutcome:
        del verb
        current = self.state.get("Workload", key)
        if current is None:
            return WriteOutcome(ok=False, status=404)
        status = build(current)
        if status is not None:
            wl = self.api.workload()
            wl["status"] = {**(wl.get("status") or {}), **status}
            self.state.apply("Workload", "MODIFIED", self.api._bump(wl))
        return WriteOutcome(ok=True)

    async def _event(self, obj: Any, *, reason: str, message: str, warning: bool = True) -> None:
        del obj, warning
        self.events.append(f"{reason}: {message}")

    def obj(self) -> dict[str, Any]:
        """The object as the scripted API holds it now."""
        return self.api.objects[(self.plural, f"{NS}/{self.name}")]

    async def reconcile(self) -> None:
        await self.ctl.reconcile(f"{NS}/{self.name}")

    def admit(self) -> None:
        """Quota reserved and admitted: one (pod set, count, flavors) of ``assignments`` per
        pod set."""
        wl = self.api.workload()
        wl["status"] = {
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                {"type": "Admitted", "status": "True", "reason": "Admitted"},
            ],
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [
                    {"name": name, "count": count, "flavors": flavors}
                    for name, count, flavors in self.assignments
                ],
            },
        }
        self.state.apply("Workload", "MODIFIED", self.api._bump(wl))

    def evict(self, reason: str = "Preempted") -> dict[str, Any]:
        """The scheduler's eviction (``Evicted=True``); returns the Workload as written."""
        wl = self.api.workload()
        wl["status"]["conditions"].append({"type": "Evicted", "status": "True", "reason": reason})
        self.state.apply("Workload", "MODIFIED", self.api._bump(wl))
        return wl

    def its_controller_writes(self, **status: Any) -> None:
        """The kind's own controller updates the object's status (merged at the top level)."""
        obj = self.obj()
        obj["status"] = {**(obj.get("status") or {}), **status}
        self.state.apply(self.state_kind, "MODIFIED", self.api._bump(obj))
