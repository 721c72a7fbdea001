"""Forms from a question's JSON Schema: one builder for the admin, Slack's modal and MCP elicitation.

:func:`build` reads the subset people use and MCP's elicitation allows: one value, or a flat object
of string, number, integer, boolean and enum fields, each with its ``title``, ``description``,
``default``, bounds (``minimum``/``maximum``, ``minLength``/``maxLength``) and ``format`` (email,
uri, date). What it cannot express (nesting, arrays, ``oneOf`` of objects, no schema) is None: the
caller keeps the JSON box for it. The same :class:`Form` is drawn as Django form fields
(:func:`django_fields`) and as a Slack modal's input blocks (:func:`slack_blocks`, read back by
:func:`from_slack_state`), for a workflow's question and an MCP server's (whose requested schema is
this subset: ``durable.elicitation``).

A workflow's schema is checked when it asks (:func:`check_schema`, an MCP server's at the edge by
``core.mcp_input``): its size, depth and number of fields bounded, a field that asks for a secret
refused (``format: password``, or a
name such as token, password or secret): MCP's specification forbids asking secrets by form, and a
question's answer is stored and shown in the admin. Every text of it is drawn escaped (Django's
widgets, Slack's ``plain_text``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import date
from typing import Any

from . import storable
from .core.mcp_input import asks_secret

#: the schema's stored JSON, nesting and fields at most (a Slack modal holds 100 blocks)
MAX_SCHEMA_BYTES = 64_000
MAX_SCHEMA_DEPTH = 12
MAX_FIELDS = 40
#: an enum's choices at most (a Slack select holds 100 options)
MAX_CHOICES = 100
#: formats a string field may take
FORMATS = ("email", "uri", "date")
SCALARS = ("string", "number", "integer", "boolean")


def format_checker() -> Any:
    """The formats of :data:`FORMATS` checked as the forms check them (Django's validators, an ISO
    date), for an answer that comes as JSON (a webhook, the JSON endpoint, Python): without it
    ``jsonschema`` takes "next tuesday" as a date."""
    import jsonschema
    from django.core.exceptions import ValidationError
    from django.core.validators import URLValidator, validate_email

    checker = jsonschema.FormatChecker(formats=())

    def _valid(check: Any) -> Any:
        def conforms(value: Any) -> bool:
            if not isinstance(value, str):
                return True  # the type's to refuse
            try:
                check(value)
            except (ValidationError, ValueError):
                return False
            return True
        return conforms

    checker.checks("email")(_valid(validate_email))
    checker.checks("uri")(_valid(URLValidator()))
    checker.checks("date")(_valid(_iso_date))
    return checker


def _iso_date(value: str) -> None:
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        raise ValueError(f"{value!r} is not YYYY-MM-DD")
    date.fromisoformat(value)  # ValueError past the month's days


class SchemaRefused(ValueError):
    """A schema that cannot be asked: too big, too deep, or asking for a secret."""


@dataclass(frozen=True)
class Field:
    """One field of a form (``name`` is "" for a question whose answer is one value)."""

    name: str
    kind: str  # "string" | "number" | "integer" | "boolean" | "enum"
    title: str
    description: str = ""
    required: bool = True
    default: Any = None
    choices: tuple[tuple[Any, str], ...] = ()  # an enum's values and their labels
    minimum: float | None = None
    maximum: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    format: str = ""

    @property
    def label(self) -> str:
        return self.title or self.name or "Answer"

    def tokens(self) -> list[str]:
        """What a form sends for each choice: the value itself when every value is a short
        string (readable in the page), else its number."""
        values = [v for v, _ in self.choices]
        if all(isinstance(v, str) and 0 < len(v) <= 150 for v in values) and len(set(values)) == len(values):
            return list(values)
        return [str(i) for i in range(len(values))]

    def choice(self, token: Any) -> Any:
        """The enum value a form sent as ``token`` (:meth:`tokens`); KeyError if none."""
        tokens = self.tokens()
        if token not in tokens:
            raise KeyError(token)
        return self.choices[tokens.index(token)][0]


@dataclass(frozen=True)
class Form:
    fields: tuple[Field, ...]
    #: the answer is the one field's value, not an object of them
    single: bool

    def answer(self, values: dict[str, Any]) -> Any:
        """The answer from each field's value (a field left empty is left out of the object)."""
        if self.single:
            return values.get(self.fields[0].name)
        return {f.name: values[f.name] for f in self.fields if values.get(f.name) is not None}


# --- reading a schema ------------------------------------------------------------------------------


def _words(value: Any, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _number(value: Any) -> float | None:
    """A bound or a default that is a finite number (an int stays an int), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or abs(value) == float("inf"):
        return None
    return value


def _length(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _choices(schema: dict[str, Any]) -> tuple[tuple[Any, str], ...] | None:
    """An enum's (value, label) pairs: ``enum`` (with ``enumNames``) or ``oneOf`` of ``const``
    with ``title`` (MCP's titled enum); None if the schema is no enum."""
    if isinstance(schema.get("enum"), list):
        values = schema["enum"]
        given = schema.get("enumNames")
        names: list[Any] = given if isinstance(given, list) else []
        labels = [names[i] if i < len(names) and isinstance(names[i], str) else None for i in range(len(values))]
    elif isinstance(schema.get("oneOf"), list) and all(isinstance(o, dict) and "const" in o for o in schema["oneOf"]):
        values = [o["const"] for o in schema["oneOf"]]
        labels = [o.get("title") if isinstance(o.get("title"), str) else None for o in schema["oneOf"]]
    else:
        return None
    if not values or len(values) > MAX_CHOICES:
        return None
    return tuple((v, (label or (v if isinstance(v, str) else json.dumps(v)))[:200]) for v, label in zip(values, labels,
                                                                                                         strict=True))


def _field(name: str, schema: Any, required: bool) -> Field | None:
    if not isinstance(schema, dict):
        return None
    common: dict[str, Any] = {"name": name, "title": _words(schema.get("title"), 200), "description": _words(schema.get("description"), 2000),
              "required": required, "default": schema.get("default")}
    choices = _choices(schema)
    if choices is not None:
        return Field(kind="enum", choices=choices, **common)
    kind = schema.get("type")
    if kind not in SCALARS:
        return None
    fmt = schema.get("format") if kind == "string" else None
    if fmt is not None and fmt not in FORMATS:
        return None
    return Field(kind=kind, minimum=_number(schema.get("minimum")), maximum=_number(schema.get("maximum")),
                 min_length=_length(schema.get("minLength")), max_length=_length(schema.get("maxLength")),
                 format=fmt or "", **common)


def order_of(schema: Any) -> list[str] | None:
    """The names of ``schema``'s properties in the order written (kept beside the schema: a
    database may store an object's keys in another order)."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    return [str(name) for name in properties][:MAX_FIELDS + 1] if isinstance(properties, dict) else None


def form_of(step: Any) -> Form | None:
    """The form of a question (a ``WorkflowStep``): its schema, its fields in the order asked."""
    return build(step.schema, order=step.field_order)


def build(schema: Any, order: list[str] | None = None) -> Form | None:
    """The form of ``schema``, or None where only a JSON box can answer it; ``order``: the
    properties' names in the order their fields come (the others after them, as they are)."""
    if not isinstance(schema, dict):
        return None
    if schema.get("type") == "object" or "properties" in schema:
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties or len(properties) > MAX_FIELDS:
            return None
        if isinstance(order, list):
            rank = {name: i for i, name in enumerate(order) if isinstance(name, str)}
            properties = dict(sorted(properties.items(), key=lambda kv: rank.get(kv[0], len(rank))))
        listed = schema.get("required")
        required: list[Any] = listed if isinstance(listed, list) else []
        fields = [_field(str(name), sub, name in required) for name, sub in properties.items()]
        if any(f is None for f in fields):
            return None
        return Form(tuple(f for f in fields if f is not None), single=False)
    field = _field("", schema, True)
    return Form((field,), single=True) if field is not None else None


def secret_fields(schema: Any) -> list[str]:
    """The names of the fields of ``schema`` that ask for a secret (anywhere in it)."""
    found: list[str] = []

    def walk(node: Any, name: str) -> None:
        if isinstance(node, dict):
            if node.get("format") == "password" or node.get("writeOnly") is True:
                found.append(name or "the answer")
            properties = node.get("properties")
            if isinstance(properties, dict):
                for key, sub in properties.items():
                    if asks_secret(str(key)):
                        found.append(str(key))
                    walk(sub, str(key))
            for key in ("items", "additionalProperties"):
                walk(node.get(key), name)
            for key in ("oneOf", "anyOf", "allOf"):
                walk(node.get(key), name)
        elif isinstance(node, list):
            for sub in node:
                walk(sub, name)

    walk(schema, "")
    return list(dict.fromkeys(found))


def check_schema(schema: Any, *, where: str) -> None:
    """:class:`SchemaRefused` (a sentence that begins with ``where``) if ``schema`` is too big or
    deep to draw, or asks for a secret."""
    if type(schema) in (dict, list) and storable.deeper_than(schema, MAX_SCHEMA_DEPTH):
        raise SchemaRefused(f"{where}: the schema nests more than {MAX_SCHEMA_DEPTH} levels deep; ask with a flatter one")
    if not storable.is_json(schema):
        raise SchemaRefused(f"{where}: the schema must be JSON (a dict), not {type(schema).__name__}")
    size = len(json.dumps(schema, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > MAX_SCHEMA_BYTES:
        raise SchemaRefused(f"{where}: the schema is {size:,} bytes of JSON, more than {MAX_SCHEMA_BYTES:,}; "
                            "ask with a smaller one")
    secrets = secret_fields(schema)
    if secrets:
        raise SchemaRefused(f"{where}: the field {', '.join(map(repr, secrets[:5]))} asks for a secret (a password, "
                            "token or key); a question's answer is stored and shown, so ask for it another way "
                            "(an integration's settings, never a form)")


# --- the admin: Django form fields -------------------------------------------------------------------


def django_fields(form: Form) -> dict[str, Any]:
    """A Django form field per field of ``form``, named ``answer`` for a single value, else
    ``answer__<n>`` (:func:`from_django` reads them back)."""
    from django import forms

    found: dict[str, Any] = {}
    for index, field in enumerate(form.fields):
        options: dict[str, Any] = {"label": field.label if not form.single else "Answer", "required": field.required,
                                   "help_text": field.description}
        if field.default is not None:
            options["initial"] = field.default
        found["answer" if form.single else f"answer__{index}"] = _django_field(forms, field, options)
    return found


def _django_field(forms: Any, field: Field, options: dict[str, Any]) -> Any:
    if field.kind == "enum":
        choices = [(t, label) for t, (_, label) in zip(field.tokens(), field.choices, strict=True)]
        default = [t for t, (v, _) in zip(field.tokens(), field.choices, strict=True) if v == field.default]
        options["initial"] = default[0] if default else None
        widget = forms.RadioSelect if len(choices) <= 8 else forms.Select
        return forms.TypedChoiceField(choices=choices, coerce=field.choice, widget=widget, **options)
    if field.kind == "boolean":
        return forms.TypedChoiceField(choices=[("true", "Yes"), ("false", "No")], coerce=lambda v: v == "true",
                                      widget=forms.RadioSelect, **{**options, "initial": (
                                          None if field.default is None else "true" if field.default else "false")})
    if field.kind in ("integer", "number"):
        cls = forms.IntegerField if field.kind == "integer" else forms.FloatField
        return cls(min_value=field.minimum, max_value=field.maximum, **options)
    if field.format == "email":
        return forms.EmailField(max_length=field.max_length, **options)
    if field.format == "uri":
        return forms.URLField(max_length=field.max_length, assume_scheme="https", **options)
    if field.format == "date":
        return forms.DateField(widget=forms.DateInput(attrs={"type": "date"}), **options)
    long = field.max_length is None or field.max_length > 200
    widget = forms.Textarea(attrs={"rows": 3, "cols": 60}) if long else forms.TextInput(attrs={"size": 60})
    return forms.CharField(min_length=field.min_length, max_length=field.max_length, strip=False, widget=widget,
                           empty_value=None if not field.required else "", **options)


def from_django(form: Form, cleaned: dict[str, Any]) -> Any:
    """The answer from a Django form's ``cleaned_data`` (:func:`django_fields`'s names)."""
    values = {}
    for index, field in enumerate(form.fields):
        value = cleaned.get("answer" if form.single else f"answer__{index}")
        if isinstance(value, date):
            value = value.isoformat()
        if value == "" and not field.required:
            value = None
        values[field.name] = value
    return form.answer(values)


# --- Slack: a modal's input blocks -----------------------------------------------------------------


def slack_text(text: str, limit: int) -> dict[str, Any]:
    """A Slack ``plain_text`` object of ``text`` (never mrkdwn: nothing in it is markup), hidden
    characters shown, at most ``limit`` characters."""
    from .display import mark_hidden

    shown = mark_hidden(text, keep="\n") or " "
    return {"type": "plain_text", "text": shown if len(shown) <= limit else shown[: limit - 1] + "…", "emoji": False}


def _option(token: str, label: str) -> dict[str, Any]:
    return {"text": slack_text(label, 75), "value": token}


def slack_blocks(form: Form) -> list[dict[str, Any]]:
    """An ``input`` block per field (``block_id`` ``f<n>``, ``action_id`` ``value``), in Slack's
    Block Kit: text, email, URL, number and date inputs, a select or radio buttons for an enum, Yes/No
    radio buttons for a boolean; every text ``plain_text``, bounded as Slack bounds it."""
    blocks = []
    for index, field in enumerate(form.fields):
        element = _slack_element(field)
        block: dict[str, Any] = {"type": "input", "block_id": f"f{index}", "label": slack_text(field.label, 2000),
                                 "element": {"action_id": "value", **element}, "optional": not field.required}
        if field.description:
            block["hint"] = slack_text(field.description, 2000)
        blocks.append(block)
    return blocks


def _slack_element(field: Field) -> dict[str, Any]:
    default = field.default
    if field.kind in ("enum", "boolean"):
        pairs = list(field.choices) if field.kind == "enum" else [(True, "Yes"), (False, "No")]
        tokens = field.tokens() if field.kind == "enum" else ["true", "false"]
        options = [_option(t, label) for t, (_, label) in zip(tokens, pairs, strict=True)]
        element: dict[str, Any] = {"type": "static_select" if len(options) > 5 else "radio_buttons", "options": options}
        chosen = [o for o, (v, _) in zip(options, pairs, strict=True) if default is not None and v == default]
        if chosen:
            element["initial_option"] = chosen[0]
        return element
    if field.kind in ("integer", "number"):
        element = {"type": "number_input", "is_decimal_allowed": field.kind == "number"}
        for key, value in (("min_value", field.minimum), ("max_value", field.maximum), ("initial_value", _number(default))):
            if value is not None:
                element[key] = str(int(value)) if field.kind == "integer" and value == int(value) else str(value)
        return element
    if field.format == "date":
        element = {"type": "datepicker"}
        if isinstance(default, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", default):
            element["initial_date"] = default
        return element
    kind = {"email": "email_text_input", "uri": "url_text_input"}.get(field.format, "plain_text_input")
    element = {"type": kind}
    if kind == "plain_text_input":
        element["multiline"] = field.max_length is None or field.max_length > 200
        if field.min_length is not None:
            element["min_length"] = min(field.min_length, 3000)
        if field.max_length is not None:
            element["max_length"] = min(max(field.max_length, 1), 3000)
    if isinstance(default, str):
        element["initial_value"] = default[:3000]
    return element


def from_slack_state(form: Form, state: Any) -> tuple[Any, dict[str, str]]:
    """The answer from a ``view_submission``'s ``view.state.values``, and the errors by
    ``block_id`` (what ``response_action: errors`` shows under each input)."""
    values: dict[str, Any] = {}
    errors: dict[str, str] = {}
    blocks = state if isinstance(state, dict) else {}
    for index, field in enumerate(form.fields):
        block_id = f"f{index}"
        entry = (blocks.get(block_id) or {}).get("value") if isinstance(blocks.get(block_id), dict) else None
        entry = entry if isinstance(entry, dict) else {}
        try:
            values[field.name] = _slack_value(field, entry)
        except ValueError as exc:
            errors[block_id] = str(exc)
            continue
        if values[field.name] is None and field.required:
            errors[block_id] = "This field is required."
    return form.answer(values), errors


def _slack_value(field: Field, entry: dict[str, Any]) -> Any:
    if field.kind in ("enum", "boolean"):
        option = entry.get("selected_option")
        if not isinstance(option, dict):
            return None
        if field.kind == "boolean":
            if option.get("value") not in ("true", "false"):
                raise ValueError("Choose Yes or No.")
            return option["value"] == "true"
        try:
            return field.choice(option.get("value"))
        except KeyError:
            raise ValueError("Choose one of the options.") from None
    raw = entry.get("selected_date") if field.format == "date" else entry.get("value")
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str) or len(raw) > 100_000:
        raise ValueError("This value cannot be read.")
    if field.kind == "integer":
        try:
            return int(raw)
        except ValueError:
            raise ValueError("Enter a whole number.") from None
    if field.kind == "number":
        try:
            number = float(raw)
        except ValueError:
            raise ValueError("Enter a number.") from None
        if number != number or number in (float("inf"), float("-inf")):
            raise ValueError("Enter a finite number.")
        return number
    return raw
