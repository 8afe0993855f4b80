"""The Kueue kinds' validating webhooks are answered without kopf's handler machinery: the same
response kopf builds for the same verdict, on the same server, every other id still kopf's."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import kopf
import pytest
from kopf._core.actions.execution import Outcome
from kopf._core.engines.admission import build_response

from phalanx.operator.validation import validate_object
from phalanx.operator.webhooks import KUEUE_KINDS, PhalanxWebhookServer, direct_validations

DIRECT = direct_validations(validate_object)


def _review(obj: dict[str, Any], *, operation: str = "CREATE") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0d9c-42",
            "operation": operation,
            "userInfo": {"username": "alice"},
            "object": obj,
            **({"oldObject": obj} if operation == "UPDATE" else {}),
        },
    }


def _workload(count: object = 1) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "train", "namespace": "team-a"},
        "spec": {
            "queueName": "team-a",
            "podSets": [
                {
                    "name": "main",
                    "count": count,
                    "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}},
                }
            ],
        },
    }


def _kopfs(review: dict[str, Any], error: Exception | None) -> dict[str, Any]:
    """What kopf answers when the registered handler raised ``error`` (None: it passed)."""
    outcomes = {"validate-workloads": Outcome(final=True, exception=error)}
    return dict(build_response(request=review, outcomes=outcomes, warnings=[], jsonpatch=[]))  # type: ignore[arg-type]


def test_every_kueue_kind_has_a_direct_answer() -> None:
    assert set(DIRECT) == {f"validate-{plural}" for plural, _ in KUEUE_KINDS}


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_a_valid_workload_is_allowed_as_kopf_allows_it(operation: str) -> None:
    review = _review(_workload(), operation=operation)
    answer = DIRECT["validate-workloads"](review)
    assert answer == _kopfs(review, None)
    assert answer["response"] == {"uid": "0d9c-42", "allowed": True}


def test_an_invalid_workload_is_refused_with_kopfs_message_and_code() -> None:
    review = _review(_workload(count=-1))
    errors = validate_object(_workload(count=-1))
    assert errors, "the fixture must be invalid"
    message = "Workload 'train' is invalid: " + "; ".join(errors)
    answer = DIRECT["validate-workloads"](review)
    assert answer == _kopfs(review, kopf.AdmissionError(message, code=422))
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 422
    assert "spec.podSets[0].count" in answer["response"]["status"]["message"]


def test_an_object_without_kind_is_checked_as_its_webhooks_kind() -> None:
    cohort = {"metadata": {"name": "loop"}, "spec": {"parentName": "loop"}}
    answer = DIRECT["validate-cohorts"](_review(cohort))
    assert answer["response"]["allowed"] is False
    assert "Cohort 'loop' is invalid" in answer["response"]["status"]["message"]
    assert "spec.parentName" in answer["response"]["status"]["message"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _post(server: PhalanxWebhookServer, path: str, review: dict[str, Any]) -> Any:
    seen: list[str | None] = []

    async def kopf_fn(request: Any, *, webhook: str | None = None, **_: Any) -> dict[str, Any]:
        seen.append(webhook)
        return {"response": {"uid": request["request"]["uid"], "allowed": True, "kopf": True}}

    serving = server(kopf_fn)
    config = await anext(serving)
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{config['url']}/{path}", json=review) as response,
        ):
            assert response.status == 200, await response.text()
            return await response.json(), seen
    finally:
        await serving.aclose()


def test_the_server_answers_direct_ids_itself_and_hands_the_rest_to_kopf() -> None:
    server = PhalanxWebhookServer(addr="127.0.0.1", port=_free_port(), insecure=True, direct=DIRECT)
    bad = _review(_workload(count=-1))
    answer, seen = asyncio.run(_post(server, "validate-workloads", bad))
    assert seen == [] and answer["response"]["allowed"] is False
    server = PhalanxWebhookServer(addr="127.0.0.1", port=_free_port(), insecure=True, direct=DIRECT)
    answer, seen = asyncio.run(_post(server, "suspend-queued-jobs", bad))
    assert seen == ["suspend-queued-jobs"] and answer["response"]["kopf"] is True


def test_a_review_without_a_request_is_a_bad_request() -> None:
    with pytest.raises(aiohttp.web.HTTPBadRequest):
        DIRECT["validate-workloads"]({"kind": "AdmissionReview"})


def test_a_check_that_crashes_refuses_the_object_as_kopf_would() -> None:
    def broken(obj: dict[str, Any]) -> list[str]:
        raise ValueError("the check broke")

    review = _review(_workload())
    answer = direct_validations(broken)["validate-workloads"](review)
    assert answer == _kopfs(review, ValueError("the check broke"))
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"] == {"message": "the check broke", "code": 500}
