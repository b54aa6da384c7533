"""Load a manifest once, validate it against its JSON Schema (Draft 2020-12), then trust it.

Unknown keys are rejected with the key named and the likely typo suggested, so a misspelt
threshold can never silently fall back to a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import jsonschema
from jsonschema.protocols import Validator
from jsonschema.validators import extend  # pyright: ignore[reportUnknownVariableType] (unannotated upstream)

from core.canonical import is_json_array, is_json_object, read_json
from core.errors import ConfigurationError
from core.workspace import MANIFESTS

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

SCHEMAS = MANIFESTS / "schemas"
_Built = TypeVar("_Built", bound="DataclassInstance")


@cache
def schema(name: str) -> dict[str, Any]:
    path = SCHEMAS / f"{name}.schema.json"
    data = read_json(path)
    jsonschema.Draft202012Validator.check_schema(data)
    return data


def _pointer(path: typing.Iterable[Any]) -> str:
    parts = [str(p) for p in path]
    return "/" + "/".join(parts) if parts else "(top level)"


def _describe(error: jsonschema.ValidationError) -> str:
    where = _pointer(error.absolute_path)
    schema, instance = error.schema, error.instance
    if error.validator == "additionalProperties" and isinstance(schema, Mapping) and is_json_object(instance):
        allowed = list(schema.get("properties", {}))
        extra = sorted(set(instance) - set(allowed))
        notes: list[str] = []
        for key in extra:
            close = difflib.get_close_matches(key, allowed, n=1)
            notes.append(f"unknown key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        return f"at {where}: " + "; ".join(notes)
    return f"at {where}: {error.message}"


def _json_integer(checker: object, instance: object) -> bool:
    """A JSON integer as the reader parses one: an int, never a bool or a float.  Draft 2020-12 calls
    4194304.0 an integer, but a float that passed as one reached ``range()`` and slicing as a float (a
    TypeError far from the manifest) or was signed into a certificate as 4194304.0."""
    return isinstance(instance, int) and not isinstance(instance, bool)


# Draft 2020-12 with "integer" meaning what our manifests mean by it: one validator class for every
# schema, so no manifest can load a float where its schema says integer.
_StrictValidator = cast(
    "type[Validator]",
    extend(
        jsonschema.Draft202012Validator,
        type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _json_integer),
    ),
)


def _validator(schema_name: str) -> Validator:
    """jsonschema's Validator protocol: its concrete classes' stubs leave ``iter_errors`` untyped."""
    return _StrictValidator(schema(schema_name))


def validate(data: Any, schema_name: str, *, source: str) -> None:
    errors = sorted(
        _validator(schema_name).iter_errors(data), key=lambda e: (list(e.absolute_path), e.message)
    )
    if errors:
        detail = "; ".join(_describe(e) for e in errors[:5])
        more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
        raise ConfigurationError(f"{source} is invalid: {detail}{more}")


def load_json(path: Path, schema_name: str) -> dict[str, Any]:
    try:
        data = read_json(path)
    except FileNotFoundError:
        raise ConfigurationError(f"manifest {path} does not exist") from None
    except OSError as exc:
        raise ConfigurationError(f"manifest {path} is not readable: {exc.strerror}") from None
    validate(data, schema_name, source=str(path))
    return data


def build(cls: type[_Built], data: Mapping[str, Any], *, where: str = "") -> _Built:
    """Turn validated JSON into a frozen keyword-only dataclass tree.

    Nested dataclasses, tuples of dataclasses and mappings of dataclasses are converted by their
    type hints; keys are matched on field names with '-' spelled '_'.
    """
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in names:
            close = difflib.get_close_matches(name, sorted(names), n=1)
            tip = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigurationError(f"unknown key {where}/{key}{tip}")
        kwargs[name] = _convert(hints[name], value, f"{where}/{key}")
    return cls(**kwargs)


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, where) if len(inner) == 1 else value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and is_json_object(value):
        return build(hint, value, where=where)
    if origin is tuple and is_json_array(value):
        item = args[0] if args else Any
        return tuple(_convert(item, v, f"{where}/{i}") for i, v in enumerate(value))
    if origin in (dict, typing.Mapping) or str(origin).endswith("Mapping'>"):
        item = args[1] if len(args) == 2 else Any
        return types.MappingProxyType({k: _convert(item, v, f"{where}/{k}") for k, v in value.items()})
    return value
