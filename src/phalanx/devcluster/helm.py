"""The ``helm`` binary the chart tests render with, built once from its Go module.

Helm ships no wheel and no Debian package here, so, like the control plane's binaries, it is
built from its pinned Go module (``go install helm.sh/helm/v3/cmd/helm@<version>`` through the
module proxy) into ``<cache>/helm-<version>/bin``: about 4 minutes on 2 cores the first time,
nothing afterwards.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from pathlib import Path

from phalanx.devcluster import pins
from phalanx.devcluster.build import BuildError, Progress, _stderr_progress, find_go
from phalanx.devcluster.locks import file_lock

__all__ = ["HELM_MODULE", "HELM_VERSION", "ensure_helm", "helm_path"]

log = logging.getLogger(__name__)

HELM_MODULE = "helm.sh/helm/v3/cmd/helm"
HELM_VERSION = "v3.21.4"
_HEARTBEAT_SECONDS = 30.0


def helm_path(version: str = HELM_VERSION) -> Path:
    return pins.cache_root() / f"helm-{version}" / "bin" / "helm"


def ensure_helm(*, version: str = HELM_VERSION, progress: Progress = _stderr_progress) -> Path:
    """The cached ``helm`` of ``version``, built first if missing (under a lock, so parallel
    callers build it once)."""
    path = helm_path(version)
    if os.access(path, os.X_OK):
        return path
    with file_lock(
        path.parent.parent / "build.lock",
        on_wait=lambda: progress(f"waiting for another build of {path}"),
    ):
        if not os.access(path, os.X_OK):
            _build(path=path, version=version, progress=progress)
    return path


def _build(*, path: Path, version: str, progress: Progress) -> None:
    go = find_go(progress=progress)
    staging = path.parent.with_name(".bin.partial")
    staging.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "GOBIN": str(staging),
        # Outside any module: the pinned version's own go.mod decides the dependencies.
        "GOFLAGS": "-mod=mod",
    }
    cmd = [str(go), "install", "-trimpath", "-ldflags=-s -w", f"{HELM_MODULE}@{version}"]
    progress(f"building helm {version} into {path.parent} ({' '.join(cmd[1:])}); about 4 min")
    started = time.monotonic()
    log_path = path.parent.parent / "build.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=path.parent.parent, env=env, stdout=out, stderr=subprocess.STDOUT
        )
        while True:
            try:
                code = proc.wait(timeout=_HEARTBEAT_SECONDS)
                break
            except subprocess.TimeoutExpired:
                progress(f"still building helm ({time.monotonic() - started:.0f}s)")
    if code != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise BuildError(f"go install of helm {version} failed (exit {code}):\n{tail}")
    path.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging / "helm", path)
    progress(f"built helm {version} in {time.monotonic() - started:.0f}s")
    log.info("event=helm_built path=%s", path)
