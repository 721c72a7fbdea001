"""Helpers for tests: a scripted model that plays canned replies instead of a real provider.

Everything here is scripted: no model service is called.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable
from typing import Any

from .core.errors import ModelError
from .core.llm.base import Completion, Message


def _copied(value: Any) -> Any:
    """A deep copy of JSON-shaped data (dicts, lists, scalars), several times cheaper than
    ``copy.deepcopy``; anything else is deep-copied."""
    kind = type(value)
    if kind is dict:
        return {k: _copied(v) for k, v in value.items()}
    if kind is list:
        return [_copied(v) for v in value]
    if kind in (str, int, float, bool) or value is None:
        return value
    return copy.deepcopy(value)


def tool_call(name: str, /, **args: Any) -> dict[str, Any]:
    """One scripted tool call. ``id`` is given by the turn it is played in."""
    return {"type": "tool_call", "name": name, "args": args}


def reply(content: str) -> dict[str, Any]:
    """A scripted final answer (or text that accompanies tool calls in a list)."""
    return {"type": "reply", "content": content}


class ScriptedModel:
    """A deterministic, scripted stand-in for a model.

    Each script entry is one assistant turn: a ``tool_call(...)``, a ``reply(...)``, or a list of
    them (parallel calls, with an optional text). The entry played is chosen by how many assistant
    turns the transcript it is sent already holds, so a run resumed in another process continues
    the same script. Call ids are ``call_<turn>_<index>``; ``call_ids`` changes that pattern (a
    ``str.format`` string with ``{turn}`` and ``{index}``), e.g. ``"toolu_{index}"`` to replay a
    model that reuses ids across turns.
    """

    is_scripted = True

    def __init__(
        self, script: list[Any], *, name: str = "scripted", call_ids: str = "call_{turn}_{index}",
        stream: bool = False, stream_delay: float = 0.0,
    ) -> None:
        """With ``stream`` the model streams as a provider does: a reply's text is handed to
        ``on_text`` word by word (``stream_delay`` seconds apart), then the whole turn returns."""
        self.script = list(script)
        self.call_ids = call_ids
        self.name = name
        self.streams = stream
        self.stream_delay = stream_delay
        self.requests: list[dict[str, Any]] = []

    def __repr__(self) -> str:
        return f"ScriptedModel({len(self.script)} scripted turns)"

    def __str__(self) -> str:
        return f"scripted model ({len(self.script)} turns)"

    def complete(
        self, messages: list[Message], tools: list[dict[str, Any]], *, on_text: Callable[[int, str], None] | None = None,
    ) -> Completion:
        self.requests.append({"messages": _copied(messages), "tools": [t["name"] for t in tools]})
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if turn >= len(self.script):
            raise ModelError(
                f"the scripted model has {len(self.script)} turns and was asked for turn {turn + 1}"
            )
        entry = self.script[turn]
        items = entry if isinstance(entry, list) else [entry]
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for item in items:
            if item.get("type") == "reply":
                texts.append(item["content"])
            elif item.get("type") == "tool_call":
                calls.append(
                    {"id": self.call_ids.format(turn=turn, index=len(calls)), "name": item["name"], "args": _copied(item["args"])}
                )
            else:
                raise ModelError(f"scripted turn {turn + 1}: use reply(...) or tool_call(...), got {item!r}")
        message: Message = {"role": "assistant", "content": "\n".join(texts) if texts else None}
        if on_text is not None and message["content"]:
            for piece in re.findall(r"\S+\s*|\s+", message["content"]):
                on_text(0, piece)
                if self.stream_delay:
                    time.sleep(self.stream_delay)
        if calls:
            message["tool_calls"] = calls
        # Scripted usage: deterministic and cheap (one "token" a message in, one a call or text out).
        usage = {"input_tokens": len(messages), "output_tokens": len(calls) + len(texts)}
        return Completion(message=message, usage=usage)
