"""Queued objects of kinds Kueue integrates and Phalanx does not: which are told, and once."""

from __future__ import annotations

import asyncio
from typing import Any

from phalanx.operator.configfile import FRAMEWORKS
from phalanx.operator.integration import KUEUE_FRAMEWORKS
from phalanx.operator.unsupported import (
    LEADER_WORKER_SET,
    UNSUPPORTED,
    UnsupportedKinds,
    told_about,
    unsupported_message,
)

DEPLOYMENT = next(k for k in UNSUPPORTED if k.framework == "deployment")


def obj(uid: str, *, labels: dict[str, str] | None = None, owned: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": f"o-{uid}", "namespace": "ns", "uid": uid}
    metadata["labels"] = labels if labels is not None else {"kueue.x-k8s.io/queue-name": "lq"}
    if owned:
        metadata["ownerReferences"] = [{"kind": "X", "name": "p", "uid": "p", "controller": True}]
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata}


def test_every_kueue_framework_is_either_integrated_or_listed_as_unsupported() -> None:
    # Catches a Kueue kind that would be left alone without a word.
    listed = {k.framework for k in UNSUPPORTED}
    assert listed.isdisjoint(FRAMEWORKS)
    assert listed | set(FRAMEWORKS) == set(KUEUE_FRAMEWORKS)


def test_only_labelled_objects_nothing_controls_are_told() -> None:
    assert told_about(obj("a"))
    assert not told_about(obj("b", labels={}))
    assert not told_about(obj("c", owned=True)), "an owner's object: its owner's business"


def test_the_message_names_the_kind_the_framework_and_what_to_do() -> None:
    message = unsupported_message(DEPLOYMENT, supported=("batch/job", "pod"))
    assert message.startswith("Deployment has label kueue.x-k8s.io/queue-name")
    assert "'deployment'" in message and "batch/job, pod" in message
    assert "remove the label" in message


class RecordingWriter:
    """Records the Events the component asks for (the writer's API side is tested apart)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, bool]] = []

    async def event(self, o: dict[str, Any], *, reason: str, message: str, warning: bool) -> None:
        self.events.append((o["metadata"]["name"], reason, warning))


def test_each_object_is_told_once_until_it_is_deleted() -> None:
    # Catches an Event per update (every MODIFIED) or none after a delete and re-create.
    writer = RecordingWriter()

    async def main() -> None:
        told = UnsupportedKinds(writer, supported=FRAMEWORKS)  # type: ignore[arg-type]
        handler = told.handler(DEPLOYMENT)
        handler("ADDED", obj("1"))
        handler("ADDED", obj("2", labels={}))
        told.start()
        await asyncio.sleep(0.05)
        handler("MODIFIED", obj("1"))
        await asyncio.sleep(0.05)
        handler("DELETED", obj("1"))
        handler("ADDED", obj("1"))
        await asyncio.sleep(0.05)
        await told.stop()

    asyncio.run(main())
    assert writer.events == [
        ("o-1", "IntegrationNotSupported", True),
        ("o-1", "IntegrationNotSupported", True),
    ]


def test_nothing_is_told_before_this_replica_schedules() -> None:
    # Catches a standby writing Events (its informers deliver, its workers must not run).
    writer = RecordingWriter()

    async def main() -> None:
        told = UnsupportedKinds(writer, supported=FRAMEWORKS)  # type: ignore[arg-type]
        told.handler(DEPLOYMENT)("ADDED", obj("1"))
        await asyncio.sleep(0.05)

    asyncio.run(main())
    assert writer.events == []


def test_an_integrated_kind_left_disabled_is_told_it_is_not_enabled() -> None:
    # Catches a disabled LeaderWorkerSet told "no integration" (wrong advice: enable it).
    writer = RecordingWriter()

    async def main() -> None:
        told = UnsupportedKinds(writer, supported=FRAMEWORKS)  # type: ignore[arg-type]
        told.handler(LEADER_WORKER_SET)("ADDED", obj("1"))
        told.start()
        await asyncio.sleep(0.05)
        await told.stop()

    asyncio.run(main())
    assert writer.events == [("o-1", "IntegrationNotEnabled", False)]
