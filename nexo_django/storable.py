"""What the database can hold: a lossless codec for JSON and text, and limits refused at the edge.

A model or a server sends anything: NUL characters (a ``read`` of a binary file), lone surrogates,
NaN and infinities, floats that PostgreSQL's ``jsonb`` gives back differently (``1e16`` comes back
as the integer ``10000000000000000``, ``-0.0`` as ``0.0``), dictionaries whose keys hold any of
that. PostgreSQL's ``jsonb`` and ``text`` refuse NUL, neither database takes a lone surrogate
(the driver cannot encode it in UTF-8), and ``NaN`` is not JSON. So every JSON value nexo_django
stores goes through :class:`StoredJSONEncoder` and comes back through :class:`StoredJSONDecoder`,
which escape exactly those values and give back what was sent, value for value (floats with
their sign and type, keys and strings with every character). Model-produced text columns
(``AgentRun.prompt``, ``result``, ``error``, ``Decision.note``) do the same with
:class:`StoredTextField`. What cannot be kept is refused before it is written, with
:class:`UnstorableValue` naming the limit: JSON nested deeper than :data:`MAX_DEPTH` levels.

The escaped forms (only values that need them are escaped; everything else is stored as is):

- a string holding NUL or a lone surrogate:
  ``{"__nexo__": "str", "v": "<the text with %, NUL and surrogates as %XXXX>"}``;
- a float that is NaN, infinite, ``-0.0`` or written with a positive exponent:
  ``{"__nexo__": "float", "v": "<repr>"}``;
- a dictionary with a key that needs escaping, or with the key ``"__nexo__"`` itself:
  ``{"__nexo__": "dict", "v": [[key, value], ...]}``;
- a text column that holds NUL or a surrogate, or starts with U+E000: ``"\\ue000"`` followed by
  the text with ``%``, NUL and surrogates as ``%XXXX``.

Read through Django (the ORM, ``nexo_django.durable.sql``) the values come back decoded. A raw SQL
reader, a JSON key lookup (``data__content=...``) or a data migration's historical model sees
the escaped form of the rare values that have one. The fields deconstruct as Django's own
``JSONField`` and ``TextField``: the columns are the same, so there is no migration.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from django.db import models

from .core.errors import NexoError

#: The key that marks an escaped value.
RESERVED = "__nexo__"
#: Nesting levels a stored JSON value may have, counted in the stored row (a tool call's
#: arguments sit three levels down in their transcript message). SQLite's JSON functions refuse
#: more than 1,000 (and its JSON columns carry a ``JSON_VALID`` check); Python's ``json`` gives
#: up at its recursion limit.
MAX_DEPTH = 512
#: The characters neither database's text takes: NUL (PostgreSQL) and lone surrogates (the
#: driver cannot encode them in UTF-8).
_BAD = re.compile("[\x00\ud800-\udfff]")
_PERCENT = re.compile("[%\x00\ud800-\udfff]")
_UNPERCENT = re.compile("%([0-9A-F]{4})")
_SURROGATE = re.compile("[\ud800-\udfff]")
#: The first character of an escaped text column (a private-use character).
TEXT_MARK = "\ue000"


class UnstorableValue(NexoError, ValueError):
    """A value the database cannot hold, refused before it is written; the message names the
    limit. A durable run that meets one fails, once, with this as its error."""


def _percent(text: str) -> str:
    return _PERCENT.sub(lambda m: f"%{ord(m.group()):04X}", text)


def _unpercent(text: str) -> str:
    return _UNPERCENT.sub(lambda m: chr(int(m.group(1), 16)), text)


def _float_needs_escape(value: float) -> bool:
    if value != value or value in (math.inf, -math.inf):
        return True
    if value == 0.0:
        return math.copysign(1.0, value) < 0
    return "e+" in repr(value)


def escape(value: Any, depth: int = 0) -> Any:
    """``value`` with every part the database cannot hold (or would give back changed) in its
    escaped form; ``value`` itself (the same object) when nothing needed it."""
    if depth > MAX_DEPTH:
        raise UnstorableValue(too_deep())
    kind = type(value)
    if kind is str:
        return {RESERVED: "str", "v": _percent(value)} if _BAD.search(value) else value
    if kind is float:
        return {RESERVED: "float", "v": repr(value)} if _float_needs_escape(value) else value
    if kind is dict:
        changed = False
        pairs = []
        keyed = RESERVED in value
        for key, item in value.items():
            new = escape(item, depth + 2)
            changed = changed or new is not item
            if type(key) is str and _BAD.search(key):
                keyed = True
            pairs.append((key, new))
        if keyed:
            return {RESERVED: "dict", "v": [[escape(k, depth + 3), v] for k, v in pairs]}
        return dict(pairs) if changed else value
    if kind in (list, tuple):
        items = [escape(item, depth + 1) for item in value]
        if any(new is not old for new, old in zip(items, value, strict=True)):
            return items
        return value
    return value


def _hook(obj: dict[str, Any]) -> Any:
    tag = obj.get(RESERVED)
    if tag is None:
        return obj
    if tag == "str":
        return _unpercent(obj["v"])
    if tag == "float":
        return float(obj["v"])
    if tag == "dict":
        return {key: item for key, item in obj["v"]}
    return obj


def too_deep() -> str:
    return (
        f"JSON nested more than {MAX_DEPTH} levels deep cannot be stored (SQLite's JSON functions "
        "stop at 1,000 levels); send flatter data"
    )


def deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` has more than ``limit`` levels of lists and dicts (iterative: any depth)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if type(item) is dict else item
        for child in children:
            if type(child) in (dict, list, tuple):
                stack.append((child, depth + 1))
    return False


#: Non-ASCII stays as it is (shorter rows); NaN and infinities are not JSON. Built once.
_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode


def is_json(value: Any) -> bool:
    """Whether ``value`` is made of JSON's types only (tuples as lists; keys strings)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_json(v) for k, v in value.items())
    return False


def dumps(value: Any) -> str:
    """The JSON text a column stores for ``value``: the value as is when the database keeps it
    unchanged (one C-speed encoding and a regex over its text), escaped when not."""
    try:
        text = _encode(value)
    except ValueError:  # NaN or an infinity; or a circular value, which escape() finds too deep
        return _escaped(escape(value))
    except RecursionError:
        raise UnstorableValue(too_deep()) from None
    if _suspect(text):
        escaped = escape(value)
        if escaped is not value:
            return _escaped(escaped)
    if len(text) > 2 * MAX_DEPTH and deeper_than(value, MAX_DEPTH):
        raise UnstorableValue(too_deep())
    return text


def _suspect(text: str) -> bool:
    """Whether the JSON text of a value (``ensure_ascii=False``) may hold something to escape: a
    NUL, a lone surrogate, the marker, a positive exponent or ``-0.0``. Substring tests (a regex
    with these alternatives cost twice the encoding); a false alarm costs a walk of the value and
    changes nothing."""
    return (
        "\\u0000" in text or "__nexo__" in text or "e+" in text or "-0.0" in text
        or (not text.isascii() and _SURROGATE.search(text) is not None)
    )


def _escaped(value: Any) -> str:
    if deeper_than(value, MAX_DEPTH):
        raise UnstorableValue(too_deep())
    try:
        return _encode(value)
    except (ValueError, RecursionError) as exc:
        raise UnstorableValue(f"this value cannot be stored as JSON: {exc}") from None


def loads(text: str) -> Any:
    """``json.loads`` of what :func:`dumps` wrote (or of an array of such values, as
    PostgreSQL's ``json_agg`` returns them): without the marker, the plain decoder, no hook."""
    return json.loads(text, object_hook=_hook) if RESERVED in text else json.loads(text)


class StoredJSONEncoder(json.JSONEncoder):
    """The column's encoder for Django (``json.dumps(value, cls=...)``): :func:`dumps`. Its
    options are fixed, so none is kept (``nexo_django.sql`` calls :func:`dumps` directly)."""

    def __init__(self, **kwargs: Any) -> None:
        pass  # nothing to set up: encode() is dumps()

    def encode(self, o: Any) -> str:
        return dumps(o)


class StoredJSONDecoder(json.JSONDecoder):
    """The column's decoder for Django (``json.loads(text, cls=...)``): :func:`loads`."""

    def __init__(self, **kwargs: Any) -> None:
        pass  # nothing to set up: decode() is loads()

    def decode(self, s: str, *args: Any, **kwargs: Any) -> Any:
        return loads(s)


class StoredJSONField(models.JSONField):
    """A ``JSONField`` whose values go through the codec. It deconstructs as Django's own
    ``JSONField`` (without the encoder and decoder): the column is the same, so no migration."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("encoder", StoredJSONEncoder)
        kwargs.setdefault("decoder", StoredJSONDecoder)
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, _, args, kwargs = super().deconstruct()
        kwargs.pop("encoder", None)
        kwargs.pop("decoder", None)
        return name, "django.db.models.JSONField", args, kwargs


def escape_text(value: str) -> str:
    """A text column's value as stored: itself, unless it holds NUL or a surrogate (or starts
    with the mark)."""
    if "\x00" not in value and not value.startswith(TEXT_MARK) and (value.isascii() or _SURROGATE.search(value) is None):
        return value
    return TEXT_MARK + _percent(value)


def unescape_text(value: str) -> str:
    return _unpercent(value[1:]) if value.startswith(TEXT_MARK) else value


class StoredTextField(models.TextField):
    """A ``TextField`` that keeps every character (see :func:`escape_text`). It deconstructs
    as Django's own ``TextField``: the column is the same, so no migration."""

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        return escape_text(value) if type(value) is str else value

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return unescape_text(value) if type(value) is str and value.startswith(TEXT_MARK) else value

    def deconstruct(self) -> Any:
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.TextField", args, kwargs


def refuse_call_ids(message: dict[str, Any], limit: int) -> None:
    """Refuse (``UnstorableValue``) a model reply whose tool call ids the database cannot keep:
    longer than ``limit`` characters (``ToolCall.tool_call_id``), or holding NUL or a lone
    surrogate. An id is the provider's name for the call, sent back with its result: it is never
    cut or changed."""
    for call in message.get("tool_calls") or ():
        call_id = str(call.get("id") or "")
        if len(call_id) > limit:
            raise UnstorableValue(
                f"the model sent a tool call id of {len(call_id)} characters ({call_id[:40]!r}...); "
                f"at most {limit} can be stored. Use a provider or a model server whose ids are shorter."
            )
        if _BAD.search(call_id):
            raise UnstorableValue(
                f"the model sent a tool call id with a NUL or a lone surrogate ({call_id!r}); such an id "
                "cannot be stored or sent back"
            )
