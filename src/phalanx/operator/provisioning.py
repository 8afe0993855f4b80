"""Kueue's ProvisioningRequest admission check controller
(``kueue.x-k8s.io/provisioning-request``).

Per workload holding quota, for each of its checks served by this controller: make the
ProvisioningRequest of the current attempt (PodTemplates first, owned by the Workload, then the
request owned by the Workload, then the templates handed to the request so they go with it),
read the autoscaler's answer from the request's conditions into the check's state
(:func:`provisioning_rules.check_update`), delete the requests no longer used, and all of them
once the workload is evicted or finished. It also keeps the ``Active`` condition of its
AdmissionChecks: True when ``parameters`` names an existing ProvisioningRequestConfig.

It reacts to changes of Workloads, ProvisioningRequests, AdmissionChecks and configs, and
resyncs every few seconds. One worker: the requests of one workload are made in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from phalanx.api.admissioncheck import PROVISIONING_REQUEST_CONTROLLER
from phalanx.operator import admission_checks as ac
from phalanx.operator import conditions as cond
from phalanx.operator import provisioning_rules as rules
from phalanx.operator.kube import TRANSIENT_ERRORS, ApiError, KubeApi, Resource
from phalanx.operator.retry import Backoff
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import StatusWriter, owned_conditions

__all__ = ["ADMISSION_CHECKS", "POD_TEMPLATES", "PROVISIONING_REQUESTS", "ProvisioningController"]

logger = logging.getLogger(__name__)

PROVISIONING_REQUESTS = Resource("autoscaling.x-k8s.io", "v1", "provisioningrequests")
POD_TEMPLATES = Resource("", "v1", "podtemplates")
ADMISSION_CHECKS = Resource("kueue.x-k8s.io", "v1beta2", "admissionchecks", namespaced=False)

_ERRORS: tuple[type[BaseException], ...] = (ApiError, *TRANSIENT_ERRORS)
_ALL = "*"


class ProvisioningController:
    def __init__(
        self,
        api: KubeApi,
        state: ClusterState,
        writer: StatusWriter,
        *,
        resync_seconds: float = 5.0,
    ) -> None:
        self.api = api
        self.state = state
        self.writer = writer
        self.resync_seconds = resync_seconds
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._requests_of: dict[str, set[str]] = {}  # workload uid -> request keys
        self._task: asyncio.Task[None] | None = None
        self._failures: dict[str, int] = {}
        self.backoff = Backoff(initial=0.5, factor=2.0, maximum=30.0)
        state.subscribe(self._on_change)

    def start(self) -> None:
        self._enqueue(_ALL)
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="phalanx-provisioning"
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -- change routing -------------------------------------------------------------------------

    def _on_change(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        if kind == "Workload":
            if obj is not None and (obj.get("status") or {}).get("admissionChecks"):
                self._enqueue(key)
        elif kind == "ProvisioningRequest":
            self._track_request(key, obj)
        elif kind in ("AdmissionCheck", "ProvisioningRequestConfig"):
            self._enqueue(_ALL)

    def _track_request(self, key: str, obj: dict[str, Any] | None) -> None:
        for uid, keys in list(self._requests_of.items()):
            keys.discard(key)
            if not keys:
                del self._requests_of[uid]
        if obj is None:
            return
        namespace = key.partition("/")[0]
        for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
            if ref.get("kind") == "Workload" and ref.get("uid"):
                self._requests_of.setdefault(str(ref["uid"]), set()).add(key)
                self._enqueue(f"{namespace}/{ref.get('name')}")

    def _enqueue(self, key: str) -> None:
        if key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    # -- the worker -----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.resync_seconds):
                    key = await self._queue.get()
            except TimeoutError:
                key = _ALL
            self._queued.discard(key)
            if key == _ALL:
                await self._sync_checks()
                for wl_key, workload in list(self.state.objects["Workload"].items()):
                    if (workload.get("status") or {}).get("admissionChecks"):
                        await self._guarded(wl_key)
            else:
                await self._guarded(key)

    async def _guarded(self, key: str) -> None:
        try:
            await self._sync(key)
        except _ERRORS as error:
            if (
                isinstance(error, ApiError)
                and error.status == 403
                and "being terminated" in str(error)
            ):
                return  # its namespace is going away, and the workload with it
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            delay = self.backoff.delay(failures - 1)
            logger.warning(
                "event=provisioning_sync_failed workload=%s retry_in=%.1f error=%r",
                key,
                delay,
                error,
            )
            asyncio.get_running_loop().call_later(delay, self._enqueue, key)
        else:
            self._failures.pop(key, None)

    async def _sync_checks(self) -> None:
        """Kueue's provisioning admission-check reconciler: Active when the config exists."""
        configs = self.state.objects["ProvisioningRequestConfig"]
        for name, check in list(self.state.objects["AdmissionCheck"].items()):
            wanted = rules.check_active(check, configs)
            if wanted is None:
                continue
            current = cond.condition((check.get("status") or {}).get("conditions"), "Active")
            if current is not None and current.get("status") == wanted["status"]:
                continue
            conditions = cond.set_condition(
                (check.get("status") or {}).get("conditions"),
                "Active",
                status=wanted["status"] == "True",
                reason=wanted["reason"],
                message=wanted["message"],
                now_ms=_now_ms(),
                generation=(check.get("metadata") or {}).get("generation"),
            )
            try:
                updated = await self.api.patch(
                    ADMISSION_CHECKS,
                    name,
                    {"status": {"conditions": conditions}},
                    subresource="status",
                )
                self.state.apply("AdmissionCheck", "MODIFIED", updated)
                logger.info(
                    "event=admission_check_active check=%s active=%s", name, wanted["status"]
                )
            except _ERRORS as error:
                logger.warning("event=admission_check_status_failed check=%s error=%r", name, error)

    # -- one workload ---------------------------------------------------------------------------

    def _owned_requests(self, workload: dict[str, Any]) -> list[dict[str, Any]]:
        uid = str((workload.get("metadata") or {}).get("uid"))
        out = []
        for key in sorted(self._requests_of.get(uid, ())):
            request = self.state.get("ProvisioningRequest", key)
            if request is not None:
                out.append(request)
        return out

    def _configs(self, names: list[str]) -> dict[str, tuple[rules.Config | None, str]]:
        configs = self.state.objects["ProvisioningRequestConfig"]
        out = {}
        for name in names:
            check = self.state.get("AdmissionCheck", name)
            if (check or {}).get("spec", {}).get(
                "controllerName"
            ) != PROVISIONING_REQUEST_CONTROLLER:
                continue
            out[name] = rules.config_for(check, configs)
        return out

    async def _sync(self, key: str) -> None:
        workload = self.state.get("Workload", key)
        if workload is None:
            return
        status = workload.get("status") or {}
        conditions = status.get("conditions") or []
        finished = cond.is_true(conditions, cond.FINISHED)
        evicted = cond.is_true(conditions, cond.EVICTED)
        reserved = cond.is_true(conditions, cond.QUOTA_RESERVED) and status.get("admission")
        owned = self._owned_requests(workload)
        if finished or evicted:
            # Kueue (CleanupProvisioningRequestsOnEviction): the requests go with the
            # reservation; the next attempt, if any, makes a new one.
            await self._delete(owned, keep=set())
            return
        if not reserved:
            return
        states = {str(c.get("name")): c for c in status.get("admissionChecks") or ()}
        configs = self._configs(sorted(states))
        if not configs:
            return
        wl_name = str(workload["metadata"]["name"])
        active: dict[str, dict[str, Any]] = {}
        for check, (config, _) in configs.items():
            if config is None or not rules.request_needed(workload, config):
                continue
            best: tuple[int, dict[str, Any]] | None = None
            for request in owned:
                attempt = rules.attempt_of(request["metadata"]["name"], wl_name, check)
                if attempt is None or not rules.synced_with_config(request, config):
                    continue
                if best is None or attempt > best[0]:
                    best = (attempt, request)
            if best is not None:
                active[check] = best[1]
        await self._write_states(key, configs, active)
        await self._delete(owned, keep={r["metadata"]["name"] for r in active.values()})
        workload = self.state.get("Workload", key) or workload
        states = {
            str(c.get("name")): c
            for c in (workload.get("status") or {}).get("admissionChecks") or ()
        }
        for check, (config, _) in configs.items():
            if config is None or not rules.request_needed(workload, config):
                continue
            attempt = rules.next_attempt(
                states.get(check), active.get(check), workload=workload, check=check
            )
            if attempt is not None:
                await self._create(workload, check, config, attempt)

    async def _write_states(
        self,
        key: str,
        configs: dict[str, tuple[rules.Config | None, str]],
        active: dict[str, dict[str, Any]],
    ) -> None:
        changed: list[tuple[str, str, str]] = []

        def build(current: dict[str, Any]) -> dict[str, Any] | None:
            changed.clear()
            status = current.get("status") or {}
            if not cond.is_true(status.get("conditions"), cond.QUOTA_RESERVED):
                return None
            states = [dict(c) for c in status.get("admissionChecks") or ()]
            now = _now_ms()
            out = states
            for check, (config, _) in configs.items():
                state = next((c for c in out if c.get("name") == check), None)
                if state is None:
                    continue
                update = rules.check_update(
                    current,
                    state,
                    check=check,
                    config=config,
                    request=active.get(check),
                )
                if update is None:
                    continue
                if update.get("state") != state.get("state"):
                    changed.append((check, str(state.get("state")), str(update.get("state"))))
                out = ac.with_state(out, update, now_ms=now)
            if out == states:
                return None
            # Every apply carries the conditions Phalanx owns (an omitted one would go).
            return {"conditions": owned_conditions(current), "admissionChecks": out}

        outcome = await self.writer.apply_status(key, build, verb="provisioning")
        workload = self.state.get("Workload", key)
        if not outcome.ok or workload is None:
            return
        for check, before, after in changed:
            state: dict[str, Any] = next(
                (
                    c
                    for c in (workload.get("status") or {}).get("admissionChecks") or ()
                    if c.get("name") == check
                ),
                {},
            )
            message = f"Admission check {check} updated state from {before} to {after}"
            if state.get("message"):
                message += f" with message: {state['message']}"
            logger.info(
                "event=admission_check_updated workload=%s check=%s state=%s", key, check, after
            )
            await self.writer.event(workload, reason="AdmissionCheckUpdated", message=message)

    async def _delete(self, requests: list[dict[str, Any]], *, keep: set[str]) -> None:
        for request in requests:
            metadata = request["metadata"]
            if metadata["name"] in keep or metadata.get("deletionTimestamp"):
                continue
            try:
                await self.api.delete(
                    PROVISIONING_REQUESTS, metadata["name"], namespace=metadata["namespace"]
                )
                logger.info(
                    "event=provisioning_request_deleted request=%s/%s",
                    metadata["namespace"],
                    metadata["name"],
                )
            except ApiError as error:
                if not error.not_found:
                    raise

    async def _create(
        self, workload: dict[str, Any], check: str, config: rules.Config, attempt: int
    ) -> None:
        namespace = workload["metadata"]["namespace"]
        name = rules.request_name(str(workload["metadata"]["name"]), check, attempt)
        flavors = self.state.objects["ResourceFlavor"]
        pod_sets = rules.merged_pod_sets(workload, config)
        templates = []
        for merged in pod_sets:
            template_name = rules.pod_template_name(name, merged.name)
            body = rules.pod_template(workload, merged, name=template_name, flavors=flavors)
            await self._create_ignoring_conflict(POD_TEMPLATES, body, namespace=namespace)
            templates.append((template_name, merged.count))
        body = rules.provisioning_request(workload, config, name=name, pod_sets=templates)
        created = await self._create_ignoring_conflict(
            PROVISIONING_REQUESTS, body, namespace=namespace
        )
        if created is None:
            return
        self.state.apply("ProvisioningRequest", "ADDED", created)
        logger.info(
            "event=provisioning_request_created request=%s/%s attempt=%d", namespace, name, attempt
        )
        await self.writer.event(
            workload,
            reason="ProvisioningRequestCreated",
            message=f'Created ProvisioningRequest: "{name}"',
        )
        # The templates go with their request (garbage collected when it is deleted).
        owner = {"metadata": {"ownerReferences": [rules.request_owner(created)]}}
        for template_name, _ in templates:
            with contextlib.suppress(ApiError):
                await self.api.patch(POD_TEMPLATES, template_name, owner, namespace=namespace)

    async def _create_ignoring_conflict(
        self, resource: Resource, body: dict[str, Any], *, namespace: str
    ) -> dict[str, Any] | None:
        try:
            return await self.api.create(resource, body, namespace=namespace)
        except ApiError as error:
            if error.conflict:
                return None  # made by an earlier pass; its watch event is on the way
            raise


def _now_ms() -> int:
    return int(time.time() * 1000)
