"""The layering contracts in pyproject.toml are enforced: breaking one fails `lint-imports`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(src: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_contracts_hold_on_the_tree() -> None:
    result = _lint(ROOT / "src")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("package", "library"),
    [
        ("quotas", "kopf"),
        ("placement", "kubernetes"),
        ("admission", "pydantic"),
        ("quotas", "sqlalchemy"),
    ],
)
def test_core_importing_a_framework_breaks_the_contract(
    tmp_path: Path, package: str, library: str
) -> None:
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "phalanx", src / "phalanx")
    (src / "phalanx" / package / "_leak.py").write_text(f"import {library}\n")
    result = _lint(src)
    assert result.returncode != 0
    assert f"phalanx.{package}._leak -> {library}" in result.stdout
