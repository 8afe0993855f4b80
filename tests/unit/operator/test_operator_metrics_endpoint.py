"""/metrics as Kueue serves it: HTTPS, and only for a caller whose token the API server accepts
(TokenReview) and allows to get /metrics (SubjectAccessReview); reviews cached briefly. The
serving certificates: renewed before they expire while the servers run, and reloaded."""

from __future__ import annotations

import asyncio
import datetime
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from prometheus_client import CollectorRegistry, Counter

from phalanx.operator.certs import ReloadingCert, ensure_webhook_certs, renew_if_due
from phalanx.operator.metrics_auth import MetricsAuthorizer, Verdict
from phalanx.operator.serving import MetricsServer
from phalanx.operator.webhooks import PhalanxWebhookServer

USERS = {"reader": ("system:serviceaccount:mon:prometheus", True), "other": ("bob", False)}


class FakeReviews:
    """Answers TokenReviews and SubjectAccessReviews as an API server with USERS would."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def request(self, method: str, path: str, *, body: Any, **_: Any) -> dict[str, Any]:
        assert method == "POST"
        kind = body["kind"]
        self.calls.append(kind)
        if kind == "TokenReview":
            found = USERS.get(body["spec"]["token"])
            if found is None:
                return {"status": {"authenticated": False, "error": "invalid bearer token"}}
            return {"status": {"authenticated": True, "user": {"username": found[0]}}}
        assert body["spec"]["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
        allowed = any(u == body["spec"]["user"] and ok for u, ok in USERS.values())
        return {"status": {"allowed": allowed}}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _client_ssl(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


async def _get(url: str, ca: Path, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers=headers, ssl=_client_ssl(ca)) as response,
    ):
        return response.status, await response.text()


def test_authorizer_verdicts_and_cache() -> None:
    clock = Clock()
    reviews = FakeReviews()
    auth = MetricsAuthorizer(reviews, ttl=30, deny_ttl=10, clock=clock)  # type: ignore[arg-type]

    async def main() -> None:
        assert (await auth.check(None)).verdict is Verdict.UNAUTHENTICATED
        assert (await auth.check("Basic abc")).verdict is Verdict.UNAUTHENTICATED
        assert reviews.calls == [], "nothing to review without a bearer token"
        assert (await auth.check("Bearer nobody")).verdict is Verdict.UNAUTHENTICATED
        assert (await auth.check("Bearer other")).verdict is Verdict.FORBIDDEN
        for _ in range(5):
            assert (await auth.check("Bearer reader")).verdict is Verdict.ALLOWED
        assert auth.reviews == 3, "one review per token while cached"
        clock.now += 11  # refusals expire first
        await auth.check("Bearer other")
        await auth.check("Bearer reader")
        assert auth.reviews == 4
        clock.now += 20
        await auth.check("Bearer reader")
        assert auth.reviews == 5

    asyncio.run(main())


def test_metrics_over_https_401_403_200(tmp_path: Path) -> None:
    certs = ensure_webhook_certs(tmp_path / "certs", hosts=["127.0.0.1"])
    registry = CollectorRegistry()
    Counter("kueue_admitted_workloads", "test", registry=registry).inc()
    reviews = FakeReviews()
    port = _free_port()

    async def main() -> None:
        server = MetricsServer(
            registry,
            listen="127.0.0.1",
            port=port,
            ssl_context=ReloadingCert(certs.cert_file, certs.key_file).context,
            authorizer=MetricsAuthorizer(reviews),  # type: ignore[arg-type]
        )
        await server.start()
        url = f"https://127.0.0.1:{port}/metrics"
        try:
            assert (await _get(url, certs.ca_file))[0] == 401
            assert (await _get(url, certs.ca_file, "nobody"))[0] == 401
            assert (await _get(url, certs.ca_file, "other"))[0] == 403
            status, text = await _get(url, certs.ca_file, "reader")
            assert status == 200 and "kueue_admitted_workloads_total 1.0" in text
            with pytest.raises(aiohttp.ClientError):  # no plain HTTP on the TLS port
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(f"http://127.0.0.1:{port}/metrics") as response,
                ):
                    assert response.status >= 400
                    raise aiohttp.ClientError("answered plain HTTP with an error")
        finally:
            await server.stop()

    asyncio.run(main())


def test_plain_metrics_only_on_loopback() -> None:
    with pytest.raises(ValueError, match="loopback only"):
        MetricsServer(
            CollectorRegistry(), listen="0.0.0.0", port=1, ssl_context=None, authorizer=None
        )


# -- certificates: renewed while running, reloaded ------------------------------------------------


def _later(seconds: float) -> Callable[[], datetime.datetime]:
    return lambda: datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)


def _served_serial(port: int, ca: Path) -> int:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        _client_ssl(ca).wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_a_self_managed_certificate_is_renewed_before_it_expires(tmp_path: Path) -> None:
    folder = tmp_path / "certs"
    validity = datetime.timedelta(hours=3)
    certs = ensure_webhook_certs(folder, hosts=["svc.ns.svc", "127.0.0.1"], validity=validity)
    key, ca = certs.key_file.read_bytes(), certs.ca_file.read_bytes()
    first = x509.load_pem_x509_certificate(certs.cert_file.read_bytes())
    assert not renew_if_due(folder, validity=validity, clock=_later(3600)), "2 of 3 h left"
    assert renew_if_due(folder, validity=validity, clock=_later(2 * 3600 + 60))
    second = x509.load_pem_x509_certificate(certs.cert_file.read_bytes())
    assert second.serial_number != first.serial_number
    assert second.not_valid_after_utc > first.not_valid_after_utc
    assert second.extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    ) == first.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    # Same key and CA: the pair always matches, the caBundle stays valid.
    assert certs.key_file.read_bytes() == key and certs.ca_file.read_bytes() == ca
    second.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))


def test_a_mounted_folder_is_never_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "secret"
    ensure_webhook_certs(folder, hosts=["a.ns.svc"])
    before = (folder / "tls.crt").read_bytes()
    monkeypatch.setattr("phalanx.operator.certs.os.access", lambda path, mode: False)
    assert not renew_if_due(folder, clock=_later(365 * 86400))
    assert (folder / "tls.crt").read_bytes() == before


def test_the_metrics_server_serves_a_renewed_certificate(tmp_path: Path) -> None:
    # Issued 80 of its 90 days ago: due for renewal now.
    certs = ensure_webhook_certs(tmp_path / "certs", hosts=["127.0.0.1"], clock=_later(-80 * 86400))
    port = _free_port()
    cert = ReloadingCert(certs.cert_file, certs.key_file)

    async def main() -> None:
        server = MetricsServer(
            CollectorRegistry(),
            listen="127.0.0.1",
            port=port,
            ssl_context=cert.context,
            authorizer=MetricsAuthorizer(FakeReviews()),  # type: ignore[arg-type]
        )
        await server.start()
        watcher = asyncio.create_task(cert.watch(interval=0.1))
        try:
            before = await asyncio.to_thread(_served_serial, port, certs.ca_file)
            assert renew_if_due(certs.cert_file.parent)
            for _ in range(50):
                await asyncio.sleep(0.1)
                if cert.reloads:
                    break
            after = await asyncio.to_thread(_served_serial, port, certs.ca_file)
            assert after != before
            on_disk = x509.load_pem_x509_certificate(certs.cert_file.read_bytes())
            assert after == on_disk.serial_number
        finally:
            watcher.cancel()
            await server.stop()

    asyncio.run(main())


def test_the_webhook_server_takes_a_renewed_certificate(tmp_path: Path) -> None:
    # kopf's server re-reads its files and publishes a fresh client config (caBundle).
    certs = ensure_webhook_certs(tmp_path / "certs", hosts=["127.0.0.1"], clock=_later(-80 * 86400))
    port = _free_port()
    server = PhalanxWebhookServer(
        addr="127.0.0.1",
        port=port,
        host="127.0.0.1",
        certfile=str(certs.cert_file),
        pkeyfile=str(certs.key_file),
        cafile=str(certs.ca_file),
        file_check_interval=0.1,
    )

    async def handler(*_: Any, **__: Any) -> Any:
        return {}

    async def main() -> None:
        configs = server(handler)
        first = await anext(configs)
        before = await asyncio.to_thread(_served_serial, port, certs.ca_file)
        # kopf asks for the next config at once; it takes the files' digest then.
        next_config = asyncio.ensure_future(anext(configs))
        await asyncio.sleep(0.3)
        assert renew_if_due(certs.cert_file.parent)
        second = await asyncio.wait_for(next_config, 5)
        after = await asyncio.to_thread(_served_serial, port, certs.ca_file)
        await configs.aclose()
        assert after != before
        assert first["caBundle"] == second["caBundle"], "same CA: no caBundle change needed"

    asyncio.run(main())
