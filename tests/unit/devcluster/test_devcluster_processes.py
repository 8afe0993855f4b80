"""Processes are stopped by pid, and only when the pid is still the process we started."""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

from phalanx.devcluster import processes


def _sleep(tmp_path: Path, *extra: str) -> processes.ProcessRecord:
    sleep = shutil.which("sleep")
    assert sleep
    return processes.start(
        "sleeper", [sleep, "300", *extra], log_path=tmp_path / "s.log", cwd=tmp_path
    )


def test_devcluster_start_records_and_stop_terminates(tmp_path: Path) -> None:
    record = _sleep(tmp_path)
    assert processes.is_running(record)
    assert record.start_ticks > 0
    assert processes.stop(record, timeout=5)
    assert not processes.is_running(record)
    assert "start sleeper" in (tmp_path / "s.log").read_text()


def test_devcluster_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    record = _sleep(tmp_path)
    try:
        impostor = dataclasses.replace(record, start_ticks=record.start_ticks + 1)
        assert not processes.is_running(impostor)
        assert processes.stop(impostor)  # "gone" as far as that record goes...
        assert processes.is_running(record)  # ...and the real process was not touched
        other_exe = dataclasses.replace(record, executable="/usr/bin/not-sleep")
        assert not processes.is_running(other_exe)
    finally:
        processes.stop(record)


def test_devcluster_sigterm_resistant_process_is_killed(tmp_path: Path) -> None:
    sh = shutil.which("sh")
    assert sh
    record = processes.start(
        "stubborn",
        [sh, "-c", "trap '' TERM; while :; do sleep 0.1; done"],
        log_path=tmp_path / "x.log",
        cwd=tmp_path,
    )
    time.sleep(0.2)
    started = time.monotonic()
    assert processes.stop(record, timeout=0.5)
    assert time.monotonic() - started < 5
    assert not processes.is_running(record)


def test_devcluster_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "c.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert processes.log_tail(log, lines=2) == "line 98\nline 99"
    assert processes.log_tail(tmp_path / "none.log") == ""
