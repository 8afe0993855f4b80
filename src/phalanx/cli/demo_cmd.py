"""``phalanx demo``: Phalanx on the local control plane, from nothing to a running burst.

Starts (or reuses) the devcluster, installs the CRDs, runs the operator in the background
(log in ~/.cache/phalanx/demo/operator.log), applies the sample queues of manifests/samples
and two bursts of GPU Jobs, shows live which Jobs are admitted, where their pods run and why
the others wait, then prints a summary and leaves everything running.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["register"]

REPO = Path(__file__).resolve().parents[3]
SAMPLES = REPO / "manifests" / "samples"
DEMO_DIR = Path.home() / ".cache" / "phalanx" / "demo"
RACK = "cloud.provider.com/topology-rack"
BLOCK = "cloud.provider.com/topology-block"
TEAM_A_DELAY = 8.0


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="run Phalanx on the local control plane with sample queues and a burst of GPU Jobs",
        description=__doc__,
    )
    parser.add_argument(
        "--timeout", type=float, default=240.0, help="stop watching after this many seconds"
    )
    parser.add_argument("--state-dir", type=Path, help="devcluster state folder")
    parser.set_defaults(func=run)


@dataclass
class Row:
    job: str
    team: str
    shape: str
    state: str
    where: str
    why: str
    preempted: bool


class Demo:
    def __init__(self, handle: Any, *, started: float) -> None:
        self.cluster = handle
        self.started = started
        self.nodes: dict[str, Mapping[str, str]] = {}
        self.ever_preempted: set[str] = set()

    def kubectl_json(self, *args: str) -> dict[str, Any]:
        return dict(json.loads(self.cluster.kubectl_ok(*args, "-o", "json")))

    def load_nodes(self) -> None:
        for node in self.kubectl_json("get", "nodes")["items"]:
            self.nodes[node["metadata"]["name"]] = node["metadata"].get("labels") or {}

    def rows(self) -> list[Row]:
        jobs = self.kubectl_json("get", "jobs", "-A", "-l", "kueue.x-k8s.io/queue-name")["items"]
        workloads = {
            (o["metadata"]["namespace"], ref["name"]): o
            for o in self.kubectl_json("get", "workloads.kueue.x-k8s.io", "-A")["items"]
            for ref in o["metadata"].get("ownerReferences") or ()
            if ref.get("kind") == "Job"
        }
        pods: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for pod in self.kubectl_json("get", "pods", "-A", "-l", "job-name")["items"]:
            key = (pod["metadata"]["namespace"], pod["metadata"]["labels"]["job-name"])
            pods.setdefault(key, []).append(pod)
        rows = []
        for job in sorted(jobs, key=lambda j: (j["metadata"]["namespace"], j["metadata"]["name"])):
            rows.append(self._row(job, workloads, pods))
        return rows

    def _row(
        self,
        job: dict[str, Any],
        workloads: Mapping[tuple[str, str], dict[str, Any]],
        pods: Mapping[tuple[str, str], list[dict[str, Any]]],
    ) -> Row:
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        container = job["spec"]["template"]["spec"]["containers"][0]
        gpus = container["resources"]["requests"].get("nvidia.com/gpu", "0")
        shape = f"{job['spec'].get('parallelism', 1)}x{gpus} GPU"
        wl = workloads.get((ns, name))
        conditions = {
            c["type"]: c for c in ((wl or {}).get("status") or {}).get("conditions") or ()
        }
        mine = pods.get((ns, name), [])
        running = [p for p in mine if p["status"].get("phase") == "Running"]
        done = [p for p in mine if p["status"].get("phase") == "Succeeded"]
        if conditions.get("Preempted", {}).get("status") == "True":
            self.ever_preempted.add(f"{ns}/{name}")
        state, why = "Pending", ""
        if wl is None:
            state = "Queued"
        elif conditions.get("Finished", {}).get("status") == "True":
            state = "Finished"
        elif conditions.get("Admitted", {}).get("status") == "True":
            evicting = conditions.get("Evicted", {}).get("status") == "True"
            state = "Evicting" if evicting else ("Running" if running else "Admitted")
        else:
            reserved = conditions.get("QuotaReserved", {})
            why = reserved.get("message", "") if reserved.get("status") == "False" else ""
            if f"{ns}/{name}" in self.ever_preempted:
                state = "Preempted"
        where_pods = running or done
        return Row(
            job=name,
            team=ns,
            shape=shape,
            state=state,
            where=self._where(where_pods),
            why=why,
            preempted=f"{ns}/{name}" in self.ever_preempted,
        )

    def _where(self, pods: list[dict[str, Any]]) -> str:
        nodes = sorted({p["spec"].get("nodeName") for p in pods if p["spec"].get("nodeName")})
        if not nodes:
            return ""
        racks = sorted({self.nodes.get(n, {}).get(RACK, "?") for n in nodes})
        blocks = sorted({self.nodes.get(n, {}).get(BLOCK, "?") for n in nodes})
        count = f"{len(nodes)} node{'s' if len(nodes) > 1 else ''}"
        if len(racks) == 1:
            return f"rack {racks[0]} ({count})"
        if len(blocks) == 1:
            return f"block {blocks[0]} ({count}, racks {', '.join(racks)})"
        return f"racks {', '.join(racks)} ({count})"


def _table(rows: list[Row], *, width: int) -> list[str]:
    head = f"{'JOB':<14} {'TEAM':<7} {'SHAPE':<9} {'STATE':<10} {'WHERE':<30} WHY"
    lines = [head]
    for r in rows:
        line = f"{r.job:<14} {r.team:<7} {r.shape:<9} {r.state:<10} {r.where:<30} {r.why}"
        lines.append(line[: max(width, 80)])
    return lines


def _usage(demo: Demo) -> str:
    parts = []
    for cq in ("team-a", "team-b"):
        proc = demo.cluster.kubectl("get", "clusterqueue.kueue.x-k8s.io", cq, "-o", "json")
        if proc.returncode != 0:
            continue
        status = json.loads(proc.stdout).get("status") or {}
        total = borrowed = "0"
        for flavor in status.get("flavorsUsage") or ():
            for res in flavor.get("resources") or ():
                if res["name"] == "nvidia.com/gpu":
                    total, borrowed = res.get("total", "0"), res.get("borrowed", "0")
        parts.append(
            f"{cq} {total}/64 GPUs" + (f" ({borrowed} borrowed)" if borrowed != "0" else "")
        )
    return "   ".join(parts)


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop_previous_operator() -> None:
    pid_file = DEMO_DIR / "operator.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text().strip() or 0)
    cmdline = Path(f"/proc/{pid}/cmdline")
    if pid and cmdline.exists() and b"operator" in cmdline.read_bytes():
        print(f"stopping the operator of the previous demo (pid {pid})")
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            if not cmdline.exists():
                break
            time.sleep(0.1)
    pid_file.unlink(missing_ok=True)


def _start_operator(kubeconfig: Path) -> tuple[subprocess.Popen[bytes], Path, int]:
    DEMO_DIR.mkdir(parents=True, exist_ok=True)
    log = DEMO_DIR / "operator.log"
    metrics_port = 8080 if _port_free(8080) else _free_port()
    cmd = [
        sys.executable,
        "-m",
        "phalanx.cli.main",
        "operator",
        f"--kubeconfig={kubeconfig}",
        f"--metrics-port={metrics_port}",
        "--metrics-secure=false",  # plain HTTP on loopback: scraped without a token
        f"--webhook-port={9443 if _port_free(9443) else _free_port()}",
        f"--webhook-cert-dir={DEMO_DIR / 'webhook-certs'}",
    ]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    (DEMO_DIR / "operator.pid").write_text(str(process.pid))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the operator exited; see {log}:\n{log.read_text()[-3000:]}")
        if "event=scheduler_ready" in log.read_text(errors="replace"):
            return process, log, metrics_port
        time.sleep(0.3)
    raise RuntimeError(f"the operator did not become ready in 90 s; see {log}")


def _port_free(port: int) -> bool:
    with contextlib.closing(socket.socket()) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _reset(cluster: Any) -> None:
    """Remove what a previous demo left, so this one starts from the same picture."""
    cluster.kubectl(
        "delete", "namespace", "team-a", "team-b", "--ignore-not-found", "--wait=true", timeout=180
    )
    for ref in (
        "clusterqueue.kueue.x-k8s.io/team-a",
        "clusterqueue.kueue.x-k8s.io/team-b",
        "cohort.kueue.x-k8s.io/research",
    ):
        cluster.kubectl("delete", ref, "--ignore-not-found", "--wait=false")
        if ref.startswith("clusterqueue"):
            # The previous demo's operator is gone: nobody else removes the resource-in-use
            # finalizer, and its Workloads went with the namespaces.
            cluster.kubectl("patch", ref, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
        cluster.kubectl("wait", "--for=delete", ref, "--timeout=60s")


def run(args: argparse.Namespace) -> int:
    from phalanx.api.crds import write_crds
    from phalanx.devcluster import cluster as devcluster
    from phalanx.devcluster.handle import ClusterHandle

    started = time.monotonic()
    print("== Phalanx demo: gang admission and topology-aware placement on a local cluster ==")
    print("-- 1/5 local control plane (etcd, kube-apiserver, controller-manager, scheduler, KWOK)")
    status = devcluster.up(state_dir=args.state_dir)
    if not status.healthy:
        print(devcluster.log_tails(args.state_dir), file=sys.stderr)
        return 1
    cluster = ClusterHandle.from_status(status)
    print(f"   API server {cluster.server}, kubeconfig {cluster.kubeconfig}")

    print("-- 2/5 CRDs (kueue.x-k8s.io/v1beta2)")
    crd_dir = DEMO_DIR / "crds"
    shutil.rmtree(crd_dir, ignore_errors=True)
    write_crds(crd_dir)
    cluster.apply_crds(path.read_text() for path in sorted(crd_dir.glob("*.yaml")))

    print("-- 3/5 operator")
    _stop_previous_operator()
    _reset(cluster)
    process, log, metrics_port = _start_operator(cluster.kubeconfig)
    print(f"   pid {process.pid}, log {log}, metrics http://127.0.0.1:{metrics_port}/metrics")

    print("-- 4/5 sample queues (manifests/samples/queues.yaml)")
    print(cluster.kubectl_ok("apply", "-f", str(SAMPLES / "queues.yaml")).rstrip())
    time.sleep(1)

    print("-- 5/5 burst: team-b now, team-a in a few seconds (manifests/samples/jobs/)")
    cluster.kubectl_ok("apply", "-f", str(SAMPLES / "jobs" / "team-b.yaml"))
    demo = Demo(cluster, started=time.monotonic())
    demo.load_nodes()
    rows = _watch(demo, cluster, timeout=args.timeout)
    _summary(demo, rows, log=log, metrics_port=metrics_port, started=started)
    return 0


def _watch(demo: Demo, cluster: Any, *, timeout: float) -> list[Row]:
    t0 = time.monotonic()
    submitted_a = False
    quiet = 0
    last: dict[str, str] = {}
    tty = sys.stdout.isatty()
    rows: list[Row] = []
    while time.monotonic() - t0 < timeout:
        elapsed = time.monotonic() - t0
        if not submitted_a and elapsed >= TEAM_A_DELAY:
            cluster.kubectl_ok("apply", "-f", str(SAMPLES / "jobs" / "team-a.yaml"))
            submitted_a = True
        rows = demo.rows()
        header = f"t={elapsed:5.1f}s   {_usage(demo)}"
        if tty:
            width = shutil.get_terminal_size((160, 40)).columns
            sys.stdout.write(
                "\033[H\033[J" + header + "\n\n" + "\n".join(_table(rows, width=width)) + "\n"
            )
            sys.stdout.flush()
        else:
            for r in rows:
                state = f"{r.state} {r.where} {r.why}".strip()
                if last.get(f"{r.team}/{r.job}") != state:
                    last[f"{r.team}/{r.job}"] = state
                    print(f"t={elapsed:5.1f}s  {r.team}/{r.job:<13} {r.shape:<9} {state}")
        busy = any(r.state in ("Running", "Admitted", "Evicting", "Queued") for r in rows)
        quiet = 0 if busy or not submitted_a else quiet + 1
        if submitted_a and quiet >= 3:
            break
        time.sleep(1.0)
    return rows


def _summary(demo: Demo, rows: list[Row], *, log: Path, metrics_port: int, started: float) -> None:
    finished = [r for r in rows if r.state == "Finished"]
    waiting = [r for r in rows if r.state not in ("Finished",)]
    lines = ["", "== Summary ==", *_table(rows, width=200), ""]
    preempted = ", ".join(sorted(demo.ever_preempted)) or "-"
    lines.append(
        f"{len(finished)} of {len(rows)} Jobs finished; "
        f"{len(demo.ever_preempted)} preempted and requeued ({preempted})."
    )
    gangs = [r for r in finished if not r.shape.startswith("1x")]
    for r in gangs:
        lines.append(f"gang {r.team}/{r.job} ({r.shape}) ran whole in {r.where}")
    for r in waiting:
        lines.append(f"still waiting: {r.team}/{r.job} ({r.shape}): {r.why or r.state}")
    lines.append(f"total time {time.monotonic() - started:.0f} s (cluster start included)")
    lines += [
        "",
        "The cluster and the operator keep running. Try:",
        f"  export KUBECONFIG={demo.cluster.kubeconfig}",
        f"  {demo.cluster.kubectl_path} get clusterqueues,localqueues -A",
        f"  {demo.cluster.kubectl_path} get workloads -A",
        f"  {demo.cluster.kubectl_path} describe workload -n team-a  # conditions say why",
        f"  curl -s http://127.0.0.1:{metrics_port}/metrics | grep ^kueue_",
        f"  operator log: {log}",
        "Stop: kill $(cat ~/.cache/phalanx/demo/operator.pid); phalanx devcluster down",
    ]
    text = "\n".join(lines)
    print(text)
    (DEMO_DIR / "summary.txt").write_text(text + "\n")
