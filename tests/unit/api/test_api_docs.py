"""docs/api.md keeps up with the rules and the unimplemented fields."""

from __future__ import annotations

from pathlib import Path

from phalanx.api.rulebook import RULES
from phalanx.api.unimplemented import UNIMPLEMENTED_FIELDS

DOC = (Path(__file__).resolve().parents[3] / "docs" / "api.md").read_text()


def test_api_docs_list_every_rule_message():
    missing = [
        r.name for r in RULES if not r.name.startswith("unimplemented-") and r.message not in DOC
    ]
    assert not missing, f"docs/api.md does not give the message of {missing}"


def test_api_docs_list_every_unimplemented_field():
    missing = [
        e.field for e in UNIMPLEMENTED_FIELDS if f"`{e.field}`" not in DOC or e.feature not in DOC
    ]
    assert not missing, f"docs/api.md does not list {missing}"
