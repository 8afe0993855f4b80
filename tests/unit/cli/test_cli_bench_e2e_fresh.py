"""``--fresh`` starts the local control plane anew; it cannot apply to a cluster named by
``--kubeconfig``, and is refused there before anything runs (the run on the local control
plane is tests/integration/test_bench_fresh.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.cli.main import main


def test_fresh_with_a_kubeconfig_is_refused_naming_both_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("")  # never read: refused first
    argv = ["bench", "e2e", "--config", "g.yaml", "--fresh", "--kubeconfig", str(kubeconfig)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--fresh" in err and "--kubeconfig" in err and "drop one of the two" in err


def test_both_bench_commands_take_fresh(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("e2e", "compare"):
        with pytest.raises(SystemExit):
            main(["bench", command, "--help"])
        assert "--fresh" in capsys.readouterr().out, command
