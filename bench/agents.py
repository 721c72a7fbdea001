"""Agents of the benchmarks, importable by worker processes. Every model here is scripted."""

from __future__ import annotations

from typing import Any

from nexo_django import Agent, tool
from nexo_django.core.tools import ToolContext
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.durable_agents import Scribe


class VirtualScribe(Scribe):
    """Scribe (a scripted gated write, then an answer) on the in-memory sandbox: no disk I/O in
    the tool, so the cycle measures the durable layer alone."""

    sandbox = "virtual"


CHAOS_LEDGER = "NEXO_CHAOS_LEDGER"
CHAOS_MODEL_LOG = "NEXO_CHAOS_MODEL_LOG"


def _append(path: str, line: str) -> None:
    import os

    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@tool(capability="shell", idempotent=False)
def ledger(entry: str, ctx: ToolContext) -> dict:
    """Scripted side effect: appends '<workspace name> <entry>' to the file named by
    NEXO_CHAOS_LEDGER (fsync'd), so bench/chaos.py can see any call that ran twice."""
    import os

    root = str(getattr(ctx.sandbox, "root", "?"))
    _append(os.environ[CHAOS_LEDGER], f"{os.path.basename(root)} {entry}\n")
    return {"logged": entry}


class ChaosModel(ScriptedModel):
    """The scripted model, which also appends '<prompt> <turn>' to NEXO_CHAOS_MODEL_LOG each time
    it is asked for a turn, so a turn asked twice (after a crash) can be counted."""

    def complete(self, messages: list[Any], tools: list[dict[str, Any]]) -> Any:
        import os

        path = os.environ.get(CHAOS_MODEL_LOG)
        if path:
            prompt = next((m.get("content") for m in messages if m.get("role") == "user"), "?")
            turn = sum(1 for m in messages if m.get("role") == "assistant")
            _append(path, f"{prompt} {turn}\n")
        return super().complete(messages, tools)


class ChaosAgent(Agent):
    """Scripted: four gated non-idempotent calls in four turns (two local writes, two ledger
    entries; an ungated glob beside the first), then an answer."""

    model = ChaosModel([
        [tool_call("glob", pattern="*"), tool_call("write", path="a.txt", content="alpha\n")],
        tool_call("ledger", entry="t1"),
        tool_call("write", path="b.txt", content="beta\n"),
        tool_call("ledger", entry="t3"),
        reply("Done."),
    ])  # fmt: skip
    sandbox = "local"
    permissions = "approve"
    tools = [ledger]


@tool(capability="read", idempotent=True)
def echo(text: str) -> dict:
    """Returns its text: the one tool of bench/concurrency.py's runs, on both sides."""
    return {"echo": text}


class Echoer(Agent):
    """One tool call (echo), then an answer, against the model NEXO["MODEL"] names: bench/concurrency.py
    points it at its slow loopback OpenAI-compatible server."""

    instructions = "Call echo once, then answer."
    permissions = "auto"
    tools = [echo]



class Looker(Agent):
    """An agent on the virtual sandbox that may only look (``glob``/``read`` ungated): given a
    scripted model of ``glob`` turns, each is an agent turn through the durable journal, without a
    person (the peer of a workflow step in bench.workflow)."""

    sandbox = "virtual"
    permissions = "read_only"
    max_turns = 10_000


class Nightly(Agent):
    """Scripted: answers at once (bench/schedules.py's scheduled agent; no worker runs it there)."""

    model = ScriptedModel([reply("(scripted) triaged.")])
