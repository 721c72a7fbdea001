"""Agents and a workflow that schedules start in tests, at module level so that workers in other
processes import them (scripted models)."""

from __future__ import annotations

from typing import Any

from nexo_django import Agent, Workflow
from nexo_django.testing import ScriptedModel, reply, tool_call


class Nightly(Agent):
    """Scripted: answers at once (every run starts a fresh transcript, so every run answers)."""

    model = ScriptedModel([reply("(scripted) triaged.")])


class Breaks(Agent):
    """Scripted with nothing to play: every run fails (ModelError)."""

    model = ScriptedModel([])


class Asks(Agent):
    """Scripted: a write under approve, so every run waits for a person."""

    model = ScriptedModel([tool_call("write", path="report.txt", content="weekly"), reply("Filed.")])
    permissions = "approve"


class Tally(Workflow):
    def call(self, payload: Any) -> Any:
        return {"counted": payload}


NOT_A_CLASS = "a string"


class Unbuildable(Agent):
    """Its constructor fails: the run cannot even be built."""

    model = ScriptedModel([reply("never")])

    def __init__(self, **kwargs: Any) -> None:
        raise RuntimeError("the agent's own setup failed")
