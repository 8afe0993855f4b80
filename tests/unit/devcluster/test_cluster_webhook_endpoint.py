"""The webhook endpoint operators started by tests and benchmarks share per cluster: one port
and one certificate, so the converting CRDs are pointed at it once, not at every start."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

from phalanx.bench.proc import cluster_webhook, webhook_args


def _ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_the_same_kubeconfig_gets_the_same_port_and_certificate(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig" / "admin.yaml"
    kubeconfig.parent.mkdir()
    first = cluster_webhook(kubeconfig)
    ca = (first.cert_dir / "ca.crt").read_bytes()
    second = cluster_webhook(kubeconfig)
    assert second == first
    assert (second.cert_dir / "ca.crt").read_bytes() == ca, "the CA bundle must not change"
    assert first.port < _ephemeral_low(), "no outgoing connection may take it meanwhile"
    assert first.args() == [
        f"--webhook-port={first.port}",
        f"--webhook-url=https://127.0.0.1:{first.port}",
        f"--webhook-cert-dir={first.cert_dir}",
    ]
    other = tmp_path / "other" / "admin.yaml"
    other.parent.mkdir()
    assert cluster_webhook(other).cert_dir != first.cert_dir


def test_a_port_another_process_holds_is_replaced(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "admin.yaml"
    first = cluster_webhook(kubeconfig)
    with contextlib.closing(socket.socket()) as holder:  # no SO_REUSEPORT: not an operator
        holder.bind(("127.0.0.1", first.port))
        holder.listen()
        moved = cluster_webhook(kubeconfig)
    assert moved.port != first.port
    assert cluster_webhook(kubeconfig).port == moved.port, "and the new one is kept"


def test_a_listening_replica_does_not_move_the_port(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "admin.yaml"
    first = cluster_webhook(kubeconfig)
    with contextlib.closing(socket.socket()) as replica:  # as kopf binds: SO_REUSEPORT
        replica.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        replica.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        replica.bind(("127.0.0.1", first.port))
        replica.listen()
        assert cluster_webhook(kubeconfig).port == first.port


def test_a_caller_choosing_its_own_address_keeps_it(tmp_path: Path) -> None:
    kubeconfig, workdir = tmp_path / "admin.yaml", tmp_path / "op"
    shared = cluster_webhook(kubeconfig).args()
    assert webhook_args(kubeconfig, workdir, webhook_port=None, extra=()) == shared
    own = webhook_args(kubeconfig, workdir, webhook_port=4321, extra=())
    assert own == ["--webhook-port=4321", f"--webhook-cert-dir={workdir / 'webhook-certs'}"]
    for extra in (["--webhook-port=99"], ["--webhook-url=https://x:1"], ["--no-webhooks"]):
        args = webhook_args(kubeconfig, workdir, webhook_port=None, extra=extra)
        assert args[-1] == f"--webhook-cert-dir={workdir / 'webhook-certs'}", extra
        assert not any(a.startswith("--webhook-url") for a in args), extra
