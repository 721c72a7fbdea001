"""A quick check of a tool's arguments against the simplest schemas (issue 34).

jsonschema's ``iter_errors`` walks a schema in Python, keyword by keyword; a durable run validates
a call's arguments when the model sends it and again when it runs after its approval. Most tools'
schemas are flat: an object of a few named properties, each of one JSON type, some required,
maybe no others allowed. For such a schema :func:`compile_check` returns a function that says
whether arguments are valid by the same rules (Draft 2020-12's ``type``, ``properties``,
``required``, ``additionalProperties``), at the cost of a few dictionary lookups. It only ever
answers True for arguments jsonschema accepts: when it answers False, jsonschema runs as before,
so the error said is jsonschema's own. A schema with any other keyword gets None: jsonschema
alone checks it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: keywords that only annotate (validate nothing)
ANNOTATIONS = frozenset({"description", "title", "$comment", "default", "examples", "deprecated",
                         "readOnly", "writeOnly"})
TOP = ANNOTATIONS | {"type", "properties", "required", "additionalProperties", "$schema"}
PROPERTY = ANNOTATIONS | {"type"}


def _is_integer(value: Any) -> bool:
    # jsonschema's "integer": an int that is not a bool, or a float without a fraction
    return type(value) is int or (type(value) is float and value.is_integer())


#: JSON type -> a check that is True only for values of that type (as jsonschema's type checker)
TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: type(v) is str,
    "integer": _is_integer,
    "number": lambda v: type(v) in (int, float),
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
    "array": lambda v: type(v) is list,
    "object": lambda v: type(v) is dict,
}


def compile_check(schema: Any) -> Callable[[dict[str, Any]], bool] | None:
    """A check of arguments (a dict) against ``schema``, or None if the schema is not one of
    the simple ones. True: valid. False: let jsonschema say why (or that it is valid after all:
    the check knows fewer value types than jsonschema, e.g. no ``Decimal``)."""
    if not isinstance(schema, dict) or not set(schema) <= TOP or schema.get("type") != "object":
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, dict) or not isinstance(required, list) or type(extra) is not bool:
        return None
    if not all(isinstance(name, str) for name in required):
        return None
    checks: dict[str, Callable[[Any], bool]] = {}
    for name, sub in properties.items():
        if not isinstance(sub, dict) or not set(sub) <= PROPERTY:
            return None
        kind = sub.get("type")
        if kind is None:
            checks[name] = _anything
        elif isinstance(kind, str) and kind in TYPES:
            checks[name] = TYPES[kind]
        else:
            return None
    needed = tuple(required)

    def check(args: dict[str, Any]) -> bool:
        for name in needed:
            if name not in args:
                return False
        for name, value in args.items():
            test = checks.get(name)
            if test is None:
                if not extra:
                    return False
            elif not test(value):
                return False
        return True

    return check


def _anything(value: Any) -> bool:
    return True
