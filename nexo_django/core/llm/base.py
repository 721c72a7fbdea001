"""The provider-neutral message format and the model protocol.

Messages inside the loop (converted to a provider's wire format at its edge only)::

    {"role": "system", "content": str}
    {"role": "user", "content": str}
    {"role": "assistant", "content": str | None,
     "tool_calls": [{"id": str, "name": str, "args": dict, "error"?: str}], "usage"?: {...},
     "stop_reason"?: str, "opaque"?: {"provider": str, "host": str, ...}}
    {"role": "tool", "tool_call_id": str, "name": str, "content": dict}

A tool call carries ``"error"`` when the provider could not parse it (bad JSON arguments) or when
the reply was cut off before the call was complete: the loop returns that error to the model
instead of running anything.

``"opaque"`` holds what a provider sent that the neutral format does not carry and that it wants
back unchanged (Anthropic thinking blocks and their signatures, Gemini's thought signatures,
OpenRouter's ``reasoning_details``). It is tagged with the provider and the host that sent it, and
a provider sends it back only to that same provider and host (:func:`opaque_for`); any other
provider ignores it. ``"stop_reason"`` is the provider's own word for why the reply ended, kept
when it is not the ordinary end of a turn.
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


def opaque_for(message: Message, provider: str, host: str) -> dict[str, Any] | None:
    """The opaque parts of ``message`` if they came from ``provider`` at ``host``, else ``None``:
    a signature is only valid where it was made."""
    opaque = message.get("opaque")
    if isinstance(opaque, dict) and opaque.get("provider") == provider and opaque.get("host") == host:
        return opaque
    return None


def add_usage(total: dict[str, int], usage: dict[str, int] | None) -> dict[str, int]:
    for key, value in (usage or {}).items():
        total[key] = total.get(key, 0) + int(value)
    return total
