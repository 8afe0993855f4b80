"""``make demo`` (``phalanx demo``), README's first command, end to end: on a local control
plane of its own it installs the CRDs, starts the operator, applies the sample queues and the
two bursts of GPU Jobs; every Job finishes, the gangs each whole in one topology domain, but
the one the samples make too wide for any rack, which waits and says why.

It runs with a HOME of its own (the demo keeps its operator's pid, log and summary under
``~/.cache/phalanx/demo``), so it never touches a demo a developer left running, and it stops
its operator and its cluster at the end, as the summary tells a user to.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phalanx.devcluster.pins import cache_root

pytestmark = pytest.mark.integration

PHALANX = Path(sys.executable).with_name("phalanx")
SAMPLE_JOBS = Path(__file__).resolve().parents[2] / "manifests" / "samples" / "jobs"


def _stop_demo_operator(home: Path) -> None:
    pid_file = home / ".cache" / "phalanx" / "demo" / "operator.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text().strip() or 0)
    cmdline = Path(f"/proc/{pid}/cmdline")
    if pid and cmdline.exists() and b"operator" in cmdline.read_bytes():
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while cmdline.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if cmdline.exists():
            os.kill(pid, signal.SIGKILL)


def test_make_demo_admits_and_finishes_every_sample_job(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    state = tmp_path / "cluster"
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["HOME"] = str(home)
    env["PHALANX_CACHE"] = str(cache_root())  # the built control plane, not a rebuild
    jobs = sum(p.read_text().count("kind: Job") for p in SAMPLE_JOBS.glob("*.yaml"))
    try:
        run = subprocess.run(
            [str(PHALANX), "demo", "--state-dir", str(state), "--timeout", "300"],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        out = run.stdout
        assert run.returncode == 0, f"{out}\n{run.stderr}"
        assert "-- 5/5 burst" in out, out
        summary = (home / ".cache" / "phalanx" / "demo" / "summary.txt").read_text()
        assert summary.strip() in out  # what it printed is what it kept
        finished = re.search(r"^(\d+) of (\d+) Jobs finished", summary, re.M)
        assert finished is not None, summary
        assert (int(finished[1]), int(finished[2])) == (jobs - 1, jobs), summary
        waiting = re.findall(r"^still waiting: (\S+) \(.*?\): (.*)$", summary, re.M)
        assert [name for name, _ in waiting] == ["team-a/a-too-wide"], summary
        assert waiting[0][1].startswith("topology placement failed"), summary
        gangs = re.findall(r"^gang \S+ \((\d+)x[^)]*\) ran whole in (.+)$", summary, re.M)
        assert gangs, f"no gang in the summary:\n{summary}"
        for _, where in gangs:
            assert where.startswith(("rack ", "block ")), summary
    finally:
        _stop_demo_operator(home)
        subprocess.run(
            [str(PHALANX), "devcluster", "down", "--state-dir", str(state)],
            env=env,
            capture_output=True,
            check=False,
            timeout=120,
        )
