"""The validating webhook's check: the same one ``phalanx validate`` runs offline."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from phalanx.api.kinds import KINDS

__all__ = ["validate_object"]

_MODELS = {info.kind: info.model for info in KINDS}
# Written by the API server or by Phalanx itself; never part of what a user asks for.
_SERVER_FIELDS = ("status",)


def validate_object(obj: dict[str, Any]) -> list[str]:
    """One message per problem, each starting with its field path; empty when valid."""
    kind = obj.get("kind")
    model = _MODELS.get(str(kind))
    if model is None:
        return []
    candidate = {k: v for k, v in obj.items() if k not in _SERVER_FIELDS}
    try:
        model.model_validate(candidate)
    except ValidationError as error:
        return [_format(e) for e in error.errors()]
    return []


def _format(error: Any) -> str:
    path = ""
    for part in error.get("loc", ()):
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return f"{path}: {error.get('msg')}" if path else str(error.get("msg"))
