"""Step 2: declare the agents.

``Scribe`` drafts notes freely and waits for a person before it publishes: under the
``approve`` mode, ``approve_when`` lets writes outside ``published/`` pass and sends every
other gated call (a write into ``published/``, a shell command) to the admin inbox.
``Reviewer`` only reads.

Both play a scripted story unless a run is started with ``model="provider:name"`` (the
example's views and ``nexo_demo --live`` pass ``NEXO_MODEL``): the scripted model calls no
provider, and its answers say that they are scripted.
"""

from __future__ import annotations

from typing import Any

from nexo_django import Agent, Permissions
from nexo_django.testing import ScriptedModel, reply, tool_call

#: The folder where writes wait for a person.
PROTECTED_FOLDER = "published"

SCRIBE_PROMPT = (
    "Write short release notes for version 1.0 of the example: draft them in drafts/notes.md, "
    "then publish the final version to published/notes.md."
)
REVIEW_PROMPT = "Review published/notes.md and say in one sentence whether it is ready."

NOTES = """# Release notes, version 1.0

- Agents run in a sandbox: a workspace folder, or in memory.
- Gated calls wait in the admin inbox until a person decides them.
- An approved run resumes exactly where it stopped.
"""


def needs_a_person(capability: str, detail: Any) -> bool:
    """The ``approve_when`` predicate: True sends the call to the inbox.

    The gate hands a write its normalised path rooted at "/" (``/published/notes.md``). Fails
    closed: only a write whose path lies outside the protected folder passes.
    """
    if capability != "write" or not isinstance(detail, str) or not detail.startswith("/"):
        return True
    top = detail.split("/", 2)[1]
    # casefold: "Published/" is the same folder on a case-insensitive file system.
    return top.casefold() == PROTECTED_FOLDER


class Scribe(Agent):
    """Drafts notes, and publishes them once a person approves."""

    # The scripted story: look, draft (passes), publish (waits for a person), answer.
    model = ScriptedModel(
        [
            # Read first: a write replaces only a file it has read (the reads fail harmlessly
            # when the files do not exist yet).
            [tool_call("read", path="drafts/notes.md"), tool_call("read", path="published/notes.md")],
            tool_call("write", path="drafts/notes.md", content=NOTES),
            tool_call("write", path="published/notes.md", content=NOTES),
            reply("(scripted model) Drafted drafts/notes.md and published published/notes.md."),
        ],
        name="scripted Scribe story",
    )
    sandbox = "local"
    permissions = Permissions("approve", approve_when=needs_a_person)
    instructions = (
        "You write notes in the workspace. Draft in drafts/, then publish the final version to "
        f"{PROTECTED_FOLDER}/: a person approves every write there. Read a file before you replace "
        "it. Answer in one or two sentences."
    )


class Reviewer(Agent):
    """Reads the workspace and gives an opinion; it can write nothing."""

    model = ScriptedModel(
        [
            tool_call("read", path="published/notes.md"),
            reply("(scripted model) published/notes.md is short, clear and ready."),
        ],
        name="scripted Reviewer story",
    )
    sandbox = "local"
    permissions = "read_only"
    instructions = "You review notes in the workspace. You can only read. Answer in one sentence."


CHAT_PROMPT = "Summarise the release for the team, and file the summary in published/."
SUMMARY = "Agents run in a sandbox; gated calls wait for a person; an approved run resumes where it stopped.\n"
CHAT_ANSWER = (
    "(scripted model) I filed the summary in published/summary.md. In short: agents run in a sandbox, "
    "every gated call waits for a person in the approval inbox, and an approved run resumes exactly "
    "where it stopped."
)
FOLLOW_UP_ANSWER = (
    "(scripted model) You asked me to summarise the release; the summary is in published/summary.md, "
    "approved before it was written."
)


class Helper(Agent):
    """The chat page's agent: answers, files what it writes in published/ once a person approves,
    and takes follow-ups. Its scripted story streams its answers word by word, as a provider does."""

    model = ScriptedModel(
        [
            tool_call("write", path="published/summary.md", content=SUMMARY),
            reply(CHAT_ANSWER),
            reply(FOLLOW_UP_ANSWER),
            reply("(scripted model) That is all my scripted story holds; start a new conversation."),
        ],
        name="scripted Helper story",
        stream=True,
        stream_delay=0.04,
    )
    sandbox = "local"
    permissions = Permissions("approve", approve_when=needs_a_person)
    instructions = (
        "You help the team with the release. Files you put in published/ wait for a person's "
        "approval. Answer in two or three sentences."
    )


AGENTS: dict[str, type[Agent]] = {"scribe": Scribe, "reviewer": Reviewer}
