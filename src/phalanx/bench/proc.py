"""Processes around a benchmark or fault run: a ``phalanx operator`` subprocess, its
Prometheus metrics, and CPU time and resident memory read from ``/proc``.

The operator runs as its own process (``python -m phalanx.cli.main operator``) exactly as a
user starts it, so what is measured is the shipped command, webhooks and all.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "Memory",
    "OperatorProcess",
    "RssSampler",
    "cpu_seconds",
    "free_port",
    "metric_sum",
    "read_memory",
    "scrape",
    "start_operator",
]

READY_LINE = "event=scheduler_ready"


_HANDED_OUT: set[int] = set()
_HANDED_OUT_LOCK = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``host`` now and that this process has not handed out
    before. Bind-and-release only proves the port free on the address tried: a port free on
    127.0.0.1 may be taken on the host's own address, so ask on the address the server will
    use; and a port handed out earlier may not be bound yet by whoever got it, so never hand
    it out twice."""
    with _HANDED_OUT_LOCK:
        for _ in range(100):
            with contextlib.closing(socket.socket()) as sock:
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port
    raise RuntimeError(f"no free port on {host} that this process has not handed out already")


@dataclass(frozen=True)
class WebhookEndpoint:
    """The webhook address and certificate folder operators started here share per cluster."""

    port: int
    cert_dir: Path

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def args(self) -> list[str]:
        return [
            f"--webhook-port={self.port}",
            f"--webhook-url={self.url}",
            f"--webhook-cert-dir={self.cert_dir}",
        ]


def cluster_webhook(kubeconfig: Path) -> WebhookEndpoint:
    """One webhook address and certificate per cluster (per kubeconfig file) for the operators
    benchmarks and tests start, kept beside the kubeconfig in ``operator-webhook/``.

    In a cluster the operator is reached through its Service, which does not change when a
    replica restarts. An operator on its own loopback port advertises a new address at every
    start, and re-pointing the converting CRDs re-initializes their storage in the API server
    (429 "storage is (re)initializing", every watch on those kinds reset, the garbage
    collector's graph rebuilt). Sharing one port and one certificate avoids that: the CRDs and
    webhook configurations are pointed here once. Replicas running at once all listen on it
    (kopf binds with SO_REUSEPORT; the kernel spreads connections among them), and with a
    fixed ``--webhook-url`` no replica points the CRDs back when it exits.

    The port is below the kernel's ephemeral range, so no outgoing connection takes it while
    no operator listens."""
    from phalanx.operator.certs import ensure_webhook_certs

    folder = kubeconfig.parent / "operator-webhook"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        port_file = folder / "port"
        text = port_file.read_text().strip() if port_file.exists() else ""
        port = int(text) if text.isdigit() else 0
        if not port or not _bindable(port):
            port = _stable_port()
            port_file.write_text(f"{port}\n")
        certs = folder / "certs"
        ensure_webhook_certs(certs, hosts=["127.0.0.1"])
    return WebhookEndpoint(port=port, cert_dir=certs)


def _bindable(port: int) -> bool:
    """Whether an operator could listen on ``port`` now (others that share it may)."""
    with contextlib.closing(socket.socket()) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _stable_port() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = list(range(max(1024, low - 8000), low))
    random.shuffle(candidates)
    for port in candidates[:200]:
        if _bindable(port):
            return port
    raise RuntimeError(f"no free port below the ephemeral range ({low}) for the webhooks")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU of a live process (all its threads), or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 2 (comm) may hold spaces or parentheses: split after its last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Memory:
    """Resident memory of a process, in KiB (``/proc/<pid>/status`` says "kB", meaning KiB)."""

    rss_kib: int
    """``VmRSS``: resident now."""
    hwm_kib: int | None
    """``VmHWM``: the most it was ever resident (the kernel's high-water mark)."""


def read_memory(status: Path) -> Memory | None:
    """``VmRSS`` and ``VmHWM`` from a ``/proc/<pid>/status`` file; None if the process is
    gone (or is a zombie or kernel thread, which have no ``VmRSS`` line)."""
    try:
        text = status.read_text()
    except OSError:
        return None
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if sep and key in ("VmRSS", "VmHWM"):
            number, _, unit = rest.strip().partition(" ")
            if unit.strip() == "kB" and number.isdigit():
                values[key] = int(number)
    if "VmRSS" not in values:
        return None
    return Memory(rss_kib=values["VmRSS"], hwm_kib=values.get("VmHWM"))


class RssSampler:
    """Samples a process's resident memory from ``/proc/<pid>/status`` every ``interval``
    seconds on a thread of its own (so a busy event loop does not thin the samples out),
    from :meth:`start` until :meth:`stop`, which takes one last sample.

    ``peak_mib`` is the highest ``VmHWM`` (or ``VmRSS``) seen, so it covers the process's
    whole life, start-up included; ``end_mib`` is ``VmRSS`` at the last sample."""

    def __init__(self, status: Path, *, interval: float = 0.5) -> None:
        self.status = status
        self.interval = interval
        self.samples = 0
        self.peak_kib: int | None = None
        self.last_kib: int | None = None
        self.longest_gap_s = 0.0
        """The longest time between two successful samples."""
        self._last_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_pid(cls, pid: int, *, interval: float = 0.5) -> RssSampler:
        return cls(Path(f"/proc/{pid}/status"), interval=interval)

    def sample(self, *, now: float | None = None) -> Memory | None:
        memory = read_memory(self.status)
        if memory is None:
            return None
        at = time.monotonic() if now is None else now
        if self._last_at is not None:
            self.longest_gap_s = max(self.longest_gap_s, at - self._last_at)
        self._last_at = at
        self.samples += 1
        self.last_kib = memory.rss_kib
        high = max(memory.rss_kib, memory.hwm_kib or 0)
        self.peak_kib = high if self.peak_kib is None else max(self.peak_kib, high)
        return memory

    @property
    def peak_mib(self) -> float | None:
        return None if self.peak_kib is None else self.peak_kib / 1024

    @property
    def end_mib(self) -> float | None:
        return None if self.last_kib is None else self.last_kib / 1024

    def start(self) -> None:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()


def scrape(url: str, *, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return str(response.read().decode())


def metric_sum(text: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """Sum of every sample of ``name`` (a counter's ``_total``) matching ``labels``."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != name:
                continue
            if labels and any(sample.labels.get(k) != v for k, v in labels.items()):
                continue
            total += sample.value
    return total


@dataclass
class OperatorProcess:
    process: subprocess.Popen[bytes]
    log: Path
    metrics_port: int
    argv: tuple[str, ...]
    log_offset: int = 0
    """Size of the (shared, appended) log when this process started."""

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def log_bytes(self) -> bytes:
        return self.log.read_bytes() if self.log.exists() else b""

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup handlers, no lease release, writes cut mid-flight."""
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self, *, timeout: float = 30.0) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def wait_ready(self, *, timeout: float = 90.0) -> None:
        """Until this process's part of the log shows the scheduler ready."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(
                    f"the operator exited ({self.process.returncode}); log {self.log}:\n"
                    + self.log_tail()
                )
            if READY_LINE in self.log_bytes()[self.log_offset :].decode(errors="replace"):
                return
            time.sleep(0.2)
        raise RuntimeError(
            f"the operator was not ready after {timeout:.0f}s; log {self.log}:\n" + self.log_tail()
        )


def webhook_args(
    kubeconfig: Path, workdir: Path, *, webhook_port: int | None, extra: Sequence[str]
) -> list[str]:
    """The webhook flags of an operator started here: the cluster's shared endpoint
    (:func:`cluster_webhook`) unless the caller chose a port or an address, or no webhooks."""
    chosen = ("--webhook-port", "--webhook-url", "--webhook-service", "--no-webhooks")
    if webhook_port is None and not any(a.split("=", 1)[0] in chosen for a in extra):
        return cluster_webhook(kubeconfig).args()
    own = [f"--webhook-cert-dir={workdir / 'webhook-certs'}"]
    if not any(a.split("=", 1)[0] == "--webhook-port" for a in extra):
        own.insert(0, f"--webhook-port={webhook_port or free_port()}")
    return own


def start_operator(
    *,
    kubeconfig: Path,
    workdir: Path,
    name: str = "operator",
    extra: Sequence[str] = (),
    metrics_port: int | None = None,
    webhook_port: int | None = None,
    env: Mapping[str, str] | None = None,
) -> OperatorProcess:
    """Start ``phalanx operator`` in the background; its log goes to ``workdir/name.log``
    (appended, so restarts of the same replica share one file)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = metrics_port or free_port()
    argv = (
        sys.executable,
        "-m",
        "phalanx.cli.main",
        "operator",
        f"--kubeconfig={kubeconfig}",
        f"--metrics-port={port}",
        "--metrics-secure=false",  # plain HTTP on loopback: scraped without a token
        *webhook_args(kubeconfig, workdir, webhook_port=webhook_port, extra=extra),
        *extra,
    )
    log = workdir / f"{name}.log"
    offset = log.stat().st_size if log.exists() else 0
    with log.open("ab") as handle:
        handle.write(f"\n==== {time.strftime('%H:%M:%S')} start {' '.join(argv[3:])}\n".encode())
        handle.flush()
        process = subprocess.Popen(
            argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
    return OperatorProcess(
        process=process, log=log, metrics_port=port, argv=argv, log_offset=offset
    )
