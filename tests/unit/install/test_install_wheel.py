"""The wheel the image installs (manifests/operator/Dockerfile) works on its own: built with
``pip wheel . --no-deps``, installed into a clean venv (no editable checkout, no dev
dependencies), its ``phalanx`` entrypoint runs. The image itself is built and run by
tests/integration/test_install_image.py, which is not in ``make test`` (minutes)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

from install_tools import REPO


def _run(*argv: str | Path, cwd: Path) -> str:
    proc = subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{argv}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_the_wheel_installs_into_a_clean_venv_and_its_entrypoint_runs(tmp_path: Path):
    # What the Dockerfile copies, built in a copy (setuptools writes build/ beside it).
    source = tmp_path / "source"
    shutil.copytree(
        REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    wheels = tmp_path / "wheels"
    _run(
        sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", wheels, ".", cwd=source
    )
    (wheel,) = wheels.glob("phalanx-*.whl")
    clean = tmp_path / "venv"
    venv.create(clean, with_pip=True)
    _run(clean / "bin" / "pip", "install", "--quiet", wheel, cwd=tmp_path)
    phalanx = clean / "bin" / "phalanx"
    # Run from a folder without the checkout: the installed package, not src/, answers.
    assert "--webhook-timeout-seconds" in _run(phalanx, "operator", "--help", cwd=tmp_path)
    assert _run(phalanx, "--version", cwd=tmp_path).strip() == "phalanx 0.1.0"
    # The kubectl plugin: `kubectl phalanx list ...` runs this script from PATH.
    plugin = clean / "bin" / "kubectl-phalanx"
    assert "workload, wl" in _run(plugin, "list", "--help", cwd=tmp_path)
    # kubectl's plugin completion runs kubectl_complete-phalanx and reads cobra's answer.
    answer = _run(clean / "bin" / "kubectl_complete-phalanx", "resu", cwd=tmp_path)
    assert answer.split() == ["resume", ":4"]
    where = _run(
        clean / "bin" / "python", "-c", "import phalanx; print(phalanx.__file__)", cwd=tmp_path
    )
    assert where.startswith(str(clean))
