"""The form builder (nexo_django/schema_forms.py): the subset it draws, what it leaves to the JSON
box, the secrets and the hostile schemas it refuses, Slack's modal read back."""

from __future__ import annotations

from typing import Any

import pytest

from nexo_django import schema_forms
from nexo_django.schema_forms import (
    SchemaRefused,
    build,
    check_schema,
    from_slack_state,
    slack_blocks,
)
from tests.workflows_for_tests import TICKET_SCHEMA


def test_a_flat_object_is_a_form_of_its_fields() -> None:
    form = build(TICKET_SCHEMA)
    assert form is not None and not form.single
    assert [(f.name, f.kind, f.required) for f in form.fields] == [
        ("title", "string", True), ("priority", "integer", True), ("due", "string", False), ("notify", "boolean", False)]
    assert form.fields[1].minimum == 1 and form.fields[1].maximum == 5 and form.fields[1].default == 3
    assert form.fields[2].format == "date" and form.fields[0].description == "One line"


@pytest.mark.parametrize("schema", [
    None, {"type": "object"}, {"type": "array", "items": {"type": "string"}},
    {"type": "object", "properties": {"nested": {"type": "object", "properties": {"a": {"type": "string"}}}}},
    {"type": "string", "format": "ipv4"},
])
def test_what_the_form_cannot_express_is_left_to_the_json_box(schema: Any) -> None:
    assert build(schema) is None


def test_enums_titled_either_way() -> None:
    form = build({"oneOf": [{"const": "hi", "title": "High"}, {"const": "lo", "title": "Low"}]})
    assert form is not None and form.single and form.fields[0].choices == (("hi", "High"), ("lo", "Low"))
    numbers = build({"enum": [1, 2, 3]})
    assert numbers is not None and numbers.fields[0].tokens() == ["0", "1", "2"] and numbers.fields[0].choice("2") == 3


@pytest.mark.parametrize("schema, named", [
    ({"type": "object", "properties": {"api_token": {"type": "string"}}}, "api_token"),
    ({"type": "object", "properties": {"Password": {"type": "string"}}}, "Password"),
    ({"type": "object", "properties": {"client-secret": {"type": "string"}}}, "client-secret"),
    ({"type": "object", "properties": {"code": {"type": "string", "format": "password"}}}, "code"),
    ({"type": "string", "format": "password"}, "the answer"),
])
def test_a_field_that_asks_for_a_secret_is_refused(schema: dict[str, Any], named: str) -> None:
    with pytest.raises(SchemaRefused, match=f"{named!r} asks for a secret"):
        check_schema(schema, where="ask('x', ...)")


@pytest.mark.parametrize("name, secret", [
    ("apiKey", True), ("ACCESS_KEY", True), ("pin", True), ("github_token", True), ("max_tokens", False),
    ("bypass", False), ("compass_heading", False), ("passenger", False), ("keyboard", False),
])
def test_secret_names_are_words_not_substrings(name: str, secret: bool) -> None:
    assert schema_forms.asks_secret(name) is secret


def test_hostile_schemas_are_refused_with_a_reason() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(100_000):
        deep = {"items": deep}
    with pytest.raises(SchemaRefused, match="nests more than 12 levels"):
        check_schema(deep, where="w")
    with pytest.raises(SchemaRefused, match="bytes of JSON, more than 64,000"):
        check_schema({"type": "string", "description": "x" * 70_000}, where="w")
    nul = {"type": "string", "title": "a\x00b"}
    check_schema(nul, where="w")  # stored faithfully (nexo_django.storable), shown with a marker
    nul_form = build(nul)
    assert nul_form is not None and "\x00" not in slack_blocks(nul_form)[0]["label"]["text"]
    check_schema(TICKET_SCHEMA, where="w")  # the ordinary one passes
    assert build({"enum": list(range(schema_forms.MAX_CHOICES + 1))}) is None


def test_slack_blocks_and_their_state_read_back() -> None:
    form = build({**TICKET_SCHEMA, "properties": {**TICKET_SCHEMA["properties"],
                                                   "title": {"type": "string", "title": "<script>alert(1)</script>"}}})
    assert form is not None
    blocks = slack_blocks(form)
    assert [b["element"]["type"] for b in blocks] == ["plain_text_input", "number_input", "datepicker", "radio_buttons"]
    assert blocks[0]["label"] == {"type": "plain_text", "text": "<script>alert(1)</script>", "emoji": False}  # never mrkdwn
    assert blocks[1]["element"] | {} == {"action_id": "value", "type": "number_input", "is_decimal_allowed": False,
                                         "min_value": "1", "max_value": "5", "initial_value": "3"}
    assert blocks[2]["optional"] is True and blocks[0]["optional"] is False
    state = {"f0": {"value": {"type": "plain_text_input", "value": "Fix"}},
             "f1": {"value": {"type": "number_input", "value": "2"}},
             "f2": {"value": {"type": "datepicker", "selected_date": "2027-01-31"}},
             "f3": {"value": {"type": "radio_buttons", "selected_option": {"value": "false"}}}}
    assert from_slack_state(form, state) == ({"title": "Fix", "priority": 2, "due": "2027-01-31", "notify": False}, {})
    bad = {**state, "f1": {"value": {"value": "two"}}, "f0": {"value": {"value": ""}}}
    assert from_slack_state(form, bad)[1] == {"f0": "This field is required.", "f1": "Enter a whole number."}
    forged = {**state, "f3": {"value": {"selected_option": {"value": "maybe"}}}}
    assert from_slack_state(form, forged)[1] == {"f3": "Choose Yes or No."}


def test_the_fields_come_in_the_order_asked_whatever_order_the_database_keeps() -> None:
    # PostgreSQL's jsonb gives an object's keys back shortest first: the order asked is kept beside it.
    stored = {"type": "object", "properties": {"due": {"type": "string"}, "title": {"type": "string"},
                                               "priority": {"type": "integer"}}}
    form = build(stored, order=["title", "priority", "due"])
    assert form is not None and [f.name for f in form.fields] == ["title", "priority", "due"]
    assert schema_forms.order_of(TICKET_SCHEMA) == ["title", "priority", "due", "notify"]
