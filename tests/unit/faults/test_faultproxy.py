"""The fault proxy (tests/integration/faultproxy.py) against a tiny aiohttp backend on
127.0.0.1: real sockets, the operator's own client (:class:`KubeApi`) on the other side.

What must hold: reads, watches and unfaulted writes pass through unchanged (watches chunk by
chunk); each fault kind does what it says about whether the write reached the backend, and
the client's view of it is one :func:`outcome_unknown` treats as unknown; only the targeted
requests are faulted; choices are seeded and counted; real credentials (a client
certificate over TLS) are presented upstream.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import socket
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration"))

from faultproxy import (
    LANDED,
    FaultKind,
    FaultPolicy,
    FaultProxy,
    RequestClass,
    classify,
)

from phalanx.operator import kubeconfig
from phalanx.operator.kube import WORKLOADS, ApiError, KubeApi, outcome_unknown
from phalanx.operator.kubeconfig import ClusterAuth

STATUS_PATH = "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads/wl-1/status"
JOB_PATH = "/apis/batch/v1/namespaces/ns/jobs/job-1"
EVENTS_PATH = "/api/v1/namespaces/ns/events"
WATCH_PATH = "/apis/kueue.x-k8s.io/v1beta2/workloads"


# -- a tiny API server ----------------------------------------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    peer_cn: str | None = None


@dataclass
class Backend:
    port: int = 0
    scheme: str = "http"
    seen: list[Seen] = field(default_factory=list)
    release_watch: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def writes(self) -> list[Seen]:
        return [s for s in self.seen if s.method != "GET"]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        peer = None
        cert = request.transport.get_extra_info("peercert") if request.transport else None
        if cert:
            peer = dict(x[0] for x in cert["subject"]).get("commonName")
        self.seen.append(
            Seen(
                method=request.method,
                path=request.path,
                query=dict(request.query),
                headers=dict(request.headers),
                body=await request.read(),
                peer_cn=peer,
            )
        )
        if request.query.get("watch") == "1":
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            await response.write(b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}\n')
            await self.release_watch.wait()
            await response.write(b'{"type":"ADDED","object":{"metadata":{"name":"b"}}}\n')
            await response.write_eof()
            return response
        if request.path.endswith("/missing"):
            return web.json_response(
                {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404},
                status=404,
            )
        if request.method == "GET":
            return web.json_response(
                {"kind": "Workload", "metadata": {"name": "wl-1", "resourceVersion": "7"}}
            )
        patch = json.loads(await request.read() or b"{}")
        return web.json_response(
            {"kind": "Workload", "metadata": {"name": "wl-1", "resourceVersion": "8"}, **patch}
        )


@dataclass
class Pki:
    ca: bytes
    server_cert: Path
    server_key: Path
    client_cert: bytes
    client_key: bytes


def _make_pki(directory: Path) -> Pki:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(cn: str, usage: x509.ObjectIdentifier, san: bool) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if san:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
        cert = builder.sign(ca_key, hashes.SHA256())
        return (
            cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )

    server_cert, server_key = leaf("apiserver", ExtendedKeyUsageOID.SERVER_AUTH, san=True)
    client_cert, client_key = leaf("phalanx-admin", ExtendedKeyUsageOID.CLIENT_AUTH, san=False)
    (directory / "server.crt").write_bytes(server_cert)
    (directory / "server.key").write_bytes(server_key)
    return Pki(
        ca=ca.public_bytes(serialization.Encoding.PEM),
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_cert=client_cert,
        client_key=client_key,
    )


@dataclass
class Rig:
    backend: Backend
    proxy: FaultProxy
    api: KubeApi
    """The operator's client, configured from the proxy's kubeconfig."""
    session: aiohttp.ClientSession


Scenario = Callable[[Rig], Awaitable[None]]


async def _serve_backend(backend: Backend, ssl_context: ssl.SSLContext | None) -> web.AppRunner:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", backend.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    backend.port = int(runner.addresses[0][1])
    return runner


def run(
    tmp_path: Path,
    scenario: Scenario,
    *,
    policy: FaultPolicy | None = None,
    auth: Callable[[Backend], ClusterAuth] | None = None,
    server_ssl: ssl.SSLContext | None = None,
) -> Rig:
    """Backend, proxy in front of it, the operator's client in front of that; run
    ``scenario``; tear down; return the rig for assertions on what each side saw."""
    holder: list[Rig] = []

    async def main() -> None:
        backend = Backend(scheme="https" if server_ssl else "http")
        runner = await _serve_backend(backend, server_ssl)
        upstream = auth(backend) if auth else ClusterAuth(server=backend.url, token="s3cret")
        proxy = FaultProxy(upstream, policy or FaultPolicy())
        await proxy.start()
        path = proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig")
        api = KubeApi(kubeconfig.load(path))
        session = aiohttp.ClientSession(proxy.url)
        rig = Rig(backend=backend, proxy=proxy, api=api, session=session)
        holder.append(rig)
        try:
            await scenario(rig)
        finally:
            backend.release_watch.set()
            await session.close()
            await api.close()
            await proxy.stop()
            await runner.cleanup()

    asyncio.run(main())
    return holder[0]


async def _patch_status(api: KubeApi, *, timeout: float = 5.0) -> dict[str, Any]:
    return await api.request(
        "PATCH",
        STATUS_PATH,
        params={"fieldManager": "phalanx", "force": "true"},
        body={"status": {"conditions": []}},
        content_type="application/apply-patch+yaml",
        timeout=timeout,
    )


# -- the pure parts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("PATCH", STATUS_PATH, {}, RequestClass.STATUS_WRITE),
        ("PUT", STATUS_PATH, {}, RequestClass.STATUS_WRITE),
        ("PATCH", STATUS_PATH.removesuffix("/status"), {}, RequestClass.WRITE),
        ("POST", "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads", {}, RequestClass.WRITE),
        ("PATCH", JOB_PATH, {}, RequestClass.WRITE),
        ("DELETE", JOB_PATH, {}, RequestClass.WRITE),
        ("GET", STATUS_PATH, {}, RequestClass.READ),
        ("GET", WATCH_PATH, {"watch": "1"}, RequestClass.WATCH),
        ("GET", WATCH_PATH, {"watch": "true"}, RequestClass.WATCH),
        ("GET", "/apis/kueue.x-k8s.io/v1beta2/watch/workloads", {}, RequestClass.WATCH),
        ("GET", WATCH_PATH, {"limit": "500"}, RequestClass.READ),
    ],
)
def test_requests_are_classified(
    method: str, path: str, query: dict[str, str], expected: RequestClass
) -> None:
    assert classify(method, path, query) is expected


def test_the_policy_is_seeded_bounded_by_budgets_and_targets_only_writes() -> None:
    rates = {FaultKind.DROP_AFTER: 0.3, FaultKind.SERVER_ERROR: 0.3}

    def choices(seed: int) -> list[FaultKind | None]:
        policy = FaultPolicy(seed=seed, status_rates=rates, budgets={FaultKind.SERVER_ERROR: 5})
        return [policy.decide(RequestClass.STATUS_WRITE) for _ in range(400)]

    first = choices(11)
    assert first == choices(11)
    assert first != choices(12)
    assert first.count(FaultKind.SERVER_ERROR) == 5  # budget
    assert 80 <= first.count(FaultKind.DROP_AFTER) <= 160  # ~0.3 of 400

    policy = FaultPolicy(
        status_rates={FaultKind.RESET_BEFORE: 1.0},
        write_rates={FaultKind.GATEWAY_TIMEOUT: 1.0},
    )
    assert policy.decide(RequestClass.READ, STATUS_PATH) is None
    assert policy.decide(RequestClass.WATCH, WATCH_PATH) is None  # no watch cuts asked for
    assert policy.decide(RequestClass.STATUS_WRITE, STATUS_PATH) is FaultKind.RESET_BEFORE
    assert policy.decide(RequestClass.WRITE, JOB_PATH) is FaultKind.GATEWAY_TIMEOUT
    assert policy.decide(RequestClass.WRITE, EVENTS_PATH) is None  # not a targeted write

    with pytest.raises(AssertionError):
        FaultPolicy(status_rates={FaultKind.DROP_AFTER: 0.7, FaultKind.STALL_AFTER: 0.4})
    with pytest.raises(AssertionError):
        FaultPolicy(status_rates={FaultKind.WATCH_CUT: 0.1})


# -- passing through ------------------------------------------------------------------------------


def test_reads_and_writes_pass_through_with_the_real_credentials(tmp_path: Path) -> None:
    results: dict[str, Any] = {}

    async def scenario(rig: Rig) -> None:
        results["get"] = await rig.api.get(WORKLOADS, "wl-1", namespace="ns")
        results["patch"] = await _patch_status(rig.api)
        with pytest.raises(ApiError) as error:
            await rig.api.request("GET", "/api/v1/namespaces/ns/pods/missing")
        results["missing"] = error.value

    # Faults on, but none asked for: everything passes.
    rig = run(tmp_path, scenario, policy=FaultPolicy(seed=1))
    assert results["get"]["metadata"]["resourceVersion"] == "7"
    assert results["patch"]["status"] == {"conditions": []}
    missing: ApiError = results["missing"]
    assert missing.status == 404 and missing.reason == "NotFound"  # Status body intact

    get, patch, _ = rig.backend.seen
    assert (get.method, get.path) == (
        "GET",
        "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads/wl-1",
    )
    assert (patch.method, patch.path) == ("PATCH", STATUS_PATH)
    assert patch.query == {"fieldManager": "phalanx", "force": "true"}
    assert patch.headers["Content-Type"] == "application/apply-patch+yaml"
    assert json.loads(patch.body) == {"status": {"conditions": []}}
    # The client has no credentials (the proxy kubeconfig has none); the proxy adds them.
    assert all(s.headers.get("Authorization") == "Bearer s3cret" for s in rig.backend.seen)
    assert rig.proxy.counts() == {kind.value: 0 for kind in FaultKind}
    assert rig.proxy.seen()["status_write"] == 1 and rig.proxy.seen()["read"] == 2


def test_a_watch_is_streamed_chunk_by_chunk(tmp_path: Path) -> None:
    lines: list[bytes] = []

    async def scenario(rig: Rig) -> None:
        async with rig.session.get(WATCH_PATH, params={"watch": "1"}) as response:
            assert response.status == 200
            # The backend holds its second event until released: the first must arrive
            # before that, or the proxy is buffering the stream.
            lines.append(await asyncio.wait_for(response.content.readline(), timeout=5))
            assert not rig.backend.release_watch.is_set()
            rig.backend.release_watch.set()
            lines.append(await asyncio.wait_for(response.content.readline(), timeout=5))
            assert await response.content.read() == b""

    rig = run(tmp_path, scenario)
    assert [json.loads(line)["object"]["metadata"]["name"] for line in lines] == ["a", "b"]
    assert rig.backend.seen[0].query == {"watch": "1"}


def test_with_faults_disabled_nothing_is_injected(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        rig.proxy.enabled = False
        for _ in range(5):
            await _patch_status(rig.api)

    rig = run(tmp_path, scenario, policy=FaultPolicy(status_rates={FaultKind.RESET_BEFORE: 1.0}))
    assert len(rig.backend.writes()) == 5
    assert sum(rig.proxy.counts().values()) == 0


# -- the faults -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(LANDED))
def test_a_landed_fault_forwards_the_write_and_leaves_the_client_unsure(
    tmp_path: Path, kind: FaultKind
) -> None:
    errors: list[BaseException] = []
    took: list[float] = []

    async def scenario(rig: Rig) -> None:
        started = time.monotonic()
        with pytest.raises(Exception) as error:
            await _patch_status(rig.api, timeout=0.5)
        took.append(time.monotonic() - started)
        errors.append(error.value)

    policy = FaultPolicy(seed=3, status_rates={kind: 1.0}, stall_seconds=2.0)
    rig = run(tmp_path, scenario, policy=policy)
    error = errors[0]
    assert len(rig.backend.writes()) == 1, "the write must have reached the API server"
    assert outcome_unknown(error), f"{kind}: {error!r} would be taken as a definite answer"
    if kind is FaultKind.GATEWAY_TIMEOUT:
        assert isinstance(error, ApiError) and error.status == 504 and error.reason == "Timeout"
    elif kind is FaultKind.SERVER_ERROR:
        assert isinstance(error, ApiError) and error.status == 500
        assert "non-JSON" in str(error)
    elif kind is FaultKind.DROP_AFTER:
        assert isinstance(error, aiohttp.ClientError)
    else:  # STALL_AFTER: the client gave up at its timeout
        assert isinstance(error, TimeoutError) and took[0] < 1.5
    assert rig.proxy.counts()[kind.value] == 1
    (record,) = rig.proxy.records()
    assert (record.kind, record.method, record.path) == (kind, "PATCH", STATUS_PATH)
    assert record.upstream_status == 200
    assert rig.proxy.counts_by_class() == {"status_write": {kind.value: 1}}


def test_a_reset_before_forwarding_never_reaches_the_api_server(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    async def scenario(rig: Rig) -> None:
        with pytest.raises(aiohttp.ClientError) as error:
            await _patch_status(rig.api)
        errors.append(error.value)
        # The next write on a new connection, and reads, are unaffected by the reset.
        await rig.api.get(WORKLOADS, "wl-1", namespace="ns")

    policy = FaultPolicy(status_rates={FaultKind.RESET_BEFORE: 1.0})
    rig = run(tmp_path, scenario, policy=policy)
    assert rig.backend.writes() == []
    assert [s.method for s in rig.backend.seen] == ["GET"]
    assert outcome_unknown(errors[0])  # from the client's side it cannot tell
    assert rig.proxy.counts()["reset_before"] == 1
    assert rig.proxy.records()[0].upstream_status is None


def test_a_stall_before_forwarding_outlasts_the_client_and_is_then_dropped(
    tmp_path: Path,
) -> None:
    async def scenario(rig: Rig) -> None:
        with pytest.raises(TimeoutError):
            await _patch_status(rig.api, timeout=0.3)
        await asyncio.sleep(1.2)  # past the stall: had it been forwarded, it would be now

    policy = FaultPolicy(status_rates={FaultKind.STALL_BEFORE: 1.0}, stall_seconds=0.8)
    rig = run(tmp_path, scenario, policy=policy)
    assert rig.backend.writes() == []
    assert rig.proxy.counts()["stall_before"] == 1


def test_a_stall_before_forwarding_within_the_client_timeout_forwards_late(
    tmp_path: Path,
) -> None:
    took: list[float] = []

    async def scenario(rig: Rig) -> None:
        started = time.monotonic()
        await _patch_status(rig.api, timeout=5.0)
        took.append(time.monotonic() - started)

    policy = FaultPolicy(status_rates={FaultKind.STALL_BEFORE: 1.0}, stall_seconds=0.5)
    rig = run(tmp_path, scenario, policy=policy)
    assert len(rig.backend.writes()) == 1
    assert took[0] >= 0.5


def test_only_targeted_writes_are_faulted(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        for _ in range(3):
            await rig.api.get(WORKLOADS, "wl-1", namespace="ns")  # reads: never
            await rig.api.request("POST", EVENTS_PATH, body={"reason": "x"})  # not targeted
            with pytest.raises(ApiError):
                await rig.api.request("PATCH", JOB_PATH, body=[], content_type="x")
            with pytest.raises(aiohttp.ClientError):
                await _patch_status(rig.api)

    policy = FaultPolicy(
        status_rates={FaultKind.RESET_BEFORE: 1.0},
        write_rates={FaultKind.GATEWAY_TIMEOUT: 1.0},
    )
    rig = run(tmp_path, scenario, policy=policy)
    methods = [(s.method, s.path) for s in rig.backend.seen]
    assert methods.count(("POST", EVENTS_PATH)) == 3
    assert methods.count(("PATCH", JOB_PATH)) == 3  # landed, then answered 504
    assert ("PATCH", STATUS_PATH) not in methods
    assert rig.proxy.counts_by_class() == {
        "status_write": {"reset_before": 3},
        "write": {"gateway_timeout": 3},
    }


def test_a_watch_cut_resets_the_stream(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    got: list[bytes] = []

    async def scenario(rig: Rig) -> None:
        started = time.monotonic()
        async with rig.session.get(WATCH_PATH, params={"watch": "1"}) as response:
            got.append(await response.content.readline())
            try:
                await asyncio.wait_for(response.content.read(), timeout=5)
            except aiohttp.ClientError as error:
                errors.append(error)
        assert time.monotonic() - started < 3

    policy = FaultPolicy(watch_cut_rate=1.0, watch_cut_after=(0.3, 0.3))
    rig = run(tmp_path, scenario, policy=policy)
    assert b'"name":"a"' in got[0]
    assert errors, "the stream ended cleanly: it was not cut"
    assert rig.proxy.counts()["watch_cut"] == 1
    assert rig.proxy.counts_by_class() == {"watch": {"watch_cut": 1}}


def test_an_unreachable_api_server_resets_the_client(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    async def scenario(rig: Rig) -> None:
        await rig.api.get(WORKLOADS, "wl-1", namespace="ns")
        rig.proxy._base = rig.proxy._base.with_port(_closed_port())
        with pytest.raises(aiohttp.ClientError) as error:
            await rig.api.get(WORKLOADS, "wl-1", namespace="ns")
        errors.append(error.value)

    rig = run(tmp_path, scenario)
    assert rig.proxy.upstream_errors >= 1
    assert sum(rig.proxy.counts().values()) == 0  # not a fault it chose


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- TLS upstream with a client certificate -------------------------------------------------------


def test_the_upstream_is_reached_over_tls_with_the_client_certificate(tmp_path: Path) -> None:
    pki = _make_pki(tmp_path)
    server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ssl.load_cert_chain(str(pki.server_cert), str(pki.server_key))
    server_ssl.load_verify_locations(cadata=pki.ca.decode())
    server_ssl.verify_mode = ssl.CERT_REQUIRED  # no client certificate, no connection
    got: list[dict[str, Any]] = []

    async def scenario(rig: Rig) -> None:
        got.append(await rig.api.get(WORKLOADS, "wl-1", namespace="ns"))
        got.append(await _patch_status(rig.api))

    def auth(backend: Backend) -> ClusterAuth:
        return ClusterAuth(
            server=backend.url,
            ca_data=pki.ca,
            client_cert_data=pki.client_cert,
            client_key_data=pki.client_key,
        )

    rig = run(tmp_path, scenario, auth=auth, server_ssl=server_ssl)
    assert got[0]["metadata"]["resourceVersion"] == "7"
    assert [s.peer_cn for s in rig.backend.seen] == ["phalanx-admin", "phalanx-admin"]
    assert all("Authorization" not in s.headers for s in rig.backend.seen)
