"""Workflows declared at module level so workers in other processes can import them (the agents
inside use scripted models). Their step functions append to the file named by NEXO_TEST_COUNTER,
so a test counts calls across processes."""

from __future__ import annotations

import os
from typing import Any

from nexo_django import Agent, Workflow
from nexo_django.testing import ScriptedModel, reply, tool_call


def _count(name: str) -> None:
    path = os.environ.get("NEXO_TEST_COUNTER")
    if path:
        with open(path, "a") as f:
            f.write(name + "\n")


def collect_notes(version: str) -> list[str]:
    _count("collect")
    return [f"{version}: faster runs", f"{version}: workflows"]


def publish(draft: str, channel: str) -> dict[str, str]:
    _count("publish:" + channel)
    return {"draft": draft, "channel": channel}


class Drafter(Agent):
    """Scripted: a gated write of the draft (in the workflow's files), then its answer."""

    model = ScriptedModel([tool_call("write", path="notes.md", content="# Notes\n"), reply("Drafted.")])
    permissions = "approve"


class Release(Workflow):
    """The issue's example: a checkpoint, an agent, a person's choice, a checkpoint."""

    def call(self, payload: Any) -> Any:
        notes = self.checkpoint("collect", collect_notes, payload["version"])
        draft = self.run_agent(Drafter, f"Draft release notes from: {notes}")
        choice = self.ask("channel", "Where should this go?", schema={"type": "string", "enum": ["blog", "mail"]})
        self.checkpoint("publish", publish, draft, choice)
        return {"published_to": choice, "files": sorted(self.checkpoint("files", self.files))}

    def files(self) -> list[str]:
        return sorted(getattr(self.workspace, "files", {}))  # the virtual sandbox's files


class Ask(Workflow):
    """A checkpoint, then one question (no agent): the cheapest workflow that waits for a person."""

    def call(self, payload: Any) -> Any:
        notes = self.checkpoint("collect", collect_notes, payload.get("version", "1.0"))
        choice = self.ask("channel", "Where should this go?", schema={"type": "string", "enum": ["blog", "mail"]})
        self.checkpoint("publish", publish, str(notes), choice)
        return {"published_to": choice}


class Twice(Workflow):
    def call(self, payload: Any) -> Any:
        self.checkpoint("same", collect_notes, "1")
        self.checkpoint("same", collect_notes, "2")


#: what Evolving's code looks like now (a test changes it while a run waits)
EVOLVING = {"first": "collect"}


class Evolving(Workflow):
    def call(self, payload: Any) -> Any:
        self.checkpoint(EVOLVING["first"], collect_notes, "1")
        return self.ask("ok", "Go on?")


class Failing(Workflow):
    def call(self, payload: Any) -> Any:
        self.checkpoint("collect", collect_notes, "1")
        raise ValueError("no release today")


#: a flat object's schema, as people ask (and MCP's elicitation allows): a form, not a JSON box
TICKET_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "title": "Title", "description": "One line", "maxLength": 80},
        "priority": {"type": "integer", "title": "Priority", "minimum": 1, "maximum": 5, "default": 3},
        "due": {"type": "string", "format": "date", "title": "Due"},
        "notify": {"type": "boolean", "title": "Tell the team"},
    },
    "required": ["title", "priority"],
}


class Ticket(Workflow):
    """One question whose answer is a flat object: the admin's form, Slack's modal."""

    def call(self, payload: Any) -> Any:
        return self.ask("ticket", "File the ticket", schema=TICKET_SCHEMA)
