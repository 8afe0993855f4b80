"""`phalanx devcluster` commands that need no running cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.cli.main import main


def test_devcluster_status_and_kubeconfig_without_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "none"
    assert main(["devcluster", "status", "--state-dir", str(state)]) == 1
    assert "no devcluster in" in capsys.readouterr().out
    assert main(["devcluster", "kubeconfig", "--state-dir", str(state)]) == 1
    assert "run: phalanx devcluster up" in capsys.readouterr().err
    assert main(["devcluster", "down", "--state-dir", str(state)]) == 0
    assert "nothing was running" in capsys.readouterr().out
    assert not state.exists()  # down on nothing creates nothing


def test_devcluster_up_rejects_an_invalid_topology_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topology = tmp_path / "bad.yaml"
    topology.write_text("blocks: 0\nracksPerBlock: 1\nhostsPerRack: 1\n")
    state = tmp_path / "state"
    code = main(["devcluster", "up", "--state-dir", str(state), "--topology", str(topology)])
    assert code == 2
    err = capsys.readouterr().err
    assert "blocks: must be a positive integer" in err
    assert "node: required mapping" in err
    assert not state.exists()


def test_devcluster_build_refuses_an_unknown_addon_before_building(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["devcluster", "build", "--with", "jobset,nope"]) == 1
    captured = capsys.readouterr()
    assert "unknown addon(s) nope: the devcluster can start jobset" in captured.err
    assert captured.out == "", "nothing was built"
