"""Run Kueue's scheduler-performance runner with minimalkueue, as Kueue's Makefile does
(``run-performance-scheduler``), and measure the CPU of the processes it starts.

The runner starts an envtest control plane (etcd and kube-apiserver, from
``KUBEBUILDER_ASSETS``: here the local control plane's own binaries), installs Kueue's CRDs,
starts minimalkueue against it, creates the scenario's objects and plays the Workloads, then
writes ``summary.yaml``, ``wlStates.csv``, ``cqStates.csv`` and ``minimalkueue.stats.yaml`` into
its output folder. Its flags are the Makefile target's (``--withLogs=true --logToFile=true``),
without metrics scraping (``NO_SCALABILITY_SCRAPE``): scraping minimalkueue every 5 s would add
to the controller CPU being compared, and bench e2e scrapes its operator only before and after.

The API server's and etcd's CPU are read as bench e2e reads its own control plane's: process
CPU (user + system) from ``/proc/<pid>/stat`` of the runner's children, sampled every 0.5 s,
from when minimalkueue has started (the control plane is up, the CRDs installed) to the last
sample while minimalkueue still runs (the runner stops it once every Workload finished).
"""

from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from phalanx.bench.proc import cpu_seconds

__all__ = ["KueueRunError", "KueueRunResult", "run_kueue"]

_SAMPLE_S = 0.5
_MINIMALKUEUE = "minimalkueue"
_WATCHED = ("kube-apiserver", "etcd", _MINIMALKUEUE)


class KueueRunError(RuntimeError):
    """Kueue's runner failed; the message carries the tail of its log."""


@dataclass(frozen=True)
class KueueRunResult:
    output_dir: Path
    log: Path
    apiserver_cpu_s: float | None
    etcd_cpu_s: float | None


def _children(parent: int) -> dict[str, int]:
    """Direct children of ``parent`` by command name (``/proc/<pid>/stat``: comm, ppid)."""
    found: dict[str, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        ppid = int(raw[raw.rindex(")") + 2 :].split()[1])
        if ppid == parent and comm in _WATCHED:
            found[comm] = int(entry.name)
    return found


@dataclass
class _Sampler:
    """CPU of the runner's kube-apiserver and etcd over minimalkueue's life."""

    runner_pid: int
    pids: dict[str, int] = field(default_factory=dict)
    start: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.wait(_SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        if len(self.pids) < len(_WATCHED):
            self.pids.update(_children(self.runner_pid))
        kueue_pid = self.pids.get(_MINIMALKUEUE)
        if kueue_pid is None or cpu_seconds(kueue_pid) is None:
            return  # not started yet, or gone: the measured window is over
        for name in ("kube-apiserver", "etcd"):
            pid = self.pids.get(name)
            value = cpu_seconds(pid) if pid else None
            if value is None:
                continue
            self.start.setdefault(name, value)
            self.last[name] = value

    def used(self, name: str) -> float | None:
        if name not in self.start:
            return None
        return self.last[name] - self.start[name]


def run_kueue(
    *,
    runner: Path,
    minimalkueue: Path,
    crd_dir: Path,
    assets_dir: Path,
    config: Path,
    output_dir: Path,
    timeout_s: float,
    enable_tas: bool = False,
) -> KueueRunResult:
    """Run the runner to completion (its own ``--timeout`` is ``timeout_s``); ``enable_tas``
    as Kueue's ``run-tas-performance-scheduler`` target (minimalkueue's TAS controllers)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    log_path = output_dir / "runner.log"
    cmd = [
        str(runner),
        f"--o={output_dir}",
        f"--crds={crd_dir}",
        f"--generatorConfig={config.resolve()}",
        f"--minimalKueue={minimalkueue}",
        "--withLogs=true",
        "--logToFile=true",
        f"--timeout={int(timeout_s)}s",
        *(["--enableTAS=true"] if enable_tas else []),
    ]
    env = {
        **os.environ,
        "KUBEBUILDER_ASSETS": str(assets_dir),
        # Kueue's test utilities look for the project's Makefile upwards from the working
        # directory unless PROJECT_DIR is set; the runner needs none of the paths they derive.
        "PROJECT_DIR": str(output_dir / "project"),
    }
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            cmd, cwd=output_dir, env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
        sampler = _Sampler(runner_pid=proc.pid)
        thread = threading.Thread(target=sampler.run, name="kueue-cpu", daemon=True)
        thread.start()
        try:
            # The runner ends on its own (--timeout); the margin covers envtest's start/stop.
            code = proc.wait(timeout=timeout_s + 300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = -9
        finally:
            sampler.stop.set()
            thread.join()
    if code != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise KueueRunError(f"Kueue's runner exited with {code} (log {log_path}):\n{tail}")
    return KueueRunResult(
        output_dir=output_dir,
        log=log_path,
        apiserver_cpu_s=sampler.used("kube-apiserver"),
        etcd_cpu_s=sampler.used("etcd"),
    )
