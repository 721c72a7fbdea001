"""Streamed replies: Server-Sent Events as the providers send them, put back together.

A streamed reply is assembled into the very JSON object the provider answers without streaming
(``choices[0].message`` for Chat Completions, ``content`` blocks for the Messages API), so the
provider's ``from_wire`` reads it as before: the transcript stores the same finished message
whether the reply was streamed or not. The text is handed on as it arrives (``on_text``); it is
never kept apart from the finished message.

A stream is complete only when its end arrived (``[DONE]`` or a ``finish_reason``; Anthropic's
``message_stop``). One cut off midway is an incomplete reply: the request fails like any other
failed model call (retried, then an error), and nothing of it is stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["AnthropicStream", "OpenAIStream", "StreamError", "TextSink", "iter_sse"]

#: ``on_text(attempt, piece)``: a piece of the reply's text, from the ``attempt``-th request
#: (0 first; a retried request starts its text again).
TextSink = Callable[[int, str], None]


class StreamError(Exception):
    """The provider reported an error inside the stream (an ``error`` event): retryable."""


def iter_sse(lines: Iterable[str]) -> Iterator[tuple[str, str]]:
    """``(event, data)`` for each event of a ``text/event-stream`` body given line by line
    (``event`` is ``"message"`` when the event names none; comments are skipped)."""
    event, data = "", list[str]()
    for line in lines:
        if not line:
            if data:
                yield event or "message", "\n".join(data)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
    if data:  # a last event without its blank line: the body ended, the parser decides if complete
        yield event or "message", "\n".join(data)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _decode(data: str) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


class OpenAIStream:
    """Chat Completions chunks (``chat.completion.chunk``) into one ``chat.completion``."""

    def __init__(self, attempt: int, on_text: TextSink | None) -> None:
        self.attempt, self.on_text = attempt, on_text
        self.done = False
        self.finish: str | None = None
        self.text: list[str] = []
        self.refusal: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.extras: dict[str, Any] = {}
        self.usage: dict[str, Any] | None = None
        self.head: dict[str, Any] = {}

    def feed(self, event: str, data: str) -> None:
        if data.strip() == "[DONE]":
            self.done = self.finish is not None
            if not self.done:
                raise StreamError("the stream ended ([DONE]) before the reply said why it finished")
            return
        chunk = _decode(data)
        if not isinstance(chunk, dict):
            return
        if isinstance(chunk.get("error"), dict):
            error = chunk["error"]
            raise StreamError(str(error.get("message") or error))
        self.head = self.head or {k: chunk[k] for k in ("id", "model", "created") if k in chunk}
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            self._delta(_dict(choice.get("delta")))
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])

    def _delta(self, delta: dict[str, Any]) -> None:
        piece = delta.get("content")
        if isinstance(piece, str) and piece:
            self.text.append(piece)
            if self.on_text is not None:
                self.on_text(self.attempt, piece)
        if isinstance(delta.get("refusal"), str):
            self.refusal.append(delta["refusal"])
        details = delta.get("reasoning_details")  # OpenRouter: a list, sent back unchanged
        if isinstance(details, list):
            self.extras.setdefault("reasoning_details", []).extend(details)
        for raw in delta.get("tool_calls") or ():
            if not isinstance(raw, dict):
                continue
            call = self.calls.setdefault(int(raw.get("index") or 0), {"type": "function", "function": {}})
            if raw.get("id"):
                call["id"] = raw["id"]
            if isinstance(raw.get("extra_content"), dict):  # Gemini's thought signature
                call["extra_content"] = raw["extra_content"]
            function = _dict(raw.get("function"))
            if function.get("name"):
                call["function"]["name"] = call["function"].get("name", "") + str(function["name"])
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                call["function"]["arguments"] = call["function"].get("arguments", "") + arguments
            elif isinstance(arguments, dict):  # a server that sends the object whole
                call["function"]["arguments"] = arguments

    def end(self) -> None:
        """The body ended: complete if the reply said why it finished (some servers send no
        ``[DONE]``); otherwise it was cut off."""
        if not self.done and self.finish is None:
            raise StreamError("the stream was cut off midway: the reply never said it finished")
        self.done = True

    def result(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text) if self.text else None}
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        message.update(self.extras)
        answer: dict[str, Any] = {**self.head, "object": "chat.completion",
                                  "choices": [{"index": 0, "message": message, "finish_reason": self.finish}]}
        if self.usage is not None:
            answer["usage"] = self.usage
        return answer


class AnthropicStream:
    """Messages API stream events (``message_start`` ... ``message_stop``) into one message."""

    def __init__(self, attempt: int, on_text: TextSink | None) -> None:
        self.attempt, self.on_text = attempt, on_text
        self.done = False
        self.message: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.json_parts: dict[int, list[str]] = {}

    def feed(self, event: str, data: str) -> None:
        payload = _decode(data)
        if not isinstance(payload, dict):
            return
        kind = payload.get("type") or event
        if kind == "error":
            error = _dict(payload.get("error"))
            raise StreamError(f"{error.get('type') or 'error'}: {error.get('message') or data}")
        if kind == "message_start" and isinstance(payload.get("message"), dict):
            self.message = dict(payload["message"])
            self.message["usage"] = dict(self.message.get("usage") or {})
        elif kind == "content_block_start" and isinstance(payload.get("content_block"), dict):
            self.blocks[int(payload.get("index") or 0)] = dict(payload["content_block"])
        elif kind == "content_block_delta" and isinstance(payload.get("delta"), dict):
            self._delta(int(payload.get("index") or 0), payload["delta"])
        elif kind == "message_delta":
            delta = _dict(payload.get("delta"))
            self.message.update({k: v for k, v in delta.items() if k in ("stop_reason", "stop_sequence")})
            usage = payload.get("usage")
            if isinstance(usage, dict):  # cumulative counts: the last one stands
                self.message.setdefault("usage", {}).update({k: v for k, v in usage.items() if v is not None})
        elif kind == "message_stop":
            self.done = True

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self.blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        if kind == "text_delta" and isinstance(delta.get("text"), str):
            block["text"] = block.get("text", "") + delta["text"]
            if self.on_text is not None and delta["text"]:
                self.on_text(self.attempt, delta["text"])
        elif kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            self.json_parts.setdefault(index, []).append(delta["partial_json"])
        elif kind == "thinking_delta" and isinstance(delta.get("thinking"), str):
            block["thinking"] = block.get("thinking", "") + delta["thinking"]
        elif kind == "signature_delta" and isinstance(delta.get("signature"), str):
            block["signature"] = block.get("signature", "") + delta["signature"]
        elif kind == "citations_delta" and isinstance(delta.get("citation"), dict):
            block.setdefault("citations", []).append(delta["citation"])

    def end(self) -> None:
        if not self.done:
            raise StreamError("the stream was cut off midway: message_stop never came")

    def result(self) -> dict[str, Any]:
        content = []
        for index in sorted(self.blocks):
            block = dict(self.blocks[index])
            if index in self.json_parts:
                text = "".join(self.json_parts[index])
                decoded = _decode(text) if text.strip() else {}
                # Arguments that are not a JSON object reach from_wire as they are: it marks the call.
                block["input"] = decoded if decoded is not None else text
            content.append(block)
        return {**self.message, "content": content}
