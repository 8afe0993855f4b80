"""``phalanx devcluster up|status|kubeconfig|down`` on a second, private cluster.

It runs in its own state folder (with its own ports and a 2-node topology), so stopping it
never disturbs the session's shared cluster.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.devcluster import pins

pytestmark = pytest.mark.integration

TOPOLOGY = """
blocks: 1
racksPerBlock: 1
hostsPerRack: 2
namePrefix: tiny
node:
  allocatable: {nvidia.com/gpu: "4", cpu: "32", memory: 256Gi, pods: "50"}
  labels: {nvidia.com/gpu.product: test-gpu}
  taints: [{key: phalanx.dev/test, value: "yes", effect: NoSchedule}]
"""


def _phalanx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "phalanx.cli.main", "devcluster", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _pids(state_dir: Path) -> dict[str, int]:
    state = json.loads((state_dir / "state.json").read_text())
    return {name: rec["pid"] for name, rec in state["processes"].items()}


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and "pytest" not in cmdline:
            found.append(int(proc.name))
    return found


def test_devcluster_cli_up_status_down_leaves_nothing_behind(
    cluster: object, tmp_path: Path
) -> None:
    # `cluster` first: the shared cluster holds the default ports, so this one must pick others.
    state_dir = tmp_path / "state"
    topology = tmp_path / "tiny.yaml"
    topology.write_text(TOPOLOGY)
    first: dict[str, int] = {}
    try:
        up = _phalanx("up", "--state-dir", str(state_dir), "--topology", str(topology))
        assert up.returncode == 0, up.stdout + up.stderr
        status = _phalanx("status", "--state-dir", str(state_dir))
        assert status.returncode == 0, status.stdout + status.stderr
        assert "cluster: healthy" in status.stdout
        assert "nodes: 2 (2 ready, topology 2)" in status.stdout
        for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"):
            assert any(
                line.split()[:2] == [name, "healthy"] for line in status.stdout.splitlines()
            ), status.stdout
        kubeconfig = _phalanx("kubeconfig", "--state-dir", str(state_dir))
        assert kubeconfig.stdout.strip() == str(state_dir / "kubeconfig" / "admin.yaml")

        kubectl = str(pins.binary_cache().path("kubectl"))
        node = json.loads(
            subprocess.run(
                [
                    kubectl,
                    f"--kubeconfig={kubeconfig.stdout.strip()}",
                    "get",
                    "node",
                    "tiny-b0-r0-h1",
                    "-o",
                    "json",
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "test-gpu"
        assert {"key": "phalanx.dev/test", "value": "yes", "effect": "NoSchedule"} in node["spec"][
            "taints"
        ]

        # A second `up` reuses the healthy cluster: same processes.
        first = _pids(state_dir)
        again = _phalanx("up", "--state-dir", str(state_dir), "--topology", str(topology))
        assert again.returncode == 0, again.stderr
        assert "reusing the healthy cluster" in again.stderr
        assert _pids(state_dir) == first

        # A dead component makes status unhealthy; `up` brings the cluster back.
        os.kill(first["kwok"], signal.SIGKILL)
        broken = _phalanx("status", "--state-dir", str(state_dir))
        assert broken.returncode == 1
        assert "cluster: NOT healthy" in broken.stdout
        healed = _phalanx("up", "--state-dir", str(state_dir), "--topology", str(topology))
        assert healed.returncode == 0, healed.stderr
        assert "cluster: healthy" in healed.stdout
    finally:
        down = _phalanx("down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stderr
    assert "stopped: etcd, kube-apiserver" in down.stdout
    pids = json.loads((state_dir / "state.json").read_text())["processes"]
    assert pids == {}
    for pid in first.values():
        assert not Path(f"/proc/{pid}").exists() or _is_zombie_or_other(pid, state_dir)
    assert _processes_mentioning(str(state_dir)) == []
    after = _phalanx("status", "--state-dir", str(state_dir))
    assert after.returncode == 1
    assert "stopped" in after.stdout
    assert "nothing was running" in _phalanx("down", "--state-dir", str(state_dir)).stdout


def _is_zombie_or_other(pid: int, state_dir: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return str(state_dir) not in cmdline or stat[stat.rindex(")") + 2] == "Z"
