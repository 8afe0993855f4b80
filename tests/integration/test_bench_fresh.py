"""``phalanx bench e2e --fresh`` runs on a control plane started anew: what the folder's
earlier cluster held is gone, as in Kueue's runner, which starts envtest afresh each run.
``--bare`` also runs the measured part on etcd and kube-apiserver alone, as envtest does.

Control planes of their own (folders under tmp_path), not the session's: ``--fresh`` deletes
the folder it is given."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from phalanx.devcluster import cluster as devcluster
from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

PHALANX = Path(sys.executable).with_name("phalanx")
SCENARIO = Path(__file__).parent / "compare_small" / "generator.yaml"
MARKER = "phalanx-bench-fresh-marker"


def _bench(state_dir: Path, *flags: str) -> dict[str, Any]:
    run = subprocess.run(
        [
            str(PHALANX),
            "bench",
            "e2e",
            "--config",
            str(SCENARIO),
            "--state-dir",
            str(state_dir),
            *flags,
            "--concurrency",
            "16",
            "--timeout",
            "300",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert run.returncode in (0, 1), run.stderr[-4000:]
    result: dict[str, Any] = json.loads(run.stdout)
    assert result["finished"] == result["workloads"] == 40, result
    return result


def test_fresh_starts_from_an_empty_control_plane(tmp_path: Path) -> None:
    # Catches --fresh ignored (the healthy cluster reused: the marker survives).
    state_dir = tmp_path / "cluster"
    try:
        before = ClusterHandle.from_status(devcluster.up(state_dir=state_dir))
        before.kubectl_ok("create", "configmap", MARKER, "-n", "default")
        result = _bench(state_dir, "--fresh")
        assert result["stopped_components"] == []
        assert result["v1beta1_served"] is True
        now = devcluster.status(state_dir=state_dir)
        assert now.healthy, "the fresh control plane is left running, as a reused one is"
        after = ClusterHandle.from_status(now)
        gone = after.kubectl("get", "configmap", MARKER, "-n", "default")
        assert gone.returncode != 0 and "NotFound" in gone.stderr, gone.stdout + gone.stderr
    finally:
        devcluster.down(state_dir=state_dir, purge=True)


def test_bare_runs_on_etcd_and_the_api_server_alone_and_v1beta1_off_serves_none(
    tmp_path: Path,
) -> None:
    # Catches --bare ignored (the three still running, or not reported), the run failing
    # without them, a bare plane that `up` cannot make whole again, and --v1beta1 off
    # installing CRDs that still serve v1beta1.
    state_dir = tmp_path / "cluster"
    try:
        result = _bench(state_dir, "--bare", "--v1beta1", "off")
        assert result["stopped_components"] == list(devcluster.BARE_STOPPED)
        assert result["v1beta1_served"] is False
        after = {c.name: c for c in devcluster.status(state_dir=state_dir).components}
        assert after["etcd"].healthy and after["kube-apiserver"].healthy, after
        for name in devcluster.BARE_STOPPED:
            assert not after[name].running, after[name]
        cluster = ClusterHandle.from_status(devcluster.up(state_dir=state_dir))
        assert devcluster.status(state_dir=state_dir).healthy
        v1beta2 = cluster.kubectl("get", "workloads.v1beta2.kueue.x-k8s.io", "-A")
        assert v1beta2.returncode == 0, v1beta2.stderr
        v1beta1 = cluster.kubectl("get", "workloads.v1beta1.kueue.x-k8s.io", "-A")
        assert v1beta1.returncode != 0, v1beta1.stdout
        # What docs/install.md tells a v1beta1 client it will get: kubectl's words, and the
        # API's 404 to a client that asks the path directly.
        assert "the server doesn't have a resource type" in v1beta1.stderr, v1beta1.stderr
        raw = cluster.kubectl("get", "--raw", "/apis/kueue.x-k8s.io/v1beta1/workloads")
        assert raw.returncode != 0, raw.stdout
        assert "the server could not find the requested resource" in raw.stderr, raw.stderr
    finally:
        devcluster.down(state_dir=state_dir, purge=True)
