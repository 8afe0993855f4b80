"""Kubernetes quantities parse to integer base units and print back the Kubernetes way."""

from __future__ import annotations

import pytest

from phalanx.quotas.quantity import QuantityError, format_quantity, parse_quantity


@pytest.mark.parametrize(
    ("text", "resource", "expected"),
    [
        ("500m", "cpu", 500),
        ("2", "cpu", 2000),
        ("1.5", "cpu", 1500),
        ("0.1", "cpu", 100),
        ("16Gi", "memory", 16 * 2**30),
        ("1500M", "memory", 1_500_000_000),
        ("1e3", "memory", 1000),
        ("8", "nvidia.com/gpu", 8),
        (8, "nvidia.com/gpu", 8),
        (3, "cpu", 3000),
        ("1.5Ki", "memory", 1536),
        ("0", "pods", 0),
        # A fraction of a base unit rounds up, never under-counting a request.
        ("1.2", "memory", 2),
        ("1u", "cpu", 1),
    ],
)
def test_parse_quantity(text: str | int, resource: str, expected: int) -> None:
    assert parse_quantity(text, resource=resource) == expected


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "5 Gi", "Gi", "1Xi", "--1", "1e"])
def test_parse_quantity_rejects_garbage_with_advice(text: str) -> None:
    with pytest.raises(QuantityError, match="use a number with an optional suffix"):
        parse_quantity(text)


def test_bool_is_not_a_quantity() -> None:
    with pytest.raises(QuantityError):
        parse_quantity(True)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "resource", "expected"),
    [
        (500, "cpu", "500m"),
        (2000, "cpu", "2"),
        (16 * 2**30, "memory", "16Gi"),
        (1_500_000_000, "memory", "1500M"),
        (8, "nvidia.com/gpu", "8"),
        (1024, "nvidia.com/gpu", "1024"),
        (0, "memory", "0"),
        (7, "memory", "7"),
    ],
)
def test_format_quantity(value: int, resource: str, expected: str) -> None:
    assert format_quantity(value, resource=resource) == expected


@pytest.mark.parametrize(
    ("text", "resource"),
    [("500m", "cpu"), ("16Gi", "memory"), ("3", "nvidia.com/gpu"), ("250m", "cpu")],
)
def test_round_trip(text: str, resource: str) -> None:
    assert format_quantity(parse_quantity(text, resource=resource), resource=resource) == text
