"""The start-up questions (``operator/access.py``): discovery is fetched once per API group, a
transport failure or a 5xx is asked again, a definite answer is not, and an answer that could
not be had is a *no* that a later question asks again.

The answers are scripted here because what is tested is the asking (how often, what is
retried); that the real API server answers these paths as scripted is shown end to end by
``test_operator_unsupported_kinds.py`` and ``test_operator_jobsets.py``, which depend on it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from phalanx.operator.access import ACCESS_REVIEWS, AccessProbe
from phalanx.operator.kube import ApiError, Resource

KUBEFLOW = {
    "/apis/kubeflow.org": {
        "preferredVersion": {"version": "v1"},
        "versions": [{"version": "v2beta1"}, {"version": "v1"}],
    },
    "/apis/kubeflow.org/v1": {
        "resources": [
            {"name": "pytorchjobs", "namespaced": True},
            {"name": "tfjobs", "namespaced": True},
        ]
    },
    "/apis/kubeflow.org/v2beta1": {"resources": [{"name": "mpijobs", "namespaced": True}]},
    "/apis/example.com": {"versions": [{"version": "v1"}]},
    "/apis/example.com/v1": {"resources": [{"name": "widgets", "namespaced": False}]},
}


class Scripted:
    """Answers from ``answers``; ``failures[path]`` is a list of errors raised first."""

    def __init__(self, *, allowed: bool = True) -> None:
        self.calls: list[tuple[str, str]] = []
        self.failures: dict[str, list[BaseException]] = {}
        self.allowed = allowed
        self.reviews: list[dict[str, Any]] = []

    async def __call__(self, method: str, path: str, *, body: Any = None) -> dict[str, Any]:
        self.calls.append((method, path))
        pending = self.failures.get(path)
        if pending:
            raise pending.pop(0)
        if path == ACCESS_REVIEWS:
            self.reviews.append(body["spec"]["resourceAttributes"])
            return {"status": {"allowed": self.allowed}}
        if path not in KUBEFLOW:
            raise ApiError(404, {"reason": "NotFound"}, method=method, path=path)
        return KUBEFLOW[path]

    def count(self, path: str) -> int:
        return sum(1 for _, p in self.calls if p == path)


async def _no_sleep(_: float) -> None:
    return None


def _probe(api: Scripted, **kwargs: Any) -> AccessProbe:
    return AccessProbe(api, sleep=_no_sleep, **kwargs)


def test_discovery_is_fetched_once_per_group_however_many_kinds_are_asked() -> None:
    api = Scripted()
    probe = _probe(api)

    async def ask() -> list[Resource | None]:
        return [
            await probe.served("kubeflow.org", plural)
            for plural in ("tfjobs", "mpijobs", "pytorchjobs", "xgboostjobs")
        ]

    found = asyncio.run(ask())
    assert found == [
        Resource("kubeflow.org", "v1", "tfjobs"),
        Resource("kubeflow.org", "v2beta1", "mpijobs"),
        Resource("kubeflow.org", "v1", "pytorchjobs"),
        None,
    ]
    assert api.count("/apis/kubeflow.org") == 1
    assert api.count("/apis/kubeflow.org/v1") == 1
    assert api.count("/apis/kubeflow.org/v2beta1") == 1


def test_a_cluster_scoped_kind_is_found_cluster_scoped() -> None:
    found = asyncio.run(_probe(Scripted()).served("example.com", "widgets"))
    assert found == Resource("example.com", "v1", "widgets", namespaced=False)


def test_an_absent_group_is_not_served_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    api = Scripted()
    with caplog.at_level(logging.WARNING, logger="phalanx.operator"):
        assert asyncio.run(_probe(api).served("ray.io", "rayjobs")) is None
    assert api.count("/apis/ray.io") == 1  # a 404 is an answer: not asked again
    assert not caplog.records


def test_a_transient_failure_is_asked_again_until_answered() -> None:
    api = Scripted()
    api.failures["/apis/kubeflow.org"] = [
        OSError("connection reset"),
        ApiError(503, {}, method="GET", path="/apis/kubeflow.org"),
    ]
    api.failures[ACCESS_REVIEWS] = [TimeoutError()]
    probe = _probe(api)

    async def ask() -> tuple[Resource | None, bool]:
        served = await probe.served("kubeflow.org", "tfjobs")
        assert served is not None
        return served, await probe.may_watch(served)

    served, allowed = asyncio.run(ask())
    assert served == Resource("kubeflow.org", "v1", "tfjobs")
    assert allowed
    assert api.count("/apis/kubeflow.org") == 3


def test_a_definite_no_is_not_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    api = Scripted()
    api.failures["/apis/kubeflow.org"] = [
        ApiError(403, {"reason": "Forbidden"}, method="GET", path="/apis/kubeflow.org")
    ]
    with caplog.at_level(logging.WARNING, logger="phalanx.operator"):
        assert asyncio.run(_probe(api).served("kubeflow.org", "tfjobs")) is None
    assert api.count("/apis/kubeflow.org") == 1
    assert "event=start_question_failed" in caplog.text


def test_an_answer_never_had_is_a_no_and_is_asked_again_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = Scripted()
    api.failures["/apis/kubeflow.org"] = [OSError("down")] * 3
    probe = _probe(api, attempts=3)

    async def ask() -> tuple[Resource | None, Resource | None]:
        return (
            await probe.served("kubeflow.org", "tfjobs"),
            await probe.served("kubeflow.org", "tfjobs"),
        )

    with caplog.at_level(logging.WARNING, logger="phalanx.operator"):
        first, second = asyncio.run(ask())
    assert first is None  # three failures: a no, logged
    assert "attempts=3" in caplog.text
    assert second == Resource("kubeflow.org", "v1", "tfjobs")  # not cached as absent
    assert api.count("/apis/kubeflow.org") == 4


def test_may_watch_asks_list_and_watch_in_every_watched_namespace() -> None:
    api = Scripted()
    probe = _probe(api, namespaces=("team-a", "team-b"))
    tfjobs = Resource("kubeflow.org", "v1", "tfjobs")
    assert asyncio.run(probe.may_watch(tfjobs))
    assert [(r["namespace"], r["verb"]) for r in api.reviews] == [
        ("team-a", "list"),
        ("team-a", "watch"),
        ("team-b", "list"),
        ("team-b", "watch"),
    ]
    cluster_scoped = Resource("example.com", "v1", "widgets", namespaced=False)
    api.reviews.clear()
    assert asyncio.run(probe.may_watch(cluster_scoped))
    assert [r.get("namespace") for r in api.reviews] == [None, None]


def test_may_watch_is_no_at_the_first_refusal_or_unanswered_review() -> None:
    denied = Scripted(allowed=False)
    tfjobs = Resource("kubeflow.org", "v1", "tfjobs")
    assert not asyncio.run(_probe(denied).may_watch(tfjobs))
    assert len(denied.reviews) == 1

    away = Scripted()
    away.failures[ACCESS_REVIEWS] = [OSError("down")] * 4
    assert not asyncio.run(_probe(away).may_watch(tfjobs))
    assert away.count(ACCESS_REVIEWS) == 4


def test_once_a_question_went_unanswered_the_next_are_asked_once_until_one_is_answered() -> None:
    # An API server away at start must not delay the start by every question's backoff.
    api = Scripted()
    api.failures["/apis/kubeflow.org"] = [OSError("down")] * 4
    api.failures["/apis/ray.io"] = [OSError("down")] * 4
    api.failures[ACCESS_REVIEWS] = [OSError("down")]
    probe = _probe(api)
    tfjobs = Resource("kubeflow.org", "v1", "tfjobs")

    async def ask() -> tuple[Resource | None, Resource | None, bool, bool]:
        return (
            await probe.served("kubeflow.org", "tfjobs"),  # 4 attempts: away
            await probe.served("ray.io", "rayjobs"),  # asked once
            await probe.may_watch(tfjobs),  # asked once: no
            await probe.may_watch(tfjobs),  # answered: back to full attempts
        )

    assert asyncio.run(ask()) == (None, None, False, True)
    assert api.count("/apis/kubeflow.org") == 4
    assert api.count("/apis/ray.io") == 1
    assert api.count(ACCESS_REVIEWS) == 1 + 1 + 1  # the failed one, then list and watch
