"""Test modules are imported by basename (pytest's default import mode, which the suites'
shared helpers such as ``core_builders`` and ``faults_support`` rely on): two modules with the
same basename in different folders stop the whole session at collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_basename_of_its_own() -> None:
    names = Counter(path.name for path in TESTS.rglob("*.py") if path.name != "__init__.py")
    clashes = sorted(name for name, count in names.items() if count > 1 and name != "conftest.py")
    assert clashes == [], f"rename one of each: {clashes}"
