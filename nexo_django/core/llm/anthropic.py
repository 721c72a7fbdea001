"""``anthropic:<model>``: the Messages API with tool use.

Neutral messages become Messages API turns here and nowhere else: system messages go to the
top-level ``system``; consecutive tool results become one user turn of ``tool_result`` blocks.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from ..errors import ConfigurationError
from . import stops
from .base import Completion, Message, assistant, opaque_for
from .http import ProviderError, Retry, endpoint, host_of
from .sse import AnthropicStream, TextSink

__all__ = ["API_VERSION", "AnthropicModel", "DEFAULT_BASE_URL", "OFFICIAL_HOST", "from_wire", "to_wire", "tool_to_wire"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
OFFICIAL_HOST = "api.anthropic.com"
API_VERSION = "2023-06-01"
#: Continuations of a turn the API paused (``stop_reason: "pause_turn"``, server tools) before
#: the turn counts as failed.
MAX_PAUSED_CONTINUATIONS = 8
#: Stop reasons that end a reply before the model finished what it was writing.
CUT_OFF = frozenset({"max_tokens", "model_context_window_exceeded"})
#: Stop reasons of an ordinary end of turn, not recorded in the neutral message.
ORDINARY = frozenset({"end_turn", "tool_use", "stop_sequence", None})


class AnthropicModel:
    """A model behind ``POST {base_url}/v1/messages``.

    ``api_key`` falls back to ``ANTHROPIC_API_KEY`` and ``base_url`` to ``ANTHROPIC_BASE_URL``
    (without ``/v1``). ``max_tokens`` is required by the API on every request.
    """

    provider = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int = 4096,
        timeout: float = 60.0,
        max_retries: int = 3,
        max_retry_wait: float = 60.0,
        client: httpx.Client | None = None,
        headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        anthropic_version: str = API_VERSION,
        sleep: Callable[[float], None] = time.sleep,
        stream: bool = True,
    ) -> None:
        if not model:
            raise ConfigurationError("anthropic: name a model, e.g. 'anthropic:claude-sonnet-4-5'")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ConfigurationError(f"anthropic: max_tokens must be a positive integer, not {max_tokens!r}")
        self.model = model
        self.name = f"anthropic:{model}"
        self.max_tokens = max_tokens
        self.anthropic_version = anthropic_version
        found = endpoint(
            "anthropic",
            env_prefix="ANTHROPIC",
            default_base_url=DEFAULT_BASE_URL,
            official_host=OFFICIAL_HOST,
            base_url=base_url,
            api_key=api_key,
            client=client,
            timeout=timeout,
            retry=Retry(max_retries=max_retries, max_retry_wait=max_retry_wait, sleep=sleep),
        )
        self.base_url, self._api_key, self.http = found.base_url, found.api_key, found.http
        self.headers = dict(headers or {})
        self.extra_body = dict(extra_body or {})
        #: ask for a streamed reply (its text is handed on as it arrives; the reply is the same)
        self.streams = bool(stream)

    def __repr__(self) -> str:
        return f"AnthropicModel({self.model!r}, base_url={self.base_url!r})"

    def complete(
        self, messages: list[Message], tools: list[dict[str, Any]], *, on_text: TextSink | None = None,
    ) -> Completion:
        """The next assistant turn. With ``stream`` on, the reply is streamed and ``on_text``
        gets its text as it arrives; the message returned is the same either way."""
        host = host_of(self.base_url)
        system, turns = to_wire(messages, host)
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "messages": turns}
        if system:
            body["system"] = system
        if tools:
            body["tools"] = [tool_to_wire(t) for t in tools]
        if self.streams:
            body["stream"] = True
        body.update(self.extra_body)
        headers = {"content-type": "application/json", "anthropic-version": self.anthropic_version, **self.headers}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        url = f"{self.base_url}/v1/messages"

        def post(body: dict[str, Any]) -> dict[str, Any]:
            if body.get("stream"):
                return self.http.post_stream(
                    url, headers, body, start=lambda attempt: AnthropicStream(attempt, on_text),
                    permanent=_spend_limit_reached,
                )
            return self.http.post(url, headers, body, permanent=_spend_limit_reached)

        data = post(body)
        # A paused turn (server tools) continues: the paused content goes back as-is, as the
        # last assistant turn, and the continuation's blocks join it in one neutral message.
        blocks: list[Any] = []
        usage: dict[str, Any] = {}
        for _ in range(MAX_PAUSED_CONTINUATIONS):
            if data.get("stop_reason") != "pause_turn" or not isinstance(data.get("content"), list):
                break
            blocks.extend(data["content"])
            _add_usage(usage, data.get("usage"))
            body = {**body, "messages": [*turns, {"role": "assistant", "content": list(blocks)}]}
            data = post(body)
        else:
            if data.get("stop_reason") == "pause_turn":
                raise ProviderError(
                    "anthropic", f"the turn was still paused after {MAX_PAUSED_CONTINUATIONS} continuations"
                )
        if blocks and isinstance(data.get("content"), list):
            _add_usage(usage, data.get("usage"))
            data = {**data, "content": [*blocks, *data["content"]], "usage": usage}
        return from_wire(data, host, max_tokens_setting="max_tokens")


def _add_usage(total: dict[str, Any], usage: Any) -> None:
    for key, value in (usage if isinstance(usage, dict) else {}).items():
        if isinstance(value, int) and not isinstance(value, bool):
            total[key] = int(total.get(key) or 0) + value


def _spend_limit_reached(payload: Any) -> bool:
    # A 429 for a spent monthly limit does not clear by waiting.
    error = payload.get("error") if isinstance(payload, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    return isinstance(details, dict) and details.get("error_code") == "enforced_spend_limit_reached"


def tool_to_wire(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": spec["name"],
        "description": spec.get("description") or "",
        "input_schema": spec.get("parameters") or {"type": "object", "properties": {}},
    }


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def to_wire(messages: list[Message], host: str = "") -> tuple[str, list[dict[str, Any]]]:
    """Neutral messages → (``system``, Messages API turns). Unknown keys are dropped; the opaque
    blocks of an assistant turn (thinking, redacted thinking, server tools) go back unchanged and
    in their place when they came from Anthropic at ``host``."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []

    def push(role: str, blocks: list[dict[str, Any]]) -> None:
        # The API wants alternating turns; tool results and a following user text share one turn.
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})

    for message in messages:
        role = message.get("role")
        content = message.get("content")
        if role == "system":
            if content:
                system.append(_text(content))
        elif role == "user":
            push("user", [{"type": "text", "text": _text(content if content is not None else "")}])
        elif role == "assistant":
            opaque = opaque_for(message, "anthropic", host)
            blocks = _assistant_blocks(message, opaque["content"] if opaque else None)
            if blocks:
                push("assistant", blocks)
        elif role == "tool":
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message["tool_call_id"],
                "content": _text(content),
            }
            if isinstance(content, dict) and "error" in content:
                block["is_error"] = True
            push("user", [block])
        else:
            raise ProviderError("anthropic", f"cannot send a message with role {role!r}")
    return "\n\n".join(system), turns


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call["id"], "name": call["name"], "input": call.get("args") or {}}


def _assistant_blocks(message: Message, layout: Any) -> list[dict[str, Any]]:
    """The content blocks of one assistant turn. With the ``layout`` kept from the response,
    every block is put back where it was: opaque blocks verbatim, text and tool calls from the
    neutral message (tool call ids may have been made unique by the loop)."""
    content = message.get("content")
    text = _text(content) if content else ""
    calls = list(message.get("tool_calls") or [])
    if not isinstance(layout, list):
        blocks: list[dict[str, Any]] = []
        if text:  # the API rejects empty text blocks
            blocks.append({"type": "text", "text": text})
        blocks.extend(_tool_use(call) for call in calls)
        return blocks
    pieces = [item.get("chars") for item in layout if isinstance(item, dict) and item.get("neutral") == "text"]
    # The text is split as the response had it; if it no longer adds up, it goes in one block.
    counts = [n for n in pieces if isinstance(n, int) and n >= 0]
    exact = len(counts) == len(pieces) and sum(counts) == len(text)
    blocks, at, text_left, calls_left = [], 0, text, iter(calls)
    for item in layout:
        if not isinstance(item, dict):
            continue
        if item.get("neutral") == "text":
            if exact:
                piece, at = text[at : at + item["chars"]], at + item["chars"]
            else:
                piece, text_left = text_left, ""
            if piece:
                blocks.append({"type": "text", "text": piece})
        elif item.get("neutral") == "tool_use":
            call = next(calls_left, None)
            if call is not None:
                blocks.append(_tool_use(call))
        elif isinstance(item.get("block"), dict):
            blocks.append(item["block"])
    if not exact and text_left:
        blocks.append({"type": "text", "text": text_left})
    blocks.extend(_tool_use(call) for call in calls_left)
    return blocks


def _call_from_wire(block: dict[str, Any]) -> dict[str, Any]:
    name = block.get("name")
    call: dict[str, Any] = {"id": str(block.get("id") or ""), "name": name if isinstance(name, str) else "", "args": {}}
    arguments = block.get("input")
    if isinstance(arguments, dict):
        call["args"] = arguments
    elif arguments is not None:
        call["error"] = f"invalid JSON arguments: expected an object, got {type(arguments).__name__}"
    if not call["name"]:
        call["error"] = "the tool_use block names no tool"
    return call


def from_wire(data: dict[str, Any], host: str = "", *, max_tokens_setting: str = "max_tokens") -> Completion:
    blocks = data.get("content")
    if not isinstance(blocks, list):
        raise ProviderError("anthropic", f"the response has no content blocks: {json.dumps(data)[:300]}")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    # Where each block was: opaque blocks (thinking, redacted_thinking, server tools) are kept
    # verbatim, text and tool_use by reference to the neutral message, so the turn can be sent
    # back exactly, in its order, without storing its text and arguments twice.
    layout: list[dict[str, Any]] = []
    for block in blocks:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
            layout.append({"neutral": "text", "chars": len(block["text"])})
        elif block.get("type") == "tool_use":
            call = _call_from_wire(block)
            if not call["id"]:
                # Unique: an id names one call of a run, and its decision with it.
                call["id"] = f"toolu_missing_{uuid.uuid4().hex[:24]}"
            calls.append(call)
            layout.append({"neutral": "tool_use"})
        elif isinstance(block.get("type"), str):
            layout.append({"block": block})
    content = "".join(texts) if texts else None
    stop = data.get("stop_reason")
    reason = f'stop_reason "{stop}"'
    if stop in CUT_OFF:
        stops.mark_calls(calls, stops.cut_off_call(reason))
        if not content and not calls:
            raise stops.cut_off_empty("anthropic", reason, max_tokens_setting)
    elif stop == "refusal":
        stops.mark_calls(calls, stops.refused_call(reason))
        if not content:
            content = stops.refusal_text(reason)
    raw_usage = data.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    # input_tokens excludes prompt-cache reads and writes; count them, as OpenAI's prompt_tokens does.
    input_tokens = sum(
        int(usage.get(key) or 0)
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    message = assistant(content, calls)
    if stop not in ORDINARY:
        message["stop_reason"] = str(stop)
    if any("block" in item for item in layout):
        message["opaque"] = {"provider": "anthropic", "host": host, "content": layout}
    return Completion(
        message=message,
        usage={"input_tokens": input_tokens, "output_tokens": int(usage.get("output_tokens") or 0)},
    )
