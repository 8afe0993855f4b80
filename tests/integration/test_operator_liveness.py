"""Keep scheduling or die loudly, against the real process: a scheduling loop that stops
completing cycles makes ``/healthz`` answer 500, and a crashed scheduling task ends the
process with exit code 1 and its traceback in the log.

The operator runs with ``PHALANX_TEST_HOOKS=1``: SIGUSR1 makes its next scheduling cycle hang,
SIGUSR2 makes it raise (see :mod:`phalanx.operator.runtime`)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from operator_fixtures import *  # noqa: F403
from operator_fixtures import OperatorProcess, free_port, start_operator, wait_for

from phalanx.devcluster.handle import ClusterHandle
from phalanx.operator.runtime import TEST_HOOKS_ENV

pytestmark = pytest.mark.integration

STALL_SECONDS = 5


def _healthz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, {}


def _start(
    cluster: ClusterHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> tuple[OperatorProcess, int]:
    monkeypatch.setenv(TEST_HOOKS_ENV, "1")
    port = free_port()
    op = start_operator(
        cluster,
        tmp_path,
        f"--liveness-port={port}",
        f"--liveness-stall-seconds={STALL_SECONDS}",
        name=name,
    )
    # Healthy first: the heartbeat is armed and cycles complete (an always-200 endpoint
    # passes this; the failure below is what it could not do).
    wait_for(
        "a passing /healthz from a scheduling replica with completed cycles",
        lambda: (
            (status := _healthz(port))[0] == 200
            and status[1].get("scheduler", {}).get("scheduling") is True
            and status[1]["scheduler"]["cycles"] > 0
        ),
        timeout=30,
        log=op.log_tail,
    )
    return op, port


def test_a_stalled_scheduling_loop_fails_liveness_within_30s(
    cluster: ClusterHandle,
    kueue_crds: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    op, port = _start(cluster, tmp_path, monkeypatch, "stall")
    try:
        op.process.send_signal(signal.SIGUSR1)
        started = time.monotonic()
        wait_for(
            "/healthz to answer 500 once no cycle completes",
            lambda: _healthz(port)[0] == 500,
            timeout=30,
            log=op.log_tail,
        )
        elapsed = time.monotonic() - started
        assert op.process.poll() is None, f"a stall is not a crash:\n{op.log_tail()}"
        log = op.log.read_text(errors="replace")
        assert "event=test_hook mode=stall" in log
        assert "event=liveness_failed reason=scheduler_stalled" in log
        # The hung cycle (2 s tick at most) + the stall limit + kopf's 10 s cache of a pass.
        assert elapsed < STALL_SECONDS + 15, elapsed
    finally:
        code = op.stop()
    # cleanup() releases the hung cycle's worker thread; else asyncio.run would join it forever.
    assert code == 0, f"SIGTERM did not stop the stalled operator cleanly (exit {code})"


def test_a_crashed_scheduling_task_exits_non_zero_with_its_traceback(
    cluster: ClusterHandle,
    kueue_crds: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    op, _port = _start(cluster, tmp_path, monkeypatch, "crash")
    try:
        op.process.send_signal(signal.SIGUSR2)
        try:
            code = op.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the operator kept running without its scheduler:\n{op.log_tail()}")
    finally:
        op.stop()
    log = op.log.read_text(errors="replace")
    assert code == 1, f"exit code {code}:\n{op.log_tail()}"
    assert "event=task_crashed task=phalanx-scheduler" in log
    assert "Traceback (most recent call last)" in log
    assert "RuntimeError: test hook: simulated scheduler crash" in log
    # A clean stop (cleanup ran, the client closed), not the hard-exit watchdog.
    assert "event=operator_stopped" in log and "event=exit_forced" not in log
