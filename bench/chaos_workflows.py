"""The workflows of bench/chaos.py: checkpoints whose functions append to a ledger, a question
the chaos's approver answers, and an agent run inside (a scripted model).

Each checkpoint's function appends ``<name> <step> <unix time>`` to NEXO_CHAOS_WF_LEDGER, so the
verdict can tell a function that ran again after its result was recorded (a double run: never
allowed) from one that ran again because its worker died before the record (at least once, as
docs/workflows.md says).
"""

from __future__ import annotations

import os
import time
from typing import Any

from nexo_django import Agent, Workflow
from nexo_django.testing import ScriptedModel, reply

CHAOS_WF_LEDGER = "NEXO_CHAOS_WF_LEDGER"
STEPS = ("one", "two", "three")


def note_step(name: str, step: str) -> str:
    path = os.environ.get(CHAOS_WF_LEDGER)
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{name} {step} {time.time():.6f}\n".encode())  # one write: one whole line
        finally:
            os.close(fd)
    return step


class ChaosChild(Agent):
    """The agent inside: one scripted answer, nothing gated (its durability is ChaosAgent's part)."""

    model = ScriptedModel([reply("child done")])
    sandbox = "virtual"
    permissions = "read_only"


class ChaosWorkflow(Workflow):
    """checkpoint, question, checkpoint, agent, checkpoint."""

    def call(self, payload: Any) -> Any:
        name = str(payload["name"])
        self.checkpoint("one", note_step, name, "one")
        choice = self.ask("go", "Go on?", schema={"type": "string"})
        self.checkpoint("two", note_step, name, "two")
        answer = self.run_agent(ChaosChild, name, name="child")
        self.checkpoint("three", note_step, name, "three")
        return {"choice": choice, "agent": answer}
