"""``openai:<model>``: the Chat Completions API with tools, on any OpenAI-compatible server
(OpenAI, Ollama, vLLM, llama.cpp server, LM Studio, OpenRouter).

Neutral messages become Chat Completions messages here and nowhere else.
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
from .sse import OpenAIStream, TextSink

__all__ = ["DEFAULT_BASE_URL", "OFFICIAL_HOST", "OpenAIModel", "from_wire", "to_wire", "tool_to_wire"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
OFFICIAL_HOST = "api.openai.com"
#: Fields of an assistant message that a server wants back unchanged (OpenRouter's reasoning).
OPAQUE_MESSAGE_FIELDS = ("reasoning_details",)
#: Fields of a tool call that a server wants back unchanged (Gemini's thought signature is in
#: ``extra_content.google.thought_signature``).
OPAQUE_CALL_FIELDS = ("extra_content",)


class OpenAIModel:
    """A model behind ``POST {base_url}/chat/completions``.

    ``api_key`` falls back to ``OPENAI_API_KEY`` and ``base_url`` to ``OPENAI_BASE_URL``. A key is
    required for api.openai.com only; local servers (Ollama, vLLM, llama.cpp) usually need none.
    ``extra_body`` is merged into every request (``temperature``, ``max_completion_tokens``...);
    ``headers`` are sent as well (OpenRouter's ``HTTP-Referer``, an organization header...).
    """

    provider = "openai"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        max_retry_wait: float = 60.0,
        client: httpx.Client | None = None,
        headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        stream: bool = True,
    ) -> None:
        if not model:
            raise ConfigurationError("openai: name a model, e.g. 'openai:gpt-4.1-mini'")
        self.model = model
        self.name = f"openai:{model}"
        found = endpoint(
            "openai",
            env_prefix="OPENAI",
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
        return f"OpenAIModel({self.model!r}, base_url={self.base_url!r})"

    def complete(
        self, messages: list[Message], tools: list[dict[str, Any]], *, on_text: TextSink | None = None,
    ) -> Completion:
        """The next assistant turn. With ``stream`` on, the reply is streamed and ``on_text``
        gets its text as it arrives; the message returned is the same either way."""
        host = host_of(self.base_url)
        body: dict[str, Any] = {"model": self.model, "messages": to_wire(messages, host)}
        if tools:  # OpenAI rejects an empty "tools" array
            body["tools"] = [tool_to_wire(t) for t in tools]
        if self.streams:  # usage comes in a last chunk only when asked for
            body.update({"stream": True, "stream_options": {"include_usage": True}})
        body.update(self.extra_body)
        headers = {"content-type": "application/json", **self.headers}
        if self._api_key:
            headers["authorization"] = f"Bearer {self._api_key}"
        url = f"{self.base_url}/chat/completions"
        if body.get("stream"):
            data = self.http.post_stream(
                url, headers, body, start=lambda attempt: OpenAIStream(attempt, on_text), permanent=_quota_spent,
            )
        else:
            data = self.http.post(url, headers, body, permanent=_quota_spent)
        return from_wire(data, host)


def _quota_spent(payload: Any) -> bool:
    # A 429 for a spent balance does not clear by waiting.
    error = payload.get("error") if isinstance(payload, dict) else None
    return isinstance(error, dict) and error.get("code") == "insufficient_quota"


def _dumps(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def tool_to_wire(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec["name"],
            "description": spec.get("description") or "",
            "parameters": spec.get("parameters") or {"type": "object", "properties": {}},
        },
    }


def to_wire(messages: list[Message], host: str = "") -> list[dict[str, Any]]:
    """Neutral messages → Chat Completions messages. Unknown keys (``usage``...) are dropped; the
    opaque fields of an assistant message and of its tool calls go back unchanged when they came
    from this same server (``host``)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role in ("system", "user"):
            out.append({"role": role, "content": message.get("content") or ""})
        elif role == "assistant":
            calls = message.get("tool_calls") or []
            wire: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
            opaque = opaque_for(message, "openai", host) or {}
            found_extras, found_calls = opaque.get("message"), opaque.get("tool_calls")
            extras: dict[str, Any] = found_extras if isinstance(found_extras, dict) else {}
            call_extras: list[Any] = found_calls if isinstance(found_calls, list) else []
            wire.update({k: v for k, v in extras.items() if k in OPAQUE_MESSAGE_FIELDS})
            if calls:
                wire["tool_calls"] = []
                for index, call in enumerate(calls):
                    wire_call = {
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["name"], "arguments": _dumps(call.get("args") or {})},
                    }
                    extra = call_extras[index] if index < len(call_extras) else None
                    if isinstance(extra, dict):
                        wire_call.update({k: v for k, v in extra.items() if k in OPAQUE_CALL_FIELDS})
                    wire["tool_calls"].append(wire_call)
            elif wire["content"] is None:
                wire["content"] = ""  # content may be null only beside tool calls
            out.append(wire)
        elif role == "tool":
            out.append(
                {"role": "tool", "tool_call_id": message["tool_call_id"], "content": _dumps(message.get("content"))}
            )
        else:
            raise ProviderError("openai", f"cannot send a message with role {role!r}")
    return out


def _call_from_wire(index: int, raw: Any) -> dict[str, Any]:
    raw = raw if isinstance(raw, dict) else {}
    function = raw.get("function") if isinstance(raw.get("function"), dict) else {}
    name = function.get("name")
    # Some compatible servers omit the id; the loop needs one to pair the result.
    call: dict[str, Any] = {
        "id": str(raw.get("id") or f"call_{index}_{uuid.uuid4().hex[:16]}"),
        "name": name if isinstance(name, str) else "",
        "args": {},
    }
    arguments = function.get("arguments")
    if isinstance(arguments, dict):  # Ollama-style servers send an object, not a string
        call["args"] = arguments
    elif arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        pass  # a tool without parameters
    elif isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except json.JSONDecodeError as exc:
            call["error"] = f"invalid JSON arguments: {exc.msg} at character {exc.pos}; send one JSON object"
        else:
            if isinstance(decoded, dict):
                call["args"] = decoded
            else:
                call["error"] = f"invalid JSON arguments: expected an object, got {type(decoded).__name__}"
    else:
        call["error"] = f"invalid JSON arguments: expected a JSON string, got {type(arguments).__name__}"
    if not call["name"]:
        call["error"] = "the tool call names no function"
    return call


def from_wire(data: dict[str, Any], host: str = "") -> Completion:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ProviderError("openai", f"the response has no choices: {json.dumps(data)[:300]}")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise ProviderError("openai", "the response's first choice has no message")
    finish = choices[0].get("finish_reason")
    reason = f'finish_reason "{finish}"'
    content = message.get("content")
    refused = content is None and bool(message.get("refusal"))
    if refused:
        content = message["refusal"]
    if content is not None and not isinstance(content, str):
        content = _dumps(content)
    found_calls = message.get("tool_calls")
    raw_calls: list[Any] = found_calls if isinstance(found_calls, list) else []
    calls = [_call_from_wire(i, raw) for i, raw in enumerate(raw_calls)]
    if finish == "length":
        stops.mark_calls(calls, stops.cut_off_call(reason))
        if not content and not calls:
            raise stops.cut_off_empty("openai", reason, 'max_completion_tokens (extra_body) or the server\'s limit')
    elif finish == "content_filter":
        # A filtered reply may have lost the end of a call as well.
        stops.mark_calls(calls, f"not run: the provider's content filter stopped the reply ({reason})")
        if not content and not calls:
            raise stops.filtered_empty("openai", reason)
    raw_usage = data.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    neutral = assistant(content, calls)
    if refused:
        neutral["stop_reason"] = "refusal"
    elif finish not in (None, "stop", "tool_calls", "function_call"):
        neutral["stop_reason"] = str(finish)
    kept = {k: message[k] for k in OPAQUE_MESSAGE_FIELDS if message.get(k) is not None}
    kept_calls = [
        {k: raw[k] for k in OPAQUE_CALL_FIELDS if isinstance(raw, dict) and raw.get(k) is not None}
        for raw in raw_calls
    ]
    if kept or any(kept_calls):
        opaque: dict[str, Any] = {"provider": "openai", "host": host}
        if kept:
            opaque["message"] = kept
        if any(kept_calls):
            opaque["tool_calls"] = kept_calls
        neutral["opaque"] = opaque
    return Completion(
        message=neutral,
        usage={
            "input_tokens": int(usage.get("prompt_tokens") or 0),
            "output_tokens": int(usage.get("completion_tokens") or 0),
        },
    )
