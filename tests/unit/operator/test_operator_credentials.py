"""Credentials as users have them: kubeconfig exec plugins (cached until they expire or the
API server answers 401), token files, merged $KUBECONFIG files, in-cluster service accounts.

The exec plugin is a real executable written to a temporary folder; it counts its runs in a
file and prints the next token of a sequence, so the tests can see when it ran."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import socket
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp.web
import pytest
import yaml

from phalanx.operator import kubeconfig
from phalanx.operator.kube import ApiError, KubeApi
from phalanx.operator.kubeconfig import KubeconfigError, load, load_kubeconfig

PLUGIN = """#!{python}
import datetime, json, os, pathlib, sys
state = pathlib.Path({state!r})
runs = int(state.read_text()) + 1 if state.exists() else 1
state.write_text(str(runs))
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
pathlib.Path({state!r} + ".info").write_text(json.dumps(info))
status = {{"token": f"token-{{runs}}"}}
ttl = float(os.environ.get("FAKE_TTL", "0"))
if ttl:
    end = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=ttl)
    status["expirationTimestamp"] = end.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
if os.environ.get("FAKE_FAIL"):
    print("no credentials for you", file=sys.stderr)
    sys.exit(3)
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}}))
"""


def _plugin(tmp_path: Path) -> tuple[Path, Path]:
    state = tmp_path / "runs"
    script = tmp_path / "bin" / "fake-auth"
    script.parent.mkdir(exist_ok=True)
    script.write_text(PLUGIN.format(python=sys.executable, state=str(state)))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, state


def _runs(state: Path) -> int:
    return int(state.read_text()) if state.exists() else 0


def _kubeconfig(
    tmp_path: Path, user: dict[str, Any], *, server: str = "https://127.0.0.1:6443"
) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "dev",
        "contexts": [{"name": "dev", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def _exec_user(
    ttl: float = 0, api_version: str = "client.authentication.k8s.io/v1", **extra: Any
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "apiVersion": api_version,
        "command": "./bin/fake-auth",  # relative to the kubeconfig's folder, as kubectl does
        "env": [{"name": "FAKE_TTL", "value": str(ttl)}],
        "interactiveMode": "Never",
        **extra,
    }
    return {"exec": entry}


@pytest.mark.parametrize(
    "api_version", ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"]
)
def test_an_exec_credential_is_cached_until_it_expires(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api_version: str
) -> None:
    _, state = _plugin(tmp_path)
    auth = load_kubeconfig(_kubeconfig(tmp_path, _exec_user(ttl=3600, api_version=api_version)))
    assert _runs(state) == 0, "the plugin runs when a credential is needed, not at load"
    assert auth.headers() == {"Authorization": "Bearer token-1"}
    assert auth.bearer_token() == "token-1"
    assert _runs(state) == 1
    info = json.loads(Path(f"{state}.info").read_text())
    assert info["apiVersion"] == api_version and info["spec"]["interactive"] is False
    assert auth.expiration is not None and auth.refresh_due() is False
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=2)
    monkeypatch.setattr(kubeconfig, "_utcnow", lambda: later)
    assert auth.refresh_due()
    assert auth.bearer_token() == "token-2"
    assert _runs(state) == 2


def test_an_exec_credential_without_expiry_is_kept_until_refused(tmp_path: Path) -> None:
    _, state = _plugin(tmp_path)
    auth = load_kubeconfig(_kubeconfig(tmp_path, _exec_user()))
    assert [auth.bearer_token() for _ in range(5)] == ["token-1"] * 5
    assert auth.invalidate("some-other-token") and auth.bearer_token() == "token-1"
    assert auth.invalidate("token-1")
    assert auth.bearer_token() == "token-2"
    assert _runs(state) == 2


def test_cluster_info_is_passed_when_asked(tmp_path: Path) -> None:
    _, state = _plugin(tmp_path)
    auth = load_kubeconfig(_kubeconfig(tmp_path, _exec_user(provideClusterInfo=True)))
    auth.bearer_token()
    info = json.loads(Path(f"{state}.info").read_text())
    assert info["spec"]["cluster"]["server"] == "https://127.0.0.1:6443"


@pytest.mark.parametrize(
    ("user", "message"),
    [
        (
            {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "x"}},
            "interactiveMode must be set",
        ),
        (_exec_user(interactiveMode="Always"), "needs a terminal"),
        (_exec_user(api_version="client.authentication.k8s.io/v1alpha1"), "not supported"),
        ({"auth-provider": {"name": "gcp"}}, "exec plugin"),
    ],
)
def test_unusable_entries_are_refused_with_the_user_named(
    tmp_path: Path, user: dict[str, Any], message: str
) -> None:
    with pytest.raises(KubeconfigError, match=rf"users\[u\].*{message}"):
        load_kubeconfig(_kubeconfig(tmp_path, user))


def test_a_failing_or_missing_plugin_says_so(tmp_path: Path) -> None:
    _plugin(tmp_path)
    user = _exec_user()
    user["exec"]["env"].append({"name": "FAKE_FAIL", "value": "1"})
    auth = load_kubeconfig(_kubeconfig(tmp_path, user))
    with pytest.raises(ValueError, match=r"exited with code 3: no credentials for you"):
        auth.bearer_token()
    missing = {"exec": {**_exec_user()["exec"], "command": "no-such-plugin-xyz"}}
    missing["exec"]["installHint"] = "Install it from example.org."
    auth = load_kubeconfig(_kubeconfig(tmp_path, missing))
    with pytest.raises(ValueError, match=r"not found on \$PATH. Install it from example.org"):
        auth.bearer_token()


def test_a_token_file_is_reread_when_refused(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("first\n")
    auth = load_kubeconfig(_kubeconfig(tmp_path, {"tokenFile": "tok"}))
    assert auth.bearer_token() == "first"
    (tmp_path / "tok").write_text("second\n")
    assert auth.bearer_token() == "first", "re-read at most once a minute"
    assert auth.invalidate("first")
    assert auth.bearer_token() == "second"


def test_kubeconfig_files_in_the_env_are_merged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = tmp_path / "a"
    a.mkdir()
    (a / "config").write_text(
        yaml.safe_dump(
            {
                "current-context": "dev",
                "contexts": [{"name": "dev", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    b = _kubeconfig(tmp_path, {"token": "from-b"})
    monkeypatch.setenv("KUBECONFIG", f"{a / 'config'}:{tmp_path / 'missing'}:{b}")
    auth = load()
    assert auth.server == "https://127.0.0.1:6443" and auth.bearer_token() == "from-b"


def test_in_cluster_credentials_from_an_overridden_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token\n")
    (sa / "ca.crt").write_bytes(b"CA")
    (sa / "namespace").write_text("phalanx-system")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv(kubeconfig.SERVICE_ACCOUNT_DIR_ENV, str(sa))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    auth = load()
    assert auth.server == "https://[fd00::1]:6443"
    assert auth.ca_data == b"CA" and auth.default_namespace == "phalanx-system"
    assert auth.bearer_token() == "sa-token"


# -- the client: 401 means a new credential, once -------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def _server() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Accepts only the token in ``state["valid"]``; counts requests."""
    state: dict[str, Any] = {"valid": None, "requests": 0}

    async def handler(request: aiohttp.web.Request) -> aiohttp.web.Response:
        state["requests"] += 1
        if request.headers.get("Authorization") != f"Bearer {state['valid']}":
            return aiohttp.web.json_response({"kind": "Status", "code": 401}, status=401)
        return aiohttp.web.json_response({"kind": "Namespace"})

    app = aiohttp.web.Application()
    app.router.add_get("/api/v1/namespaces/default", handler)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await aiohttp.web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        await runner.cleanup()


def test_a_401_runs_the_plugin_again_and_retries_once(tmp_path: Path) -> None:
    _, state = _plugin(tmp_path)

    async def main() -> None:
        async with _server() as (url, server):
            auth = load_kubeconfig(_kubeconfig(tmp_path, _exec_user(), server=url))
            api = KubeApi(auth)
            try:
                server["valid"] = "token-1"
                await api.request("GET", "/api/v1/namespaces/default")
                await api.request("GET", "/api/v1/namespaces/default")
                assert _runs(state) == 1, "a good credential is reused"
                server["valid"] = "token-2"  # the old one was revoked
                await api.request("GET", "/api/v1/namespaces/default")
                assert _runs(state) == 2 and server["requests"] == 4
                server["valid"] = "never"
                with pytest.raises(ApiError) as refused:
                    await api.request("GET", "/api/v1/namespaces/default")
                assert refused.value.status == 401
                assert server["requests"] == 6, "one retry, not a loop"
            finally:
                await api.close()

    asyncio.run(main())


def test_an_expired_credential_is_refreshed_before_the_request(tmp_path: Path) -> None:
    _, state = _plugin(tmp_path)

    async def main() -> None:
        async with _server() as (url, server):
            auth = load_kubeconfig(_kubeconfig(tmp_path, _exec_user(ttl=1), server=url))
            api = KubeApi(auth)
            try:
                server["valid"] = "token-1"
                await api.request("GET", "/api/v1/namespaces/default")
                await asyncio.sleep(1.2)
                server["valid"] = "token-2"
                await api.request("GET", "/api/v1/namespaces/default")
                assert _runs(state) == 2
                assert server["requests"] == 2, "refreshed on expiry, no 401 needed"
            finally:
                await api.close()

    asyncio.run(main())
