"""One running Phalanx operator: its clients, informers, state and background tasks.

kopf's ``on.startup``/``on.cleanup`` call :meth:`PhalanxOperator.startup` and
:meth:`PhalanxOperator.cleanup`; everything here runs on kopf's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from phalanx.operator import kubeconfig
from phalanx.operator.config import OperatorConfig
from phalanx.operator.informer import Informer
from phalanx.operator.kube import JOBS, NODES, PODS, WORKLOADS, KubeApi, Resource
from phalanx.operator.metrics import Metrics
from phalanx.operator.state import ClusterState
from phalanx.operator.validation import validate_object

__all__ = ["PhalanxOperator"]

logger = logging.getLogger(__name__)

# Pods that finished hold no capacity; a field selector makes the server drop them (it sends
# DELETED when a pod leaves the selection), which halves pod traffic on a busy cluster.
_LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


class PhalanxOperator:
    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self.auth = kubeconfig.load(config.kubeconfig, context=config.context)
        self.state = ClusterState()
        self.metrics = Metrics()
        self.api: KubeApi | None = None
        self.informers: list[Informer] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._components: list[Any] = []
        self._started = False

    @property
    def synced(self) -> bool:
        return bool(self.informers) and all(i.synced.is_set() for i in self.informers)

    def validate_object(self, obj: dict[str, Any]) -> list[str]:
        return validate_object(obj)

    def spawn(self, coro: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        task.add_done_callback(_log_crash)
        self._tasks.append(task)
        return task

    async def startup(self) -> None:
        if self._started:
            return
        self._started = True
        self.api = KubeApi(self.auth)
        if self.config.metrics_port:
            self.metrics.serve(self.config.metrics_port, addr=self.config.metrics_addr)
        self._start_informer(WORKLOADS, "Workload")
        self._start_informer(JOBS, "Job", label_selector="kueue.x-k8s.io/queue-name")
        self._start_informer(PODS, "Pod", field_selector=_LIVE_PODS)
        self._start_informer(NODES, "Node")
        for factory in _COMPONENT_FACTORIES:
            component = factory(self)
            self._components.append(component)
            start = getattr(component, "start", None)
            if start is not None:
                start()
        logger.info(
            "event=operator_started server=%s namespaces=%s",
            self.auth.server,
            ",".join(self.config.namespaces) or "*",
        )

    def _start_informer(
        self,
        resource: Resource,
        kind: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> None:
        assert self.api is not None
        namespaces: tuple[str | None, ...] = (
            self.config.namespaces if resource.namespaced and self.config.namespaces else (None,)
        )
        for namespace in namespaces:
            informer = Informer(
                self.api,
                resource,
                self.state.handler(kind),
                namespace=namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                on_synced=self.state.mark_changed,
            )
            self.informers.append(informer)
            self._tasks.append(informer.start())

    async def wait_synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.informers))

    async def cleanup(self) -> None:
        for component in reversed(self._components):
            stop = getattr(component, "stop", None)
            if stop is not None:
                with contextlib.suppress(Exception):
                    await stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.api is not None:
            await self.api.close()
        logger.info("event=operator_stopped")


def _log_crash(task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        logger.error("event=task_crashed task=%s error=%r", task.get_name(), error)


# Components (controllers, the scheduling loop) created at startup, in order; each is a
# callable taking the operator and returning an object with optional start()/async stop().
_COMPONENT_FACTORIES: list[Callable[[PhalanxOperator], Any]] = []
