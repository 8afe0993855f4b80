"""The second phase of admission: from QuotaReserved to Admitted, as Kueue's workload
controller drives it.

The core reserves quota; this component, called by the scheduling loop between cycles,
looks at every workload holding quota in a ClusterQueue with AdmissionChecks and:

- keeps its ``status.admissionChecks`` listing exactly the checks that apply to its flavors
  (new ones Pending);
- writes ``Admitted=True`` once every check is Ready (the Job controller starts the Job
  then, with the checks' ``podSetUpdates``);
- a check in ``Rejected``: deactivates the workload (``spec.active: false``, a warning Event
  ``AdmissionCheckRejected``); the core then evicts it as any deactivated workload;
- a check in ``Retry``: evicts it (reason ``AdmissionCheck``), to be requeued at the check's
  retry time; when the eviction completes every check is reset to Pending.

The check states themselves are written by the check's controller (Phalanx's own for
ProvisioningRequests, :mod:`phalanx.operator.provisioning`, or any external one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from phalanx.admission.records import Phase
from phalanx.admission.scheduler import Scheduler
from phalanx.operator import admission_checks as ac
from phalanx.operator import conditions as cond
from phalanx.operator.decision_status import Eviction
from phalanx.operator.kube import API_ERRORS, WORKLOADS, KubeApi
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import StatusWriter, owned_conditions

__all__ = ["AdmissionCheckSync"]

logger = logging.getLogger(__name__)


class AdmissionCheckSync:
    def __init__(
        self,
        *,
        api: KubeApi,
        state: ClusterState,
        writer: StatusWriter,
        scheduler: Scheduler,
        start_eviction: Callable[[str, Eviction], None],
        spawn: Callable[[Any], None],
    ) -> None:
        self.api = api
        self.state = state
        self.writer = writer
        self.scheduler = scheduler
        self.start_eviction = start_eviction
        self.spawn = spawn
        self._busy: set[str] = set()
        self._with_checks: set[str] = set()
        """ClusterQueues that have (or had, in this process) admission checks: only their
        workloads can need anything here."""

    def checks_for(self, cluster_queue: str, admission: Mapping[str, Any] | None) -> list[str]:
        return ac.applicable_checks(self.state.get("ClusterQueue", cluster_queue), admission)

    def deactivation_message(self, key: str) -> str | None:
        """Kueue's eviction message for a workload deactivated by a Rejected check."""
        workload = self.state.get("Workload", key) or {}
        rejected = ac.in_state((workload.get("status") or {}).get("admissionChecks"), ac.REJECTED)
        if not rejected:
            return None
        return "The workload is deactivated due to " + ac.checks_message(rejected, ac.REJECTED)

    def reconcile(self, *, now_ms: int, evicting: Mapping[str, Eviction]) -> None:
        for name, queue in self.scheduler.queues.items():
            if queue.spec.admission_checks:
                self._with_checks.add(name)
            if name not in self._with_checks:
                continue
            for key, entry in queue.admitted.items():
                if key in evicting or key in self._busy or entry.phase != Phase.ADMITTED:
                    continue
                workload = self.state.get("Workload", key)
                if workload is not None:
                    self._workload(key, workload, name, now_ms=now_ms)

    def _workload(self, key: str, workload: dict[str, Any], cq: str, *, now_ms: int) -> None:
        status = workload.get("status") or {}
        conditions = status.get("conditions") or []
        admission = status.get("admission")
        if (
            not admission
            or not cond.is_true(conditions, cond.QUOTA_RESERVED)
            or cond.is_true(conditions, cond.FINISHED)
        ):
            return  # the admission write has not landed yet, or nothing is left to do
        if self.state.get("ClusterQueue", cq) is None:
            return  # Kueue syncs checks only against a ClusterQueue it can read
        states = status.get("admissionChecks") or []
        required = self.checks_for(cq, admission)
        if ac.sync_states(states, required, now_ms=now_ms) is not None:
            self._write(key, verb="checks")
            return
        rejected = ac.in_state(states, ac.REJECTED)
        if rejected:
            if (workload.get("spec") or {}).get("active", True):
                self._busy.add(key)
                self.spawn(self._deactivate(key, workload, rejected))
            return
        retry = ac.in_state(states, ac.RETRY)
        if retry:
            self.start_eviction(
                key,
                Eviction(
                    reason=ac.EVICTED_BY_CHECK,
                    message="Evicted due to " + ac.checks_message(retry, ac.RETRY),
                    cluster_queue=cq,
                    requeue_at=ac.retry_requeue_at(states) or now_ms,
                ),
            )
            return
        if ac.all_ready(states) and not cond.is_true(conditions, cond.ADMITTED):
            self._write(key, verb="admit-checks")

    def _write(self, key: str, *, verb: str) -> None:
        self._busy.add(key)
        self.spawn(self._apply(key, verb=verb))

    async def _apply(self, key: str, *, verb: str) -> None:
        def build(current: dict[str, Any]) -> dict[str, Any] | None:
            status = current.get("status") or {}
            admission = status.get("admission")
            if not admission or not cond.is_true(status.get("conditions"), cond.QUOTA_RESERVED):
                return None
            now = _now_ms()
            cq = str(admission.get("clusterQueue"))
            if self.state.get("ClusterQueue", cq) is None:
                return None
            required = self.checks_for(cq, admission)
            states = status.get("admissionChecks") or []
            synced = ac.sync_states(states, required, now_ms=now)
            if synced is not None:
                states = synced
            conditions = owned_conditions(current)
            admitted = cond.is_true(conditions, cond.ADMITTED)
            if not admitted:
                # Kueue never takes Admitted back here: a check that regresses after admission
                # acts through Retry or Rejected.
                conditions = ac.quota_reserved(conditions, ready=ac.all_ready(states), now_ms=now)
            if synced is None and cond.is_true(conditions, cond.ADMITTED) == admitted:
                return None
            return {"conditions": conditions, "admissionChecks": states}

        try:
            outcome = await self.writer.apply_status(key, build, verb=verb)
            if outcome.ok:
                workload = self.state.get("Workload", key)
                conditions = ((workload or {}).get("status") or {}).get("conditions")
                if workload is not None and verb == "admit-checks":
                    reserved = cond.condition(conditions, cond.QUOTA_RESERVED) or {}
                    since = ac.parse_time(reserved.get("lastTransitionTime"))
                    wait = max(0, _now_ms() - since) / 1000 if since else 0.0
                    admission = (workload.get("status") or {}).get("admission") or {}
                    logger.info("event=admitted_after_checks workload=%s", key)
                    await self.writer.event(
                        workload,
                        reason="Admitted",
                        message=f"Admitted by ClusterQueue {admission.get('clusterQueue')},"
                        f" wait time since reservation was {wait:.0f}s",
                    )
        finally:
            self._busy.discard(key)
            self.state.mark_changed()

    async def _deactivate(
        self, key: str, workload: dict[str, Any], rejected: list[Mapping[str, Any]]
    ) -> None:
        metadata = workload["metadata"]
        message = ac.checks_message(rejected, ac.REJECTED)
        try:
            updated = await self.api.patch(
                WORKLOADS,
                metadata["name"],
                {"spec": {"active": False}},
                namespace=metadata["namespace"],
            )
            self.state.apply("Workload", "MODIFIED", updated)
            logger.info("event=deactivated_by_check workload=%s message=%r", key, message)
            await self.writer.event(
                workload,
                reason="AdmissionCheckRejected",
                message=f"Deactivated due to {message}",
                warning=True,
            )
        except API_ERRORS as error:
            logger.warning("event=deactivate_failed workload=%s error=%r", key, error)
        finally:
            self._busy.discard(key)
            self.state.mark_changed()


def _now_ms() -> int:
    return int(time.time() * 1000)
