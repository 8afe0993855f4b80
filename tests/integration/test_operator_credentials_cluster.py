"""Credentials as users have them, on the local control plane: the operator authenticated
by a kubeconfig exec plugin that prints a real ServiceAccount token, by a tokenFile, and by an
in-cluster-shaped config (KUBERNETES_SERVICE_HOST/PORT, token and CA files); and /metrics
over HTTPS answering 401 without a token, 403 to a ServiceAccount without the
phalanx-metrics-reader ClusterRole, 200 to one bound to it."""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from operator_fixtures import *  # noqa: F403
from operator_fixtures import PHALANX, REPO, OperatorProcess, free_port, start_operator

from phalanx.devcluster.handle import ClusterHandle
from phalanx.operator.kubeconfig import SERVICE_ACCOUNT_DIR_ENV

pytestmark = pytest.mark.integration

NS = "phx-creds"

PLUGIN = """#!{python}
import json, os, pathlib
runs = pathlib.Path({runs!r})
runs.write_text(str(int(runs.read_text()) + 1 if runs.exists() else 1))
token = pathlib.Path({token!r}).read_text().strip()
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential",
                  "status": {{"token": token}}}}))
"""


def _token(cluster: ClusterHandle, name: str) -> str:
    return cluster.kubectl_ok("create", "token", name, "-n", NS, "--duration=1h").strip()


@pytest.fixture(scope="module")
def accounts(cluster: ClusterHandle, kueue_crds: Path) -> Iterator[dict[str, str]]:
    """ServiceAccounts: ``operator`` (cluster-admin: this tests credentials, not RBAC),
    ``scraper`` (bound to phalanx-metrics-reader from the manifests), ``other`` (nothing)."""
    cluster.kubectl("create", "namespace", NS)
    for name in ("operator", "scraper", "other"):
        cluster.kubectl("create", "serviceaccount", name, "-n", NS)
    rbac = list(yaml.safe_load_all((REPO / "manifests" / "base" / "rbac.yaml").read_text()))
    reader = [d for d in rbac if d and d["metadata"]["name"] == "phalanx-metrics-reader"]
    assert len(reader) == 1, "manifests/base/rbac.yaml has the phalanx-metrics-reader role"
    cluster.kubectl_ok("apply", "-f", "-", input=yaml.safe_dump(reader[0]))
    bindings = (
        ("phx-creds-operator", "cluster-admin", "operator"),
        ("phx-creds-scraper", "phalanx-metrics-reader", "scraper"),
    )
    for binding, role, account in bindings:
        cluster.kubectl(
            "create",
            "clusterrolebinding",
            binding,
            f"--clusterrole={role}",
            f"--serviceaccount={NS}:{account}",
        )
    yield {name: _token(cluster, name) for name in ("operator", "scraper", "other")}
    for binding, _, _ in bindings:
        cluster.kubectl("delete", "clusterrolebinding", binding, "--wait=false")
    cluster.kubectl("delete", "namespace", NS, "--wait=false")


def _user_kubeconfig(cluster: ClusterHandle, user: dict[str, Any], path: Path) -> Path:
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    base = cluster.kubeconfig.parent
    for entry in config["clusters"]:
        ca = entry["cluster"].get("certificate-authority")
        if ca:  # the copy lives elsewhere: inline the CA
            entry["cluster"]["certificate-authority-data"] = base64.b64encode(
                (base / ca).read_bytes()
            ).decode()
            del entry["cluster"]["certificate-authority"]
    config["users"] = [{"name": "u", "user": user}]
    for entry in config["contexts"]:
        entry["context"]["user"] = "u"
    path.write_text(yaml.safe_dump(config))
    return path


def _whoami(op: OperatorProcess) -> None:
    assert "event=operator_started" in op.log.read_text(errors="replace"), op.log_tail()


def test_the_operator_runs_on_an_exec_plugin_and_serves_metrics_to_readers_only(
    cluster: ClusterHandle, accounts: dict[str, str], tmp_path: Path
) -> None:
    token_file = tmp_path / "sa-token"
    token_file.write_text(accounts["operator"])
    runs = tmp_path / "runs"
    plugin = tmp_path / "fake-eks-get-token"
    plugin.write_text(PLUGIN.format(python=sys.executable, runs=str(runs), token=str(token_file)))
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    exec_user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": str(plugin),
            "interactiveMode": "Never",
        }
    }
    kubeconfig = _user_kubeconfig(cluster, exec_user, tmp_path / "exec.yaml")
    port = free_port()
    op = start_operator(
        cluster,
        tmp_path,
        f"--kubeconfig={kubeconfig}",
        f"--metrics-port={port}",
        "--metrics-secure=true",
        "--metrics-listen=127.0.0.1",
        name="exec",
    )
    try:
        _whoami(op)
        assert int(runs.read_text()) >= 1, "the plugin ran"
        ca = op.cert_dir() / "ca.crt"
        url = f"https://127.0.0.1:{port}/metrics"
        assert _scrape(url, ca, None)[0] == 401
        assert _scrape(url, ca, "not-a-token")[0] == 401
        assert _scrape(url, ca, accounts["other"])[0] == 403
        status, text = _scrape(url, ca, accounts["scraper"])
        assert status == 200 and "phalanx_scheduling_cycle_duration_seconds" in text
        before = int(runs.read_text())
        for _ in range(3):
            assert _scrape(url, ca, accounts["scraper"])[0] == 200
        assert int(runs.read_text()) == before, "the exec credential is cached"
        log = op.log.read_text(errors="replace")
        assert "event=metrics_refused status=403" in log
    finally:
        assert op.stop() == 0, op.log_tail()


def _scrape(url: str, ca: Path, token: str | None) -> tuple[int, str]:
    async def get() -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        context = ssl.create_default_context(cafile=str(ca))
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, headers=headers, ssl=context) as response,
        ):
            return response.status, await response.text()

    return asyncio.run(get())


def test_the_operator_runs_on_a_token_file(
    cluster: ClusterHandle, accounts: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(accounts["operator"] + "\n")
    kubeconfig = _user_kubeconfig(cluster, {"tokenFile": "token"}, tmp_path / "tf.yaml")
    op = start_operator(cluster, tmp_path, f"--kubeconfig={kubeconfig}", name="tokenfile")
    try:
        _whoami(op)
    finally:
        assert op.stop() == 0, op.log_tail()


def test_the_operator_runs_in_cluster_shaped(
    cluster: ClusterHandle, accounts: dict[str, str], tmp_path: Path
) -> None:
    config = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]
    server = config["server"]
    host, _, port = server.removeprefix("https://").rpartition(":")
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(accounts["operator"])
    ca = config.get("certificate-authority-data")
    ca_bytes = (
        base64.b64decode(ca)
        if ca
        else (cluster.kubeconfig.parent / config["certificate-authority"]).read_bytes()
    )
    (sa / "ca.crt").write_bytes(ca_bytes)
    (sa / "namespace").write_text(NS)
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.update(
        {
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
            SERVICE_ACCOUNT_DIR_ENV: str(sa),
            "HOME": str(tmp_path),  # no ~/.kube/config to fall back on
        }
    )
    log = tmp_path / "incluster.log"
    cmd = [
        str(PHALANX),
        "operator",
        "--no-webhooks",
        "--metrics-port=0",
        "--no-leader-elect",
    ]
    with open(log, "wb") as handle:
        process = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env)
    op = OperatorProcess(process=process, log=log, metrics_port=0)
    try:
        deadline = time.monotonic() + 60
        while "event=scheduler_ready" not in log.read_text(errors="replace"):
            assert process.poll() is None, op.log_tail()
            assert time.monotonic() < deadline, op.log_tail()
            time.sleep(0.3)
        assert f"server=https://{host}:{port}" in log.read_text(errors="replace")
    finally:
        assert op.stop() == 0, op.log_tail()
