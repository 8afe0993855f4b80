"""Cross-field rules, written once and enforced twice.

Each :class:`Rule` carries a CEL expression, which the CRD generator places in the schema as
an ``x-kubernetes-validations`` entry so that the API server enforces it, and a Python check,
which ``phalanx validate`` and the operator run offline. Both report the same message. A rule
with no CEL (too costly for the API server's budget) or no Python check (a transition rule:
it needs the previous object) says so, and docs/api.md lists which is which.

The same walk also enforces Kubernetes' list semantics offline: entries of a map-list
(``x-kubernetes-list-type: map``) must have unique keys, and items of a set-list must be
unique, as the API server requires.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from phalanx.api.fields import KueueModel

__all__ = [
    "FieldError",
    "Rule",
    "join_path",
    "run_rules",
    "walk_models",
]

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class FieldError:
    """One problem with an object: where (a field path such as
    ``spec.resourceGroups[0].flavors[1].name``; empty for the whole object) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


@dataclass(frozen=True, kw_only=True)
class Rule(Generic[M]):
    """A validation rule placed on the schema node of ``model`` (or of its ``field``).

    ``check`` receives the model instance (also for a rule placed on a field) and yields the
    paths, relative to that instance, of each violation; an empty path means the instance.
    """

    name: str
    model: type[M]
    message: str
    cel: str | None
    check: Callable[[M], Iterable[str]] | None
    field: str | None = None
    field_path: str | None = None
    why_no_cel: str | None = None

    def __post_init__(self) -> None:
        if self.cel is None and not self.why_no_cel:
            raise ValueError(f"rule {self.name}: a rule without CEL must say why")
        if self.check is None and (self.cel is None or "oldSelf" not in self.cel):
            raise ValueError(f"rule {self.name}: only transition rules may lack a Python check")

    @property
    def is_transition(self) -> bool:
        """Whether the rule compares with the previous object (``oldSelf``)."""
        return self.cel is not None and "oldSelf" in self.cel

    def x_kubernetes_validation(self) -> dict[str, str]:
        """The ``x-kubernetes-validations`` entry of this rule."""
        if self.cel is None:
            raise ValueError(f"rule {self.name} has no CEL expression")
        entry = {"rule": self.cel, "message": self.message}
        if self.field_path:
            entry["fieldPath"] = self.field_path
        return entry


def join_path(base: str, rel: str | int) -> str:
    """Append a field name or list index to a field path."""
    if isinstance(rel, int):
        return f"{base}[{rel}]"
    if not rel:
        return base
    if not base or rel.startswith("["):
        return f"{base}{rel}"
    return f"{base}.{rel}"


def walk_models(node: BaseModel, path: str = "") -> Iterator[tuple[str, BaseModel]]:
    """Yield every model instance in ``node``'s tree (``node`` first) with its field path."""
    yield path, node
    for name, info in type(node).model_fields.items():
        alias = info.alias or name
        yield from _walk_value(getattr(node, name), join_path(path, alias))


def _walk_value(value: Any, path: str) -> Iterator[tuple[str, BaseModel]]:
    if isinstance(value, BaseModel):
        yield from walk_models(value, path)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk_value(item, join_path(path, index))


def _list_semantics_errors(node: BaseModel, path: str) -> Iterator[FieldError]:
    for name, info in type(node).model_fields.items():
        extra = info.json_schema_extra
        value = getattr(node, name)
        if not isinstance(extra, dict) or not isinstance(value, list):
            continue
        alias = info.alias or name
        list_type = extra.get("x-kubernetes-list-type")
        seen: set[Any] = set()
        for index, item in enumerate(value):
            if list_type == "set":
                key: Any = item
                where = join_path(join_path(path, alias), index)
                what = f"duplicate value {item!r}: the items of {alias} must be unique"
            elif list_type == "map":
                declared = extra.get("x-kubernetes-list-map-keys")
                keys = [str(k) for k in declared] if isinstance(declared, list) else ["name"]
                key = tuple(_key_value(item, k) for k in keys)
                shown = ", ".join(f"{k}={v!r}" for k, v in zip(keys, key, strict=True))
                where = join_path(join_path(join_path(path, alias), index), keys[0])
                what = f"duplicate entry {shown}: each entry of {alias} needs a unique {keys[0]}"
            else:
                break
            if key in seen:
                yield FieldError(where, what)
            seen.add(key)


def _key_value(item: Any, key: str) -> Any:
    if isinstance(item, BaseModel):
        for name, info in type(item).model_fields.items():
            if (info.alias or name) == key:
                return getattr(item, name)
    return None


def run_rules(root: KueueModel, rules: Iterable[Rule[Any]]) -> list[FieldError]:
    """Run the Python side of ``rules``, and the list semantics, over ``root``'s tree."""
    by_model: dict[type[BaseModel], list[Rule[Any]]] = {}
    for rule in rules:
        if rule.check is not None:
            by_model.setdefault(rule.model, []).append(rule)
    errors: list[FieldError] = []
    for path, node in walk_models(root):
        errors.extend(_list_semantics_errors(node, path))
        for rule in by_model.get(type(node), ()):
            assert rule.check is not None
            errors.extend(
                FieldError(join_path(path, rel), rule.message) for rel in rule.check(node)
            )
    return errors
