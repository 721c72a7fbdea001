"""Agents declared at module level so workers in other processes can import them (scripted models)."""

from __future__ import annotations

from nexo_django import Agent
from nexo_django.testing import ScriptedModel, reply, tool_call


class Scribe(Agent):
    """Scripted: writes notes.txt under approve, then answers."""

    model = ScriptedModel([tool_call("write", path="notes.txt", content="hi"), reply("Done.")])
    sandbox = "local"
    permissions = "approve"


class ParallelScribe(Agent):
    """Scripted: one turn with an ungated read and two gated writes, then an answer."""

    model = ScriptedModel(
        [
            [
                tool_call("glob", pattern="*"),
                tool_call("write", path="a.txt", content="A"),
                tool_call("write", path="b.txt", content="B"),
            ],
            reply("Both handled."),
        ]
    )
    sandbox = "local"
    permissions = "approve"


class ThreeTurns(Agent):
    """Scripted: glob, a gated write, a read, then an answer (three tool turns)."""

    model = ScriptedModel(
        [
            tool_call("glob", pattern="*"),
            tool_call("write", path="out.txt", content="three"),
            tool_call("read", path="out.txt"),
            reply("Finished."),
        ]
    )
    sandbox = "virtual"
    permissions = "approve"
