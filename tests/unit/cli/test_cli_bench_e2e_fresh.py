"""``--fresh`` starts the local control plane anew, deleting its state folder (``--bare`` too:
it implies ``--fresh``): refused before anything runs with a cluster named by
``--kubeconfig``, or without a folder named by ``--state-dir`` (the default one is the
demo's). The runs on the local control plane are tests/integration/test_bench_fresh.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.cli.main import main


@pytest.mark.parametrize("flag", ["--fresh", "--bare"])
def test_fresh_with_a_kubeconfig_is_refused_naming_both_flags(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("")  # never read: refused first
    argv = ["bench", "e2e", "--config", "g.yaml", flag, "--kubeconfig", str(kubeconfig)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert flag in err and "--kubeconfig" in err and "drop one of the two" in err


@pytest.mark.parametrize("flag", ["--fresh", "--bare"])
@pytest.mark.parametrize("command", ["e2e", "compare"])
def test_fresh_without_a_state_dir_is_refused_and_deletes_nothing(
    command: str, flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Catches --fresh (or --bare) purging the devcluster's default folder when no folder
    # was named.
    missing = tmp_path / "never-read.yaml"
    assert main(["bench", command, "--config", str(missing), flag]) == 2
    err = capsys.readouterr().err
    assert flag in err and "--state-dir" in err, err
    assert "never-read.yaml" not in err, "refused before the config is read"


def test_both_bench_commands_take_fresh_and_bare(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("e2e", "compare"):
        with pytest.raises(SystemExit):
            main(["bench", command, "--help"])
        out = capsys.readouterr().out
        assert "--fresh" in out and "--bare" in out, command


def test_v1beta1_off_with_a_kubeconfig_is_refused_naming_both_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Catches --v1beta1 off silently ignored on a cluster whose CRDs the run does not install.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("")  # never read: refused first
    argv = ["bench", "e2e", "--config", "g.yaml", "--v1beta1", "off"]
    assert main([*argv, "--kubeconfig", str(kubeconfig)]) == 2
    err = capsys.readouterr().err
    assert "--v1beta1 off" in err and "--kubeconfig" in err and "drop one of the two" in err
