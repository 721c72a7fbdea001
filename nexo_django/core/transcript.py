"""The transcript's bookkeeping the loop and the durable journal share: call ids made unique, the
calls of the last turn without a result, the tokens spent (re-exported by :mod:`.agent`)."""

from __future__ import annotations

import re
import uuid
from typing import Any

from .llm.base import Message

_UNSAFE_ID = re.compile(r"[^a-zA-Z0-9_-]")


def unique_call_ids(message: Message, used: set[str]) -> Message:
    """``message`` with every tool call id that ``used`` (or an earlier call of the same turn)
    holds already, or that is empty, renamed: a decision belongs to one call, so a model reusing
    an id must not inherit another call's approval. New ids match ``^[a-zA-Z0-9_-]+$``, which
    Anthropic requires of ids sent back to it."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    seen = set(used)
    renamed: list[dict[str, Any]] = []
    for call in calls:
        call_id = str(call.get("id") or "")
        if not call_id or call_id in seen:
            base = _UNSAFE_ID.sub("_", call_id)[:64] or "call"
            call = {**call, "id": f"{base}_{uuid.uuid4().hex[:12]}"}
        seen.add(call["id"])
        renamed.append(call)
    return {**message, "tool_calls": renamed}


def open_calls(messages: list[Message]) -> list[dict[str, Any]]:
    """Tool calls of the last assistant turn that have no result yet, in order."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") == "assistant":
            done = {m["tool_call_id"] for m in messages[index + 1 :] if m.get("role") == "tool"}
            return [c for c in message.get("tool_calls") or () if c["id"] not in done]
    return []


def tokens_spent(messages: list[Message]) -> int:
    """Input and output tokens of every model turn in the transcript (each reply keeps its usage)."""
    total = 0
    for m in messages:
        usage = m.get("usage") if m.get("role") == "assistant" else None
        if isinstance(usage, dict):
            total += sum(v for k, v in usage.items() if k in ("input_tokens", "output_tokens") and isinstance(v, int))
    return total
