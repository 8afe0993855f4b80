"""The operator's long-running tasks wait with ``asyncio.timeout``, never ``asyncio.wait_for``.

CPython 3.11's ``wait_for`` can swallow a cancellation that arrives while the awaited future
completes (3.12 reimplemented it on ``asyncio.timeout``). A replica stopping on SIGTERM once
hung in the scheduling loop's stop until it was killed, at the moment a state change landed;
we could not reproduce it on demand, so this keeps the suspect pattern out instead."""

from __future__ import annotations

import re
from pathlib import Path

import phalanx.operator

OPERATOR = Path(phalanx.operator.__file__).parent


def test_no_operator_module_uses_asyncio_wait_for() -> None:
    offenders = [
        f"{path.name}:{number}"
        for path in sorted(OPERATOR.glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bwait_for\(", line) and not line.lstrip().startswith("#")
    ]
    assert offenders == [], f"use asyncio.timeout instead of wait_for: {offenders}"
