"""Step 2b: a workflow. Several steps, with an agent and a person inside, durable like one run.

``PublishNotes`` gathers the facts of a version (a checkpoint: run once, its result stored), has
the Scribe draft and publish the notes (its publish waits for a person in the admin inbox, and the
whole workflow waits with it), asks a person where to announce them (a question in the inbox, a
form built from its schema), then records the announcement (a checkpoint). See docs/workflows.md.
"""

from __future__ import annotations

from typing import Any

from example_project.notes.agents import SCRIBE_PROMPT, Scribe
from nexo_django import Workflow

CHANNELS = ["blog", "mail", "nowhere"]


def gather_facts(version: str) -> list[str]:
    """What goes into the notes (a real project would read its changelog or tracker here)."""
    return [f"version {version}", "agents run in a sandbox", "gated calls wait in the admin inbox"]


def announce(channel: str, version: str) -> dict[str, str]:
    """Where the notes were announced (a real project would post them here, idempotently: a crash
    before this step's result is stored runs it again)."""
    return {"channel": channel, "text": f"Release notes for {version} are out."}


class PublishNotes(Workflow):
    """Facts, the Scribe's notes (publishing waits for a person), a person's choice, the announcement."""

    sandbox = "local"  # the Scribe acts in the workflow's folder (the cwd given to run/run_later)

    def call(self, payload: Any) -> Any:
        version = str(payload.get("version", "1.0"))
        facts = self.checkpoint("facts", gather_facts, version)
        # model=None plays the Scribe's scripted story; a 'provider:model' string calls a provider.
        notes = self.run_agent(Scribe, f"{SCRIBE_PROMPT} Facts: {', '.join(facts)}.", model=payload.get("model"))
        channel = self.ask("channel", "Where should the release notes be announced?",
                           schema={"type": "string", "enum": CHANNELS})
        announcement = self.checkpoint("announce", announce, channel, version)
        return {"notes": notes, "announced": announcement}
