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
from .base import Completion, Message, assistant
from .http import ProviderError, Retry, endpoint

__all__ = ["API_VERSION", "AnthropicModel", "DEFAULT_BASE_URL", "OFFICIAL_HOST", "from_wire", "to_wire", "tool_to_wire"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
OFFICIAL_HOST = "api.anthropic.com"
API_VERSION = "2023-06-01"


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

    def __repr__(self) -> str:
        return f"AnthropicModel({self.model!r}, base_url={self.base_url!r})"

    def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> Completion:
        system, turns = to_wire(messages)
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "messages": turns}
        if system:
            body["system"] = system
        if tools:
            body["tools"] = [tool_to_wire(t) for t in tools]
        body.update(self.extra_body)
        headers = {"content-type": "application/json", "anthropic-version": self.anthropic_version, **self.headers}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        data = self.http.post(f"{self.base_url}/v1/messages", headers, body, permanent=_spend_limit_reached)
        return from_wire(data)


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


def to_wire(messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """Neutral messages → (``system``, Messages API turns). Unknown keys are dropped."""
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
            blocks: list[dict[str, Any]] = []
            if content:  # the API rejects empty text blocks
                blocks.append({"type": "text", "text": _text(content)})
            for call in message.get("tool_calls") or []:
                blocks.append({"type": "tool_use", "id": call["id"], "name": call["name"], "input": call.get("args") or {}})
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


def from_wire(data: dict[str, Any]) -> Completion:
    blocks = data.get("content")
    if not isinstance(blocks, list):
        raise ProviderError("anthropic", f"the response has no content blocks: {json.dumps(data)[:300]}")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            call = _call_from_wire(block)
            if not call["id"]:
                # Unique: an id names one call of a run, and its decision with it.
                call["id"] = f"toolu_missing_{uuid.uuid4().hex[:24]}"
            calls.append(call)
        # thinking, redacted_thinking and server-tool blocks are not part of the neutral format
    raw_usage = data.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    # input_tokens excludes prompt-cache reads and writes; count them, as OpenAI's prompt_tokens does.
    input_tokens = sum(
        int(usage.get(key) or 0)
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    return Completion(
        message=assistant("".join(texts) if texts else None, calls),
        usage={"input_tokens": input_tokens, "output_tokens": int(usage.get("output_tokens") or 0)},
    )
