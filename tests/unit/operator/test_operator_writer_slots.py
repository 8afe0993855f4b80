"""Decisions go first: pending explanations never take a decision's slot, and wait while
decisions queue for one (up to ``pending_yield_seconds``, so they still trickle on).

An API that holds every PATCH until released stands in for a slow API server; what is
checked is which writes the writer has sent, and in what order.
"""

from __future__ import annotations

import asyncio
from typing import Any

from phalanx.operator.metrics import Metrics
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import StatusWriter

KEYS = ("a", "b", "c", "p")


class HeldApi:
    """Records each status PATCH as it is sent; answers it once ``release`` is set."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.in_flight: set[str] = set()
        self.release = asyncio.Event()

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        name = kwargs["body"]["metadata"]["name"]
        self.sent.append(name)
        self.in_flight.add(name)
        try:
            await self.release.wait()
        finally:
            self.in_flight.discard(name)
        return {}


def admit(current: dict[str, Any]) -> dict[str, Any] | None:
    return {"admission": {"clusterQueue": "cq"}, "conditions": []}


def _writer(api: HeldApi, *, yield_seconds: float) -> StatusWriter:
    state = ClusterState()
    for name in KEYS:
        state.apply(
            "Workload",
            None,
            {"metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"}, "status": {}},
        )
    return StatusWriter(
        api,  # type: ignore[arg-type]
        state,
        Metrics(),
        concurrency=2,
        pending_concurrency=1,
        pending_yield_seconds=yield_seconds,
        pending_min_interval=0.0,
    )


async def _three_decisions_then_an_explanation(writer: StatusWriter) -> list[asyncio.Task[None]]:
    """Start the writer, send decisions for a, b and c, then ask to explain p."""
    writer.start()
    decisions = [
        asyncio.create_task(writer.apply_status(f"ns/{n}", admit, verb="admit")) for n in "abc"
    ]
    await asyncio.sleep(0.05)
    writer.explain("ns/p", message="waiting for quota", inadmissible=False)
    return decisions


def test_an_explanation_waits_until_no_decision_queues_for_a_slot() -> None:
    async def main() -> list[str]:
        api = HeldApi()
        writer = _writer(api, yield_seconds=5.0)
        decisions = await _three_decisions_then_an_explanation(writer)
        await asyncio.sleep(0.1)
        # a and b hold both decision slots and c waits for one: the explanation waits too.
        assert api.sent == ["a", "b"], api.sent
        api.release.set()
        await asyncio.gather(*decisions)
        await asyncio.sleep(0.05)
        await writer.stop()
        return api.sent

    assert asyncio.run(main()) == ["a", "b", "c", "p"]


def test_an_explanation_waits_no_longer_than_its_yield_and_takes_no_decision_slot() -> None:
    async def main() -> None:
        api = HeldApi()
        writer = _writer(api, yield_seconds=0.1)
        decisions = await _three_decisions_then_an_explanation(writer)
        await asyncio.sleep(0.3)
        # The decision backlog never cleared (a and b are held), yet the explanation went
        # out after its yield, on a slot of its own: c still waits for a decision slot.
        assert api.in_flight == {"a", "b", "p"}, api.in_flight
        assert "c" not in api.sent
        api.release.set()
        await asyncio.gather(*decisions)
        await writer.stop()

    asyncio.run(main())
