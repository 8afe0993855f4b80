"""Kueue's scheduler-performance scenarios (``test/performance/scheduler/configs`` of
sigs.k8s.io/kueue at the version ``bench compare`` runs), from the Go module cache: fetched
from the module proxy by ``go mod download`` the first time, as the local control plane's
builds fetch their modules."""

from __future__ import annotations

import functools
import json
import subprocess
import tempfile
from pathlib import Path

from phalanx.devcluster.build import find_go
from phalanx.devcluster.kueue_perf import KUEUE_VERSION


@functools.cache
def kueue_scenarios() -> Path:
    """The folder holding ``baseline/``, ``tas/`` and ``large-scale/`` (each a
    ``generator.yaml`` and its ``rangespec.yaml``)."""
    with tempfile.TemporaryDirectory() as outside_any_module:
        proc = subprocess.run(
            [str(find_go()), "mod", "download", "-json", f"sigs.k8s.io/kueue@{KUEUE_VERSION}"],
            capture_output=True,
            text=True,
            check=False,
            cwd=outside_any_module,
            timeout=300,
        )
    if proc.returncode != 0:
        raise RuntimeError(
            f"go mod download sigs.k8s.io/kueue@{KUEUE_VERSION} failed:"
            f" {proc.stderr or proc.stdout}"
        )
    module = Path(json.loads(proc.stdout)["Dir"])
    folder = module / "test" / "performance" / "scheduler" / "configs"
    if not (folder / "baseline" / "generator.yaml").is_file():
        raise RuntimeError(f"no scenarios in {folder}")
    return folder
