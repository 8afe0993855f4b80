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

import functools
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel

from phalanx.api.fields import KueueModel

__all__ = [
    "FieldError",
    "Rule",
    "RuleIndex",
    "index_rules",
    "join_path",
    "run_rules",
    "unwrap_annotation",
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


@dataclass(frozen=True)
class _FieldPlan:
    """What the walk needs to know of one field, computed once per model class."""

    attribute: str
    alias: str
    holds_models: bool
    list_type: str | None
    map_keys: tuple[str, ...]


def unwrap_annotation(annotation: Any) -> Any:
    """``X`` from ``X | None`` and ``Annotated[X, ...]``."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            options = [arg for arg in get_args(annotation) if arg is not type(None)]
            if len(options) != 1:
                return annotation
            annotation = options[0]
        else:
            return annotation


def _holds_models(annotation: Any) -> bool:
    annotation = unwrap_annotation(annotation)
    origin = get_origin(annotation)
    if origin is list:
        return _holds_models(get_args(annotation)[0])
    if origin is dict:
        return _holds_models(get_args(annotation)[1])
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


@functools.cache
def _plan(model: type[BaseModel]) -> tuple[_FieldPlan, ...]:
    # The walk runs on every object the operator reads: skip the fields that can hold no
    # model and need no list check (strings, counts, pod templates) once, here.
    plans = []
    for attribute, info in model.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        list_type = extra.get("x-kubernetes-list-type")
        declared = extra.get("x-kubernetes-list-map-keys")
        keys = tuple(str(k) for k in declared) if isinstance(declared, list) else ()
        plan = _FieldPlan(
            attribute=attribute,
            alias=info.alias or attribute,
            holds_models=_holds_models(info.annotation),
            list_type=str(list_type) if list_type in ("set", "map") else None,
            map_keys=keys,
        )
        if plan.holds_models or plan.list_type:
            plans.append(plan)
    return tuple(plans)


def walk_models(node: BaseModel, path: str = "") -> Iterator[tuple[str, BaseModel]]:
    """Yield every model instance in ``node``'s tree (``node`` first) with its field path."""
    yield path, node
    for plan in _plan(type(node)):
        if plan.holds_models:
            yield from _walk_value(getattr(node, plan.attribute), join_path(path, plan.alias))


def _walk_value(value: Any, path: str) -> Iterator[tuple[str, BaseModel]]:
    if isinstance(value, BaseModel):
        yield from walk_models(value, path)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk_value(item, join_path(path, index))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _walk_value(item, f"{path}[{key}]")


def _list_semantics_errors(node: BaseModel, path: str) -> Iterator[FieldError]:
    for plan in _plan(type(node)):
        value = getattr(node, plan.attribute)
        if plan.list_type is None or not isinstance(value, list) or len(value) < 2:
            continue
        keys = plan.map_keys or ("name",)
        seen: set[Any] = set()
        for index, item in enumerate(value):
            key = item if plan.list_type == "set" else tuple(_key_value(item, k) for k in keys)
            if key not in seen:
                seen.add(key)
                continue
            where = join_path(join_path(path, plan.alias), index)
            if plan.list_type == "set":
                what = f"duplicate value {item!r}: the items of {plan.alias} must be unique"
            else:
                shown = ", ".join(f"{k}={v!r}" for k, v in zip(keys, key, strict=True))
                where = join_path(where, keys[0])
                what = (
                    f"duplicate entry {shown}: each entry of {plan.alias} needs a unique {keys[0]}"
                )
            yield FieldError(where, what)


def _key_value(item: Any, key: str) -> Any:
    if isinstance(item, BaseModel):
        for plan_item, info in type(item).model_fields.items():
            if (info.alias or plan_item) == key:
                return getattr(item, plan_item)
    return None


RuleIndex = Mapping[type[BaseModel], tuple[Rule[Any], ...]]


def index_rules(rules: Iterable[Rule[Any]]) -> RuleIndex:
    """The rules with a Python check, by the model they apply to (build once, run often)."""
    by_model: dict[type[BaseModel], list[Rule[Any]]] = {}
    for rule in rules:
        if rule.check is not None:
            by_model.setdefault(rule.model, []).append(rule)
    return {model: tuple(found) for model, found in by_model.items()}


def run_rules(root: KueueModel, index: RuleIndex) -> list[FieldError]:
    """Run the Python side of the indexed rules, and the list semantics, over ``root``'s tree."""
    errors: list[FieldError] = []
    for path, node in walk_models(root):
        errors.extend(_list_semantics_errors(node, path))
        for rule in index.get(type(node), ()):
            assert rule.check is not None
            errors.extend(
                FieldError(join_path(path, rel), rule.message) for rel in rule.check(node)
            )
    return errors
