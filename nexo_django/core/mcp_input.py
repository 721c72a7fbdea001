"""What an MCP server asks a person for, read at the edge (protocol 2026-07-28's ``input_required``).

A tool call may answer ``{"resultType": "input_required", "inputRequests": {key: request},
"requestState": "..."}``: the server needs input before it can finish, and the client calls the
same tool again with ``inputResponses`` (by the same keys) and the state, byte for byte.
:func:`read` turns that result into :class:`~nexo_django.core.errors.InputRequired` with an
:class:`Ask` per elicitation request (form mode: a message and a flat object's schema; url mode: a
message and a link the person opens). Everything in it is the server's untrusted input: bounded
here (the number of requests, each message, the schema's size and depth and its fields, the URL,
the state) and refused with the reason (:class:`InputRefused`) rather than stored half; a form field
that asks for a secret is refused, as MCP's specification forbids it. Sampling and roots requests
are refused: a person answers elicitation, nothing else. :func:`responses` builds the SDK's
``ElicitResult`` per key from the answers (accept with its content, decline, cancel).

Plain Python and the ``mcp`` SDK's types: no Django here (the durable layer stores the asks as
questions of the run and answers them through its one answering function).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .errors import InputRequired

#: requests of one result, a message's characters, the state's, a URL's, a schema's JSON bytes and
#: depth, its fields, at most
MAX_REQUESTS = 8
MAX_MESSAGE = 4000
MAX_STATE = 64_000
MAX_URL = 2048
MAX_SCHEMA_BYTES = 32_000
MAX_SCHEMA_DEPTH = 6
MAX_FIELDS = 40
#: rounds of input one call may ask for (a server that asks again and again is stopped)
MAX_ROUNDS = 5
#: the primitive types of MCP's requested schema
PRIMITIVES = ("string", "number", "integer", "boolean")
#: the actions a person's answer takes (MCP's ElicitResult)
ACTIONS = ("accept", "decline", "cancel")
#: words of a field's name that ask for a secret (split at separators and camelCase)
SECRET_WORDS = frozenset({"password", "passwd", "passphrase", "passcode", "pass", "pin", "secret", "token", "otp",
                          "credential", "credentials", "apikey", "privatekey"})
SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"), ("auth", "code")})
_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
#: keywords a validator would act on beyond MCP's primitives: a regex run on every answer (one that
#: backtracks for ever), a reference it would resolve (a fetch, a loop); refused anywhere in the schema
ACTIVE_KEYWORDS = frozenset({"pattern", "patternProperties", "propertyNames", "$ref", "$dynamicRef", "$recursiveRef",
                             "$id", "$anchor", "$dynamicAnchor", "$defs", "definitions"})


class InputRefused(ValueError):
    """What a server asked for cannot be asked (too big, a secret, not elicitation): the reason."""


@dataclass(frozen=True)
class Ask:
    """One elicitation request: ``mode`` "form" (``schema``) or "url" (``url``)."""

    key: str
    mode: str
    message: str
    schema: dict[str, Any] | None = None
    url: str | None = None


@dataclass(frozen=True)
class Answers:
    """The answers to a call's asks (``{key: {"action", "content"?}}``), with the state to echo
    and the round they answer (the tool is called again with them)."""

    answers: dict[str, dict[str, Any]]
    state: str | None
    round: int


def asks_secret(name: str) -> bool:
    """Whether a field named ``name`` asks for a secret (``api_token``, ``apiKey``; not ``max_tokens``)."""
    words = [w.lower() for w in re.split(r"[\W_]+|(?<=[a-z0-9])(?=[A-Z])", name) if w]
    return any(w in SECRET_WORDS for w in words) or any((a, b) in SECRET_PAIRS for a, b in zip(words, words[1:], strict=False))


def _depth(value: Any, limit: int) -> bool:
    """Whether ``value`` nests deeper than ``limit`` (iterative: no recursion on hostile input)."""
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth >= limit:
                return True
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return False


def _active_keyword(schema: dict[str, Any]) -> str | None:
    """The first of :data:`ACTIVE_KEYWORDS` a key of any object in ``schema`` is (iterative)."""
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found = next((k for k in node if k in ACTIVE_KEYWORDS), None)
            if found is not None:
                return str(found)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None


def check_requested(key: str, schema: Any) -> dict[str, Any]:
    """MCP's requested schema: a flat object of primitive (or enum) properties; the reason otherwise."""
    if not isinstance(schema, dict):
        raise InputRefused(f"input {key!r}: the requested schema is not an object")
    if _depth(schema, MAX_SCHEMA_DEPTH):
        raise InputRefused(f"input {key!r}: the requested schema nests more than {MAX_SCHEMA_DEPTH} levels deep")
    size = len(json.dumps(schema, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass"))
    if size > MAX_SCHEMA_BYTES:
        raise InputRefused(f"input {key!r}: the requested schema is {size:,} bytes of JSON, more than {MAX_SCHEMA_BYTES:,}")
    active = _active_keyword(schema)
    if active is not None:
        raise InputRefused(f"input {key!r}: the requested schema uses {active!r}, which MCP's requested schema has "
                           "not (a regex or a reference the validator would run)")
    properties = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(properties, dict) or len(properties) > MAX_FIELDS:
        raise InputRefused(f"input {key!r}: the requested schema is not a flat object of at most {MAX_FIELDS} fields")
    for name, prop in properties.items():
        if not isinstance(prop, dict) or not (prop.get("type") in PRIMITIVES or isinstance(prop.get("enum"), list)
                                              or isinstance(prop.get("oneOf"), list)):
            raise InputRefused(f"input {key!r}: field {name!r} is not a string, number, integer, boolean or enum")
        if prop.get("format") == "password" or asks_secret(str(name)):
            raise InputRefused(f"input {key!r}: field {name!r} asks for a secret (a password, token or key), which "
                               "MCP forbids asking by form")
    return schema


def _text(value: Any, limit: int, what: str) -> str:
    if not isinstance(value, str):
        raise InputRefused(f"{what} is not text")
    if len(value) > limit:
        raise InputRefused(f"{what} is {len(value):,} characters, more than {limit:,}")
    return value


def read(tool: str, result: Any) -> InputRequired:
    """The ``InputRequired`` of an SDK ``InputRequiredResult``; :class:`InputRefused` with the
    reason if any of it cannot be asked."""
    requests = dict(getattr(result, "input_requests", None) or {})
    state = getattr(result, "request_state", None)
    if state is not None:
        _text(state, MAX_STATE, "the server's requestState")
    if len(requests) > MAX_REQUESTS:
        raise InputRefused(f"the server asked for {len(requests)} inputs at once, more than {MAX_REQUESTS}")
    asks: dict[str, Ask] = {}
    for key, request in requests.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise InputRefused(f"an input's key {str(key)[:80]!r} is not 1-64 letters, digits or _.:-")
        if getattr(request, "method", None) != "elicitation/create":
            raise InputRefused(f"input {key!r}: the server asks for {getattr(request, 'method', '?')}; only a "
                               "person's input (elicitation) is answered")
        params = request.params
        message = _text(getattr(params, "message", None), MAX_MESSAGE, f"input {key!r}'s message")
        if getattr(params, "mode", "form") == "url":
            url = _text(getattr(params, "url", None), MAX_URL, f"input {key!r}'s URL")
            if not url.startswith(("https://", "http://")) or any(c.isspace() or ord(c) < 32 for c in url):
                raise InputRefused(f"input {key!r}: the URL to open is not an http(s) URL")
            asks[key] = Ask(key, "url", message, url=url)
        else:
            schema = params.requested_schema
            dumped = schema.model_dump(by_alias=True, exclude_none=True) if hasattr(schema, "model_dump") else schema
            asks[key] = Ask(key, "form", message, schema=check_requested(key, dumped))
    if not asks:
        raise InputRefused("the server asked for input but named no elicitation request")
    return InputRequired(tool, asks, state)


def responses(answers: Answers) -> dict[str, Any]:
    """The SDK's ``inputResponses`` (an ``ElicitResult`` per key) for ``answers``."""
    from mcp.types import ElicitResult

    found: dict[str, Any] = {}
    for key, answer in answers.answers.items():
        action: Any = answer.get("action") if answer.get("action") in ACTIONS else "cancel"
        content = answer.get("content") if action == "accept" and isinstance(answer.get("content"), dict) else None
        found[key] = ElicitResult(action=action, content=content)
    return found
