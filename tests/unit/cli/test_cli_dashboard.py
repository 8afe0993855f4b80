"""The dashboard's flags: a clear refusal, naming the flag, for a plain-HTTP listener off
loopback, a bad port or a certificate folder without its files."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from phalanx.cli.dashboard_cmd import tls_context
from phalanx.cli.main import build_parser
from phalanx.cli.operator_cmd import dashboard_sidecar


def _args(**overrides: object) -> argparse.Namespace:
    values: dict[str, object] = {
        "dashboard_port": 8090,
        "dashboard_listen": "127.0.0.1",
        "dashboard_cert_dir": None,
    }
    values.update(overrides)
    return argparse.Namespace(**values)


def test_operator_dashboard_on_loopback_is_started(capsys: pytest.CaptureFixture[str]) -> None:
    assert dashboard_sidecar(_args()) is not None
    assert capsys.readouterr().err == ""


def test_operator_dashboard_off_loopback_needs_tls(capsys: pytest.CaptureFixture[str]) -> None:
    assert dashboard_sidecar(_args(dashboard_listen="0.0.0.0")) is None
    err = capsys.readouterr().err
    assert "--dashboard-listen 0.0.0.0" in err and "--dashboard-cert-dir" in err


def test_operator_dashboard_port_range(capsys: pytest.CaptureFixture[str]) -> None:
    assert dashboard_sidecar(_args(dashboard_port=70000)) is None
    assert "--dashboard-port 70000" in capsys.readouterr().err


def test_cert_dir_without_files_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--dashboard-cert-dir .*tls\.crt and tls\.key"):
        tls_context(tmp_path, "--dashboard-cert-dir")


def test_workstation_command_parses() -> None:
    args = build_parser().parse_args(["dashboard", "--insecure-local", "--port", "9000"])
    assert (args.insecure_local, args.port, args.listen) == (True, 9000, "127.0.0.1")


def _kubeconfig(tmp_path: Path) -> Path:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    return kubeconfig


def test_workstation_insecure_off_loopback_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = _kubeconfig(tmp_path)
    args = build_parser().parse_args(
        ["dashboard", f"--kubeconfig={kubeconfig}", "--insecure-local", "--listen", "0.0.0.0"]
    )
    assert args.func(args) == 2
    assert "loopback only" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://db/x", "--store 'mysql://db/x': backend 'mysql' is not supported"),
        ("sqlite:///{tmp}/none.db", "no such file; the operator creates it (--store)"),
    ],
)
def test_workstation_store_that_cannot_be_opened_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, says: str
) -> None:
    store = url.format(tmp=tmp_path)
    args = build_parser().parse_args(
        ["dashboard", f"--kubeconfig={_kubeconfig(tmp_path)}", "--insecure-local", "--store", store]
    )
    assert args.func(args) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists(), "a reader leaves no empty store behind"
