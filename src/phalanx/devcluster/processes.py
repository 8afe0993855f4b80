"""Start and stop the devcluster's processes, by pid, and only those it started.

A pid alone can be reused by an unrelated process after ours exits, so each record also keeps
the process's start time (``/proc/<pid>/stat`` field 22) and the executable path; a process is
considered ours only while all three match. Processes run in their own session so they outlive
the ``phalanx devcluster up`` that started them and ignore the terminal's Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    start_ticks: int
    executable: str

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "executable": self.executable,
        }

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> ProcessRecord:
        return cls(
            name=name,
            pid=int(data["pid"]),
            start_ticks=int(data["start_ticks"]),
            executable=str(data["executable"]),
        )


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, start_ticks)`` of a live pid, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces or parentheses: split after its last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def _executable(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def _reap(pid: int) -> None:
    # When the starter is still alive (e.g. a pytest session), the stopped process is its
    # child and stays a zombie until waited for.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def is_running(record: ProcessRecord) -> bool:
    """Whether the recorded process is alive and is still the one we started."""
    stat = _stat(record.pid)
    if stat is None:
        return False
    state, ticks = stat
    if state in ("Z", "X"):
        _reap(record.pid)
        return False
    if ticks != record.start_ticks:
        return False
    exe = _executable(record.pid)
    # The binary may have been replaced in the cache after start ("(deleted)" suffix).
    return exe is None or exe.removesuffix(" (deleted)") == record.executable


def start(
    name: str, argv: list[str], *, log_path: Path, cwd: Path, env: dict[str, str] | None = None
) -> ProcessRecord:
    """Start ``argv`` detached, stdout+stderr appended to ``log_path``; ``env`` is its whole
    environment (None: ours)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log_file:
        log_file.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} start {name}\n".encode())
        log_file.flush()
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    stat = _stat(proc.pid)
    ticks = stat[1] if stat else 0
    return ProcessRecord(
        name=name, pid=proc.pid, start_ticks=ticks, executable=os.path.realpath(argv[0])
    )


def stop(record: ProcessRecord, *, timeout: float = 10.0) -> bool:
    """SIGTERM, wait up to ``timeout``, then SIGKILL; return True when the process is gone.

    A record that no longer matches a live process (already exited, or pid reused) is left
    alone and counts as gone.
    """
    if not is_running(record):
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(record.pid)
        if not is_running(record):
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(record.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        _reap(record.pid)
        if not is_running(record):
            return True
        time.sleep(0.1)
    return False


def log_tail(path: Path, *, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ("" when absent)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
