"""The routine Events' rate limit: a token bucket, the flags that set it, and the writer
skipping (and counting) routine Events once it is spent, never a preemption or a warning."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from typing import Any

import pytest

from phalanx.cli import operator_cmd
from phalanx.operator.metrics import Metrics
from phalanx.operator.ratelimit import TokenBucket
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import StatusWriter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_gives_its_burst_then_its_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=2.0, burst=3, clock=clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    clock.now = 0.5  # one token back
    assert [bucket.take(), bucket.take()] == [True, False]
    clock.now = 100.0  # refilled to the burst, not beyond
    assert sum(bucket.take() for _ in range(10)) == 3


def test_a_rate_of_zero_means_no_limit() -> None:
    bucket = TokenBucket(rate=0, burst=1, clock=Clock())
    assert all(bucket.take() for _ in range(1000))


@pytest.mark.parametrize(("rate", "burst"), [(-1.0, 1), (1.0, 0)])
def test_a_bucket_refuses_a_negative_rate_or_an_empty_burst(rate: float, burst: int) -> None:
    with pytest.raises(ValueError, match="rate >= 0 and burst >= 1"):
        TokenBucket(rate=rate, burst=burst)


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "fast"])
def test_the_qps_flag_refuses_what_is_not_a_rate(value: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="Events per second"):
        operator_cmd._events_qps(value)


@pytest.mark.parametrize("value", ["0", "-3", "1.5"])
def test_the_burst_flag_refuses_what_is_not_a_count(value: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="Event"):
        operator_cmd._events_burst(value)


def test_the_operator_command_names_the_bad_flag() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "phalanx.cli.main", "operator", "--routine-events-qps=-2"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "--routine-events-qps" in proc.stderr and ">= 0" in proc.stderr


@pytest.mark.parametrize(
    ("flag", "needle"),
    [
        ("--pending-explanations-qps=-2", "explanations per second >= 0"),
        ("--pending-explanations-qps=fast", "not a number of explanations"),
        ("--pending-explanations-burst=0", "at least 1"),
    ],
)
def test_the_explanations_limit_flags_name_what_is_wrong(flag: str, needle: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "phalanx.cli.main", "operator", flag],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert flag.split("=")[0] in proc.stderr and needle in proc.stderr, proc.stderr


class Recorder:
    def __init__(self) -> None:
        self.created: list[str] = []

    async def create(self, _resource: Any, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.created.append(body["reason"])
        return body


def test_routine_events_beyond_the_limit_are_skipped_and_counted_others_never() -> None:
    api = Recorder()
    metrics = Metrics()
    writer = StatusWriter(
        api,  # type: ignore[arg-type]
        ClusterState(),
        metrics,
        routine_events=TokenBucket(rate=0.001, burst=2),
    )
    obj = {"metadata": {"name": "w", "namespace": "ns", "uid": "u"}}

    async def main() -> None:
        for reason in ("Admitted", "QuotaReserved", "Admitted", "CreatedWorkload"):
            await writer.event(obj, reason=reason, message="m")
        await writer.event(obj, reason="Preempted", message="m")
        await writer.event(obj, reason="Evicted", message="m")
        await writer.event(obj, reason="Admitted", message="m", warning=True)

    asyncio.run(main())
    assert api.created == ["Admitted", "QuotaReserved", "Preempted", "Evicted", "Admitted"]
    skipped = {
        s.labels["reason"]: s.value
        for s in metrics.events_skipped_total.collect()[0].samples
        if s.name.endswith("_total")
    }
    assert skipped == {"Admitted": 1.0, "CreatedWorkload": 1.0}
