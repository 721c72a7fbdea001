"""Scripted, streamed agents for the tests of the run's live page (issue 33, item 4): slow enough
that a test sees each status while the text is being written, and reloads a page mid-turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nexo_django import Agent
from nexo_django.errors import ModelError
from nexo_django.testing import ScriptedModel, reply, tool_call

#: What the Narrator says in its first turn (with a write that waits for a person), then its second.
STORY = ("Once upon a time a worker wrote this story one word at a time, slowly, so that a page "
         "far away could show every word the moment it was written, and a reader who came late "
         "would still read it from the start. ")
ENDING = "And the person said yes, and the story ended here, one word at a time, as it began. "
#: Seconds between two words: about three seconds a turn.
WORD = 0.1


class _Held(ScriptedModel):
    """Scripted, streamed: with ``NEXO_TEST_MODEL_GATE`` set (``tests.durable_agents.model_gate``),
    each turn sends HELD_AFTER pieces, then holds the rest until ``open_turn`` opens that turn (at
    most a minute), so that a page looks, reloads or cancels mid-turn however slow the machine;
    a fixed pace raced a loaded one (the text was over before the page came back). Without the
    variable, it streams at its pace."""

    def complete(self, messages: list[dict], tools: list[dict], **kwargs: Any) -> Any:
        import os

        from tests.durable_agents import wait_open

        on_text = kwargs.pop("on_text", None)
        gate = os.environ.get("NEXO_TEST_MODEL_GATE")
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        sent = 0

        def held(index: int, piece: str) -> None:
            nonlocal sent
            sent += 1
            if gate and sent > HELD_AFTER:
                wait_open(f"{gate}.{turn}")
            on_text(index, piece)

        return super().complete(messages, tools, on_text=held if on_text else None, **kwargs)


#: Pieces a held turn sends before it waits for its gate.
HELD_AFTER = 10


def open_turn(gate: Path, turn: int) -> Path:
    """Lets a held model's turn ``turn`` (0 for the first) send the rest of its text."""
    opened = Path(f"{gate}.{turn}")
    opened.touch()
    return opened


class Narrator(Agent):
    """Scripted, streamed: tells STORY and asks to write it (approve mode), then tells ENDING."""

    model = _Held([[reply(STORY), tool_call("write", path="story.txt", content="story")], reply(ENDING)],
                  stream=True, stream_delay=WORD)
    sandbox = "virtual"
    permissions = "approve"


class Rambler(Agent):
    """Scripted, streamed: talks for about six seconds (long enough to be cancelled meanwhile)."""

    model = _Held([reply(STORY * 2)], stream=True, stream_delay=WORD)
    sandbox = "virtual"


class _Dropped(ScriptedModel):
    """Scripted: streams its turn's text, then fails as a provider that drops the connection."""

    def complete(self, messages: list[dict], tools: list[dict], **kwargs: Any) -> Any:
        super().complete(messages, tools, **kwargs)
        raise ModelError("scripted: the provider closed the connection mid-answer")


class Stumbler(Agent):
    """Scripted, streamed: writes STORY, then its provider fails: the run fails."""

    model = _Dropped([reply(STORY)], stream=True, stream_delay=WORD / 2)
    sandbox = "virtual"
