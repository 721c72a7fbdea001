"""An MCP server's input_required result read at the edge (core/mcp_input.py), built with the SDK's
own types: what is bounded, what is refused and why, what is kept as sent."""

from __future__ import annotations

from typing import Any

import pytest
from mcp.types import (
    CreateMessageRequest,
    CreateMessageRequestParams,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    InputRequiredResult,
)

from nexo_django.core import mcp_input
from nexo_django.core.mcp_input import Answers, InputRefused, read, responses

WORD = {"type": "object", "properties": {"word": {"type": "string", "title": "<script>alert(1)</script>"}}}


def form(message: str = "Which word?", schema: Any = None) -> ElicitRequest:
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema or WORD))


def result(requests: dict[str, Any], state: str | None = "s") -> InputRequiredResult:
    return InputRequiredResult(input_requests=requests, request_state=state)


def test_form_and_url_asks_are_read_with_the_state_as_sent() -> None:
    state = "opaque\x00state"
    found = read("ask", result({"w": form("Say it\x00"), "u": ElicitRequest(params=ElicitRequestURLParams(
        message="Open it", url="https://example.com/x"))}, state))
    assert found.state == state and found.asks["w"].message == "Say it\x00"  # stored faithfully, shown escaped
    assert found.asks["w"].schema == WORD and found.asks["u"].url == "https://example.com/x"


@pytest.mark.parametrize("requests, state, reason", [
    ({f"k{i}": form() for i in range(mcp_input.MAX_REQUESTS + 1)}, "s", "more than 8"),
    ({"w": form("x" * 5000)}, "s", "more than 4,000"),
    ({"w": form()}, "x" * 70_000, "requestState is 70,000 characters"),
    ({"w": form(schema={"type": "object", "properties": {"a": {"type": "string", "description": "x" * 40_000}}})},
     "s", "bytes of JSON"),
    ({"w": form(schema={"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}}}})},
     "s", "field 'a' is not a string"),
    ({"w": form(schema={"type": "object", "properties": {"password": {"type": "string"}}})}, "s", "asks for a secret"),
    ({"w": form(schema={"type": "object", "properties": {"pin_code": {"type": "string", "format": "password"}}})},
     "s", "asks for a secret"),
    ({"u": ElicitRequest(params=ElicitRequestURLParams(message="m", url="javascript:alert(1)"))}, "s", "not an http"),
    ({"u": ElicitRequest(params=ElicitRequestURLParams(message="m", url="https://a.example/\nx"))}, "s", "not an http"),
    ({"bad key!": form()}, "s", "is not 1-64 letters"),
    ({"s": CreateMessageRequest(params=CreateMessageRequestParams(messages=[], max_tokens=5))}, "s",
     "only a person's input"),
])
def test_what_cannot_be_asked_is_refused_with_the_reason(requests: dict[str, Any], state: str, reason: str) -> None:
    with pytest.raises(InputRefused, match=reason):
        read("ask", result(requests, state))


def test_a_deep_schema_is_refused_without_recursing() -> None:
    deep: Any = {"type": "string"}
    for _ in range(50_000):
        deep = {"items": deep}
    with pytest.raises(InputRefused, match="nests more than 6 levels"):
        mcp_input.check_requested("w", {"type": "object", "properties": {"a": deep}})


def test_the_answers_become_the_sdks_elicit_results() -> None:
    given = responses(Answers({"a": {"action": "accept", "content": {"word": "hi"}}, "b": {"action": "decline"},
                               "c": {"action": "whatever"}}, "s", 1))
    assert {k: (v.action, v.content) for k, v in given.items()} == {
        "a": ("accept", {"word": "hi"}), "b": ("decline", None), "c": ("cancel", None)}
