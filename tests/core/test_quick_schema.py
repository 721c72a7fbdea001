"""nexo_django.core.tools.quick_schema: the quick check of flat schemas never accepts what
jsonschema refuses, and a refused call still gets jsonschema's own error (issue 34)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from nexo_django.core.errors import ToolArgumentError
from nexo_django.core.tools import Tool
from nexo_django.core.tools.files import GLOB, READ, WRITE
from nexo_django.core.tools.quick_schema import compile_check

FLAT = {
    "type": "object",
    "description": "all the simple types",
    "properties": {
        "s": {"type": "string", "description": "a string"},
        "i": {"type": "integer"},
        "n": {"type": "number"},
        "b": {"type": "boolean"},
        "z": {"type": "null"},
        "a": {"type": "array"},
        "o": {"type": "object"},
        "any": {"description": "no type"},
    },
    "required": ["s"],
    "additionalProperties": False,
}
VALUES: list[Any] = ["", "x", 0, 1, -3, 2**70, 1.0, 1.5, float("nan"), float("inf"), True, False, None, [], [1],
                     {}, {"k": 1}, (1,)]


@pytest.mark.parametrize("extra", [False, True])
def test_the_quick_check_agrees_with_jsonschema_or_defers_to_it(extra: bool) -> None:
    schema = {**FLAT, "additionalProperties": extra}
    check = compile_check(schema)
    assert check is not None
    validator = Draft202012Validator(schema)
    checked = 0
    for name, value in itertools.product([*FLAT["properties"], "other"], VALUES):
        for args in ({"s": "x", name: value}, {name: value}):
            valid = validator.is_valid(args)
            if check(args):
                assert valid, args  # never accepts what jsonschema refuses
            else:
                # False for a valid value only where jsonschema knows a type it does not (a tuple)
                assert not valid or isinstance(value, tuple), args
            checked += 1
    assert checked > 200


def test_schemas_with_other_keywords_are_left_to_jsonschema() -> None:
    for schema in (
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}},
        {"type": "object", "properties": {"n": {"enum": [1, 2]}}},
        {"type": "object", "properties": {"n": {"type": ["integer", "null"]}}},
        {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
        {"type": "object", "additionalProperties": {"type": "string"}},
        {"type": "object", "properties": {"n": True}},
        {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}, "$defs": {"n": {"type": "string"}}},
        {"properties": {"n": {"type": "string"}}},
        {"type": "array"},
    ):
        assert compile_check(schema) is None, schema


def test_a_tool_refuses_as_jsonschema_says_and_returns_what_it_validated() -> None:
    assert WRITE._quick is not None and READ._quick is not None and GLOB._quick is not None
    with pytest.raises(ToolArgumentError, match="missing required argument content"):
        WRITE.validate({"path": "a.txt"})
    with pytest.raises(ToolArgumentError, match="unexpected argument extra"):
        WRITE.validate({"path": "a.txt", "content": "x", "extra": 1})
    with pytest.raises(ToolArgumentError, match="argument content: 5 is not of type 'string'"):
        WRITE.validate({"path": "a.txt", "content": 5})
    assert WRITE.validate({"path": "./a//b.txt", "content": "x"}) == {"path": "a/b.txt", "content": "x"}
    tool = Tool("t", "t", {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}},
                capability="read", idempotent=True, run=lambda args, ctx: args)
    assert tool._quick is None
    with pytest.raises(ToolArgumentError, match="less than the minimum"):
        tool.validate({"n": -1})
