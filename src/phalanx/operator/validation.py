"""The validating webhook's check: the same one ``phalanx validate`` runs offline."""

from __future__ import annotations

from typing import Any

from phalanx.api.kinds import KINDS
from phalanx.api.loader import check_object

__all__ = ["validate_object"]

_KINDS = frozenset(info.kind for info in KINDS)
# Written by the API server or by Phalanx itself; never part of what a user asks for.
_SERVER_FIELDS = ("status",)


def validate_object(obj: dict[str, Any]) -> list[str]:
    """One message per problem, each starting with its field path; empty when valid."""
    if obj.get("kind") not in _KINDS:
        return []
    candidate = {k: v for k, v in obj.items() if k not in _SERVER_FIELDS}
    candidate.setdefault("apiVersion", "kueue.x-k8s.io/v1beta2")
    _, errors = check_object(candidate)
    return [str(error) for error in errors]
