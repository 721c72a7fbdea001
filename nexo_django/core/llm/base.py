"""The provider-neutral message format and the model protocol.

Messages inside the loop (converted to a provider's wire format at its edge only)::

    {"role": "system", "content": str}
    {"role": "user", "content": str}
    {"role": "assistant", "content": str | None,
     "tool_calls": [{"id": str, "name": str, "args": dict, "error"?: str}], "usage"?: {...}}
    {"role": "tool", "tool_call_id": str, "name": str, "content": dict}

A tool call carries ``"error"`` when the provider could not parse it (bad JSON arguments): the
loop returns that error to the model instead of running anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["Completion", "Message", "Model", "add_usage", "assistant"]

Message = dict[str, Any]


@dataclass
class Completion:
    message: Message  # an assistant message
    usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 0, "output_tokens": 0})


@runtime_checkable
class Model(Protocol):
    """Anything with ``complete(messages, tools) -> Completion``; ``tools`` are tool specs
    (``{"name", "description", "parameters"}``)."""

    def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> Completion: ...


def assistant(content: str | None, tool_calls: list[dict[str, Any]] | None = None) -> Message:
    message: Message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def add_usage(total: dict[str, int], usage: dict[str, int] | None) -> dict[str, int]:
    for key, value in (usage or {}).items():
        total[key] = total.get(key, 0) + int(value)
    return total
