"""Concurrent up/down/build calls queue on a file lock instead of racing."""

from __future__ import annotations

import threading
from pathlib import Path

from phalanx.devcluster.locks import file_lock


def test_devcluster_second_holder_waits_and_is_told(tmp_path: Path) -> None:
    lock = tmp_path / "sub" / "lock"
    order: list[str] = []
    waited = threading.Event()

    def second() -> None:
        with file_lock(lock, on_wait=waited.set):
            order.append("second")

    with file_lock(lock):
        thread = threading.Thread(target=second)
        thread.start()
        assert waited.wait(timeout=5)
        order.append("first")
    thread.join(timeout=5)
    assert order == ["first", "second"]


def test_devcluster_uncontended_lock_does_not_report_waiting(tmp_path: Path) -> None:
    calls: list[int] = []
    with file_lock(tmp_path / "lock", on_wait=lambda: calls.append(1)):
        pass
    with file_lock(tmp_path / "lock", on_wait=lambda: calls.append(1)):
        pass
    assert calls == []
