"""From YAML or a decoded object to a validated model, with every error's field path.

``parse_object`` is the entry point for one decoded object (what the operator receives);
``load_manifests`` and ``check_manifests`` read a multi-document YAML stream (what a user
applies). Errors name the field (``spec.resourceGroups[0].flavors[1].name``) and say what to do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from phalanx.api.fields import API_VERSION, DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN, GROUP
from phalanx.api.kinds import KINDS, KueueObject, kind_info
from phalanx.api.rulebook import RULES
from phalanx.api.rules import FieldError, index_rules, join_path, run_rules, unwrap_annotation
from phalanx.api.unimplemented import find_unimplemented

__all__ = [
    "Document",
    "InvalidObjectError",
    "ManifestError",
    "check_manifests",
    "check_object",
    "load_manifests",
    "parse_object",
    "to_manifest",
    "validate_object",
]


_RULE_INDEX = index_rules(RULES)


class InvalidObjectError(ValueError):
    """An object that is not a valid Kueue v1beta2 object; ``errors`` says where and why."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        self.errors = tuple(errors)
        super().__init__("; ".join(str(e) for e in self.errors))


@dataclass(frozen=True, kw_only=True)
class Document:
    """The outcome for one object of a YAML stream."""

    index: int
    """Position of the object in the stream, from 0 (items of a ``List`` count one each)."""
    kind: str | None
    name: str | None
    obj: KueueObject | None
    errors: tuple[FieldError, ...]
    skipped: bool = False
    """An object of another API group, skipped on request."""

    @property
    def label(self) -> str:
        """``KIND/NAME`` as kubectl prints it, with placeholders for what is missing."""
        return f"{self.kind or '<no kind>'}/{self.name or f'<document {self.index + 1}>'}"


class ManifestError(ValueError):
    """A YAML stream with at least one invalid object."""

    def __init__(self, documents: Sequence[Document]) -> None:
        self.documents = tuple(d for d in documents if d.errors)
        lines = [f"{d.label}: {e}" for d in self.documents for e in d.errors]
        super().__init__("\n".join(lines))


def parse_object(data: Mapping[str, Any]) -> KueueObject:
    """Validate one decoded object and return its model; raise InvalidObjectError."""
    obj, errors = check_object(data)
    if errors or obj is None:
        raise InvalidObjectError(errors)
    return obj


def check_object(data: Any) -> tuple[KueueObject | None, list[FieldError]]:
    """Validate one decoded object: the model (if the object parses) and every error."""
    if not isinstance(data, Mapping):
        return None, [
            FieldError("", f"must be a Kubernetes object (a mapping), got {_kind_of(data)}")
        ]
    head_errors = _check_type_meta(data)
    if head_errors:
        return None, head_errors
    info = kind_info(str(data["kind"]))
    assert info is not None
    try:
        obj = info.model.model_validate(dict(data))
    except ValidationError as exc:
        return None, [_convert(info.model, error) for error in exc.errors()]
    return obj, validate_object(obj)


def validate_object(obj: KueueObject) -> list[FieldError]:
    """The cross-field rules (the Python side of the CRDs' CEL rules) for a parsed object."""
    return run_rules(obj, _RULE_INDEX)


def check_manifests(text: str, *, ignore_other_kinds: bool = False) -> list[Document]:
    """Validate every object of a multi-document YAML stream (``kind: List`` is expanded)."""
    documents: list[Document] = []
    try:
        raw_documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        return [Document(index=0, kind=None, name=None, obj=None, errors=(_yaml_error(exc),))]
    for raw in _expand_lists(raw_documents):
        index = len(documents)
        kind, name = _kind_and_name(raw)
        if ignore_other_kinds and _is_foreign(raw):
            documents.append(
                Document(index=index, kind=kind, name=name, obj=None, errors=(), skipped=True)
            )
            continue
        obj, errors = check_object(raw)
        documents.append(Document(index=index, kind=kind, name=name, obj=obj, errors=tuple(errors)))
    return documents


def load_manifests(text: str) -> list[KueueObject]:
    """Parse a multi-document YAML stream; raise ManifestError listing every error."""
    documents = check_manifests(text)
    if any(d.errors for d in documents):
        raise ManifestError(documents)
    return [d.obj for d in documents if d.obj is not None]


def to_manifest(obj: KueueObject, *, with_defaults: bool = False) -> dict[str, Any]:
    """The object as it goes on the wire: as written, or with every default filled in."""
    if with_defaults:
        return obj.model_dump(mode="json", by_alias=True, exclude_none=True)
    return obj.model_dump(mode="json", by_alias=True, exclude_unset=True)


# --- type meta --------------------------------------------------------------------------


def _check_type_meta(data: Mapping[str, Any]) -> list[FieldError]:
    api_version, kind = data.get("apiVersion"), data.get("kind")
    served = ", ".join(info.kind for info in KINDS)
    if not api_version:
        return [FieldError("apiVersion", f"required field is missing; use {API_VERSION}")]
    if not kind:
        return [FieldError("kind", f"required field is missing; one of {served}")]
    if api_version != API_VERSION:
        if str(api_version).startswith(f"{GROUP}/"):
            message = (
                f"Phalanx serves {API_VERSION} only, not {api_version!r}; convert the manifest"
                f" to {API_VERSION}"
            )
        else:
            message = f"{api_version!r} is not a Kueue object; Phalanx checks {API_VERSION} objects"
        return [FieldError("apiVersion", message)]
    if kind_info(str(kind)) is None:
        return [FieldError("kind", f"{kind!r} is not a kind Phalanx serves; one of {served}")]
    return []


def _is_foreign(raw: Any) -> bool:
    if not isinstance(raw, Mapping):
        return False
    api_version = str(raw.get("apiVersion") or "")
    return bool(api_version) and not api_version.startswith(f"{GROUP}/")


def _expand_lists(documents: list[Any]) -> list[Any]:
    expanded: list[Any] = []
    for doc in documents:
        if (
            isinstance(doc, Mapping)
            and doc.get("kind") == "List"
            and isinstance(doc.get("items"), list)
        ):
            expanded.extend(doc["items"])
        else:
            expanded.append(doc)
    return expanded


def _kind_and_name(raw: Any) -> tuple[str | None, str | None]:
    if not isinstance(raw, Mapping):
        return None, None
    metadata = raw.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    kind = raw.get("kind")
    return (str(kind) if kind else None), (str(name) if name else None)


def _yaml_error(exc: yaml.YAMLError) -> FieldError:
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return FieldError("", f"YAML syntax error{where}: {problem}")


def _kind_of(value: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__
    )


# --- pydantic errors to field errors ----------------------------------------------------

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUOTED = re.compile(r"'([^']*)'")


def _format_loc(loc: tuple[int | str, ...]) -> str:
    path = ""
    for item in loc:
        if isinstance(item, int) or _IDENTIFIER.match(item):
            path = join_path(path, item)
        else:
            path = f"{path}[{item}]"  # a map key such as nvidia.com/gpu
    return path


def _convert(root: type[BaseModel], error: ErrorDetails) -> FieldError:
    loc = tuple(error["loc"])
    path = _format_loc(loc)
    return FieldError(path, _message(root, loc, error))


def _message(root: type[BaseModel], loc: tuple[int | str, ...], error: ErrorDetails) -> str:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        field = str(loc[-1]) if loc else ""
        entry = find_unimplemented(_model_at(root, loc[:-1]), field)
        if entry is not None:
            return entry.message
        return f"unknown field {field!r}: Kueue v1beta2 has no such field here; check the spelling"
    if kind in ("enum", "literal_error"):
        allowed = ", ".join(_QUOTED.findall(str(ctx.get("expected", ""))))
        return f"must be one of {allowed}; got {value!r}"
    if kind == "too_long":
        return f"at most {ctx.get('max_length')} items allowed, got {ctx.get('actual_length')}"
    if kind == "too_short":
        return f"at least {ctx.get('min_length')} item(s) required, got {ctx.get('actual_length')}"
    if kind == "string_too_long":
        return f"at most {ctx.get('max_length')} characters allowed"
    if kind == "string_too_short":
        return f"must have at least {ctx.get('min_length')} character(s)"
    if kind == "string_pattern_mismatch":
        return _pattern_message(str(ctx.get("pattern", "")), value)
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        bound = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<="}
        return f"must be {bound.get(kind, '<')} {next(iter(ctx.values()), '?')}; got {value!r}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be an integer; got {value!r}"
    if kind in ("bool_type", "bool_parsing"):
        return f"must be true or false; got {value!r}"
    if kind == "string_type":
        return f"must be a string; got {value!r}"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"must be a mapping (an object); got {_kind_of(value)}"
    if kind == "list_type":
        return f"must be a list; got {_kind_of(value)}"
    message = error["msg"]
    return message.removeprefix("Value error, ")


def _pattern_message(pattern: str, value: Any) -> str:
    if pattern == DNS_SUBDOMAIN_PATTERN:
        return (
            f"{value!r} is not a valid name: use lower-case letters, digits, '-' and '.',"
            " starting and ending with a letter or digit (RFC 1123 subdomain)"
        )
    if pattern == DNS_LABEL_PATTERN:
        return (
            f"{value!r} is not a valid name: use lower-case letters, digits and '-', starting"
            " and ending with a letter or digit, at most 63 characters (RFC 1123 label)"
        )
    return f"{value!r} does not match the pattern {pattern}"


def _model_at(root: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model class found at ``loc`` below ``root``, following list items and map values."""
    current: Any = root
    for item in loc:
        current = unwrap_annotation(current)
        if isinstance(item, int):
            if get_origin(current) is not list:
                return None
            current = get_args(current)[0]
        elif isinstance(current, type) and issubclass(current, BaseModel):
            fields = {(info.alias or name): info for name, info in current.model_fields.items()}
            if item not in fields:
                return None
            current = fields[item].annotation
        elif get_origin(current) is dict:
            current = get_args(current)[1]
        else:
            return None
    current = unwrap_annotation(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None
