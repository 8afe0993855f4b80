"""Kubernetes quantities as integers in base units.

Quota arithmetic must be exact: floats drift, and a drifted quota either strands a GPU or
oversubscribes one. Every resource is therefore held as an integer count of its base unit:
milli-units for CPU (``cpu``), and whole units for everything else (bytes for memory and
storage, devices for ``nvidia.com/gpu``, pods for ``pods``).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = [
    "QuantityError",
    "format_quantity",
    "is_milli_resource",
    "parse_quantity",
]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
_PATTERN = re.compile(
    r"^(?P<num>[+-]?(?:\d+\.?\d*|\.\d+))"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exp>[+-]?\d+))?$"
)

# Resources counted in milli-units, as the Kubernetes scheduler counts them.
_MILLI_RESOURCES = frozenset({"cpu"})


class QuantityError(ValueError):
    """A quantity string that Kubernetes would not accept."""


def is_milli_resource(resource: str) -> bool:
    """Whether ``resource`` is held in milli-units (CPU) rather than whole units."""
    return resource in _MILLI_RESOURCES


def _is_byte_resource(resource: str) -> bool:
    """Memory-like resources print with byte suffixes; counts (GPUs, pods) print plainly."""
    return (
        resource == ""
        or resource.endswith(("memory", "storage"))
        or resource.startswith("hugepages-")
    )


def parse_quantity(text: str | int, *, resource: str = "") -> int:
    """Parse a Kubernetes quantity into an integer of the resource's base unit.

    ``parse_quantity("500m", resource="cpu") == 500``; ``parse_quantity("16Gi") == 17179869184``.
    Fractions of a base unit round up, as the API server rounds requests, so a
    quota is never under-counted.
    """
    if isinstance(text, bool):
        raise QuantityError(f"{text!r} is not a quantity")
    if isinstance(text, int):
        return text * 1000 if is_milli_resource(resource) else text
    match = _PATTERN.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise QuantityError(
            f"{text!r} is not a quantity; use a number with an optional suffix"
            " such as 500m, 2, 16Gi or 1e3"
        )
    try:
        number = Decimal(match["num"])
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise QuantityError(f"{text!r} is not a quantity") from exc
    suffix = match["suffix"] or ""
    if match["exp"] is not None:
        number *= Decimal(10) ** int(match["exp"])
    elif suffix in _BINARY:
        number *= _BINARY[suffix]
    else:
        number *= _DECIMAL[suffix]
    if is_milli_resource(resource):
        number *= 1000
    whole = int(number.to_integral_value(rounding="ROUND_CEILING"))
    return whole


def format_quantity(value: int, *, resource: str = "") -> str:
    """Print an integer of base units the way Kubernetes prints it.

    CPU comes out as whole cores when it can ("2") and milli-cores otherwise ("500m"); byte
    counts (memory, storage, or an unnamed resource) use the largest binary suffix that
    divides them exactly ("16Gi"), then decimal ("1500M"), then a plain integer; device and
    pod counts print as plain integers.
    """
    if is_milli_resource(resource):
        return str(value // 1000) if value % 1000 == 0 else f"{value}m"
    if value == 0 or not _is_byte_resource(resource):
        return str(value)
    for suffix, factor in reversed(_BINARY.items()):
        if value % factor == 0:
            return f"{value // factor}{suffix}"
    for suffix in ("E", "P", "T", "G", "M", "k"):
        factor = int(_DECIMAL[suffix])
        if value % factor == 0:
            return f"{value // factor}{suffix}"
    return str(value)
