"""Kueue's visibility API as Phalanx serves it (phalanx.operator.visibility), without a cluster:
the PendingWorkloadsSummary shapes in both of Kueue's versions (v1beta2 and v1beta1), limit and
offset as Kueue bounds them, positions that are
the order in which the core then admits, the discovery documents, the pending-by-reason gauge,
and the HTTPS server that believes X-Remote-* headers only from a client certificate the
request-header CA signed for an allowed name, then asks a SubjectAccessReview (403 otherwise).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import socket
import ssl
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from prometheus_client import CollectorRegistry, Gauge

from phalanx.admission.budgets import Budget, ScopeKind
from phalanx.admission.model import (
    ClusterQueue,
    FlavorQuotas,
    LocalQueue,
    PodSet,
    ResourceFlavor,
    ResourceGroup,
    Workload,
)
from phalanx.admission.scheduler import Scheduler, SchedulerConfig
from phalanx.operator.certs import ensure_webhook_certs
from phalanx.operator.visibility import (
    FrontProxy,
    NotServing,
    PendingReasons,
    VisibilityServer,
    api_resource_list,
    pending_in_cluster_queue,
    pending_in_local_queue,
)
from phalanx.quotas.resources import ResourceQuota

CPU = 1000
BASE = "/apis/visibility.kueue.x-k8s.io/v1beta2"
BASE_V1BETA1 = "/apis/visibility.kueue.x-k8s.io/v1beta1"


class World:
    """One ClusterQueue ``cq`` of ``cpus`` CPUs, LocalQueues ``a`` and ``b`` in ``team``."""

    def __init__(self, cpus: int = 1, *, budgets: tuple[Budget, ...] = ()) -> None:
        self.scheduler = Scheduler(config=SchedulerConfig(budgets=budgets))
        self.objects: dict[str, dict[str, Any]] = {}
        self.scheduler.apply_resource_flavor(ResourceFlavor("default"))
        self.scheduler.set_namespace("team", {})
        self.scheduler.apply_cluster_queue(
            ClusterQueue(
                "cq",
                (
                    ResourceGroup(
                        ("cpu",), (FlavorQuotas("default", {"cpu": ResourceQuota(cpus * CPU)}),)
                    ),
                ),
            )
        )
        for lq in ("a", "b"):
            self.scheduler.apply_local_queue(LocalQueue("team", lq, "cq"))
        self.now = 0

    def submit(self, name: str, lq: str, *, priority: int = 0, t: int = 0) -> None:
        self.objects[f"team/{name}"] = {
            "metadata": {
                "name": name,
                "namespace": "team",
                "creationTimestamp": f"2026-01-01T00:00:{t:02d}Z",
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": f"uid-{name}",
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            }
        }
        self.scheduler.add_workload(
            Workload(
                "team",
                name,
                lq,
                (PodSet("main", 1, {"cpu": CPU}),),
                priority=priority,
                creation_time=t * 1000,
            )
        )

    def cycle(self) -> list[str]:
        self.now += 1000_000
        result = self.scheduler.run_cycle(self.now)
        return [admit.workload.split("/")[1] for admit in result.admitted]

    def finish(self, name: str) -> None:
        self.scheduler.finish_workload(f"team/{name}")

    def cq(self, **kwargs: Any) -> dict[str, Any]:
        found = pending_in_cluster_queue(self.scheduler, self.objects, "cq", **kwargs)
        assert found is not None
        return found

    def lq(self, name: str, **kwargs: Any) -> dict[str, Any]:
        found = pending_in_local_queue(self.scheduler, self.objects, "team", name, **kwargs)
        assert found is not None
        return found


def names(summary: Mapping[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in summary["items"]]


@pytest.fixture
def world() -> World:
    w = World()
    # Arrival order w0..w5; w4 jumps ahead by priority; w0 is admitted by the first cycle.
    for i, (lq, prio) in enumerate([("a", 0), ("b", 0), ("a", 0), ("b", 0), ("a", 5), ("b", 0)]):
        w.submit(f"w{i}", lq, priority=prio, t=i)
    assert w.cycle() == ["w4"]
    return w


def test_summary_and_items_have_kueues_shape(world: World) -> None:
    summary = world.cq()
    assert summary["kind"] == "PendingWorkloadsSummary"
    assert summary["apiVersion"] == "visibility.kueue.x-k8s.io/v1beta2"
    assert summary["metadata"] == {"creationTimestamp": None}
    first = summary["items"][0]
    assert first == {
        "metadata": {
            "name": "w0",
            "namespace": "team",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            # Kueue copies apiVersion, kind, name and uid only
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "w0", "uid": "uid-w0"}
            ],
        },
        "priority": 0,
        "localQueueName": "a",
        "positionInClusterQueue": 0,
        "positionInLocalQueue": 0,
        "phalanxExplanation": first["phalanxExplanation"],
    }
    assert first["phalanxExplanation"]["reason"] == "WaitingForQuota"
    assert "cpu" in first["phalanxExplanation"]["message"]


def test_v1beta1_is_v1beta2_but_for_its_api_version(world: World) -> None:
    """Kueue's two versions share one storage and field-for-field the same types."""
    for kwargs in ({}, {"limit": 2, "offset": 1}):
        v2, v1 = world.cq(**kwargs), world.cq(version="v1beta1", **kwargs)
        assert v1["apiVersion"] == "visibility.kueue.x-k8s.io/v1beta1"
        assert v2["apiVersion"] == "visibility.kueue.x-k8s.io/v1beta2"
        assert {**v1, "apiVersion": None} == {**v2, "apiVersion": None}
        assert names(v1)  # not two empty pages
    v1_lq = world.lq("b", version="v1beta1")
    assert v1_lq["apiVersion"] == "visibility.kueue.x-k8s.io/v1beta1"
    assert v1_lq["items"] == world.lq("b")["items"]


def test_positions_in_cluster_and_local_queues(world: World) -> None:
    summary = world.cq()
    assert names(summary) == ["w0", "w1", "w2", "w3", "w5"]
    assert [i["positionInClusterQueue"] for i in summary["items"]] == [0, 1, 2, 3, 4]
    assert [i["positionInLocalQueue"] for i in summary["items"]] == [0, 0, 1, 1, 2]
    b = world.lq("b")
    assert names(b) == ["w1", "w3", "w5"]
    assert [i["positionInClusterQueue"] for i in b["items"]] == [1, 3, 4]
    assert [i["positionInLocalQueue"] for i in b["items"]] == [0, 1, 2]


def test_limit_and_offset_as_kueue(world: World) -> None:
    page = world.cq(limit=2, offset=1)
    assert names(page) == ["w1", "w2"]
    # positions in the LocalQueue count the workloads before the page too
    assert [i["positionInLocalQueue"] for i in page["items"]] == [0, 1]
    assert names(world.cq(limit=0)) == names(world.cq())  # 0: Kueue's default, 1000
    assert names(world.cq(limit=-3)) == []
    assert names(world.cq(offset=-1)) == names(world.cq())
    assert names(world.cq(offset=9)) == []
    b = world.lq("b", limit=1, offset=1)
    assert names(b) == ["w3"]
    assert b["items"][0]["positionInLocalQueue"] == 1
    assert b["items"][0]["positionInClusterQueue"] == 3


def test_unknown_queues_are_none() -> None:
    w = World()
    assert pending_in_cluster_queue(w.scheduler, {}, "nope") is None
    assert pending_in_local_queue(w.scheduler, {}, "team", "nope") is None
    assert pending_in_local_queue(w.scheduler, {}, "other", "a") is None


def test_positions_are_the_admission_order(world: World) -> None:
    """Free the quota one workload at a time: each cycle admits position 0."""
    expected = names(world.cq())
    running = "w4"
    admitted = []
    while True:
        head = names(world.cq())[:1]
        world.finish(running)
        got = world.cycle()
        if not got:
            break
        assert got == head
        admitted += got
        running = got[0]
    assert admitted == expected


def test_backing_off_workloads_come_last() -> None:
    w = World()
    w.submit("early", "a", t=0)
    w.submit("late", "a", t=1)
    assert w.cycle() == ["early"]
    w.scheduler.workload_evicted("team/early", now=w.now, requeue_at=w.now + 10**9)
    summary = w.cq()
    assert names(summary) == ["late", "early"]
    assert summary["items"][1]["phalanxExplanation"]["reason"] == "Backoff"


def test_workloads_waiting_for_a_budget_are_listed_after_the_queue() -> None:
    """b's budget (0.25 cpu-hours per 1000 h) is used up: b2 waits for its reset, listed after
    the live queue with its explanation; without the budget's heap it would be missing."""
    budget = Budget(ScopeKind.LOCAL_QUEUE, "team/b", "cpu", 0.25, 1000 * 3_600_000)
    w = World(cpus=3, budgets=(budget,))
    w.submit("b1", "b", t=0)
    assert w.cycle() == ["b1"]  # holds 1 CPU from 1000 s on: 0.278 cpu-hours at 2000 s
    w.submit("a1", "a", t=1)
    w.submit("b2", "b", t=2)
    w.submit("a2", "a", t=3)
    w.submit("a3", "a", t=4)
    assert w.cycle() == ["a1", "a2"]  # at 2000 s; b2 waits for the budget, a3 for quota
    summary = w.cq()
    assert names(summary) == ["a3", "b2"]
    explanation = summary["items"][1]["phalanxExplanation"]
    assert explanation["reason"] == "BudgetExceeded"
    assert "LocalQueue team/b used 0.2778 of its 0.25 cpu-hours" in explanation["message"]
    assert names(w.lq("b")) == ["b2"]


def test_pending_by_reason_gauge(world: World) -> None:
    gauge = Gauge(
        "phalanx_pending_workloads", "x", ["cluster_queue", "reason"], registry=CollectorRegistry()
    )
    clock = [0.0]
    reasons = PendingReasons(gauge, interval=5.0, clock=lambda: clock[0])
    world.scheduler.add_workload(Workload("team", "lost", "missing", (PodSet("m", 1, {}),)))
    reasons.after_cycle(world.scheduler)
    assert gauge.labels("cq", "WaitingForQuota")._value.get() == 5
    assert gauge.labels("", "LocalQueueDoesNotExist")._value.get() == 1
    world.scheduler.delete_workload("team/lost")
    reasons.after_cycle(world.scheduler)  # within the interval: not recounted
    assert gauge.labels("", "LocalQueueDoesNotExist")._value.get() == 1
    clock[0] = 6.0
    reasons.after_cycle(world.scheduler)
    samples = {
        (s.labels["cluster_queue"], s.labels["reason"]): s.value
        for metric in gauge.collect()
        for s in metric.samples
    }
    assert samples == {("cq", "WaitingForQuota"): 5}


def test_front_proxy_settings_from_the_configmap() -> None:
    fp = FrontProxy.from_configmap(
        {
            "requestheader-client-ca-file": "-----BEGIN CERTIFICATE-----\n...",
            "requestheader-allowed-names": '["front-proxy-client"]',
            "requestheader-username-headers": '["X-Remote-User"]',
            "requestheader-group-headers": '["X-Remote-Group"]',
            "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
        }
    )
    assert fp.allowed_names == ("front-proxy-client",)
    ok = {"subject": ((("commonName", "front-proxy-client"),),)}
    assert fp.common_name_allowed(ok)
    assert not fp.common_name_allowed({"subject": ((("commonName", "mallory"),),)})
    assert not fp.common_name_allowed(None)
    with pytest.raises(ValueError, match="aggregation layer"):
        FrontProxy.from_configmap({})


# -- the HTTPS server ----------------------------------------------------------------------------


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, (issuer or (subject,))[0])])
        )
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
    )
    if issuer is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        return builder.sign(key, hashes.SHA256())
    builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
    return builder.sign(issuer[1], hashes.SHA256())


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _client_files(folder: Path, name: str, ca: tuple[str, ec.EllipticCurvePrivateKey]) -> Path:
    key = _key()
    cert = _cert(name, key, ca)
    path = folder / f"{name}.pem"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        + cert.public_bytes(serialization.Encoding.PEM)
    )
    return path


class FakeReviews:
    """SubjectAccessReviews as RBAC would answer them: alice may get team/a's pending
    workloads, admin everything."""

    def __init__(self) -> None:
        self.reviews: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, *, body: Any, **_: Any) -> dict[str, Any]:
        assert (method, body["kind"]) == ("POST", "SubjectAccessReview")
        spec = body["spec"]
        self.reviews.append(spec)
        attrs = spec["resourceAttributes"]
        allowed = spec["user"] == "admin" or (
            spec["user"] == "alice"
            and attrs["resource"] == "localqueues"
            and attrs.get("namespace") == "team"
            and attrs["name"] == "a"
        )
        return {"status": {"allowed": allowed}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def pki(tmp_path: Path) -> Iterator[dict[str, Any]]:
    serving = tmp_path / "serving"
    ensure_webhook_certs(serving, hosts=["localhost", "127.0.0.1"])
    ca_key = _key()
    ca = ("front-proxy-ca", ca_key)
    ca_pem = _pem(_cert("front-proxy-ca", ca_key, None))
    rogue_key = _key()
    rogue = ("rogue-ca", rogue_key)
    yield {
        "serving": serving,
        "ca_pem": ca_pem,
        "proxy": _client_files(tmp_path, "front-proxy-client", ca),
        "other_name": _client_files(tmp_path, "someone-else", ca),
        "rogue": _client_files(tmp_path, "front-proxy-client-rogue", rogue),
    }


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _get(
    port: int,
    path: str,
    *,
    cert: Path | None,
    user: str | None = "alice",
    groups: tuple[str, ...] = ("system:authenticated",),
) -> tuple[int, dict[str, Any]]:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if cert is not None:
        context.load_cert_chain(str(cert))
    headers: list[tuple[str, str]] = []
    if user:
        headers.append(("X-Remote-User", user))
        headers.extend(("X-Remote-Group", g) for g in groups)
        headers.append(("X-Remote-Extra-Scopes%2Fteam", "x"))
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"https://127.0.0.1:{port}{path}", ssl=context, headers=headers) as r,
    ):
        return r.status, json.loads(await r.text())


async def _serving(
    pki: dict[str, Any], world: World, *, serving: bool = True
) -> tuple[VisibilityServer, FakeReviews]:
    reviews = FakeReviews()

    async def reader(fn: Any) -> Any:
        if not serving:
            raise NotServing("this replica does not schedule")
        return fn(world.scheduler, world.objects)

    server = VisibilityServer(
        api=reviews,  # type: ignore[arg-type]
        reader=reader,
        listen="127.0.0.1",
        port=_free_port(),
        cert_folder=pki["serving"],
    )
    server.use(FrontProxy(client_ca=pki["ca_pem"], allowed_names=("front-proxy-client",)))
    await server.start()
    return server, reviews


def test_server_answers_an_allowed_user_through_the_front_proxy(
    pki: dict[str, Any], world: World
) -> None:
    async def scenario() -> None:
        server, reviews = await _serving(pki, world)
        try:
            code, body = await _get(
                server.port,
                f"{BASE}/namespaces/team/localqueues/a/pendingworkloads?limit=1&offset=1",
                cert=pki["proxy"],
            )
            assert code == 200, body
            assert names(body) == ["w2"]
            spec = reviews.reviews[-1]
            assert spec["user"] == "alice"
            assert spec["groups"] == ["system:authenticated"]
            assert spec["extra"] == {"scopes/team": ["x"]}
            assert spec["resourceAttributes"] == {
                "verb": "get",
                "group": "visibility.kueue.x-k8s.io",
                "version": "v1beta2",
                "resource": "localqueues",
                "subresource": "pendingworkloads",
                "namespace": "team",
                "name": "a",
            }
            code, body = await _get(
                server.port,
                f"{BASE}/clusterqueues/cq/pendingworkloads",
                cert=pki["proxy"],
                user="admin",
            )
            assert code == 200 and names(body) == ["w0", "w1", "w2", "w3", "w5"]
            code, body = await _get(
                server.port,
                f"{BASE}/clusterqueues/nope/pendingworkloads",
                cert=pki["proxy"],
                user="admin",
            )
            assert code == 404 and body["reason"] == "NotFound"
            code, body = await _get(
                server.port,
                f"{BASE}/clusterqueues/cq/pendingworkloads?limit=x",
                cert=pki["proxy"],
                user="admin",
            )
            assert code == 400
            # v1beta1: the same answer in its version, reviewed as a v1beta1 request
            code, body = await _get(
                server.port,
                f"{BASE_V1BETA1}/namespaces/team/localqueues/a/pendingworkloads?limit=1&offset=1",
                cert=pki["proxy"],
            )
            assert code == 200 and names(body) == ["w2"], body
            assert body["apiVersion"] == "visibility.kueue.x-k8s.io/v1beta1"
            assert body["items"][0]["positionInLocalQueue"] == 1
            assert reviews.reviews[-1]["resourceAttributes"]["version"] == "v1beta1"
            code, body = await _get(
                server.port,
                f"{BASE_V1BETA1}/clusterqueues/cq/pendingworkloads",
                cert=pki["proxy"],
                user="admin",
            )
            assert code == 200 and names(body) == ["w0", "w1", "w2", "w3", "w5"]
            assert body["apiVersion"] == "visibility.kueue.x-k8s.io/v1beta1"
        finally:
            await server.stop()

    _run(scenario())


def test_server_refuses_with_403(pki: dict[str, Any], world: World) -> None:
    async def scenario() -> None:
        server, reviews = await _serving(pki, world)
        lq_b = f"{BASE}/namespaces/team/localqueues/b/pendingworkloads"
        cq = f"{BASE}/clusterqueues/cq/pendingworkloads"
        try:
            # RBAC says no (SubjectAccessReview)
            code, body = await _get(server.port, lq_b, cert=pki["proxy"])
            assert code == 403 and body["reason"] == "Forbidden"
            assert (
                'User "alice" cannot get resource "localqueues/pendingworkloads"'
                in (body["message"])
            )
            code, _ = await _get(server.port, cq, cert=pki["proxy"])
            assert code == 403
            asked = len(reviews.reviews)
            # No client certificate: the headers are not believed, whoever they name
            code, body = await _get(server.port, cq, cert=None, user="admin")
            assert code == 403 and 'User "system:anonymous"' in body["message"]
            # A certificate of the CA for a name not allowed
            code, _ = await _get(server.port, cq, cert=pki["other_name"], user="admin")
            assert code == 403
            # The front proxy, but no user
            code, _ = await _get(server.port, cq, cert=pki["proxy"], user=None)
            assert code == 403
            assert len(reviews.reviews) == asked  # none of those reached a review
            # A certificate of another CA does not even complete the handshake
            with pytest.raises(aiohttp.ClientError):
                await _get(server.port, cq, cert=pki["rogue"], user="admin")
            # v1beta1 is reviewed as v1beta2 is: RBAC says no, and no front proxy, no user
            code, _ = await _get(
                server.port,
                f"{BASE_V1BETA1}/namespaces/team/localqueues/b/pendingworkloads",
                cert=pki["proxy"],
            )
            assert code == 403
            asked = len(reviews.reviews)
            code, _ = await _get(
                server.port, f"{BASE_V1BETA1}/clusterqueues/cq/pendingworkloads", cert=None
            )
            assert code == 403 and len(reviews.reviews) == asked
            # Discovery: the front proxy only
            for base in (BASE, BASE_V1BETA1):
                code, _ = await _get(server.port, base, cert=None)
                assert code == 403
        finally:
            await server.stop()

    _run(scenario())


def test_discovery_documents(pki: dict[str, Any], world: World) -> None:
    async def scenario() -> None:
        server, _ = await _serving(pki, world, serving=False)
        try:
            code, groups = await _get(server.port, "/apis", cert=pki["proxy"], user=None)
            assert code == 200 and groups["kind"] == "APIGroupList"
            assert groups["groups"][0]["preferredVersion"] == {
                "groupVersion": "visibility.kueue.x-k8s.io/v1beta2",
                "version": "v1beta2",
            }
            code, group = await _get(
                server.port, "/apis/visibility.kueue.x-k8s.io", cert=pki["proxy"], user=None
            )
            assert code == 200 and group["kind"] == "APIGroup"
            # Both versions, v1beta2 preferred and first, as Kueue's PrioritizedVersions
            assert group["versions"] == [
                {"groupVersion": "visibility.kueue.x-k8s.io/v1beta2", "version": "v1beta2"},
                {"groupVersion": "visibility.kueue.x-k8s.io/v1beta1", "version": "v1beta1"},
            ]
            assert group["preferredVersion"]["version"] == "v1beta2"
            assert groups["groups"][0] == {
                k: v for k, v in group.items() if k in groups["groups"][0]
            }
            for version, base in (("v1beta2", BASE), ("v1beta1", BASE_V1BETA1)):
                code, resources = await _get(server.port, base, cert=pki["proxy"], user=None)
                assert code == 200 and resources == api_resource_list(version)
                assert resources["groupVersion"] == f"visibility.kueue.x-k8s.io/{version}"
                got = {r["name"]: (r["namespaced"], r["verbs"]) for r in resources["resources"]}
                assert got == {
                    "clusterqueues": (False, []),
                    "clusterqueues/pendingworkloads": (False, ["get"]),
                    "localqueues": (True, []),
                    "localqueues/pendingworkloads": (True, ["get"]),
                }
            # A standby: 503, to retry
            code, body = await _get(
                server.port,
                f"{BASE}/clusterqueues/cq/pendingworkloads",
                cert=pki["proxy"],
                user="admin",
            )
            assert code == 503 and body["reason"] == "ServiceUnavailable"
        finally:
            await server.stop()

    _run(scenario())
