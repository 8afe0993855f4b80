"""Pydantic's JSON Schema, reshaped into a Kubernetes structural OpenAPI v3 schema.

The API server accepts only structural schemas: every node has a ``type``, there are no
``$ref``s, and ``anyOf`` appears only in the int-or-string form. Pydantic's schema differs in
four ways, undone here: shared definitions behind ``$ref``, ``anyOf [X, null]`` for optional
fields, ``additionalProperties: false`` for forbidden extras (the API server prunes unknown
fields instead), and a few pydantic-only keys. Rules and unimplemented fields are placed on the
definitions before they are inlined, so every use of a model carries them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from phalanx.api.rules import Rule
from phalanx.api.unimplemented import UNIMPLEMENTED_FIELDS

__all__ = ["ALLOWED_KEYS", "SchemaError", "structural_schema"]

# JSONSchemaProps keys this generator may emit; anything else is a bug to surface, not ship.
ALLOWED_KEYS = frozenset(
    {
        "type",
        "format",
        "description",
        "default",
        "enum",
        "properties",
        "required",
        "items",
        "additionalProperties",
        "maxItems",
        "minItems",
        "maxLength",
        "minLength",
        "maxProperties",
        "minProperties",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "pattern",
        "anyOf",
        "x-kubernetes-int-or-string",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
        "x-kubernetes-validations",
    }
)
_DROPPED = frozenset({"title", "additionalProperties", "$defs"})
_RENAMED = {"ge": "minimum", "le": "maximum"}


class SchemaError(ValueError):
    """The models produced a schema the API server would refuse."""


def structural_schema(
    model: type[BaseModel],
    rules: Iterable[Rule[Any]],
    *,
    top_properties: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The structural schema of ``model`` with ``rules`` placed as x-kubernetes-validations.

    ``top_properties`` replace properties of the top node (the object's type-meta and
    metadata, whose schema belongs to the API server).
    """
    raw = model.model_json_schema(by_alias=True, mode="validation")
    # Every model's schema by class name, the top one included; the generator keeps class
    # names unique, so a name identifies one model.
    nodes: dict[str, dict[str, Any]] = {name: dict(d) for name, d in raw.get("$defs", {}).items()}
    top = {key: value for key, value in raw.items() if key != "$defs"}
    if top_properties:
        top["properties"] = {**top["properties"], **top_properties}
        top["required"] = [name for name in top.get("required", ()) if name not in top_properties]
    nodes[model.__name__] = top
    for entry in UNIMPLEMENTED_FIELDS:
        name = entry.model.__name__
        if name in nodes:
            properties = {**nodes[name].get("properties", {}), entry.field: entry.schema()}
            nodes[name] = {**nodes[name], "properties": properties}
    for rule in rules:
        name = rule.model.__name__
        if name not in nodes or rule.cel is None:
            continue
        if rule.field is None:
            nodes[name] = _with_rule(nodes[name], rule)
        else:
            properties = dict(nodes[name]["properties"])
            properties[rule.field] = _with_rule(properties[rule.field], rule)
            nodes[name] = {**nodes[name], "properties": properties}
    return _normalize(nodes[model.__name__], nodes, path=model.__name__)


def _with_rule(node: dict[str, Any], rule: Rule[Any]) -> dict[str, Any]:
    existing = list(node.get("x-kubernetes-validations", ()))
    return {**node, "x-kubernetes-validations": [*existing, rule.x_kubernetes_validation()]}


def _resolve(node: dict[str, Any], defs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Inline ``$ref`` and collapse ``anyOf [X, null]``; the outer node's keys win."""
    while True:
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[-1]]
            outer = {k: v for k, v in node.items() if k != "$ref"}
            node = _merge(target, outer)
        elif "anyOf" in node and {"type": "null"} in node["anyOf"]:
            options = [option for option in node["anyOf"] if option != {"type": "null"}]
            outer = {k: v for k, v in node.items() if k != "anyOf"}
            node = _merge(options[0], outer) if len(options) == 1 else {**outer, "anyOf": options}
        else:
            return node


def _merge(inner: dict[str, Any], outer: dict[str, Any]) -> dict[str, Any]:
    merged = {**inner, **outer}
    rules = [*inner.get("x-kubernetes-validations", ()), *outer.get("x-kubernetes-validations", ())]
    if rules:
        merged["x-kubernetes-validations"] = rules
    return merged


def _normalize(
    node: dict[str, Any], defs: dict[str, dict[str, Any]], *, path: str
) -> dict[str, Any]:
    node = _resolve(node, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED or (key == "default" and value is None):
            continue
        key = _RENAMED.get(key, key)
        if key not in ALLOWED_KEYS:
            raise SchemaError(f"{path}: unsupported schema key {key!r}")
        if key == "properties":
            value = {
                name: _normalize(sub, defs, path=f"{path}.{name}") for name, sub in value.items()
            }
        elif key == "description":
            # Docstrings are wrapped for the source; kubectl explain re-wraps on its own.
            value = " ".join(str(value).split()).replace("``", "`")
        elif key == "items":
            value = _normalize(value, defs, path=f"{path}[]")
        out[key] = value
    if out.get("format") == "int32":
        # The API server does not enforce int32's range from the format alone.
        out.setdefault("minimum", -(2**31))
        out.setdefault("maximum", 2**31 - 1)
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _normalize(
            node["additionalProperties"], defs, path=f"{path}{{}}"
        )
    _check_structural(out, path)
    return out


def _check_structural(node: dict[str, Any], path: str) -> None:
    if "type" in node:
        if "anyOf" in node:
            raise SchemaError(f"{path}: anyOf beside a type is not structural")
        return
    if node.get("x-kubernetes-int-or-string"):
        if node.get("anyOf") != [{"type": "integer"}, {"type": "string"}]:
            raise SchemaError(f"{path}: int-or-string must be anyOf [integer, string]")
        return
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return
    raise SchemaError(f"{path}: every schema node needs a type")
