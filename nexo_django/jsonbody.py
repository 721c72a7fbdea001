"""The one JSON reader for what a request sends: a body, or a form field holding JSON.

Bounded before anything is parsed: its size (bytes) and how deep its arrays and objects nest. A
body nested 100,000 deep made ``json.loads`` raise ``RecursionError`` (a 500); here it is a
:class:`BadJSON` that says why, and the caller answers 400 having changed nothing. Every view
that parses JSON from a request goes through :func:`read_json`; a channel's verifier (Slack,
webhooks) checks the signature over the raw body first, then calls it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.http import HttpRequest

#: Bytes of JSON a request may send (a decision, edited arguments, a channel's payload).
MAX_BYTES = 1_000_000
#: How deep arrays and objects may nest.
MAX_DEPTH = 64

# A JSON string (its escapes included); what is left outside them is structure and scalars. An
# unterminated string runs to the end of the text (its closing quote optional): required, a body
# of ``"\"\"\"...`` made the search retry from every quote, quadratic (20 KB took 26 s).
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]")


class BadJSON(ValueError):
    """What a request sent is not JSON this app reads; the message says why, in one sentence."""


def depth(text: str) -> int:
    """How deep the arrays and objects of ``text`` nest (brackets inside strings not counted)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    deepest = level = 0
    for char in brackets:
        if char in "[{":
            level += 1
            deepest = max(deepest, level)
        else:
            level -= 1
    return deepest


def read_json(raw: bytes | str, *, what: str = "the body", max_bytes: int = MAX_BYTES,
              max_depth: int = MAX_DEPTH, empty: Any = None) -> Any:
    """``raw`` parsed, or :class:`BadJSON`: over ``max_bytes``, nested deeper than ``max_depth``,
    not UTF-8, or not JSON. ``empty``: what an empty ``raw`` is (None: refused as not JSON)."""
    size = len(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw)
    if size > max_bytes:
        raise BadJSON(f"{what} is {size:,} bytes of JSON; at most {max_bytes:,} are read")
    if not raw.strip():
        if empty is not None:
            return empty
        raise BadJSON(f"{what} is empty; send a JSON value")
    try:
        text = raw if isinstance(raw, str) else raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadJSON(f"{what} is not UTF-8 text (byte {exc.start})") from exc
    nesting = depth(text)
    if nesting > max_depth:
        raise BadJSON(f"{what} nests arrays and objects {nesting:,} deep; at most {max_depth} are read")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadJSON(f"{what} is not valid JSON: {exc}") from exc


def request_json(request: HttpRequest, *, empty: Any = None, **bounds: Any) -> Any:
    """The request's body through :func:`read_json` (its size checked before it is read)."""
    limit = bounds.get("max_bytes", MAX_BYTES)
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > limit:
        raise BadJSON(f"the body is {length:,} bytes of JSON; at most {limit:,} are read")
    return read_json(request.body, empty=empty, **bounds)
