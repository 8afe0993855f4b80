"""The conversion webhook's I/O: ConversionReviews answered on the webhook server's /convert,
and the CRDs' client config kept pointing at the server (and given back on a clean exit)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp.web
import pytest
import yaml

from phalanx.api.v1beta1 import V1BETA1_API_VERSION
from phalanx.operator.conversion import (
    CONVERTED_CRDS,
    ConversionWebhook,
    conversion_client_config,
    review,
)
from phalanx.operator.kube import ApiError

REPO = Path(__file__).resolve().parents[3]
V1BETA2 = "kueue.x-k8s.io/v1beta2"
CA = "Q0EgYnVuZGxl"


def _cq(api_version: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "ClusterQueue",
        "metadata": {"name": "q"},
        "spec": spec,
    }


def _review(desired: str, *objects: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": "u-1", "desiredAPIVersion": desired, "objects": list(objects)},
    }


# -- the review -----------------------------------------------------------------------------------


def test_a_review_converts_every_object_in_order_and_echoes_the_uid() -> None:
    answer = review(_review(V1BETA1_API_VERSION, _cq(V1BETA2, cohortName="a"), _cq(V1BETA2)))
    assert answer["kind"] == "ConversionReview"
    assert answer["apiVersion"] == "apiextensions.k8s.io/v1"
    response = answer["response"]
    assert response["uid"] == "u-1"
    assert response["result"] == {"status": "Success"}
    assert response["convertedObjects"] == [
        _cq(V1BETA1_API_VERSION, cohort="a"),
        _cq(V1BETA1_API_VERSION),
    ]


def test_an_object_that_cannot_be_converted_fails_the_review_with_its_name() -> None:
    bad = {**_cq(V1BETA2), "apiVersion": "kueue.x-k8s.io/v1alpha1"}
    response = review(_review(V1BETA1_API_VERSION, _cq(V1BETA2), bad))["response"]
    assert response["result"]["status"] == "Failure"
    assert "ClusterQueue q" in response["result"]["message"]
    assert response["convertedObjects"] == []
    assert response["uid"] == "u-1"


def test_a_body_that_is_not_a_conversion_review_is_a_bad_request() -> None:
    with pytest.raises(aiohttp.web.HTTPBadRequest):
        review({"kind": "AdmissionReview", "request": {}})


def test_the_server_answers_reviews_on_convert_and_hands_every_other_id_to_kopf() -> None:
    seen: list[str | None] = []

    async def kopf_fn(request: Any, *, webhook: str | None = None, **_: Any) -> dict[str, Any]:
        seen.append(webhook)
        return {"kopf": True}

    async def server(fn: Any) -> AsyncIterator[dict[str, Any]]:
        # What kopf's server does with POST <path>/<id>: call fn with the id.
        converted = await fn(
            _review(V1BETA1_API_VERSION, _cq(V1BETA2, cohortName="a")), webhook="convert"
        )
        admitted = await fn({"kind": "AdmissionReview"}, webhook="validate-clusterqueues")
        yield {"url": "https://127.0.0.1:9443", "caBundle": CA, "answers": [converted, admitted]}

    conversion = ConversionWebhook(restore_on_exit=False)

    async def run() -> list[dict[str, Any]]:
        return [c async for c in conversion.serving(server)(kopf_fn)]

    (config,) = asyncio.run(run())
    converted, admitted = config["answers"]
    assert converted["response"]["convertedObjects"][0]["spec"] == {"cohort": "a"}
    assert admitted == {"kopf": True} and seen == ["validate-clusterqueues"]
    # Each config the server yields is what the CRDs get (at the /convert path).
    assert conversion.client_config == {"url": "https://127.0.0.1:9443/convert", "caBundle": CA}


def test_the_crd_client_config_is_the_servers_at_the_convert_path() -> None:
    assert conversion_client_config({"url": "https://h:1/hooks/", "caBundle": CA}) == {
        "url": "https://h:1/hooks/convert",
        "caBundle": CA,
    }
    service = {"namespace": "phalanx-system", "name": "phalanx-webhook", "port": 443}
    assert conversion_client_config({"service": service, "caBundle": CA}) == {
        "service": {**service, "path": "/convert"},
        "caBundle": CA,
    }


# -- keeping the CRDs pointing here ---------------------------------------------------------------


class FakeApi:
    """The CRDs as the API server holds them; merge patches applied like the server does."""

    def __init__(self, crds: dict[str, dict[str, Any]]) -> None:
        self.crds = crds
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.fail_patch: int | None = None

    async def get(self, resource: Any, name: str, **_: Any) -> dict[str, Any]:
        if name not in self.crds:
            raise ApiError(404, {"reason": "NotFound"}, method="GET", path=name)
        return copy.deepcopy(self.crds[name])

    async def patch(
        self, resource: Any, name: str, patch: dict[str, Any], **_: Any
    ) -> dict[str, Any]:
        if self.fail_patch is not None:
            raise ApiError(self.fail_patch, {"reason": "Forbidden"}, method="PATCH", path=name)
        crd = self.crds[name]
        assert patch["metadata"]["resourceVersion"] == crd["metadata"]["resourceVersion"]
        self.patches.append((name, patch))
        _merge(crd["spec"], patch["spec"])
        crd["metadata"]["resourceVersion"] = str(int(crd["metadata"]["resourceVersion"]) + 1)
        return crd


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _generated_crd(name: str) -> dict[str, Any]:
    path = REPO / "crds" / f"kueue.x-k8s.io_{name.split('.')[0]}.yaml"
    crd = yaml.safe_load(path.read_text())
    crd["metadata"]["resourceVersion"] = "1"
    return dict(crd)


def _client_config(api: FakeApi, name: str) -> dict[str, Any]:
    return dict(api.crds[name]["spec"]["conversion"]["webhook"]["clientConfig"])


LOCAL = {"url": "https://127.0.0.1:9443", "caBundle": CA}


def test_sync_points_each_converted_crd_at_the_server_once() -> None:
    api = FakeApi({name: _generated_crd(name) for name in CONVERTED_CRDS})
    conversion = ConversionWebhook(restore_on_exit=False)
    conversion.advertise(LOCAL)
    patched = asyncio.run(conversion.sync(api, conversion.client_config or {}))  # type: ignore[arg-type]
    assert sorted(patched) == sorted(CONVERTED_CRDS)
    for name in CONVERTED_CRDS:
        assert _client_config(api, name) == {
            "url": "https://127.0.0.1:9443/convert",
            "caBundle": CA,
        }
    # Nothing differs any more: no write.
    assert asyncio.run(conversion.sync(api, conversion.client_config or {})) == []  # type: ignore[arg-type]
    assert len(api.patches) == len(CONVERTED_CRDS)


def test_behind_a_service_only_the_ca_bundle_is_added() -> None:
    name = "clusterqueues.kueue.x-k8s.io"
    api = FakeApi({name: _generated_crd(name)})
    conversion = ConversionWebhook(restore_on_exit=False, crd_names=[name])
    service = {"namespace": "phalanx-system", "name": "phalanx-webhook", "port": 443}
    conversion.advertise({"service": service, "caBundle": CA})
    asyncio.run(conversion.sync(api, conversion.client_config or {}))  # type: ignore[arg-type]
    assert _client_config(api, name) == {"service": {**service, "path": "/convert"}, "caBundle": CA}


def test_crds_that_do_not_convert_through_the_webhook_or_are_missing_are_left_alone() -> None:
    topology = _generated_crd("topologies.kueue.x-k8s.io")
    assert topology["spec"]["conversion"] == {"strategy": "None"}
    api = FakeApi({"topologies.kueue.x-k8s.io": topology})
    conversion = ConversionWebhook(
        restore_on_exit=False, crd_names=["topologies.kueue.x-k8s.io", "workloads.kueue.x-k8s.io"]
    )
    assert asyncio.run(conversion.sync(api, conversion_client_config(LOCAL))) == []
    assert api.patches == []


def test_a_refused_patch_is_logged_and_retried_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    name = "workloads.kueue.x-k8s.io"
    api = FakeApi({name: _generated_crd(name)})
    api.fail_patch = 403
    conversion = ConversionWebhook(restore_on_exit=False, crd_names=[name])
    assert asyncio.run(conversion.sync(api, conversion_client_config(LOCAL))) == []
    assert "event=conversion_crd_patch_failed" in caplog.text and "403" in caplog.text


def test_keep_crds_repairs_a_reapplied_crd_and_gives_it_back_on_exit() -> None:
    name = "localqueues.kueue.x-k8s.io"
    generated = _generated_crd(name)
    api = FakeApi({name: copy.deepcopy(generated)})
    conversion = ConversionWebhook(restore_on_exit=True, crd_names=[name])

    async def scenario() -> list[dict[str, Any]]:
        seen = []
        task = asyncio.create_task(conversion.keep_crds(api, interval=0.05))  # type: ignore[arg-type]
        conversion.advertise(LOCAL)
        await asyncio.sleep(0.03)
        seen.append(_client_config(api, name))
        # Someone applies the generated CRD again: the next round points it back here.
        api.crds[name]["spec"]["conversion"] = copy.deepcopy(generated["spec"]["conversion"])
        await asyncio.sleep(0.15)
        seen.append(_client_config(api, name))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        seen.append(_client_config(api, name))
        return seen

    served, repaired, restored = asyncio.run(scenario())
    ours = {"url": "https://127.0.0.1:9443/convert", "caBundle": CA}
    assert served == ours and repaired == ours
    assert restored == generated["spec"]["conversion"]["webhook"]["clientConfig"]


def test_on_exit_a_crd_another_server_took_over_is_not_given_back() -> None:
    name = "cohorts.kueue.x-k8s.io"
    api = FakeApi({name: _generated_crd(name)})
    conversion = ConversionWebhook(restore_on_exit=True, crd_names=[name])
    other = {"url": "https://127.0.0.1:9999/convert", "caBundle": CA}

    async def scenario() -> None:
        task = asyncio.create_task(conversion.keep_crds(api, interval=10))  # type: ignore[arg-type]
        conversion.advertise(LOCAL)
        await asyncio.sleep(0.03)
        api.crds[name]["spec"]["conversion"]["webhook"]["clientConfig"] = dict(other)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert _client_config(api, name) == other


# -- RBAC -----------------------------------------------------------------------------------------


def test_the_cluster_role_lets_the_operator_patch_exactly_the_converted_crds() -> None:
    # Wherever the manifests keep the operator's ClusterRole.
    docs = [
        doc
        for path in sorted((REPO / "manifests").rglob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if isinstance(doc, dict)
    ]
    rules = [
        rule
        for doc in docs
        if doc.get("kind") == "ClusterRole" and doc["metadata"]["name"] == "phalanx"
        for rule in doc["rules"]
        if "customresourcedefinitions" in rule["resources"]
    ]
    writes = [r for r in rules if set(r["verbs"]) - {"get", "list", "watch"}]
    assert len(writes) == 1, writes
    # patch, and get (reading the CRD back before patching), on those CRDs only.
    assert set(writes[0]["verbs"]) - {"get"} == {"patch"}
    assert sorted(writes[0]["resourceNames"]) == sorted(CONVERTED_CRDS)
